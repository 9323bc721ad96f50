"""`python -m deployment.score`: the served model scored on its export's test samples.

    .venv-serving/bin/python -m deployment.score EXPORT [--url HOST:PORT] [--protocol http|grpc]

Sends the samples the export checked itself on (EXPORT/check_samples.npz: the test split's inputs,
labels and TensorFlow's probabilities) to a Triton server in batches and scores the answers: AUC,
log loss, normalized entropy and calibration of the served predictions beside the same metrics of
the model run in this process by ONNX Runtime and of TensorFlow's at export (equal within 1e-5 for
float32 tables; int8 tables differ from TensorFlow by their quantization), and the largest
difference between served and in-process. Without --url it starts `python -m deployment.serve` on
EXPORT (127.0.0.1, free ports) and stops it at the end. Exit 0 when every served probability is
within 1e-5 of the in-process one, 1 when not (or when the server fails), 2 on bad input (one
`error:` line).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence

import numpy as np

from deployment.client import connect, free_ports, infer, start_server, stop_server
from deployment.contract import (CATEGORICAL_INPUT, NUMERICAL_INPUT, PROBABILITY_TOLERANCE, ContractError,
                                 ServingContract, load_contract)
from deployment.runtime import open_export
from recsys.runtime.metrics import serving_scores as scores

TOLERANCE = PROBABILITY_TOLERANCE  # max |served - in-process| of a probability


def load_samples(contract: ServingContract) -> Dict[str, np.ndarray]:
    """The export's check samples; ContractError (one line) when the export has none or they are unreadable."""
    if contract.check_samples is None:
        raise ContractError(f"{contract.folder}: serving.json names no check_samples (an export of an earlier "
                            f"version: export the checkpoint again)")
    path = contract.folder / contract.check_samples
    try:
        with np.load(path) as archive:
            samples = {key: archive[key] for key in (NUMERICAL_INPUT, CATEGORICAL_INPUT, "labels", "probabilities")}
    except (OSError, ValueError, KeyError) as error:
        raise ContractError(f"{path}: not the export's check samples ({error})") from None
    return samples


def batches(samples: Dict[str, np.ndarray], batch_size: int) -> Iterator[Dict[str, np.ndarray]]:
    """The samples' inputs, `batch_size` rows at a time."""
    for start in range(0, len(samples["labels"]), batch_size):
        yield {name: samples[name][start:start + batch_size] for name in (NUMERICAL_INPUT, CATEGORICAL_INPUT)}


def served_probabilities(protocol: str, url: str, model: str, samples: Dict[str, np.ndarray],
                         batch_size: int) -> np.ndarray:
    """The server's probabilities of every sample, `batch_size` rows per request."""
    client = connect(protocol, url)
    try:
        return np.concatenate([infer(protocol, client, model, feed).reshape(-1) for feed in batches(samples, batch_size)])
    finally:
        client.close()


def in_process_probabilities(contract: ServingContract, samples: Dict[str, np.ndarray], batch_size: int) -> np.ndarray:
    """The same model's probabilities from ONNX Runtime in this process."""
    export = open_export(contract.folder)
    return np.concatenate([export.predict(feed).reshape(-1) for feed in batches(samples, batch_size)])


def describe(name: str, values: Dict[str, float]) -> str:
    return f"  {name:<24} " + ", ".join(f"{key} {value:.6f}" for key, value in values.items())


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deployment.score", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("export", type=Path, help="an export folder of python -m deployment.export")
    parser.add_argument("--url", default=None,
                        help="host:port of a running server (its --protocol port); default: serve EXPORT here")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--model_name", default=None, help="the served model's name (default: the export's model)")
    parser.add_argument("--batch_size", type=int, default=1024, help="rows per request")
    parser.add_argument("--record", type=Path, default=None,
                        help="also write the scores as JSON to this file (served, in_process, tensorflow, max_abs_diff)")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch_size must be at least 1, got {args.batch_size}")
    return args


def report(args: argparse.Namespace, contract: ServingContract, samples: Dict[str, np.ndarray], served: np.ndarray,
           url: str, model: str) -> int:
    """Prints (and with --record writes) the served scores beside the in-process ones; the exit code."""
    labels = samples["labels"].reshape(-1)
    in_process = in_process_probabilities(contract, samples, args.batch_size)
    difference = float(np.max(np.abs(served - in_process)))
    record = {"export": str(args.export), "model": model, "protocol": args.protocol, "url": url,
              "samples": int(len(labels)), "served": scores(labels, served), "in_process": scores(labels, in_process),
              "tensorflow": scores(labels, samples["probabilities"].reshape(-1)), "max_abs_diff": difference}
    print(f"served {model} over {args.protocol.upper()} at {url}: {len(labels)} test samples of the export's check")
    print(describe(f"served ({args.protocol})", record["served"]))
    print(describe("in-process ONNX Runtime", record["in_process"]))
    print(describe("TensorFlow (at export)", record["tensorflow"]))
    print(f"  max |served - in-process| of the probabilities = {difference:.3g} (limit {TOLERANCE:g})", flush=True)
    if args.record is not None:
        staging = args.record.with_name(f".{args.record.name}.tmp")
        staging.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(staging, args.record)
    if not difference <= TOLERANCE:
        print(f"error: the served probabilities differ from in-process ONNX Runtime's by up to {difference:.3g} "
              f"(limit {TOLERANCE:g})", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        contract = load_contract(args.export)
        samples = load_samples(contract)
    except ContractError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    server, url, model = None, args.url, args.model_name or contract.model
    try:
        if url is None:
            http_port, grpc_port = free_ports(2)
            server = start_server(args.export, http_port, grpc_port)
            url = f"127.0.0.1:{http_port if args.protocol == 'http' else grpc_port}"
        served = served_probabilities(args.protocol, url, model, samples, args.batch_size)
    except Exception as error:  # the server failed to start or to answer: tritonclient's errors, OSError
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: scoring {args.export} on {url or 'a new server'} failed: {first}", file=sys.stderr)
        if server is not None:
            stop_server(server)
        return 1
    try:
        return report(args, contract, samples, served, url, model)
    finally:
        if server is not None:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())

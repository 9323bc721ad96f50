"""Load test of the Triton server (`python -m deployment.serve`) beside in-process ONNX Runtime.

    .venv-serving/bin/python -m bench.serving [--export EXPORT_DIR] [--protocol grpc] [--requests 2000] [--seconds 5]

The export defaults to make demo's (demo_output/onnx_export: the demo's trained DLRM).

Starts the server on the export (127.0.0.1, free ports), then for each batch size and concurrency
(1, 4, 16 clients, each its own connection, sending the same valid batch back to back) sends requests
until --requests have been answered or --seconds have passed, and records throughput (samples/s)
and the p50/p95/p99 latency each client measured around its call. The same model's in-process ONNX
Runtime inference is timed in the same run, one call per batch, as the floor a server adds to. Every
served answer is checked against the in-process one. Only localhost is ever sent to. Writes
bench/results/serving.json and prints a table. Runs in .venv-serving (tritonclient, no TensorFlow).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from deployment.client import connect, free_ports, request_inputs, start_server, stop_server
from deployment.contract import ContractError, example_batch
from deployment.runtime import open_export
from recsys.runtime.cpu_settings import cpu_model_name

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench" / "results" / "serving.json"
DEMO_EXPORT = REPO_ROOT / "demo_output" / "onnx_export"  # make demo's last step writes it


def percentiles(seconds: List[float]) -> Dict[str, float]:
    p50, p95, p99 = np.percentile(np.array(seconds) * 1e3, [50, 95, 99])
    return {"p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3), "p99_ms": round(float(p99), 3)}


def time_in_process(export: Any, feed: Dict[str, np.ndarray], requests: int, seconds: float) -> Dict[str, Any]:
    """In-process ONNX Runtime: one `predict` per request, one thread, bounded like the served cells."""
    export.predict(feed)
    latencies, start = [], time.perf_counter()
    while len(latencies) < requests and time.perf_counter() - start < seconds:
        began = time.perf_counter()
        export.predict(feed)
        latencies.append(time.perf_counter() - began)
    elapsed = time.perf_counter() - start
    rows = len(next(iter(feed.values())))
    return {"requests": len(latencies), "samples_per_s": round(rows * len(latencies) / elapsed, 1),
            **percentiles(latencies)}


def time_served(protocol: str, url: str, model: str, feed: Dict[str, np.ndarray], expected: np.ndarray,
                concurrency: int, requests: int, seconds: float) -> Dict[str, Any]:
    """`concurrency` clients sending `feed` until `requests` answers or `seconds`; a wrong answer or
    an error counts as failed."""
    latencies: List[float] = []
    failed, issued = [0], [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client_loop() -> None:
        client = connect(protocol, url)
        tensors = request_inputs(protocol, feed)
        while time.perf_counter() < deadline:
            with lock:
                if issued[0] >= requests:
                    break
                issued[0] += 1
            began = time.perf_counter()
            try:
                ok = np.allclose(client.infer(model, tensors).as_numpy("probabilities"), expected, atol=1e-5)
            except Exception:  # tritonclient's InferenceServerException, a dropped connection
                ok = False
            took = time.perf_counter() - began
            with lock:
                if ok:
                    latencies.append(took)
                else:
                    failed[0] += 1
        client.close()

    threads = [threading.Thread(target=client_loop) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    rows = len(next(iter(feed.values())))
    return {"requests": len(latencies), "failed": failed[0],
            "samples_per_s": round(rows * len(latencies) / elapsed, 1), **(percentiles(latencies) if latencies else {})}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, default=DEMO_EXPORT,
                        help="export folder of python -m deployment.export (default: make demo's, demo_output/onnx_export)")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    parser.add_argument("--batch_sizes", default="1,64,1024", help="comma-separated rows per request")
    parser.add_argument("--requests", type=int, default=2000, help="most requests per cell")
    parser.add_argument("--seconds", type=float, default=5.0, help="most seconds per cell")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if not args.export.exists():
        print(f"error: --export {args.export}: no such folder (run make demo, whose last step writes "
              f"{DEMO_EXPORT}, or give an export folder of python -m deployment.export)", file=sys.stderr)
        sys.exit(2)
    try:
        export = open_export(args.export)
    except ContractError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    ports = free_ports(2)
    server = start_server(args.export, ports[0], ports[1], ["--max_batch_size", str(max(4096, max(batch_sizes)))])
    url = f"127.0.0.1:{ports[1] if args.protocol == 'grpc' else ports[0]}"
    cells = []
    try:
        for rows in batch_sizes:
            numerical, categorical = example_batch(export.contract, rows, seed=rows)
            feed = {"numerical_features": numerical, "categorical_features": categorical}
            expected = export.predict(feed)
            cells.append({"batch_size": rows, "where": "in-process", "concurrency": 1,
                          **time_in_process(export, feed, args.requests, args.seconds)})
            for clients in concurrency:
                cells.append({"batch_size": rows, "where": f"triton/{args.protocol}", "concurrency": clients,
                              **time_served(args.protocol, url, export.contract.model, feed, expected, clients,
                                            args.requests, args.seconds)})
    finally:
        stop_server(server)
    record = {"export": str(args.export), "model": export.contract.model, "protocol": args.protocol,
              "bounds": {"requests_per_cell": args.requests, "seconds_per_cell": args.seconds},
              "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "cpu": cpu_model_name(),
                       "load_average": os.getloadavg()}, "cells": cells}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    staging = args.output.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(staging, args.output)
    print(f"{'batch':>6} {'where':<14} {'clients':>7} {'requests':>8} {'failed':>6} {'samples/s':>11} "
          f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for cell in cells:
        print(f"{cell['batch_size']:>6} {cell['where']:<14} {cell['concurrency']:>7} {cell['requests']:>8} "
              f"{cell.get('failed', 0):>6} {cell['samples_per_s']:>11.1f} {cell.get('p50_ms', float('nan')):>8.2f} "
              f"{cell.get('p95_ms', float('nan')):>8.2f} {cell.get('p99_ms', float('nan')):>8.2f}")
    print(f"wrote {args.output}")
    if any(cell.get("failed") for cell in cells):
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Real tritonclient clients for tests/test_serving.py, run in .venv-serving (tritonclient's protobuf
and TensorFlow's do not share an environment). Each command prints one JSON object on its last line.

    python tests/serving_client.py predict HTTP GRPC MODEL EXPORT      served vs in-process, both protocols
    python tests/serving_client.py bad HTTP GRPC MODEL EXPORT          each bad request's status and message
    python tests/serving_client.py load HTTP GRPC MODEL SECONDS EXPORT...   concurrent clients; which export
                                                                       each answer matches, and failures
    python tests/serving_client.py configs REPO                        every config.pbtxt parsed as ModelConfig

HTTP and GRPC are host:port. `load` prints `ready` once every client has had an answer, then runs
until SECONDS have passed.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from deployment.client import connect, infer
from deployment.contract import example_batch
from deployment.runtime import open_export

def batch_of(export: str, rows: int, seed: int = 0) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """A valid batch for `export` and its in-process ONNX Runtime probabilities."""
    loaded = open_export(Path(export))
    numerical, categorical = example_batch(loaded.contract, rows, seed)
    inputs = {"numerical_features": numerical, "categorical_features": categorical}
    return inputs, loaded.predict(inputs)


def predict(http: str, grpc: str, model: str, export: str) -> Dict[str, Any]:
    inputs, expected = batch_of(export, rows=64)
    result = {}
    for protocol, url in (("http", http), ("grpc", grpc)):
        client = connect(protocol, url)
        result[protocol] = float(np.max(np.abs(infer(protocol, client, model, inputs) - expected)))
        client.close()
    return result


def bad_cases(inputs: Dict[str, np.ndarray]) -> Dict[str, Dict[str, np.ndarray]]:
    """One bad request per kind, each derived from the valid `inputs` (the tiny exports' layout:
    cat_0 one-hot of 10, cat_1 one-hot of 7, cat_2 two-hot of 5)."""
    numerical, categorical = inputs["numerical_features"], inputs["categorical_features"]

    def changed(array: np.ndarray, index: Tuple[int, int], value: float) -> np.ndarray:
        array = array.copy()
        array[index] = value
        return array
    return {
        "wrong_shape": {"numerical_features": numerical[:, :2].copy(), "categorical_features": categorical},
        "wrong_dtype": {"numerical_features": numerical.astype(np.float64), "categorical_features": categorical},
        "id_out_of_range": {"numerical_features": numerical, "categorical_features": changed(categorical, (3, 1), 7)},
        "pad_in_one_hot": {"numerical_features": numerical, "categorical_features": changed(categorical, (2, 0), -1)},
        "nan": {"numerical_features": changed(numerical, (1, 2), np.nan), "categorical_features": categorical},
        "inf": {"numerical_features": changed(numerical, (0, 0), np.inf), "categorical_features": categorical},
        "missing_input": {"numerical_features": numerical},
    }


def keep_sending(protocol: str, url: str, model: str, inputs: Dict[str, np.ndarray], expected: np.ndarray,
                 running: Callable[[], bool], record: Dict[str, Any]) -> None:
    """Valid requests until `running()` is false; counts answers and failures (a wrong answer too)."""
    client = connect(protocol, url)
    while running():
        try:
            ok = np.allclose(infer(protocol, client, model, inputs), expected, atol=1e-6)
        except InferenceServerException as error:
            ok, record["error"] = False, str(error)[:300]
        record["answers" if ok else "failures"] += 1
    client.close()


def bad(http: str, grpc: str, model: str, export: str) -> Dict[str, Any]:
    """Every bad request over both protocols while other clients send valid ones all along."""
    inputs, expected = batch_of(export, rows=8)
    background = [{"answers": 0, "failures": 0} for _ in range(2)]
    done = threading.Event()
    threads = [threading.Thread(target=keep_sending, args=(protocol, url, model, inputs, expected,
                                                           lambda: not done.is_set(), record))
               for (protocol, url), record in zip((("http", http), ("grpc", grpc)), background)]
    for thread in threads:
        thread.start()
    replies = {}
    for protocol, url in (("http", http), ("grpc", grpc)):
        client = connect(protocol, url)
        for case, request in bad_cases(inputs).items():
            try:
                infer(protocol, client, model, request)
                replies[f"{protocol}/{case}"] = {"status": "ok", "message": ""}
            except InferenceServerException as error:
                replies[f"{protocol}/{case}"] = {"status": str(error.status()), "message": error.message()}
        client.close()
    done.set()
    for thread in threads:
        thread.join()
    return {"replies": replies, "background": background}


def load(http: str, grpc: str, model: str, seconds: float, exports: List[str]) -> Dict[str, Any]:
    """Concurrent clients (2 HTTP, 2 gRPC) sending one batch for `seconds`; each answer is matched to
    the export whose in-process prediction it equals (-1: none)."""
    inputs, _ = batch_of(exports[0], rows=8)
    references = [open_export(Path(e)).predict(inputs) for e in exports]
    records: List[Dict[str, Any]] = []
    lock = threading.Lock()
    started = threading.Barrier(5)
    deadline = time.monotonic() + seconds

    def client_loop(protocol: str, url: str) -> None:
        client = connect(protocol, url)
        first = True
        while first or time.monotonic() < deadline:
            try:
                answer = infer(protocol, client, model, inputs)
                match = next((i for i, ref in enumerate(references) if np.allclose(answer, ref, atol=1e-6)), -1)
                entry = {"t": time.monotonic(), "export": match}
            except InferenceServerException as error:
                entry = {"t": time.monotonic(), "error": str(error)[:300]}
            with lock:
                records.append(entry)
            if first:
                first = False
                started.wait()
        client.close()

    threads = [threading.Thread(target=client_loop, args=(protocol, url))
               for protocol, url in (("http", http), ("grpc", grpc)) * 2]
    for thread in threads:
        thread.start()
    started.wait()
    print("ready", flush=True)
    for thread in threads:
        thread.join()
    records.sort(key=lambda entry: entry["t"])
    switches = [entry["export"] for i, entry in enumerate(records)
                if "export" in entry and (i == 0 or records[i - 1].get("export") != entry["export"])]
    return {"requests": len(records), "failures": [e["error"] for e in records if "error" in e][:5],
            "failed": sum("error" in e for e in records), "switches": switches,
            "last": records[-1].get("export") if records else None}


def configs(repo: str) -> Dict[str, Any]:
    parsed = {}
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        parsed[path.parent.name] = {
            "name": config.name, "platform": config.platform, "max_batch_size": config.max_batch_size,
            "inputs": [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.input],
            "outputs": [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.output],
            "dynamic_batching": config.HasField("dynamic_batching"),
            "versions": sorted(p.name for p in path.parent.iterdir() if p.is_dir())}
    return parsed


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "load":
        result = load(rest[0], rest[1], rest[2], float(rest[3]), rest[4:])
    else:
        result = {"predict": predict, "bad": bad, "configs": configs}[command](*rest)
    print(json.dumps(result), flush=True)

"""The client side of `deployment.serve`, for what talks to it from this repository (the scorer, the
load test, the tests): free local ports, the server started on an export and waited for, and one
batch sent over HTTP or gRPC with tritonclient. Runs in .venv-serving (no TensorFlow)."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Sequence, TextIO

import numpy as np

from deployment.contract import ContractError, OUTPUT

REPO_ROOT = Path(__file__).resolve().parent.parent
TRITON_TYPES = {"float32": "FP32", "float64": "FP64", "int32": "INT32", "int64": "INT64"}
SERVING_LINE = "[serve] serving"  # deployment.serve's line once a version answers


def free_ports(count: int) -> List[int]:
    """`count` TCP ports free on 127.0.0.1 right now."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def protocol_module(protocol: str) -> Any:
    """tritonclient's module for "http" or "grpc"."""
    if protocol == "grpc":
        import tritonclient.grpc as module
    elif protocol == "http":
        import tritonclient.http as module
    else:
        raise ValueError(f"protocol must be http or grpc, got {protocol!r}")
    return module


def connect(protocol: str, url: str) -> Any:
    """A client of the server at `url` (host:port of that protocol)."""
    module = protocol_module(protocol)
    return module.InferenceServerClient(url, network_timeout=300.0) if protocol == "http" else \
        module.InferenceServerClient(url)


def request_inputs(protocol: str, feed: Dict[str, np.ndarray]) -> list:
    """tritonclient's InferInputs holding `feed` (input name -> array)."""
    module = protocol_module(protocol)
    tensors = []
    for name, array in feed.items():
        tensor = module.InferInput(name, list(array.shape), TRITON_TYPES[array.dtype.name])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def infer(protocol: str, client: Any, model: str, feed: Dict[str, np.ndarray]) -> np.ndarray:
    """The served probabilities `[rows, 1]` of one request."""
    return client.infer(model, request_inputs(protocol, feed)).as_numpy(OUTPUT)


def _copy_lines(stream: TextIO) -> None:
    for line in stream:
        sys.stderr.write(line)


def start_server(source: Path, http_port: int, grpc_port: int, extra: Sequence[str] = ()) -> subprocess.Popen:
    """`python -m deployment.serve` on `source` (an export or a repository) with this interpreter,
    returned once it serves (its log goes on to this stderr); ContractError when it ends first."""
    process = subprocess.Popen([sys.executable, "-m", "deployment.serve", str(source), "--http_port", str(http_port),
                                "--grpc_port", str(grpc_port), *extra], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    for line in process.stdout:
        sys.stderr.write(line)
        if line.startswith(SERVING_LINE):
            threading.Thread(target=_copy_lines, args=(process.stdout,), daemon=True).start()
            return process
    raise ContractError(f"deployment.serve exited with {process.wait()} before serving {source}")


def stop_server(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """Stops a server of `start_server` (its own graceful stop first) and waits for it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

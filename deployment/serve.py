"""Serve an export (or a model repository's newest version) with the Triton server nvidia-pytriton ships.

    python -m deployment.serve SOURCE [--http_port 8000] [--grpc_port 8001] [--max_batch_size 4096] ...

SOURCE is an export folder (serving.json + model.onnx, from `python -m deployment.export`) or a model
folder of a repository written by `python -m deployment.repository` (or the repository holding one).
The server is pytriton's bundled `tritonserver` with its Python backend; each version's model is
`deployment/triton_model.py`: ONNX Runtime inside, each request checked against serving.json, dynamic
batching on, HTTP and gRPC (KServe v2) on 127.0.0.1 unless --address says otherwise.

Refresh: every --poll_s the source is looked at again. A new version folder in the repository (or,
for an export folder, a new serving.json: the export replaces the folder whole) is opened and checked
here first (`deployment.runtime.open_export`, and the same contract as the served version); a good one
is loaded through Triton's model-control API as the next version, which serves new requests once it
is ready while the old one finishes its own (none fails); a corrupt or mismatched one is refused with
one `error:` line on stderr and the served version stays. SIGINT/SIGTERM stop the server.

Why not pytriton's Python binding (`Triton.bind`): it turns any exception of the inference function
into an INTERNAL error (HTTP 500) for every request of the dynamic batch; the Python backend's
per-request `TritonError(INVALID_ARG)` gives the bad request alone a 400 / INVALID_ARGUMENT.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

from deployment.contract import CONTRACT_FILE, ContractError, ServingContract, load_contract
from deployment.repository import CONFIG_FILE, DEFAULT_MAX_BATCH_SIZE, DEFAULT_QUEUE_DELAY_US, model_config_text, versions
from deployment.runtime import open_export

MODEL_FILE = Path(__file__).resolve().parent / "triton_model.py"
REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 5


def log(line: str, error: bool = False) -> None:
    """One line of the server's own log (stderr for errors, stdout otherwise), written whole."""
    stream = sys.stderr if error else sys.stdout
    stream.write(("error: " if error else "[serve] ") + line + "\n")
    stream.flush()


@dataclass
class Source:
    """Where versions come from: a repository model folder (numbered versions) or an export folder
    (each new serving.json is the next version)."""
    path: Path
    is_export: bool

    def newest(self) -> Optional[Tuple[str, Path]]:
        """(identity, folder) of the newest version, or None when there is none yet. The identity
        changes exactly when a new version arrives."""
        if self.is_export:
            try:
                stat = (self.path / CONTRACT_FILE).stat()
            except FileNotFoundError:
                return None
            return f"{stat.st_ino}:{stat.st_mtime_ns}", self.path
        present = versions(self.path)
        return (str(present[-1]), self.path / str(present[-1])) if present else None


def resolve_source(path: Path) -> Source:
    """SOURCE's kind (see the module doc); ContractError when it is none of them."""
    if (path / CONTRACT_FILE).is_file():
        return Source(path, is_export=True)
    if (path / CONFIG_FILE).is_file():
        return Source(path, is_export=False)
    models = [child for child in sorted(path.iterdir()) if (child / CONFIG_FILE).is_file()] if path.is_dir() else []
    if len(models) == 1:
        return Source(models[0], is_export=False)
    raise ContractError(f"{path}: neither an export folder (serving.json) nor a model repository with one model "
                        f"(<model>/{CONFIG_FILE}); found {len(models)} models")


def tritonserver_dir() -> Path:
    """The `tritonserver` tree inside the nvidia-pytriton package."""
    import pytriton
    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def prepare_backends(work: Path) -> Path:
    """A backend folder for this Python: pytriton's Python backend beside the stub built for this
    interpreter's version (pytriton ships one stub per Python version), linked, not copied."""
    server = tritonserver_dir()
    python_dir = work / "backends" / "python"
    python_dir.mkdir(parents=True)
    for item in (server / "backends" / "python").iterdir():
        if item.name != "__pycache__":
            (python_dir / item.name).symlink_to(item)
    stub = server / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
    if not stub.is_file():
        raise ContractError(f"nvidia-pytriton ships no Python backend stub for Python "
                            f"{sys.version_info[0]}.{sys.version_info[1]} (looked for {stub})")
    (python_dir / "triton_python_backend_stub").symlink_to(stub)
    return work / "backends"


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def stage_version(contract: ServingContract, model_dir: Path, version: int) -> None:
    """The export of `contract` as `version` of the served model folder, whole (renamed into place)."""
    staging = model_dir / f".{version}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    _link_or_copy(contract.onnx_path, staging / contract.onnx)
    _link_or_copy(contract.folder / CONTRACT_FILE, staging / CONTRACT_FILE)
    (staging / "model.py").symlink_to(MODEL_FILE)
    staging.rename(model_dir / str(version))


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when this process dies, so no server outlives it."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """The tritonserver process serving one model, and the versions it was given."""

    def __init__(self, args: argparse.Namespace, source: Source, work: Path) -> None:
        self.args = args
        self.source = source
        self.work = work
        self.repo = work / "repository"
        self.process: Optional[subprocess.Popen] = None
        self.served: Optional[ServingContract] = None
        self.served_identity: Optional[str] = None
        self.version = 0
        self.refused: set = set()

    @property
    def model_dir(self) -> Path:
        return self.repo / self.args.model_name

    def check(self, folder: Path) -> ServingContract:
        """The export in `folder`, opened and checked, and of the served contract; ContractError else."""
        contract = open_export(folder, threads=1).contract
        if self.served is not None:
            why = self.served.mismatch(contract)
            if why:
                raise ContractError(f"{folder}: {why}")
        return contract

    def start(self, first: Tuple[str, Path]) -> None:
        """Starts tritonserver on the first version and waits until it serves."""
        identity, folder = first
        contract = self.check(folder)
        self.model_dir.mkdir(parents=True)
        parameters = {"onnx_threads": str(self.args.threads)}
        (self.model_dir / CONFIG_FILE).write_text(model_config_text(
            contract, self.args.model_name, self.args.max_batch_size, self.args.queue_delay_us, backend="python",
            instances=self.args.instances, parameters=parameters))
        stage_version(contract, self.model_dir, 1)
        server = tritonserver_dir()
        command = [str(server / "bin" / "tritonserver"), f"--model-repository={self.repo}",
                   f"--backend-directory={prepare_backends(self.work)}", "--model-control-mode=explicit",
                   f"--load-model={self.args.model_name}", f"--http-address={self.args.address}",
                   f"--http-port={self.args.http_port}", f"--grpc-address={self.args.address}",
                   f"--grpc-port={self.args.grpc_port}", "--allow-metrics=false", "--log-info=false", "--pinned-memory-pool-byte-size=0",
                   f"--exit-timeout-secs={EXIT_TIMEOUT_S}", "--strict-readiness=true"]
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(server.parent.parent / "nvidia_pytriton.libs"),
                                                               env.get("LD_LIBRARY_PATH")]))
        # The backend's stub runs this interpreter's Python: its venv (numpy, onnxruntime) first on
        # PATH, this repository importable (deployment/).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(command, env=env, preexec_fn=_die_with_parent)
        self._wait_ready()
        self._accepted(contract, identity, 1)

    def _client(self):
        import tritonclient.http as httpclient
        return httpclient.InferenceServerClient(f"127.0.0.1:{self.args.http_port}", network_timeout=300.0)

    def _wait_ready(self) -> None:
        client = self._client()
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ContractError(f"tritonserver exited with {self.process.returncode} before serving "
                                        f"(see its log above)")
                try:
                    if client.is_model_ready(self.args.model_name):
                        return
                except Exception:  # not listening yet
                    pass
                time.sleep(0.2)
        finally:
            client.close()
        raise ContractError(f"tritonserver did not serve {self.args.model_name} within {READY_TIMEOUT_S:.0f} s")

    def _accepted(self, contract: ServingContract, identity: str, version: int) -> None:
        self.served, self.served_identity, self.version = contract, identity, version
        log(f"serving {self.args.model_name} version {version} (step {contract.step}, from {contract.folder}) on "
            f"http://{self.args.address}:{self.args.http_port} and grpc {self.args.address}:{self.args.grpc_port}")

    def refresh(self) -> None:
        """Loads the source's newest version when it is new and good; refuses it with one line else."""
        newest = self.source.newest()
        if newest is None or newest[0] == self.served_identity or newest[0] in self.refused:
            return
        identity, folder = newest
        try:
            contract = self.check(folder)
        except ContractError as error:
            self.refused.add(identity)
            log(f"refused the new version ({error}); still serving version {self.version}", error=True)
            return
        version = self.version + 1
        stage_version(contract, self.model_dir, version)
        client = self._client()
        try:
            client.load_model(self.args.model_name)
        except Exception as error:  # Triton's load failed: it keeps the served version
            self.refused.add(identity)
            shutil.rmtree(self.model_dir / str(version), ignore_errors=True)
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            log(f"refused the new version from {folder} (Triton could not load it: {first}); still serving "
                f"version {self.version}", error=True)
            return
        finally:
            client.close()
        for old in versions(self.model_dir):
            if old < version - 1:
                shutil.rmtree(self.model_dir / str(old), ignore_errors=True)
        self._accepted(contract, identity, version)

    def stop(self) -> None:
        """Stops tritonserver (its own graceful exit first) and waits for it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=EXIT_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deployment.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="an export folder, or a model repository (its model folder)")
    parser.add_argument("--address", default="127.0.0.1", help="address HTTP and gRPC listen on")
    parser.add_argument("--http_port", type=int, default=8000)
    parser.add_argument("--grpc_port", type=int, default=8001)
    parser.add_argument("--model_name", default=None,
                        help="name served (default: the repository's model folder, or serving.json's model)")
    parser.add_argument("--max_batch_size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                        help="largest batch the dynamic batcher forms (and largest request)")
    parser.add_argument("--queue_delay_us", type=int, default=DEFAULT_QUEUE_DELAY_US,
                        help="how long the dynamic batcher waits to fill a batch")
    parser.add_argument("--instances", type=int, default=1, help="model instances (each its own session)")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: its default)")
    parser.add_argument("--poll_s", type=float, default=1.0, help="how often the source is looked at for a new version")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m deployment.serve`: see the module doc. Exit 2 with one `error:` line on bad input."""
    args = parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    work = Path(tempfile.mkdtemp(prefix="dlrm-serve-"))
    server: Optional[Server] = None
    try:
        for name, value in (("--max_batch_size", args.max_batch_size), ("--instances", args.instances)):
            if value < 1:
                raise ContractError(f"{name} {value}: must be >= 1")
        source = resolve_source(args.source)
        first = source.newest()
        if first is None:
            raise ContractError(f"{source.path}: the repository has no version folder yet")
        if args.model_name is None:
            args.model_name = load_contract(first[1]).model if source.is_export else source.path.name
        server = Server(args, source, work)
        server.start(first)
        while not stop.wait(args.poll_s):
            if server.process.poll() is not None:
                log(f"tritonserver exited with {server.process.returncode}", error=True)
                return 1
            server.refresh()
        return 0
    except ContractError as error:
        log(str(error), error=True)
        return 2
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

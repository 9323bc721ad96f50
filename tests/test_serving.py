"""Serving (issue 41): the real Triton server of nvidia-pytriton, real tritonclient clients over HTTP and
gRPC, real ONNX Runtime, all in .venv-serving (scripts/setup.sh makes it; TensorFlow is not there).

One server for the module (`python -m deployment.serve` on a model repository, ports chosen free,
bound to 127.0.0.1, stopped at the end with nothing left running). The exports are the tiny ones of
tests/serving_fixtures.py; the tests only read the export folders, so real exports can replace them.
The tests run in file order: the refresh test goes last, it changes the served version.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pytest

from deployment.client import free_ports
from tests import multiproc

REPO = Path(__file__).resolve().parent.parent
SERVING_PYTHON = REPO / ".venv-serving" / "bin" / "python"
MODEL = "dlrm"


def serving_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)
    return env


def run_serving(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`args` run by .venv-serving's python from the repository root."""
    return subprocess.run([str(SERVING_PYTHON), *args], cwd=REPO, env=serving_env(), capture_output=True,
                          text=True, timeout=timeout)


def client(*args: str, timeout: float = 120) -> dict:
    """tests/serving_client.py's JSON answer for `args`."""
    result = run_serving("tests/serving_client.py", *args, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def children_of(pid: int) -> List[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Dict[str, Path]:
    """Export folders: `a` and `b` (a newer checkpoint of the same model), `wide` (4 numericals),
    `corrupt` (model.onnx cut short)."""
    multiproc.require(SERVING_PYTHON.exists(), "no .venv-serving (scripts/setup.sh makes it)")
    root = tmp_path_factory.mktemp("exports")
    made = {}
    for name, flags in (("a", []), ("b", ["--seed", "1"]), ("wide", ["--num_numerical", "4"]),
                        ("corrupt", ["--seed", "2", "--corrupt"])):
        result = run_serving("tests/serving_fixtures.py", str(root / name), *flags)
        assert result.returncode == 0, result.stderr
        made[name] = root / name
    return made


@pytest.fixture(scope="module")
def server(exports, tmp_path_factory):
    """`python -m deployment.serve` on a repository whose version 1 is export `a`."""
    repo = tmp_path_factory.mktemp("repository")
    written = run_serving("-m", "deployment.repository", str(exports["a"]), str(repo))
    assert written.returncode == 0, written.stderr
    http_port, grpc_port = free_ports(2)
    log = repo.parent / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen([str(SERVING_PYTHON), "-m", "deployment.serve", str(repo), "--http_port",
                                    str(http_port), "--grpc_port", str(grpc_port), "--poll_s", "0.3"],
                                   cwd=REPO, env=serving_env(), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while "serving dlrm version 1" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    helpers = children_of(process.pid)
    yield {"http": f"127.0.0.1:{http_port}", "grpc": f"127.0.0.1:{grpc_port}", "repo": repo / MODEL, "log": log,
           "process": process}
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert [pid for pid in helpers if Path(f"/proc/{pid}").exists()] == [], "tritonserver or a stub outlived serve"


def test_repository_configs_are_triton_model_configs(exports, server, tmp_path):
    """deployment.repository's config.pbtxt parses as Triton's ModelConfig (tritonclient's protobuf);
    a version of other widths is refused with one line, nothing written."""
    repo = tmp_path / "repo"
    for version in ("3", "7"):
        assert run_serving("-m", "deployment.repository", str(exports["a"]), str(repo), "--version", version,
                           "--model_name", "ctr").returncode == 0
    refused = run_serving("-m", "deployment.repository", str(exports["wide"]), str(repo), "--model_name", "ctr")
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"error: {exports['wide']}: cannot be version 8 of {repo / 'ctr'}: inputs [numerical_features float32 "
        "[-1, 4], categorical_features int32 [-1, 4]] differ from version 7's [numerical_features float32 [-1, 3], "
        "categorical_features int32 [-1, 4]]"]
    parsed = client("configs", str(repo))
    assert parsed == {"ctr": {
        "name": "ctr", "platform": "onnxruntime_onnx", "max_batch_size": 4096, "dynamic_batching": True,
        "inputs": [["numerical_features", "TYPE_FP32", [3]], ["categorical_features", "TYPE_INT32", [4]]],
        "outputs": [["probabilities", "TYPE_FP32", [1]]], "versions": ["3", "7"]}}
    assert client("configs", str(server["repo"].parent))["dlrm"]["versions"] == ["1"]


def test_served_predictions_equal_in_process_onnx_runtime(exports, server):
    differences = client("predict", server["http"], server["grpc"], MODEL, str(exports["a"]))
    assert differences == {"http": pytest.approx(0, abs=1e-6), "grpc": pytest.approx(0, abs=1e-6)}


def test_bad_requests_get_one_error_each_and_the_rest_is_served(exports, server):
    """Each bad request: 400 / INVALID_ARGUMENT naming the input and what was expected, while clients
    sending valid requests all along (batched with the bad ones) get every answer right."""
    result = client("bad", server["http"], server["grpc"], MODEL, str(exports["a"]))
    expected = {
        "wrong_shape": "unexpected shape for input 'numerical_features' for model 'dlrm'. Expected [-1,3], got [8,2]",
        "wrong_dtype": "inference input 'numerical_features' data-type is 'FP64', but model 'dlrm' expects 'FP32'",
        "id_out_of_range": "input 'categorical_features' has id 7 at row 3, column 1 (feature 'cat_1'): "
                           "expected 0 <= id < 7",
        "pad_in_one_hot": "input 'categorical_features' has id -1 at row 2, column 0 (feature 'cat_0'): "
                          "expected 0 <= id < 10",
        "nan": "input 'numerical_features' has nan at row 1, column 2 ('num_2'): expected finite values",
        "inf": "input 'numerical_features' has inf at row 0, column 0 ('num_0'): expected finite values",
        "missing_input": "missing required input(s) ['categorical_features']",
    }
    for protocol, status in (("http", "400"), ("grpc", "StatusCode.INVALID_ARGUMENT")):
        for case, words in expected.items():
            reply = result["replies"][f"{protocol}/{case}"]
            assert reply["status"] == status, (protocol, case, reply)
            assert words in reply["message"] and "Traceback" not in reply["message"], (protocol, case, reply)
    for record in result["background"]:
        assert record["failures"] == 0 and record["answers"] > 0, record


def test_refresh_under_load_fails_no_request_and_refuses_bad_versions(exports, server):
    """Version 2 (export b) added while 4 clients send requests: none fails, the answers switch from
    a's predictions to b's. Then a version of other widths and a corrupt one: each refused with one
    line in the server's log, b still served."""
    load = subprocess.Popen([str(SERVING_PYTHON), "tests/serving_client.py", "load", server["http"], server["grpc"],
                             MODEL, "6", str(exports["a"]), str(exports["b"])], cwd=REPO, env=serving_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert load.stdout.readline().strip() == "ready", load.stderr.read()[-3000:]
    added = run_serving("-m", "deployment.repository", str(exports["b"]), str(server["repo"].parent))
    assert added.returncode == 0, added.stderr
    out, err = load.communicate(timeout=120)
    assert load.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["failed"] == 0, result["failures"]
    assert result["switches"] == [0, 1], result  # a's answers, then b's only
    assert "serving dlrm version 2" in server["log"].read_text()

    for count, (bad, version) in enumerate((("wide", 3), ("corrupt", 4)), start=1):  # by hand: the writer refuses
        staging = server["repo"] / f".{version}.copy"
        staging.mkdir()
        for name in ("model.onnx", "serving.json"):
            (staging / name).write_bytes((exports[bad] / name).read_bytes())
        staging.rename(server["repo"] / str(version))
        deadline = time.monotonic() + 30
        while server["log"].read_text().count("refused") < count:
            assert time.monotonic() < deadline, server["log"].read_text()[-3000:]
            time.sleep(0.2)
    time.sleep(1)  # a few more polls: each refusal is said once
    refusals = [line for line in server["log"].read_text().splitlines() if "refused" in line]
    assert len(refusals) == 2, refusals
    assert refusals[0].startswith(f"error: refused the new version ({server['repo'] / '3'}: inputs [numerical_features "
                                  "float32 [-1, 4]")
    assert refusals[0].endswith("; still serving version 2")
    assert f"{server['repo'] / '4' / 'model.onnx'}: ONNX Runtime cannot load it" in refusals[1]
    differences = client("predict", server["http"], server["grpc"], MODEL, str(exports["b"]))
    assert differences == {"http": pytest.approx(0, abs=1e-6), "grpc": pytest.approx(0, abs=1e-6)}


def test_serve_and_score_refuse_a_folder_that_is_no_export_with_one_line(tmp_path, exports):
    multiproc.require(SERVING_PYTHON.exists(), "no .venv-serving (scripts/setup.sh makes it)")
    result = run_serving("-m", "deployment.serve", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {tmp_path}: neither an export folder (serving.json) nor a model repository with one model "
        "(<model>/config.pbtxt); found 0 models"]
    scored = run_serving("-m", "deployment.score", str(tmp_path))
    assert scored.returncode == 2 and scored.stderr.splitlines() == [
        f"error: {tmp_path / 'serving.json'}: not found (an export folder holds serving.json and model.onnx)"]
    # an export without the check's samples (the fixtures' are hand-made) cannot be scored: one line
    scored = run_serving("-m", "deployment.score", str(exports["a"]))
    assert scored.returncode == 2 and scored.stderr.splitlines() == [
        f"error: {exports['a']}: serving.json names no check_samples (an export of an earlier version: export the "
        f"checkpoint again)"]

"""Criteo preprocessing (preproc/): the real shell scripts with both engines (the embedded DuckDB
one and PySpark in local mode), checked against an independent pandas/numpy computation of the
same dictionaries and transforms, and against each other byte for byte."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Dict, List, Sequence

import numpy as np
import pandas as pd
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPROC = os.path.join(REPO, "preproc")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from preproc import synthetic_criteo  # noqa: E402
from multiproc import assert_one_error, require, snapshot  # noqa: E402
from recsys.data.feature_spec import FeatureSpec, get_categorical_feature_type  # noqa: E402

HAVE_SPARK = shutil.which("java") is not None and importlib.util.find_spec("pyspark") is not None
needs_spark = pytest.mark.skipif(not HAVE_SPARK, reason="needs java and pyspark")
HAVE_DUCKDB = importlib.util.find_spec("duckdb") is not None
ENGINES = ("duckdb", "spark")

NUM_DAYS = 4
LINES_PER_DAY = 10_000
THRESHOLD = 2
# Small jobs spend most of their CPU in the JVM's optimising compiler; the quick tier is enough here.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
NUM_INTEGER, NUM_CATEGORICAL = 13, 26
# The bounded-memory run: 4 x 90,000 lines are about 93 MB of raw input, against a 40 MB limit.
MEMORY_TEST_LINES_PER_DAY = 90_000
MEMORY_TEST_LIMIT_MB = 16
# day -> {line index: kind}; day 3 has one bad line in each half (test, validation).
BAD_LINES = {1: {10: "wrong_field_count", 500: "bad_label", 999: "non_integer_numerical",
                 7_500: "non_hex_categorical"},
             3: {100: "non_hex_categorical", 6_000: "wrong_field_count"}}
# Where garbage_lines() go, as original line indices: day 1 once; day 3 once in each half, so the
# half boundary stays on the same original line (the pinned digest holds).
GARBAGE_AT = {1: range(50, 9_000, 700), 3: [*range(20, 4_900, 400), *range(5_020, 9_900, 400)]}


def garbage_lines() -> List[bytes]:
    """Lines of random bytes and near-Criteo lines with stray bytes (no line breaks, no LINE_DELIMITER
    of the embedded engine): not UTF-8 (lone 0xff/0xfe, truncated and overlong sequences, a UTF-16
    surrogate, a latin-1 byte in a categorical value), and valid UTF-8 with NUL bytes or a non-ASCII
    character (rejected for their fields)."""
    good = synthetic_criteo.good_lines(1, day=0, seed=99)[0].encode()

    def with_field(index: int, value: bytes) -> bytes:
        fields = good.split(b"\t")
        fields[index] = value
        return b"\t".join(fields)

    rng = np.random.default_rng(29)
    random = [bytes(b for b in rng.integers(0, 256, 300, dtype=np.uint8).tobytes() if b not in b"\n\r\x01")
              for _ in range(3)]
    return [b"\x00\x00\x00", b"\xff", b"\xfe\xfe garbage \xfe", b"\xe2\x82", b"ab\xc0\xafcd", b"\xed\xa0\x80",
            with_field(20, b"ab\xe9cd"), good[:-1] + b"\xe2\x82", with_field(20, b"ab\x00cd"),
            with_field(20, "abé".encode()), good.replace(b"\t", b"\x00"), *random]


def garbage_reason(line: bytes) -> str:
    """The rejection reason of a garbage line, by Python's UTF-8 decoder and the rules."""
    sys.path.insert(0, PREPROC)
    from criteo_rules import NOT_UTF8, describe_bad_line
    try:
        return describe_bad_line(line.decode("utf-8"))[0]
    except UnicodeDecodeError:
        return NOT_UTF8


def insert_garbage(path: str, positions: Sequence[int]) -> List[str]:
    """Insert garbage_lines() in turn before the given original line indices of a day file; returns
    their reasons."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")[:-1]
    garbage = garbage_lines()
    inserted = [garbage[k % len(garbage)] for k in range(len(positions))]
    for index, line in sorted(zip(positions, inserted), reverse=True):
        lines.insert(index, line)
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    return [garbage_reason(line) for line in inserted]


def _environment(**overrides: str) -> Dict[str, str]:
    env = dict(os.environ)
    venv_bin = os.path.join(REPO, ".venv", "bin")
    env["PATH"] = os.pathsep.join([venv_bin, os.path.dirname(sys.executable), env.get("PATH", "")])
    env.setdefault("PYTHON", sys.executable)
    env.update(overrides)
    return env


def run_prepare(tmp: str, *args: str, raw: str = "", inside: Sequence[str] = (), **env: str) -> subprocess.CompletedProcess:
    """prepare_dataset.sh with every path under `tmp` (raw input in `tmp/raw` unless `raw`); `inside`: words
    that run it in another host (a test cluster's host)."""
    paths = dict(download_dir=raw or os.path.join(tmp, "raw"), spark_output_path=os.path.join(tmp, "spark"),
                 conversion_intermediate_dir=os.path.join(tmp, "intermediate"),
                 final_output_dir=os.path.join(tmp, "final"), SPARK_LOCAL_DIRS=os.path.join(tmp, "spark_tmp"),
                 NUM_DAYS=str(NUM_DAYS), SPARK_DRIVER_JAVA_OPTIONS=QUICK_JIT, PROGRESS_INTERVAL="0")
    paths.update(env)
    return subprocess.run([*inside, "bash", os.path.join(PREPROC, "prepare_dataset.sh"), *args], env=_environment(**paths),
                          capture_output=True, text=True, timeout=900)


# ----------------------------------------------------------------------------- expectations
def parse_good_lines(lines: Sequence[str], bad: Dict[int, str]) -> pd.DataFrame:
    """Good lines as a frame: label, i1..i13 (float, NaN when empty), c1..c26 (int, -1 when empty)."""
    rows = [line.split("\t") for index, line in enumerate(lines) if index not in bad]
    frame = pd.DataFrame(rows)
    out = pd.DataFrame({"label": frame[0].astype(int)})
    for j in range(1, 1 + NUM_INTEGER):
        out[f"i{j}"] = pd.to_numeric(frame[j].replace("", np.nan)).astype(float)
    for j in range(NUM_CATEGORICAL):
        out[f"c{j}"] = [int(v, 16) if v else -1 for v in frame[1 + NUM_INTEGER + j]]
    return out


def expected_dictionaries(good: pd.DataFrame, threshold: int) -> List[Dict[int, int]]:
    """Per column: value -> 1-based id by descending count, ties by ascending value, count >= threshold."""
    dictionaries = []
    for j in range(NUM_CATEGORICAL):
        counts = good[f"c{j}"][good[f"c{j}"] >= 0].value_counts()
        kept = counts[counts >= threshold].rename("count").reset_index()
        kept.columns = ["value", "count"]
        kept = kept.sort_values(["count", "value"], ascending=[False, True])
        dictionaries.append({int(v): i for i, v in enumerate(kept["value"], start=1)})
    return dictionaries


def expected_numerical(values: np.ndarray) -> np.ndarray:
    """The documented rule: ln(max(x, -2) + 3), missing -> 0, float32 then float16."""
    with np.errstate(invalid="ignore"):
        logged = np.log(np.maximum(values, -2.0) + 3.0)
    return np.where(np.isnan(values), 0.0, logged).astype(np.float32).astype(np.float16)


def expected_matrix(good: pd.DataFrame, dictionaries: List[Dict[int, int]]) -> np.ndarray:
    """[rows, 40] float64: label, transformed numericals (float16 values), categorical ids."""
    numerical = expected_numerical(good[[f"i{j}" for j in range(1, 1 + NUM_INTEGER)]].to_numpy())
    ids = [good[f"c{j}"].map(lambda v, d=dictionaries[j]: d.get(v, 0)).to_numpy() for j in range(NUM_CATEGORICAL)]
    return np.column_stack([good["label"].to_numpy(), numerical.astype(np.float64), *ids]).astype(np.float64)


def read_split(final: str, split: str, spec: FeatureSpec) -> np.ndarray:
    """One written split as the same [rows, 40] float64 matrix."""
    folder = os.path.join(final, split)
    label = np.fromfile(os.path.join(folder, "label.bin"), dtype=np.bool_)
    numerical = np.fromfile(os.path.join(folder, "numerical.bin"), dtype="<f2").reshape(-1, NUM_INTEGER)
    categorical = [np.fromfile(os.path.join(folder, f"cat_{j}.bin"), dtype=spec.dtype_of(f"cat_{j}.bin"))
                   for j in range(NUM_CATEGORICAL)]
    return np.column_stack([label, numerical.astype(np.float64), *categorical]).astype(np.float64)


def sorted_rows(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.lexsort(matrix.T[::-1])]


# ----------------------------------------------------------------------------- end to end
def engine_available(engine: str) -> None:
    """Skip (fail under CI) when an engine's components are missing."""
    if engine == "spark":
        require(HAVE_SPARK, "needs java and pyspark")
    else:
        require(HAVE_DUCKDB, "needs duckdb")


def dataset_digest(final: str) -> str:
    """sha256 over every file of a dataset but the summary (which names the engine), in path order."""
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(final)):
        dirs.sort()
        for name in sorted(files):
            if name == "preprocessing_summary.json":
                continue
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, final).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def criteo_input(tmp_path_factory):
    """The raw days (in `tmp/raw`) and the pandas expectations every engine is checked against."""
    tmp = str(tmp_path_factory.mktemp("criteo"))
    days = synthetic_criteo.write_days(os.path.join(tmp, "raw"), NUM_DAYS, LINES_PER_DAY, seed=7,
                                       bad_lines=BAD_LINES)
    garbage = {day: insert_garbage(os.path.join(tmp, "raw", f"day_{day}"), positions)
               for day, positions in GARBAGE_AT.items()}
    lines = {day: written.lines for day, written in days.items()}
    good = {day: parse_good_lines(day_lines, BAD_LINES.get(day, {})) for day, day_lines in lines.items()}
    dictionaries = expected_dictionaries(pd.concat(good.values(), ignore_index=True), THRESHOLD)
    half = LINES_PER_DAY // 2
    last = NUM_DAYS - 1
    bad_last = BAD_LINES.get(last, {})
    test_good = parse_good_lines(lines[last][:half], bad_last)
    validation_good = parse_good_lines(lines[last][half:], {i - half: k for i, k in bad_last.items() if i >= half})
    return SimpleNamespace(tmp=tmp, raw=os.path.join(tmp, "raw"), lines=lines, good=good, dictionaries=dictionaries,
                           test_good=test_good, validation_good=validation_good, garbage=garbage)


_RUNS: Dict[str, SimpleNamespace] = {}


@pytest.fixture(scope="module", params=ENGINES)
def criteo_run(request, criteo_input):
    """prepare_dataset.sh CPU THRESHOLD with one engine on the shared input (each engine runs once)."""
    engine = request.param
    engine_available(engine)
    if engine not in _RUNS:
        tmp = os.path.join(criteo_input.tmp, engine)
        os.makedirs(tmp)
        start = time.monotonic()
        result = run_prepare(tmp, "--engine", engine, "CPU", str(THRESHOLD), raw=criteo_input.raw)
        elapsed = time.monotonic() - start
        print(f"\nprepare_dataset.sh --engine {engine} CPU {THRESHOLD} on {NUM_DAYS} x {LINES_PER_DAY} lines: "
              f"{elapsed:.1f} s")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        final = os.path.join(tmp, "final")
        _RUNS[engine] = SimpleNamespace(**{**vars(criteo_input), "tmp": tmp}, engine=engine, final=final,
                                        output=result, spec=FeatureSpec.from_yaml(os.path.join(final, "feature_spec.yaml")))
    return _RUNS[engine]


def test_layout_and_feature_spec(criteo_run):
    final, spec = criteo_run.final, criteo_run.spec
    assert sorted(os.listdir(final)) == ["feature_spec.yaml", "preprocessing_summary.json", "test", "train",
                                         "validation"]
    spec.check_feature_spec()
    counts = spec.check_files()
    expected_files = sorted(["label.bin", "numerical.bin"] + [f"cat_{j}.bin" for j in range(NUM_CATEGORICAL)])
    for split in ("train", "test", "validation"):
        assert sorted(os.listdir(os.path.join(final, split))) == expected_files
    cardinalities = [len(d) + 1 for d in criteo_run.dictionaries]
    assert spec.cardinalities == cardinalities
    for j, cardinality in enumerate(cardinalities):
        assert str(spec.dtype_of(f"cat_{j}.bin")) == get_categorical_feature_type(cardinality)
    assert counts["test"] == len(criteo_run.test_good)
    assert not any(name.endswith((".partial", ".halves")) for name in os.listdir(criteo_run.tmp))
    assert not os.path.exists(os.path.join(criteo_run.tmp, "intermediate"))
    assert os.path.isdir(os.path.join(criteo_run.tmp, "spark")) == (criteo_run.engine == "spark")


def test_the_run_prints_its_estimate_first(criteo_run):
    """Before it starts, the run prints one estimate line for its input, its line count within 2%."""
    printed = [line for line in criteo_run.output.stdout.splitlines() if line.startswith("estimate: ")]
    assert len(printed) == 1, criteo_run.output.stdout[-2000:]
    lines = int(printed[0].split()[1].replace(",", ""))
    total = json.load(open(os.path.join(criteo_run.final, "preprocessing_summary.json")))["total"]["input_lines"]
    assert abs(lines - total) <= 0.02 * total
    assert f" with {criteo_run.engine}: about " in printed[0] and ", peak disk " in printed[0]


def test_row_counts_and_rejections_add_up(criteo_run):
    """Every malformed line, garbage bytes included, is counted under its reason, per split and day."""
    sys.path.insert(0, PREPROC)
    from criteo_rules import NOT_UTF8, REJECTION_REASONS
    with open(os.path.join(criteo_run.final, "preprocessing_summary.json")) as f:
        summary = json.load(f)
    splits = summary["splits"]
    train_days = range(NUM_DAYS - 1)
    day1 = list(BAD_LINES[1].values()) + criteo_run.garbage[1]
    assert NOT_UTF8 in day1 and "wrong_field_count" in criteo_run.garbage[1]
    assert splits["train"]["input_lines"] == LINES_PER_DAY * len(train_days) + len(criteo_run.garbage[1])
    assert splits["train"]["rows"] == LINES_PER_DAY * len(train_days) - len(BAD_LINES[1])
    assert splits["train"]["rejected_by_reason"] == {k: day1.count(k) for k in REJECTION_REASONS}
    assert splits["train"]["by_day"]["day_1"]["rejected"] == {k: day1.count(k) for k in REJECTION_REASONS if k in day1}
    last_garbage = criteo_run.garbage[NUM_DAYS - 1]
    halves = {"test": ["non_hex_categorical"] + last_garbage[:len(last_garbage) // 2],
              "validation": ["wrong_field_count"] + last_garbage[len(last_garbage) // 2:]}
    assert splits["test"]["rows"] == len(criteo_run.test_good) == LINES_PER_DAY // 2 - 1
    assert splits["validation"]["rows"] == len(criteo_run.validation_good) == LINES_PER_DAY - LINES_PER_DAY // 2 - 1
    for split, rejected in halves.items():
        assert splits[split]["rejected_by_reason"] == {k: rejected.count(k) for k in REJECTION_REASONS}, split
    for split in splits.values():
        assert split["rows"] + split["rejected_lines"] == split["input_lines"]
    garbage = sum(len(lines) for lines in criteo_run.garbage.values())
    assert summary["total"]["input_lines"] == NUM_DAYS * LINES_PER_DAY + garbage
    assert summary["engine"] == criteo_run.engine
    counts = criteo_run.spec.check_files()
    assert counts["train"] == splits["train"]["rows"] and counts["test"] == splits["test"]["rows"]


@pytest.mark.parametrize("split", ["test", "validation"])
def test_last_day_halves_match_pandas_row_by_row(criteo_run, split):
    """Input order is kept, so every id and numerical matches the pandas/numpy computation exactly."""
    good = criteo_run.test_good if split == "test" else criteo_run.validation_good
    expected = expected_matrix(good, criteo_run.dictionaries)
    actual = read_split(criteo_run.final, split, criteo_run.spec)
    np.testing.assert_array_equal(actual[:, 0], expected[:, 0])
    np.testing.assert_array_equal(actual[:, 1 + NUM_INTEGER:], expected[:, 1 + NUM_INTEGER:])
    np.testing.assert_array_equal(actual[:, 1:1 + NUM_INTEGER], expected[:, 1:1 + NUM_INTEGER])


def test_train_is_a_shuffle_of_days_before_the_last(criteo_run):
    good = pd.concat([criteo_run.good[day] for day in range(NUM_DAYS - 1)], ignore_index=True)
    expected = expected_matrix(good, criteo_run.dictionaries)
    actual = read_split(criteo_run.final, "train", criteo_run.spec)
    assert actual.shape == expected.shape
    assert not np.array_equal(actual, expected), "train rows were not shuffled"
    np.testing.assert_array_equal(sorted_rows(actual), sorted_rows(expected))


def test_numerical_transform_on_sampled_values(criteo_run):
    """Spot checks of the rule itself, including missing values and values at and below -2."""
    good, actual = criteo_run.test_good, read_split(criteo_run.final, "test", criteo_run.spec)
    raw = good[[f"i{j}" for j in range(1, 1 + NUM_INTEGER)]].to_numpy()
    rng = np.random.default_rng(0)
    picks = list(rng.choice(len(good), size=200, replace=False))
    picks += list(np.flatnonzero((raw <= -2).any(axis=1))[:20]) + list(np.flatnonzero(np.isnan(raw).any(axis=1))[:20])
    for row in picks:
        for j in range(NUM_INTEGER):
            x = raw[row, j]
            want = 0.0 if np.isnan(x) else float(np.float16(np.float32(np.log(max(x, -2.0) + 3.0))))
            assert actual[row, 1 + j] == want, (row, j, x)
    assert (raw <= -2).any() and np.isnan(raw).any()


def test_rare_values_map_to_zero(criteo_run):
    """A value seen fewer than THRESHOLD times in all days gets id 0; every other value a non-zero id."""
    everything = pd.concat(criteo_run.good.values(), ignore_index=True)
    actual = read_split(criteo_run.final, "test", criteo_run.spec)
    for j in (3, 9, 15):
        counts = everything[f"c{j}"].value_counts()
        column = criteo_run.test_good[f"c{j}"].to_numpy()
        seen = column >= 0
        rare = seen & (counts.reindex(column).fillna(0).to_numpy() < THRESHOLD)
        assert rare.any()
        assert (actual[rare, 1 + NUM_INTEGER + j] == 0).all()
        assert (actual[seen & ~rare, 1 + NUM_INTEGER + j] > 0).all()
        assert (actual[~seen, 1 + NUM_INTEGER + j] == 0).all()


def test_rerun_reuses_finished_outputs(criteo_run):
    result = run_prepare(criteo_run.tmp, "--engine", criteo_run.engine, "CPU", str(THRESHOLD), raw=criteo_run.raw)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("Reusing the Spark output" in result.stdout) == (criteo_run.engine == "spark")
    assert "Reusing the dataset" in result.stdout


# The digest of the dataset built from the fixed input above (synthetic_criteo seed 7, BAD_LINES,
# threshold 2, seed 12345): a change of the rules, ids, transforms or train order changes it.
PINNED_DIGEST = "0426c2ee4d63c15000fb4d99fecbfb7678c13833f58c496b3b6ac5b5ab170fbc"


def test_both_engines_write_the_same_bytes(criteo_run):
    """The duckdb and Spark datasets are identical file for file, and equal to the pinned digest."""
    digest = dataset_digest(criteo_run.final)
    assert digest == PINNED_DIGEST, f"{criteo_run.engine}: {digest}"
    other = _RUNS.get("duckdb" if criteo_run.engine == "spark" else "spark")
    if other is not None:
        for split in ("train", "test", "validation"):
            for name in sorted(os.listdir(os.path.join(criteo_run.final, split))):
                with open(os.path.join(criteo_run.final, split, name), "rb") as a, \
                        open(os.path.join(other.final, split, name), "rb") as b:
                    assert a.read() == b.read(), f"{split}/{name} differs between the engines"
        with open(os.path.join(criteo_run.final, "preprocessing_summary.json")) as a, \
                open(os.path.join(other.final, "preprocessing_summary.json")) as b:
            mine, theirs = json.load(a), json.load(b)
        for summary in (mine, theirs):
            summary.pop("engine"), summary.pop("params", None)
        assert mine == theirs


@pytest.mark.parametrize("criteo_run", ["duckdb"], indirect=True)
def test_main_trains_on_the_output(criteo_run):
    main = os.path.join(REPO, "main.py")
    if not os.path.isfile(main):
        pytest.skip("main.py not present yet")
    python = os.path.join(REPO, ".venv", "bin", "python")
    result = subprocess.run([python if os.path.exists(python) else sys.executable, main, "--mode", "train",
                             "--dataset_path", criteo_run.final, "--cpu", "--dot_interaction", "tensorflow",
                             "--batch_size", "256", "--valid_batch_size", "256", "--max_steps", "5",
                             "--embedding_dim", "16", "--bottom_mlp_dims", "32,16", "--top_mlp_dims", "32,1"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


# ----------------------------------------------------------------------------- bad input
@pytest.fixture
def small_raw(tmp_path):
    synthetic_criteo.write_days(str(tmp_path / "raw"), NUM_DAYS, 200, seed=3)
    return tmp_path


def assert_nothing_written(tmp) -> None:
    leftovers = sorted(set(os.listdir(tmp)) - {"raw", "spark_tmp"})
    assert leftovers == [], f"a failed run left {leftovers}"


def test_missing_day_is_one_clear_error(small_raw):
    os.remove(small_raw / "raw" / "day_2")
    result = run_prepare(str(small_raw), "CPU", "2")
    assert result.returncode != 0
    assert f"{small_raw}/raw/day_2 is missing" in result.stderr
    assert result.stderr.count("error:") == 1
    assert_nothing_written(small_raw)


def test_empty_day_file_is_one_clear_error(small_raw):
    open(small_raw / "raw" / "day_1", "w").close()
    result = run_prepare(str(small_raw), "CPU", "2")
    assert result.returncode != 0
    assert f"{small_raw}/raw/day_1 is empty" in result.stderr
    assert_nothing_written(small_raw)


def test_unknown_platform_and_usage(small_raw):
    result = run_prepare(str(small_raw), "TPU", "2")
    assert result.returncode != 0 and "unknown platform 'TPU'" in result.stderr
    for script in ("prepare_dataset.sh", "run_spark.sh", "run-spark.sh", "run_spark_cpu.sh", "run_spark_gpu.sh",
                   "verify_criteo_downloaded.sh"):
        usage = subprocess.run(["bash", os.path.join(PREPROC, script), "--help"], capture_output=True, text=True)
        assert usage.returncode == 0 and usage.stdout.startswith("Usage:"), script
    # run-spark.sh, the reference README's name, is run_spark.sh with the same arguments
    for script in ("run_spark.sh", "run-spark.sh"):
        result = subprocess.run(["bash", os.path.join(PREPROC, script), "TPU", "in", "out", "2"], capture_output=True,
                                text=True)
        assert result.returncode != 0 and "unknown platform 'TPU'" in result.stderr, script


def test_gpu_pipeline_without_rapids_names_the_jar(small_raw):
    result = subprocess.run(["bash", os.path.join(PREPROC, "run_spark_gpu.sh"), str(small_raw / "raw"),
                             str(small_raw / "spark"), "2", "DGX2"], env=_environment(RAPIDS_JAR=""),
                            capture_output=True, text=True)
    if importlib.util.find_spec("pyspark") is None:
        assert "no Spark found" in result.stderr
    else:
        assert result.returncode != 0
        assert "rapids-4-spark" in result.stderr and "RAPIDS_JAR" in result.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_strict_mode_stops_at_the_first_bad_line(tmp_path, engine):
    engine_available(engine)
    synthetic_criteo.write_days(str(tmp_path / "raw"), NUM_DAYS, 300, seed=5,
                            bad_lines={1: {57: "non_integer_numerical", 200: "bad_label"},
                                       2: {3: "wrong_field_count"}})
    nested = {name: str(tmp_path / "new" / name / "out")  # no parent folder made for them may remain
              for name in ("spark_output_path", "conversion_intermediate_dir", "final_output_dir")}
    result = run_prepare(str(tmp_path), "--engine", engine, "CPU", "2", STRICT="1", **nested)
    assert result.returncode != 0
    # spark-submit forwards the Python driver's stderr to its stdout.
    output = result.stdout + result.stderr
    assert f"{tmp_path}/raw/day_1: line 58: non_integer_numerical: column 5 value '3.5' is not an integer" \
        in output, output[-3000:]
    assert_nothing_written(tmp_path)


@pytest.mark.skipif(not HAVE_DUCKDB, reason="needs duckdb")
def test_engine_failure_leaves_no_folder_behind(small_raw):
    """A run the embedded engine stops midway (a day file with bytes that are not UTF-8 and a line
    over its reader's buffer) ends in one error naming the file, and leaves no output, scratch or
    parent folder that it created: only the raw input remains."""
    with open(small_raw / "raw" / "day_2", "ab") as f:
        f.write(b"\xff\xfe\n" + b"7" * (1 << 21) + b"\n")
    before = snapshot(small_raw)
    outputs = {name: str(small_raw / "new" / name / "out") for name in
               ("spark_output_path", "conversion_intermediate_dir", "final_output_dir")}
    result = run_prepare(str(small_raw), "--engine", "duckdb", "CPU", "2", DUCKDB_MEMORY_LIMIT="16MB", **outputs)
    assert_one_error(result, f"{small_raw}/raw/day_2 holds lines that are not UTF-8 and a line of 2,097,152 bytes")
    assert snapshot(small_raw) == before


def test_unknown_engine_is_one_clear_error(small_raw):
    result = run_prepare(str(small_raw), "--engine", "pandas", "CPU", "2")
    assert_one_error(result, "unknown engine 'pandas'")
    result = run_prepare(str(small_raw), "--engine", "duckdb", "DGX2", "2")
    assert_one_error(result, "the duckdb engine runs on CPUs only")
    assert_nothing_written(small_raw)


@needs_spark
def test_a_bad_spark_network_timeout_is_one_clear_error(small_raw):
    result = run_prepare(str(small_raw), "--engine", "spark", "CPU", "2", SPARK_NETWORK_TIMEOUT="5")
    assert_one_error(result, "SPARK_NETWORK_TIMEOUT must be whole seconds, at least 20", "got '5'")
    assert_nothing_written(small_raw)


# ----------------------------------------------------------------------------- library pieces
@pytest.fixture(scope="module")
def spark_utils():
    if not HAVE_SPARK:
        pytest.skip("needs java and pyspark")
    sys.path.insert(0, PREPROC)
    import spark_data_utils
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("test_preproc")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions", QUICK_JIT).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    yield SimpleNamespace(spark=spark, utils=spark_data_utils)
    spark.stop()


def test_parse_frequency_limit():
    sys.path.insert(0, PREPROC)
    from criteo_rules import InputError, parse_frequency_limit
    assert parse_frequency_limit("15") == (15, {})
    assert parse_frequency_limit("3,14:1, _c39:20") == (3, {"_c14": 1, "_c39": 20})
    assert parse_frequency_limit("") == (0, {})
    for bad in ("x", "13:4", "40:2", "-1", "14:-3"):
        with pytest.raises(InputError):
            parse_frequency_limit(bad)


@needs_spark
def test_per_column_frequency_limits_match_pandas(spark_utils, tmp_path):
    """The Spark dictionary (one grouped count over all columns, ids by range-partitioned offsets)."""
    days = synthetic_criteo.write_days(str(tmp_path), 2, 3000, seed=11)
    good = pd.concat([parse_good_lines(day.lines, {}) for day in days.values()], ignore_index=True)
    u = spark_utils.utils
    limits = [3] * NUM_CATEGORICAL
    limits[0], limits[3] = 1, 10
    counts = u.count_pass(u.parse_lines(u.read_day_files(spark_utils.spark, u.day_file_paths(str(tmp_path), [0, 1]))))
    rows = u.assign_ids(spark_utils.spark, counts, limits, 3).collect()
    for j, threshold in ((0, 1), (3, 10), (5, 3), (9, 3)):
        want = expected_dictionaries(good, threshold)[j]
        got = {r["data"]: r["id"] for r in rows if r["column"] == f"_c{14 + j}"}
        assert got == want, f"column _c{14 + j}"
    assert u.line_counts(counts) == {(0, "lines"): 3000, (1, "lines"): 3000}


def validation_cases() -> List[tuple]:
    """(raw line, expected rejection reason or None) covering each rule and its edges."""
    good = synthetic_criteo.good_lines(1, day=0)[0].split("\t")

    def line(**changes: str) -> str:
        fields = list(good)
        for index, value in changes.items():
            fields[int(index[1:])] = value
        return "\t".join(fields)

    return [
        (line(f0="1", f1="-0", f14="ABCDEF12", f15="ffffffffffffffff", f16="0"), None),
        (line(f1="", f13="", f14="", f39=""), None),
        (line(f0=""), "bad_label"),
        (line(f0="1.0"), "bad_label"),
        (line(f2="+5"), "non_integer_numerical"),
        (line(f2="1e3"), "non_integer_numerical"),
        (line(f2=" 5"), "non_integer_numerical"),
        (line(f20="12345678901234567"), "non_hex_categorical"),
        (line(f20="0x12"), "non_hex_categorical"),
        (line(f20="ab\x01cd"), "non_hex_categorical"),
        ("", "wrong_field_count"),  # a blank line
        (line() + "\t", "wrong_field_count"),
    ]


def write_validation_cases(path) -> List[str]:
    """validation_cases() and then garbage_lines() as a day file; returns the expected reasons."""
    cases, garbage = validation_cases(), garbage_lines()
    with open(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in [text.encode() for text, _ in cases] + garbage))
    return [reason for _, reason in cases] + [garbage_reason(line) for line in garbage]


# A day file whose first bad line (line 3) is not UTF-8, and whose error names it.
NOT_UTF8_FIRST = (b"\n".join([b"1" + b"\t" * 39, b"0" + b"\t" * 39, b"0\t\xff", b"x"]) + b"\n",
                  "line 3: not_utf8: the line is not valid UTF-8 text")


@needs_spark
def test_line_validation_rules(spark_utils, tmp_path):
    cases = validation_cases()
    reasons = write_validation_cases(tmp_path / "day_0")
    u = spark_utils.utils
    parsed = u.parse_lines(u.read_day_files(spark_utils.spark, [str(tmp_path / "day_0")]))
    got = parsed.orderBy(u.BLOCK_START, u.POSITION).collect()
    assert [r[u.REASON] and u.REJECTION_REASONS[r[u.REASON] - 1] for r in got] == reasons
    assert got[0]["_c14"] == 0xABCDEF12 and got[0]["_c15"] == -1  # 64-bit two's complement
    assert got[0]["_c1"] == np.float32(np.log(3.0))
    assert got[1]["_c1"] == 0.0 and got[1]["_c14"] is None
    first = u.first_rejected_line(parsed)
    assert first["line"] == 3 and first["text"] == cases[2][0] and first["file"].endswith("day_0")
    (tmp_path / "day_1").write_bytes(NOT_UTF8_FIRST[0])
    first = u.first_rejected_line(u.parse_lines(u.read_day_files(spark_utils.spark, [str(tmp_path / "day_1")], 1)))
    assert first["line"] == 3 and first["text"] is None
    assert NOT_UTF8_FIRST[1] in str(u.strict_error(first["file"], first["line"], first["text"]))


@pytest.mark.skipif(not HAVE_DUCKDB, reason="needs duckdb")
def test_line_validation_rules_duckdb(tmp_path):
    """The embedded engine judges every case as the rules (and Spark, above) do: lines read as text
    by their fields, lines its reader refuses as not UTF-8, numbered as in the file."""
    sys.path.insert(0, PREPROC)
    import duckdb_pipeline as d
    from criteo_rules import NOT_UTF8, REJECTION_REASONS, describe_bad_line, strict_error
    cases = validation_cases()
    path = str(tmp_path / "day_0")
    reasons = write_validation_cases(path)
    buffer = d.CSV_BUFFER_BYTES
    con = d.connect(str(tmp_path / "work.duckdb"), str(tmp_path / "spill"), 1, None)
    with pytest.raises(d.duckdb.InvalidInputException, match="[Ii]nvalid unicode"):
        con.execute(f"SELECT count(*) FROM ({d.scan_sql(path, 0, buffer)})").fetchall()
    (tmp_path / "clean").write_text("\n".join(text for text, _ in cases) + "\n")
    assert d.not_utf8_files([path, str(tmp_path / "clean")], buffer) == [path]
    con.execute("SET preserve_insertion_order = true")
    con.execute(f"CREATE TABLE read AS SELECT line, text, CASE WHEN NOT good THEN {d.reason_code_sql()} END AS code "
                f"FROM (SELECT line, text, string_split(text, E'\\t') AS fields, {d.good_sql()} AS good "
                f"FROM ({d.scan_sql(path, 0, buffer, 'rules', numbered=True)}))")
    refused = d.refused_lines(con, "rules", [path], [0])
    rows = con.execute(f"SELECT {d.file_line_sql('read.line', refused)} AS line, text, code FROM read "
                       f"UNION ALL SELECT line, NULL, {d.NOT_UTF8_CODE} FROM ({refused}) ORDER BY line").fetchall()
    assert [line for line, _, _ in rows] == list(range(1, len(reasons) + 1))
    assert [text for _, text, _ in rows[:len(cases)]] == [text for text, _ in cases]
    assert [code and REJECTION_REASONS[code - 1] for _, _, code in rows] == reasons
    assert [(describe_bad_line(text) or (None,))[0] for text, _ in cases] == [reason for _, reason in cases]
    assert d.first_bad_line(con, path, 0, buffer, refusing=True)[0] == 3
    (tmp_path / "day_1").write_bytes(NOT_UTF8_FIRST[0])
    line, text = d.first_bad_line(con, str(tmp_path / "day_1"), 1, buffer, refusing=True)
    con.close()
    assert (line, text, describe_bad_line(text)[0]) == (3, None, NOT_UTF8)
    assert NOT_UTF8_FIRST[1] in str(strict_error(str(tmp_path / "day_1"), line, text))


@pytest.mark.skipif(not HAVE_DUCKDB, reason="needs duckdb")
def test_train_order_is_seeded(tmp_path):
    """The same seed writes the same train bytes; another seed another order of the same rows; the
    order is that of the md5 key the rules define."""
    sys.path.insert(0, PREPROC)
    import duckdb_pipeline as d
    days = synthetic_criteo.write_days(str(tmp_path / "raw"), 3, 400, seed=13)

    def train(seed: int, run: str) -> np.ndarray:
        out = str(tmp_path / run)
        d.prepare(str(tmp_path / "raw"), 3, "2", out, str(tmp_path / f"scratch_{run}"), seed, threads=1,
                  progress_interval=0)
        return np.fromfile(os.path.join(out, "train", "numerical.bin"), dtype="<f2").reshape(-1, NUM_INTEGER)

    first, again, other = train(99, "a"), train(99, "b"), train(7, "c")
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    np.testing.assert_array_equal(sorted_rows(first.astype(np.float64)), sorted_rows(other.astype(np.float64)))
    keys = sorted((hashlib.md5(f"99\t{day}\t{text}".encode()).hexdigest(), day, text)
                  for day in (0, 1) for text in days[day].lines)
    want = expected_numerical(np.array([[float(v) if v else np.nan for v in text.split("\t")[1:14]]
                                        for _, _, text in keys]))
    np.testing.assert_array_equal(first, want)


# ----------------------------------------------------------------------------- safe outputs (issue 12)
def run_preproc_script(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(PREPROC, script), *map(str, args)], env=_environment(),
                          capture_output=True, text=True, timeout=300)


def write_spark_like_output(folder, rows_per_part=(3, 2)) -> None:
    """<split>/part-*.parquet with columns _c0.._c39 (int, float, int) and _SUCCESS, as Spark writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    for split in ("train", "test", "validation"):
        os.makedirs(os.path.join(folder, split))
        for index, rows in enumerate(rows_per_part):
            columns = {"_c0": pa.array(rng.integers(0, 2, rows), pa.int32())}
            columns.update({f"_c{i}": pa.array(rng.random(rows), pa.float32()) for i in range(1, 14)})
            columns.update({f"_c{i}": pa.array(rng.integers(0, 5, rows), pa.int32()) for i in range(14, 40)})
            pq.write_table(pa.table(columns), os.path.join(folder, split, f"part-{index:05d}.parquet"))
        open(os.path.join(folder, split, "_SUCCESS"), "w").close()


def test_parquet_to_binary_is_all_or_nothing(tmp_path):
    src, scratch, dst = tmp_path / "spark", tmp_path / "scratch", tmp_path / "packed"
    write_spark_like_output(str(src))
    ok = run_preproc_script("parquet_to_binary.py", "--src_dir", src, "--intermediate_dir", scratch,
                            "--dst_dir", dst, "--parallel_jobs", "1")
    assert ok.returncode == 0, ok.stderr
    assert sorted(os.listdir(tmp_path)) == ["packed", "spark"]  # the scratch folder it made is gone
    assert {name: os.path.getsize(dst / name) for name in os.listdir(dst)} == {
        f"{split}_data.bin": 5 * 160 for split in ("train", "test", "validation")}

    (src / "validation" / "part-00001.parquet").write_bytes(b"not parquet")
    before = snapshot(tmp_path)
    cases = [(["--dst_dir", tmp_path / "new"], [f"{src}/validation/part-00001.parquet: unreadable parquet part"]),
             (["--dst_dir", dst], [f"--dst_dir {dst} already holds", "--overwrite"]),
             (["--dst_dir", dst, "--overwrite"], ["unreadable parquet part"]),  # the old output survives
             (["--dst_dir", src / "train", "--overwrite"], ["lies inside --src_dir"])]
    for args, fragments in cases:
        result = run_preproc_script("parquet_to_binary.py", "--src_dir", src, "--intermediate_dir", scratch,
                                    "--parallel_jobs", "1", *args)
        assert_one_error(result, *fragments)
    assert snapshot(tmp_path) == before


def packed_dataset(folder, rows: int = 50, cardinality: int = 7) -> np.ndarray:
    """<split>_data.bin (the same valid records for each split) and model_size.json; returns the records."""
    rng = np.random.default_rng(1)
    records = np.empty((rows, 40), "<i4")
    records[:, 0] = rng.integers(0, 2, rows)
    records[:, 1:14] = rng.random((rows, 13)).astype("<f4").view("<i4")
    records[:, 14:] = rng.integers(0, cardinality, (rows, 26))
    os.makedirs(folder)
    for split in ("train", "test", "validation"):
        records.tofile(os.path.join(folder, f"{split}_data.bin"))
    with open(os.path.join(folder, "model_size.json"), "w") as f:
        json.dump({f"_c{i}": cardinality - 1 for i in range(14, 40)}, f)
    return records


@pytest.mark.parametrize("corruption, message", [
    ((7, 0, 2), "record 7: label is not 0 or 1"),
    ((9, 3, np.float32(np.inf).view("<i4")), "record 9: numerical column _c3 is not finite"),
    ((4, 5, np.float32(70000).view("<i4")), "record 4: numerical column _c5 is not finite in float16"),
    ((3, 20, 7), "record 3: id of column _c20 lies outside [0, 7)"),
    ((2, 30, -1), "record 2: id of column _c30 lies outside [0, 7)"),
])
def test_split_dataset_refuses_values_a_cast_would_change(tmp_path, corruption, message):
    sys.path.insert(0, PREPROC)
    from split_dataset import split_dataset
    records = packed_dataset(str(tmp_path / "packed"))
    row, column, value = corruption
    records[row, column] = value
    records.tofile(str(tmp_path / "packed" / "validation_data.bin"))  # the last split: earlier ones were written
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=f"validation_data.bin: {message}".replace("[", r"\[").replace(")", r"\)")):
        split_dataset(str(tmp_path / "packed"), str(tmp_path / "final"), chunk_rows=16)
    assert snapshot(tmp_path) == before


def test_split_dataset_outputs_and_path_errors(tmp_path):
    packed, final = tmp_path / "packed", tmp_path / "final"
    packed_dataset(str(packed))
    ok = run_preproc_script("split_dataset.py", "--dataset", packed, "--output", final)
    assert ok.returncode == 0, ok.stderr
    assert sorted(os.listdir(final)) == ["feature_spec.yaml", "test", "train", "validation"]
    assert FeatureSpec.from_yaml(str(final / "feature_spec.yaml")).check_files() == {"train": 50, "test": 50}
    (final / "notes.txt").write_text("mine")
    with open(packed / "test_data.bin", "ab") as f:
        f.write(b"\0" * 7)
    before = snapshot(tmp_path)
    cases = [(["--output", final], [f"--output {final} already holds", "--overwrite"]),
             (["--output", final, "--overwrite"], ["holds notes.txt, which the new output would not contain"]),
             (["--output", packed / "sub", "--overwrite"], [f"lies inside --dataset {packed}"]),
             (["--output", tmp_path / "new"], ["test_data.bin: size 8007 B is not a whole number of 160-byte records"]),
             (["--output", final / "notes.txt" / "x"], ["is a file, not a directory"])]
    for args, fragments in cases:
        assert_one_error(run_preproc_script("split_dataset.py", "--dataset", packed, *args), *fragments)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("overlap", ["final_output_dir", "conversion_intermediate_dir", "spark_output_path"])
def test_prepare_dataset_refuses_folders_that_overlap(small_raw, overlap):
    """An output that is, holds or lies in the raw input or another output would be deleted by a run."""
    tmp = str(small_raw)
    target = {"final_output_dir": os.path.join(tmp, "raw"),                  # the raw input itself
              "conversion_intermediate_dir": tmp,                           # holds everything
              "spark_output_path": os.path.join(tmp, "final", "spark")}[overlap]  # inside the final folder
    before = snapshot(tmp)
    result = run_prepare(tmp, "CPU", "2", **{overlap: target})
    assert_one_error(result, f"{overlap} {target}")
    assert snapshot(tmp) == before


@needs_spark
def test_spark_outputs_are_written_whole_or_not_at_all(spark_utils, tmp_path, capsys):
    u, spark = spark_utils.utils, spark_utils.spark
    from pyspark.sql import functions as F
    final = tmp_path / "out"
    u.write_parquet(spark.range(5).write, str(final), "errorifexists")
    old = snapshot(tmp_path)
    failing = spark.range(5).select(F.when(F.col("id") < 3, F.col("id"))
                                    .otherwise(F.raise_error(F.lit("boom"))).alias("id"))
    with pytest.raises((u.Py4JJavaError, u.PySparkException), match="boom") as failure:
        u.write_parquet(failing.write, str(final), "overwrite")
    assert snapshot(tmp_path) == old  # the previous output is intact and no temporary folder is left
    gist = u.spark_failure(failure.value)  # main's `error: the Spark job failed: ...` line
    assert "boom" in gist and "\n" not in gist, gist
    raw = tmp_path / "raw"
    raw.mkdir()
    for args, message in (
            (["--output_folder", str(final)], f"--output_folder {final} already holds files"),
            (["--output_folder", str(raw / "out"), "--write_mode", "overwrite"], "lies inside --input_folder"),
            (["--output_folder", str(tmp_path)], "contains --input_folder")):
        arguments = ["--num_days", "2", "--input_folder", str(raw), "--halves_folder", str(raw), *args]
        assert u.main(arguments) == 2  # bad input (cli.py), refused before Spark is asked to do anything
        errors = capsys.readouterr().err.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], errors
    assert sorted(os.listdir(tmp_path)) == ["out", "raw"]


# ----------------------------------------------------------------------------- engines at scale
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, what: str, timeout: float = 120,
                   host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the {what} exited with {process.returncode}"
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"the {what} did not listen on {host}:{port} within {timeout} s")


def _stop_daemon(process: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM to the daemon's process group, then SIGKILL if it is still there after `grace` seconds.

    A Spark Worker stops its executors in a shutdown hook that can outlast any fixed wait on a loaded
    machine (seen in full suites); the test checks the dataset, not how politely the daemons leave."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def spark_daemon(role: str, host: str, port: int, env: Dict[str, str], log, *args: str,
                 inside: Sequence[str] = ()) -> subprocess.Popen:
    """Start a Spark standalone `Master` or `Worker` (spark-class) bound to `host`:`port`, in a process group
    of its own (its executors too, for _stop_daemon); `inside`: words that run it in another host (a
    test cluster's host). Returns once it listens."""
    import pyspark
    spark_class = os.path.join(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "bin", "spark-class")
    daemon = subprocess.Popen([*inside, spark_class, f"org.apache.spark.deploy.{role.lower()}.{role}", "--host", host,
                               "--port", str(port), "--webui-port", str(_free_port()), *args],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(port, daemon, role.lower(), host=host)
    except BaseException:
        _stop_daemon(daemon)
        raise
    return daemon


@pytest.mark.skipif(not HAVE_DUCKDB, reason="needs duckdb")
def test_duckdb_engine_spills_under_a_small_memory_limit(tmp_path):
    """DUCKDB_MEMORY_LIMIT over 5 times below the input size: the train sort runs in key ranges
    (several at this limit) and the dataset is the same as without a limit (one range)."""
    sys.path.insert(0, PREPROC)
    import duckdb_pipeline as d
    synthetic_criteo.write_days(str(tmp_path / "raw"), NUM_DAYS, MEMORY_TEST_LINES_PER_DAY, seed=17)
    input_bytes = sum(os.path.getsize(tmp_path / "raw" / f"day_{day}") for day in range(NUM_DAYS))
    limited = run_prepare(str(tmp_path / "limited"), "--engine", "duckdb", "CPU", "3", raw=str(tmp_path / "raw"),
                          DUCKDB_MEMORY_LIMIT=f"{MEMORY_TEST_LIMIT_MB}MB", TOTAL_CORES="1")
    assert limited.returncode == 0, limited.stderr[-3000:]
    assert input_bytes >= 5 * MEMORY_TEST_LIMIT_MB * 10**6
    assert d.sort_parts(3 * MEMORY_TEST_LINES_PER_DAY, f"{MEMORY_TEST_LIMIT_MB}MB") > 1
    assert d.sort_parts(3 * MEMORY_TEST_LINES_PER_DAY, None) == 1
    free = run_prepare(str(tmp_path / "free"), "--engine", "duckdb", "CPU", "3", raw=str(tmp_path / "raw"))
    assert free.returncode == 0, free.stderr[-3000:]
    assert dataset_digest(str(tmp_path / "limited" / "final")) == dataset_digest(str(tmp_path / "free" / "final"))


def test_the_estimate_reproduces_the_benchmark_it_is_built_from(tmp_path):
    """preproc/estimate.py's constants are bench/results/preproc.json's, its formula gives back the
    measured seconds at both measured sizes, a cluster speeds up only Spark's jobs, and its line
    count of a synthetic day set is within 2%; disk and memory follow the documented rules."""
    from preproc import estimate as est
    with open(os.path.join(REPO, "bench", "results", "preproc.json")) as f:
        bench = json.load(f)
    assert bench["cores"] == est.MEASURED_CORES
    for engine, runs in bench["engines"].items():
        assert tuple(r["input_lines"] for r in runs) == est.MEASURED_LINES
        assert tuple(r["input_bytes"] for r in runs) == est.MEASURED_BYTES
        for stage, points in est.MEASURED_STAGE_SECONDS[engine].items():
            assert points == pytest.approx([r["stage_seconds"][stage] for r in runs], abs=1e-3)
        assert est.MEASURED_PEAK_RSS_MIB[engine] == pytest.approx([r["peak_rss_mb"] for r in runs], abs=0.1)
        for run, lines in zip(runs, est.MEASURED_LINES):
            predicted = est.stage_seconds(engine, lines, est.MEASURED_CORES)
            assert sum(predicted.values()) == pytest.approx(sum(run["stage_seconds"].values()), rel=0.02)
    one, cluster = (est.stage_seconds("spark", 10**9, 64, cores) for cores in (64, 640))
    assert cluster["train"] < one["train"] / 5 and cluster["dictionary"] < one["dictionary"] / 5
    assert (cluster["to_binary"], cluster["split_dataset"]) == (one["to_binary"], one["split_dataset"])

    synthetic_criteo.write_days(str(tmp_path), 3, 3_000, seed=5)
    paths = [str(tmp_path / f"day_{day}") for day in range(3)]
    assert est.estimate_lines(paths) == pytest.approx(9_000, rel=0.02)
    input_bytes = sum(os.path.getsize(p) for p in paths)
    fits = est.estimate("duckdb", 9_000, input_bytes, os.path.getsize(paths[-1]), 2, memory_limit=10**9)
    assert not fits.spills and fits.peak_disk == input_bytes + 9_000 * (1 + 2 * 13 + 4 * 26)
    spills = est.estimate("duckdb", 9_000, input_bytes, os.path.getsize(paths[-1]), 2, memory_limit=10**6)
    assert spills.spills and spills.peak_memory == 10**6
    assert spills.peak_disk == fits.peak_disk + 9_000 * est.PARSED_BYTES_PER_LINE
    assert est.output_bytes_per_row(est.criteo_t15_cardinalities()) == 1 + 26 + 8 * 1 + 9 * 2 + 9 * 4


def test_the_preprocessing_doc_holds_the_table_the_estimate_prints():
    """docs/preprocessing.md's Criteo 1TB table is `python -m preproc.estimate --criteo1tb`'s output."""
    from preproc import estimate as est
    with open(os.path.join(REPO, "docs", "preprocessing.md")) as f:
        doc = f.read()
    assert f"<!-- criteo1tb_estimate -->\n{est.criteo1tb_table()}\n<!-- /criteo1tb_estimate -->" in doc

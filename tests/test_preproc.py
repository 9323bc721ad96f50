"""Criteo preprocessing (preproc/): the real shell scripts and PySpark in local mode, checked
against an independent pandas/numpy computation of the same dictionaries and transforms."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
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

import criteo_synth  # noqa: E402
from multiproc import assert_one_error, snapshot  # noqa: E402
from feature_spec import FeatureSpec, get_categorical_feature_type  # noqa: E402

HAVE_SPARK = shutil.which("java") is not None and importlib.util.find_spec("pyspark") is not None
needs_spark = pytest.mark.skipif(not HAVE_SPARK, reason="needs java and pyspark")

NUM_DAYS = 4
LINES_PER_DAY = 10_000
THRESHOLD = 2
# Small jobs spend most of their CPU in the JVM's optimising compiler; the quick tier is enough here.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
NUM_INTEGER, NUM_CATEGORICAL = 13, 26
# day -> {line index: kind}; day 3 has one bad line in each half (test, validation).
BAD_LINES = {1: {10: "wrong_field_count", 500: "bad_label", 999: "non_integer_numerical",
                 7_500: "non_hex_categorical"},
             3: {100: "non_hex_categorical", 6_000: "wrong_field_count"}}


def _environment(**overrides: str) -> Dict[str, str]:
    env = dict(os.environ)
    venv_bin = os.path.join(REPO, ".venv", "bin")
    env["PATH"] = os.pathsep.join([venv_bin, os.path.dirname(sys.executable), env.get("PATH", "")])
    env.setdefault("PYTHON", sys.executable)
    env.update(overrides)
    return env


def run_prepare(tmp: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """prepare_dataset.sh with every path under `tmp` (raw input in `tmp/raw`)."""
    paths = dict(download_dir=os.path.join(tmp, "raw"), spark_output_path=os.path.join(tmp, "spark"),
                 conversion_intermediate_dir=os.path.join(tmp, "intermediate"),
                 final_output_dir=os.path.join(tmp, "final"), SPARK_LOCAL_DIRS=os.path.join(tmp, "spark_tmp"),
                 NUM_DAYS=str(NUM_DAYS), SPARK_DRIVER_JAVA_OPTIONS=QUICK_JIT)
    paths.update(env)
    return subprocess.run(["bash", os.path.join(PREPROC, "prepare_dataset.sh"), *args], env=_environment(**paths),
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
@pytest.fixture(scope="module")
def criteo_run(tmp_path_factory):
    if not HAVE_SPARK:
        pytest.skip("needs java and pyspark")
    tmp = str(tmp_path_factory.mktemp("criteo"))
    lines = criteo_synth.write_days(os.path.join(tmp, "raw"), NUM_DAYS, LINES_PER_DAY, seed=7, bad_lines=BAD_LINES)
    start = time.monotonic()
    result = run_prepare(tmp, "CPU", str(THRESHOLD))
    elapsed = time.monotonic() - start
    print(f"\nprepare_dataset.sh CPU {THRESHOLD} on {NUM_DAYS} x {LINES_PER_DAY} lines: {elapsed:.1f} s")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    final = os.path.join(tmp, "final")
    good = {day: parse_good_lines(day_lines, BAD_LINES.get(day, {})) for day, day_lines in lines.items()}
    dictionaries = expected_dictionaries(pd.concat(good.values(), ignore_index=True), THRESHOLD)
    half = LINES_PER_DAY // 2
    last = NUM_DAYS - 1
    bad_last = BAD_LINES.get(last, {})
    test_good = parse_good_lines(lines[last][:half], bad_last)
    validation_good = parse_good_lines(lines[last][half:], {i - half: k for i, k in bad_last.items() if i >= half})
    return SimpleNamespace(tmp=tmp, final=final, lines=lines, good=good, dictionaries=dictionaries,
                           test_good=test_good, validation_good=validation_good,
                           spec=FeatureSpec.from_yaml(os.path.join(final, "feature_spec.yaml")))


@needs_spark
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
    assert not any(name.endswith(".partial") for name in os.listdir(criteo_run.tmp))
    assert not os.path.exists(os.path.join(criteo_run.tmp, "intermediate"))


@needs_spark
def test_row_counts_and_rejections_add_up(criteo_run):
    with open(os.path.join(criteo_run.final, "preprocessing_summary.json")) as f:
        summary = json.load(f)
    splits = summary["splits"]
    train_days = range(NUM_DAYS - 1)
    train_bad = [kind for day in train_days for kind in BAD_LINES.get(day, {}).values()]
    assert splits["train"]["input_lines"] == LINES_PER_DAY * len(train_days)
    assert splits["train"]["rows"] == LINES_PER_DAY * len(train_days) - len(train_bad)
    assert splits["train"]["rejected_by_reason"] == {k: train_bad.count(k) for k in criteo_synth.BAD_LINE_KINDS}
    assert splits["train"]["by_day"]["day_1"]["rejected"] == {k: 1 for k in criteo_synth.BAD_LINE_KINDS}
    assert splits["test"]["rows"] == len(criteo_run.test_good) == LINES_PER_DAY // 2 - 1
    assert splits["test"]["rejected_by_reason"]["non_hex_categorical"] == 1
    assert splits["validation"]["rows"] == len(criteo_run.validation_good) == LINES_PER_DAY - LINES_PER_DAY // 2 - 1
    assert splits["validation"]["rejected_by_reason"]["wrong_field_count"] == 1
    for split in splits.values():
        assert split["rows"] + split["rejected_lines"] == split["input_lines"]
    assert summary["total"]["input_lines"] == NUM_DAYS * LINES_PER_DAY
    counts = criteo_run.spec.check_files()
    assert counts["train"] == splits["train"]["rows"] and counts["test"] == splits["test"]["rows"]


@needs_spark
@pytest.mark.parametrize("split", ["test", "validation"])
def test_last_day_halves_match_pandas_row_by_row(criteo_run, split):
    """Input order is kept, so every id and numerical matches the pandas/numpy computation exactly."""
    good = criteo_run.test_good if split == "test" else criteo_run.validation_good
    expected = expected_matrix(good, criteo_run.dictionaries)
    actual = read_split(criteo_run.final, split, criteo_run.spec)
    np.testing.assert_array_equal(actual[:, 0], expected[:, 0])
    np.testing.assert_array_equal(actual[:, 1 + NUM_INTEGER:], expected[:, 1 + NUM_INTEGER:])
    np.testing.assert_array_equal(actual[:, 1:1 + NUM_INTEGER], expected[:, 1:1 + NUM_INTEGER])


@needs_spark
def test_train_is_a_shuffle_of_days_before_the_last(criteo_run):
    good = pd.concat([criteo_run.good[day] for day in range(NUM_DAYS - 1)], ignore_index=True)
    expected = expected_matrix(good, criteo_run.dictionaries)
    actual = read_split(criteo_run.final, "train", criteo_run.spec)
    assert actual.shape == expected.shape
    assert not np.array_equal(actual, expected), "train rows were not shuffled"
    np.testing.assert_array_equal(sorted_rows(actual), sorted_rows(expected))


@needs_spark
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


@needs_spark
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


@needs_spark
def test_rerun_reuses_finished_outputs(criteo_run):
    result = run_prepare(criteo_run.tmp, "CPU", str(THRESHOLD))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Reusing the Spark output" in result.stdout
    assert "Reusing the dataset" in result.stdout


def test_main_trains_on_the_output(request):
    main = os.path.join(REPO, "main.py")
    if not os.path.isfile(main):
        pytest.skip("main.py not present yet")
    criteo_run = request.getfixturevalue("criteo_run")
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
    criteo_synth.write_days(str(tmp_path / "raw"), NUM_DAYS, 200, seed=3)
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
    for script in ("prepare_dataset.sh", "run_spark.sh", "run_spark_cpu.sh", "run_spark_gpu.sh",
                   "verify_criteo_downloaded.sh"):
        usage = subprocess.run(["bash", os.path.join(PREPROC, script), "--help"], capture_output=True, text=True)
        assert usage.returncode == 0 and usage.stdout.startswith("Usage:"), script


def test_gpu_pipeline_without_rapids_names_the_jar(small_raw):
    result = subprocess.run(["bash", os.path.join(PREPROC, "run_spark_gpu.sh"), str(small_raw / "raw"),
                             str(small_raw / "spark"), "2", "DGX2"], env=_environment(RAPIDS_JAR=""),
                            capture_output=True, text=True)
    if importlib.util.find_spec("pyspark") is None:
        assert "no Spark found" in result.stderr
    else:
        assert result.returncode != 0
        assert "rapids-4-spark" in result.stderr and "RAPIDS_JAR" in result.stderr


@needs_spark
def test_strict_mode_stops_at_the_first_bad_line(tmp_path):
    criteo_synth.write_days(str(tmp_path / "raw"), NUM_DAYS, 300, seed=5,
                            bad_lines={1: {57: "non_integer_numerical", 200: "bad_label"},
                                       2: {3: "wrong_field_count"}})
    result = run_prepare(str(tmp_path), "CPU", "2", STRICT="1")
    assert result.returncode != 0
    # spark-submit forwards the Python driver's stderr to its stdout.
    output = result.stdout + result.stderr
    assert f"{tmp_path}/raw/day_1: line 58: non_integer_numerical: column 5 value '3.5' is not an integer" \
        in output, output[-3000:]
    assert_nothing_written(tmp_path)


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
    if importlib.util.find_spec("pyspark") is None:
        pytest.skip("needs pyspark")
    from spark_data_utils import InputError, parse_frequency_limit
    assert parse_frequency_limit("15") == (15, {})
    assert parse_frequency_limit("3,14:1, _c39:20") == (3, {"_c14": 1, "_c39": 20})
    assert parse_frequency_limit("") == (0, {})
    for bad in ("x", "13:4", "40:2", "-1", "14:-3"):
        with pytest.raises(InputError):
            parse_frequency_limit(bad)


@needs_spark
def test_per_column_frequency_limits_match_pandas(spark_utils, tmp_path):
    lines = criteo_synth.write_days(str(tmp_path), 2, 3000, seed=11)
    good = pd.concat([parse_good_lines(day_lines, {}) for day_lines in lines.values()], ignore_index=True)
    u = spark_utils.utils
    parsed = u.parse_lines(u.read_day_files(spark_utils.spark, u.day_file_paths(str(tmp_path), [0, 1])))
    dictionary = u.build_dictionary(parsed.where("_rejection_reason IS NULL"), 3, {"_c14": 1, "_c17": 10})
    rows = dictionary.collect()
    for j, threshold in ((0, 1), (3, 10), (5, 3), (9, 3)):
        want = expected_dictionaries(good, threshold)[j]
        got = {r["data"]: r["id"] for r in rows if r["column"] == f"_c{14 + j}"}
        assert got == want, f"column _c{14 + j}"


@needs_spark
def test_line_validation_rules(spark_utils, tmp_path):
    good = criteo_synth.good_lines(1, day=0)[0].split("\t")

    def line(**changes: str) -> str:
        fields = list(good)
        for index, value in changes.items():
            fields[int(index[1:])] = value
        return "\t".join(fields)

    cases = [
        (line(f0="1", f1="-0", f14="ABCDEF12", f15="ffffffffffffffff", f16="0"), None),
        (line(f1="", f13="", f14="", f39=""), None),
        (line(f0=""), "bad_label"),
        (line(f0="1.0"), "bad_label"),
        (line(f2="+5"), "non_integer_numerical"),
        (line(f2="1e3"), "non_integer_numerical"),
        (line(f20="12345678901234567"), "non_hex_categorical"),
        (line(f20="0x12"), "non_hex_categorical"),
        (line() + "\t", "wrong_field_count"),
        ("", "wrong_field_count"),
    ]
    (tmp_path / "day_0").write_text("\n".join(text for text, _ in cases) + "\n")
    u = spark_utils.utils
    parsed = u.parse_lines(u.read_day_files(spark_utils.spark, [str(tmp_path / "day_0")]))
    got = parsed.orderBy(u.POSITION).collect()
    assert [r[u.REASON] for r in got] == [reason for _, reason in cases]
    assert got[0]["_c14"] == 0xABCDEF12 and got[0]["_c15"] == -1 and got[0]["_c1"] == 0.0
    assert got[1]["_c1"] is None and got[1]["_c14"] is None
    first = u.first_rejected_line(parsed)
    assert first["line"] == 3 and first["reason"] == "bad_label" and first["file"].endswith("day_0")


@needs_spark
def test_total_random_order_is_seeded(spark_utils, tmp_path):
    """The same seed writes the same rows in the same order; the order is not the input order."""
    lines = criteo_synth.write_days(str(tmp_path / "raw"), 2, 500, seed=13)
    u, spark = spark_utils.utils, spark_utils.spark
    paths = u.day_file_paths(str(tmp_path / "raw"), [0, 1])
    u.generate_models(spark, paths, [0, 1], str(tmp_path / "models"), "2", "overwrite", strict=False)

    def rows_in_written_order(run: int) -> np.ndarray:
        out = str(tmp_path / f"train_{run}")
        u.transform(spark, paths, [0, 1], str(tmp_path / "models"), out, "total_random", True, 99,
                    1_000_000, "overwrite", strict=False)
        parts = sorted(f for f in os.listdir(out) if f.endswith(".parquet"))
        return np.concatenate([pd.read_parquet(os.path.join(out, f)).to_numpy() for f in parts])

    first, again = rows_in_written_order(1), rows_in_written_order(2)
    np.testing.assert_array_equal(first, again)
    input_labels = [int(line.split("\t")[0]) for day in (0, 1) for line in lines[day]]
    assert len(first) == len(input_labels) and list(first[:, 0]) != input_labels


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
    with pytest.raises(Exception, match="boom"):
        u.write_parquet(failing.write, str(final), "overwrite")
    assert snapshot(tmp_path) == old  # the previous output is intact and no temporary folder is left
    raw = tmp_path / "raw"
    raw.mkdir()
    for args, message in (
            (["--mode", "transform", "--output_folder", str(final)], f"--output_folder {final} already exists"),
            (["--mode", "transform", "--output_folder", str(raw / "out"), "--write_mode", "overwrite"],
             "lies inside --input_folder"),
            (["--mode", "generate_models", "--model_folder", str(tmp_path)], "contains --input_folder")):
        arguments = ["--days", "0-1", "--input_folder", str(raw), "--model_folder", str(tmp_path / "m"), *args]
        assert u.main(arguments) == 1  # refused before Spark is asked to do anything
        errors = capsys.readouterr().err.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], errors
    assert sorted(os.listdir(tmp_path)) == ["out", "raw"]

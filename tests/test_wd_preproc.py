"""Wide & Deep data: the Outbrain-format generator and its teacher, the preprocessing (DuckDB and
Spark byte for byte), the records as the reader sees them (tf.data), the split, CTR, similarity and
geo rules against independent pandas computations, and bad input."""
import glob
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from wide_and_deep import features
from wide_and_deep.outbrain_rules import DAY_MS, INPUT_FILES, NUM_DAYS, eval_mask
from wide_and_deep.outbrain_synthetic import generate
from wide_and_deep.preprocessing import __main__ as cli
from wide_and_deep.preprocessing.pipeline import DuckDBEngine, preprocess
from wide_and_deep.preprocessing.tfrecord import write_record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_SPARK = shutil.which("java") is not None and importlib.util.find_spec("pyspark") is not None
DISPLAYS, SEED = 3000, 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small generated input and its DuckDB output (2 files per split)."""
    root = tmp_path_factory.mktemp("wd")
    generate(str(root / "csv"), DISPLAYS, SEED)
    preprocess(DuckDBEngine(threads=2), str(root / "csv"), str(root / "duckdb"), num_train_files=2, num_eval_files=2)
    return root


def read_split(folder):
    """Every record of a split as a dict of numpy arrays, and the record sizes."""
    spec = {k: tf.io.VarLenFeature(tf.int64 if t == "int64" else tf.float32) for k, t in features.record_keys().items()}
    files = sorted(glob.glob(os.path.join(folder, "part-r-*")))
    columns, sizes = defaultdict(list), []
    for record in tf.data.TFRecordDataset(files):
        example = tf.io.parse_single_example(record, spec)
        for key in spec:
            columns[key].append(tf.sparse.to_dense(example[key]).numpy())
        sizes.append(len(columns["label"][-1]))
    return {k: np.concatenate(v) for k, v in columns.items()}, sizes, files


def csv(root, stem):
    return pd.read_csv(os.path.join(root, "csv", f"{stem}.csv"), keep_default_na=False, dtype=str)


# ----------------------------------------------------------------------------- generator
def test_generator_is_deterministic(tmp_path):
    generate(str(tmp_path / "a"), 400, 7)
    generate(str(tmp_path / "b"), 400, 7)
    generate(str(tmp_path / "c"), 400, 8)
    for stem in INPUT_FILES:
        a = (tmp_path / "a" / f"{stem}.csv").read_bytes()
        assert a == (tmp_path / "b" / f"{stem}.csv").read_bytes(), stem
    assert (tmp_path / "a" / "clicks_train.csv").read_bytes() != (tmp_path / "c" / "clicks_train.csv").read_bytes()
    assert (tmp_path / "a" / "teacher.json").read_bytes() == (tmp_path / "b" / "teacher.json").read_bytes()


def test_generator_files_and_cardinalities(data):
    for stem, columns in INPUT_FILES.items():
        with open(data / "csv" / f"{stem}.csv") as f:
            assert f.readline().strip() == ",".join(columns)
    clicks, events = csv(data, "clicks_train"), csv(data, "events")
    per_display = clicks.groupby("display_id").agg(n=("ad_id", "size"), clicked=("clicked", lambda c: (c == "1").sum()),
                                                   distinct=("ad_id", "nunique"))
    assert per_display["n"].between(2, 12).all() and (per_display["n"] == per_display["distinct"]).all()
    assert (per_display["clicked"] == 1).all() and len(per_display) == DISPLAYS == len(events)
    timestamps = events["timestamp"].astype(np.int64)
    assert timestamps.between(0, NUM_DAYS * DAY_MS - 1).all() and timestamps.is_monotonic_increasing
    geo = events["geo_location"]
    assert geo.str.fullmatch(r"[A-Z]{2}(>[A-Z0-9]{2}(>[0-9]{3})?)?|").all()
    assert geo.str.fullmatch(r"US>[A-Z]{2}>[0-9]{3}").mean() > 0.5 and (geo == "").sum() > 0
    assert (events["platform"] == "\\N").sum() > 0 and set(events["platform"]) <= {"1", "2", "3", "\\N"}
    meta = csv(data, "documents_meta")
    for column in ("source_id", "publisher_id", "publish_time"):
        assert 0 < (meta[column] == "").sum() < len(meta) / 2, column
    # power-law skew: the most shown ad is shown far more often than the average one
    views = clicks["ad_id"].value_counts()
    assert views.iloc[0] > 10 * views.mean()
    teacher = json.loads((data / "csv" / "teacher.json").read_text())
    assert 0.5 < teacher["map_at_12_eval"] < 1.0 and teacher["click_rows"] == len(clicks)
    assert 0.5 < teacher["auc_eval"] < 1.0


# ----------------------------------------------------------------------------- records
@pytest.mark.parametrize("size", [0, 1, 100, 16383, 16384, 16385, 600_001])
def test_record_framing_equals_tensorflows(tmp_path, size):
    """The numpy CRC-32C framing writes the bytes of tf.io.TFRecordWriter."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    with tf.io.TFRecordWriter(str(tmp_path / "tf")) as writer:
        writer.write(data)
    with open(tmp_path / "ours", "wb") as handle:
        write_record(handle, data)
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "tf").read_bytes()


def test_records_readable_by_tf_data(data):
    meta = json.loads((data / "duckdb" / "metadata.json").read_text())
    assert meta == {"train_rows": meta["train_rows"], "eval_rows": meta["eval_rows"], "prebatch_size": 4096,
                    "buckets": features.BUCKETS, "format": "wide_and_deep-tfrecords", "version": 1}
    for split in ("train", "eval"):
        columns, sizes, files = read_split(data / "duckdb" / split)
        assert [os.path.basename(f) for f in files] == ["part-r-00000", "part-r-00001"][:len(files)]
        assert sizes[:-1] == [4096] * (len(sizes) - 1) and 0 < sizes[-1] <= 4096
        assert sum(sizes) == meta[f"{split}_rows"]
        for name, buckets in features.BUCKETS.items():
            assert columns[name].dtype == np.int64 and columns[name].min() >= 0 and columns[name].max() < buckets
        for name in features.NUMERIC_FEATURES:
            assert columns[name].dtype == np.float32 and np.isfinite(columns[name]).all()
            assert columns[name].min() >= 0 and columns[name].max() <= 1, name
            assert (columns[name] > 0).any(), name
        assert set(np.unique(columns["label"])) == {0, 1}


def test_split_keeps_each_display_whole(data):
    train, _, _ = read_split(data / "duckdb" / "train")
    evaluation, _, _ = read_split(data / "duckdb" / "eval")
    assert not set(train["display_id"]) & set(evaluation["display_id"])
    events = csv(data, "events")
    kept = events[(events["geo_location"] != "") & (events["platform"] != "\\N")]
    ids, days = kept["display_id"].astype(np.int64).to_numpy(), kept["timestamp"].astype(np.int64).to_numpy() // DAY_MS
    expected = set(ids[eval_mask(0, ids, days)])
    assert set(evaluation["display_id"]) == expected
    assert set(ids[days >= 11]) <= expected  # the last two days are all eval
    assert 0.1 < np.mean(list(map(bool, eval_mask(0, ids[days <= 10], days[days <= 10])))) < 0.3
    teacher = json.loads((data / "csv" / "teacher.json").read_text())
    assert teacher["eval_displays"] == len(expected)
    # eval rows are in display order (the reference's MAP groups within a batch); train is shuffled
    assert (np.diff(evaluation["display_id"]) >= 0).all() and not (np.diff(train["display_id"]) >= 0).all()


def test_ctrs_views_and_geo_codes_follow_the_reference_rules(data):
    train, _, _ = read_split(data / "duckdb" / "train")
    evaluation, _, _ = read_split(data / "duckdb" / "eval")
    rows = pd.concat([pd.DataFrame(train).assign(split="train"), pd.DataFrame(evaluation).assign(split="eval")])
    in_train = rows[rows["split"] == "train"]
    for key, feature, minimum in (("ad_id", "pop_ad_id", 5), ("campaign_id", "pop_campain_id", 10),
                                  ("ad_advertiser", "pop_advertiser_id", 10)):
        stats = in_train.groupby(key)["label"].agg(["size", "sum"])
        views = rows[key].map(stats["size"]).fillna(0).to_numpy()
        clicks = rows[key].map(stats["sum"]).fillna(0).to_numpy()
        expected = np.where(views > minimum, clicks / np.maximum(views, 1), 0).astype(np.float32)
        np.testing.assert_array_equal(rows[feature].to_numpy(), expected, err_msg=feature)
        assert (views <= minimum).any() or key != "ad_id"  # the threshold is exercised
    views = rows["ad_id"].map(in_train.groupby("ad_id").size()).to_numpy(dtype=np.float64)
    logs = np.log2(1 + views)
    expected = np.nan_to_num((logs - np.nanmin(logs)) / (np.nanmax(logs) - np.nanmin(logs))).astype(np.float32)
    np.testing.assert_allclose(rows["ad_views_log_01scaled"].to_numpy(), expected, atol=1e-7)
    # geo: occurrence count among the kept events, -1 (mod buckets) when under 10
    events = csv(data, "events")
    kept = events[(events["geo_location"] != "") & (events["platform"] != "\\N")]
    country = kept.set_index(kept["display_id"].astype(np.int64))["geo_location"].str[:2]
    counts = country.map(country.value_counts())
    code = np.where(counts >= 10, counts, -1) % features.BUCKETS["event_country"]
    expected = pd.Series(code, index=country.index)
    np.testing.assert_array_equal(rows["event_country"].to_numpy(), expected.loc[rows["display_id"]].to_numpy())
    assert (rows["event_country"] == features.BUCKETS["event_country"] - 1).any()  # a rare one


def test_similarities_match_a_float64_tfidf(data):
    """The cosine of confidence x ln(ln(N/df)) weights, computed here without the 2**-24 quantum."""
    evaluation, _, _ = read_split(data / "duckdb" / "eval")
    topics = pd.read_csv(data / "csv" / "documents_topics.csv")
    n = topics["document_id"].nunique()
    df = topics.groupby("topic_id")["document_id"].nunique()
    topics["w"] = topics["confidence_level"] * np.log(np.log(n / topics["topic_id"].map(df)))
    vectors = {doc: dict(zip(g["topic_id"], g["w"])) for doc, g in topics.groupby("document_id")}

    def cosine(a, b):
        if a not in vectors or b not in vectors:
            return 0.0
        va, vb = vectors[a], vectors[b]
        dot = sum(w * vb.get(t, 0.0) for t, w in va.items())
        return dot / math.sqrt(sum(w * w for w in va.values())) / math.sqrt(sum(w * w for w in vb.values()))

    expected = [cosine(a, b) for a, b in zip(evaluation["doc_event_id"], evaluation["doc_id"])]
    np.testing.assert_allclose(evaluation["doc_event_doc_ad_sim_topics"], expected, atol=2e-6)
    assert np.mean(np.array(expected) > 0) > 0.02


# ----------------------------------------------------------------------------- Spark parity
@pytest.mark.skipif(not HAVE_SPARK, reason="needs java and pyspark")
def test_spark_writes_the_same_bytes(data):
    env = {**os.environ, "PYTHONPATH": REPO, "SPARK_DRIVER_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1",
           "INPUT_DIR": str(data / "csv"), "OUTPUT_DIR": str(data / "spark"), "THREADS": "2"}
    result = subprocess.run(["bash", os.path.join(REPO, "wide_and_deep", "scripts", "preproc.sh"), "spark", "2"],
                            env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    names = sorted(os.path.relpath(p, data / "duckdb") for p in glob.glob(str(data / "duckdb" / "**"), recursive=True))
    assert names == sorted(os.path.relpath(p, data / "spark") for p in glob.glob(str(data / "spark" / "**"), recursive=True))
    for name in names:
        if os.path.isfile(data / "duckdb" / name):
            assert (data / "duckdb" / name).read_bytes() == (data / "spark" / name).read_bytes(), name
    # bytes that are not UTF-8: refused by Spark too (DuckDB's reader refuses them; test below)
    shutil.copytree(data / "csv", data / "not_utf8")
    with open(data / "not_utf8" / "documents_entities.csv", "ab") as f:
        f.write(b"1,\xff\xfe,0.5\n")
    env.update(INPUT_DIR=str(data / "not_utf8"), OUTPUT_DIR=str(data / "spark_not_utf8"))
    result = subprocess.run(["bash", os.path.join(REPO, "wide_and_deep", "scripts", "preproc.sh"), "spark", "2"],
                            env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 2 and "documents_entities.csv: cannot be read (not UTF-8)" in result.stderr
    assert not (data / "spark_not_utf8").exists()


# ----------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    generate(str(root / "csv"), 400, 5)
    return root / "csv"


def copy_input(tiny, tmp_path):
    shutil.copytree(tiny, tmp_path / "in")
    return tmp_path / "in"


def run_cli(*args):
    return cli.main(["--threads", "2", "--num_train_files", "1", "--num_eval_files", "1", *map(str, args)])


def test_malformed_lines_and_unknown_ids_are_counted(tiny, tmp_path):
    folder = copy_input(tiny, tmp_path)
    assert run_cli("--input", folder, "--output", tmp_path / "clean") == 0
    with open(folder / "clicks_train.csv", "a") as f:
        f.write("x,1,0\n1,2\n\n5,3,2\n999999,1,0\n1,999999,0\n")
    with open(folder / "events.csv", "a") as f:
        f.write("7,abc,1,notatime,1,US\n")
    assert run_cli("--input", folder, "--output", tmp_path / "out") == 0
    summary = json.loads((tmp_path / "out" / "preproc_summary.json").read_text())
    clean = json.loads((tmp_path / "clean" / "preproc_summary.json").read_text())
    clicks = summary["files"]["clicks_train"]
    assert clicks["malformed"] == 4 and clicks["unknown_display"] == 1 and clicks["unknown_ad"] == 1
    assert clicks["lines"] == clean["files"]["clicks_train"]["lines"] + 6
    assert clicks["lines"] == sum(v for k, v in clicks.items() if k != "lines")
    assert summary["files"]["events"]["malformed"] == 1
    for name in ("train", "eval"):
        assert (tmp_path / "out" / name / "part-r-00000").read_bytes() == \
            (tmp_path / "clean" / name / "part-r-00000").read_bytes()


def test_displays_without_a_click_are_counted_and_reported(tiny, tmp_path, capsys):
    """MAP@12 scores a display by its clicked ad: a display whose clicks are all 0 is left out of it, and
    preproc_summary.json and the printed summary say how many such displays each split has."""
    folder = copy_input(tiny, tmp_path)
    assert run_cli("--input", folder, "--output", tmp_path / "clean") == 0
    clicks = pd.read_csv(folder / "clicks_train.csv", dtype=str)
    clicks.loc[clicks["display_id"] == clicks["display_id"].iloc[0], "clicked"] = "0"
    clicks.to_csv(folder / "clicks_train.csv", index=False)
    capsys.readouterr()
    assert run_cli("--input", folder, "--output", tmp_path / "out") == 0
    printed = capsys.readouterr().out
    clean = json.loads((tmp_path / "clean" / "preproc_summary.json").read_text())["displays"]
    summary = json.loads((tmp_path / "out" / "preproc_summary.json").read_text())["displays"]
    assert [summary[s]["displays"] for s in ("train", "eval")] == [clean[s]["displays"] for s in ("train", "eval")]
    more = {s: summary[s]["without_click"] - clean[s]["without_click"] for s in ("train", "eval")}
    assert sorted(more.values()) == [0, 1], (clean, summary)
    split = max(more, key=more.get)
    assert (f"{split}: {summary[split]['without_click']} of {summary[split]['displays']} displays have no clicked "
            f"ad; MAP@12 leaves them out") in printed


def test_strict_refuses_malformed_lines(tiny, tmp_path, capsys):
    folder = copy_input(tiny, tmp_path)
    with open(folder / "documents_topics.csv", "a") as f:
        f.write("1,2,high\n")
    assert run_cli("--input", folder, "--output", tmp_path / "out", "--strict") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "documents_topics.csv" in err and "1 malformed" in err
    assert not (tmp_path / "out").exists() and not glob.glob(str(tmp_path / ".out*"))


@pytest.mark.parametrize("problem", ["missing_file", "missing_column", "duplicate_ad", "empty_eval", "not_utf8",
                                     "pasted_twice"])
def test_bad_input_is_one_error_naming_the_file(tiny, tmp_path, capsys, problem):
    folder = copy_input(tiny, tmp_path)
    if problem == "missing_file":
        os.remove(folder / "documents_meta.csv")
        expected = ("documents_meta.csv", "not found")
    elif problem == "missing_column":
        text = (folder / "events.csv").read_text().replace("platform,geo_location", "platform", 1)
        (folder / "events.csv").write_text(text)
        expected = ("events.csv", "missing column(s) geo_location")
    elif problem == "duplicate_ad":
        with open(folder / "promoted_content.csv") as f:
            f.readline()
            line = f.readline()
        with open(folder / "promoted_content.csv", "a") as f:
            f.write(line)
        expected = ("promoted_content.csv", f"ad_id {line.split(',')[0]} occurs 2 times")
    elif problem == "pasted_twice":  # its rows would count twice
        text = (folder / "clicks_train.csv").read_text()
        (folder / "clicks_train.csv").write_text(text + text)
        expected = ("clicks_train.csv", f"line {text.count(chr(10)) + 1} repeats the header line")
    elif problem == "not_utf8":
        with open(folder / "documents_entities.csv", "ab") as f:
            f.write(b"1,\xff\xfe,0.5\n")
        expected = ("documents_entities.csv", "not UTF-8")
    else:
        events = pd.read_csv(folder / "events.csv", dtype=str, keep_default_na=False)
        events["timestamp"] = "0"
        events.to_csv(folder / "events.csv", index=False)
        days = np.zeros(len(events), dtype=np.int64)
        # only the displays that go to train stay in clicks_train
        train_ids = set(events["display_id"][~eval_mask(0, events["display_id"].astype(np.int64), days)])
        clicks = pd.read_csv(folder / "clicks_train.csv", dtype=str)
        clicks[clicks["display_id"].isin(train_ids)].to_csv(folder / "clicks_train.csv", index=False)
        expected = ("clicks_train.csv", "the eval split is empty")
    (tmp_path / "keep").mkdir()
    assert run_cli("--input", folder, "--output", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and all(part in err for part in expected), err
    assert sorted(os.listdir(tmp_path)) == ["in", "keep"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_is_one_line_and_leaves_nothing(tmp_path, signum):
    """A real signal to a real `python -m wide_and_deep.preprocessing` while its temporary output folder
    exists: one line naming the signal, exit 128 + N (DLRM's convention), no traceback, the temporary folder
    removed; and a killed run's stale temporary (a dead PID's) is removed too, a live process's kept."""
    generate(str(tmp_path / "in"), 3000, 1)
    stale, live = tmp_path / ".out.tmp-999999999", tmp_path / f".out.tmp-{os.getpid()}"
    (stale / "train").mkdir(parents=True)
    live.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "wide_and_deep.preprocessing", "--input", str(tmp_path / "in"),
                                "--output", str(tmp_path / "out"), "--threads", "2", "--num_train_files", "1",
                                "--num_eval_files", "1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    staging = tmp_path / f".out.tmp-{process.pid}"
    while not staging.exists() and process.poll() is None:
        time.sleep(0.002)
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err[-3000:]
    assert err.splitlines() == [f"stopped by {signal.Signals(signum).name}: the run ended before finishing; outputs "
                                f"already on disk are complete, nothing half-written remains"], err[-3000:]
    assert sorted(os.listdir(tmp_path)) == sorted(["in", live.name])


def test_existing_output_is_refused_and_kept(tiny, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine").write_text("x")
    assert run_cli("--input", tiny, "--output", tmp_path / "out") == 2
    assert "already exists" in capsys.readouterr().err
    assert os.listdir(tmp_path / "out") == ["mine"]


def test_preproc_script_flags():
    script = os.path.join(REPO, "wide_and_deep", "scripts", "preproc.sh")
    result = subprocess.run(["bash", script, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "spark|duckdb [N]" in result.stdout
    for args, message in ((["hadoop"], "engine must be spark or duckdb"), (["duckdb", "0"], "N (files per split)")):
        result = subprocess.run(["bash", script, *args], capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr.startswith("error: ") and message in result.stderr

"""Benchmark of the split-binary input pipeline against numpy.fromfile, on one core.

Writes a Criteo-shaped dataset (13 numerical float16, 26 categorical int32, bool label) larger
than 2 GB, warms the page cache, then measures in separate single-core processes:
  * raw:      numpy.fromfile of every train file (whole files), samples/s;
  * pipeline: one epoch of `dataloader.create_input_pipelines(...).train` at batch 65536,
              samples/s and the process's peak RSS (the loader should hold only a few batches).
Raw and pipeline runs alternate (best of --rounds each), so a busy machine slows both alike.
Writes bench/results/loader.json with pipeline_samples_per_s, raw_read_samples_per_s, ratio and
peak RSS, and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "loader.json"
NUM_NUMERICAL = 13
NUM_CATEGORICAL = 26
CARDINALITY = 100_000  # int32 ids, as the large Criteo tables
BATCH_SIZE = 65536


def pin_to_one_core() -> int:
    """Restrict this process (and the threads it starts later) to one CPU; return which."""
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_dataset(directory: str, train_batches: int) -> None:
    """Random Criteo-shaped split-binary data: `train_batches` full batches, one test batch."""
    import datasets
    from feature_spec import FeatureSpec

    spec = FeatureSpec.get_default_feature_spec(NUM_NUMERICAL, [CARDINALITY] * NUM_CATEGORICAL,
                                                directory)
    rng = np.random.default_rng(0)
    with datasets.SplitBinaryWriter(spec) as writer:
        for mapping, batches in (("train", train_batches), ("test", 1)):
            for _ in range(batches):
                writer.append(mapping,
                              rng.random((BATCH_SIZE, NUM_NUMERICAL), dtype=np.float32),
                              rng.integers(0, 2, BATCH_SIZE),
                              [rng.integers(0, CARDINALITY, BATCH_SIZE, dtype=np.int32)
                               for _ in range(NUM_CATEGORICAL)])
        writer.commit()


def train_files(directory: str) -> list:
    return sorted(str(p) for p in Path(directory, "train").iterdir())


def warm_page_cache(directory: str) -> None:
    for path in train_files(directory):
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def measure_raw(directory: str, num_samples: int) -> dict:
    """numpy.fromfile of every train file, whole; best of two passes."""
    pin_to_one_core()
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        for path in train_files(directory):
            np.fromfile(path, dtype=np.uint8)
        best = min(best, time.perf_counter() - start)
    return {"raw_read_samples_per_s": num_samples / best}


def measure_pipeline(directory: str, num_samples: int) -> dict:
    """One epoch of the train pipeline consumed by a Python loop (as a training loop does) and
    one consumed inside the graph (no Python per batch); peak RSS of this process."""
    core = pin_to_one_core()
    import tensorflow as tf

    import dataloader

    rss_before = peak_rss_mib()
    train = dataloader.create_input_pipelines(dataset_type="tf_raw", dataset_path=directory,
                                              train_batch_size=BATCH_SIZE,
                                              eval_batch_size=BATCH_SIZE).train
    start = time.perf_counter()
    samples = sum(int(labels.shape[0]) for _, labels in train)
    python_loop = time.perf_counter() - start
    start = time.perf_counter()
    in_graph = int(train.reduce(np.int64(0), lambda total, element: total + tf.shape(
        element[1], out_type=tf.int64)[0]))
    graph_loop = time.perf_counter() - start
    assert samples == in_graph == num_samples // BATCH_SIZE * BATCH_SIZE
    return {"pipeline_samples_per_s": samples / python_loop,
            "pipeline_in_graph_samples_per_s": samples / graph_loop, "core": core,
            "rss_before_reading_mib": rss_before, "peak_rss_mib": peak_rss_mib()}


def run_role(role: str, directory: str, num_samples: int) -> dict:
    """Run one measurement in a fresh process, so neither pollutes the other's RSS or caches."""
    output = subprocess.run([sys.executable, __file__, f"--role={role}", f"--data_dir={directory}",
                             f"--num_samples={num_samples}"], check=True, capture_output=True,
                            text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def best_of(rounds: int, directory: str, num_samples: int) -> tuple:
    """Alternate raw and pipeline runs, so a busy machine slows both alike; keep each's best."""
    raw, pipeline = [], []
    for _ in range(rounds):
        raw.append(run_role("raw", directory, num_samples))
        pipeline.append(run_role("pipeline", directory, num_samples))
    best_pipeline = max(pipeline, key=lambda r: r["pipeline_samples_per_s"])
    best_pipeline["pipeline_in_graph_samples_per_s"] = max(
        r["pipeline_in_graph_samples_per_s"] for r in pipeline)
    best_pipeline["peak_rss_mib"] = max(r["peak_rss_mib"] for r in pipeline)
    return max(raw, key=lambda r: r["raw_read_samples_per_s"]), best_pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", help="dataset directory (default: a temporary one, removed)")
    parser.add_argument("--train_batches", type=int, default=264,
                        help="full train batches to write (264 x 65536 samples = 2.27 GB)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds")
    parser.add_argument("--role", choices=("raw", "pipeline"), help=argparse.SUPPRESS)
    parser.add_argument("--num_samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "raw":
        print(json.dumps(measure_raw(args.data_dir, args.num_samples)))
        return
    if args.role == "pipeline":
        print(json.dumps(measure_pipeline(args.data_dir, args.num_samples)))
        return

    directory = args.data_dir or tempfile.mkdtemp(prefix="dlrm_loader_bench_")
    try:
        if not os.path.exists(os.path.join(directory, "feature_spec.yaml")):
            write_dataset(directory, args.train_batches)
        dataset_bytes = sum(os.path.getsize(p) for p in train_files(directory))
        num_samples = os.path.getsize(os.path.join(directory, "train", "label.bin"))
        warm_page_cache(directory)
        raw, pipeline = best_of(args.rounds, directory, num_samples)
    finally:
        if not args.data_dir:
            shutil.rmtree(directory, ignore_errors=True)
    result = {
        "shape": f"{NUM_NUMERICAL} numerical float16, {NUM_CATEGORICAL} categorical int32, bool label",
        "batch_size": BATCH_SIZE, "train_samples": num_samples, "dataset_bytes": dataset_bytes,
        "cores": 1, "load_average_1min": os.getloadavg()[0], **raw, **pipeline,
        "ratio": pipeline["pipeline_samples_per_s"] / raw["raw_read_samples_per_s"],
        "ratio_in_graph": pipeline["pipeline_in_graph_samples_per_s"] / raw["raw_read_samples_per_s"],
        "batch_bytes": dataset_bytes // num_samples * BATCH_SIZE,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'dataset':<34}{dataset_bytes / 1e9:.2f} GB, {num_samples} samples, batch {BATCH_SIZE}")
    print(f"{'raw numpy.fromfile (1 core)':<34}{raw['raw_read_samples_per_s'] / 1e6:8.2f} M samples/s")
    print(f"{'pipeline, Python loop (1 core)':<34}{pipeline['pipeline_samples_per_s'] / 1e6:8.2f} M samples/s")
    print(f"{'pipeline, in-graph loop (1 core)':<34}"
          f"{pipeline['pipeline_in_graph_samples_per_s'] / 1e6:8.2f} M samples/s")
    print(f"{'ratio':<34}{result['ratio']:8.2f}")
    print(f"{'peak RSS while reading':<34}{pipeline['peak_rss_mib']:8.0f} MiB "
          f"(before reading {pipeline['rss_before_reading_mib']:.0f} MiB)")
    print(f"wrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()

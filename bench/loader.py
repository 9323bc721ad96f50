"""Benchmark of the split-binary input pipeline against numpy.fromfile, on one core.

Writes a Criteo-shaped dataset (13 numerical float16, 26 categorical int32, bool label) larger
than 2 GB, warms the page cache, then measures in separate single-core processes:
  * raw:       numpy.fromfile of every train file (whole files), samples/s;
  * pipeline:  one epoch of `dataloader.create_input_pipelines(...).train` at batch 65536 taken
               three ways: by a Python loop; as the trainer takes it (`Trainer.train_next`: a
               compiled step per batch that pulls the batch from the iterator inside its graph);
               and by one in-graph reduce. Then one epoch of bare `SplitBinaryReader.read_batch`
               calls; and the process's peak RSS (the loader should hold only a few batches);
  * unchecked: the same without the per-batch value checks (`check_values=False`), to price them.
Raw, pipeline and unchecked runs alternate (best of --rounds each), so a busy machine slows all
alike. The checks' cost per sample is set against a training step's time per sample from
bench/results/train.json (batch 4096, no XLA, pool allocator). Writes bench/results/loader.json
and prints a table, with the 1-minute load average before and after (others share the machine).
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

import numpy as np  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "loader.json"
TRAIN_RESULTS = REPO_ROOT / "bench" / "results" / "train.json"
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
    from recsys.data import split_binary
    from recsys.data.feature_spec import FeatureSpec

    spec = FeatureSpec.get_default_feature_spec(NUM_NUMERICAL, [CARDINALITY] * NUM_CATEGORICAL,
                                                directory)
    rng = np.random.default_rng(0)
    with split_binary.SplitBinaryWriter(spec) as writer:
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


def measure_pipeline(directory: str, num_samples: int, check_values: bool) -> dict:
    """One epoch of the train pipeline consumed by a Python loop, one by a compiled step per batch
    that takes the batch inside its graph (as `Trainer.train_next` does), one consumed inside a
    single graph (no Python per batch), and one of bare `read_batch` calls; peak RSS."""
    core = pin_to_one_core()
    import tensorflow as tf

    import dataloader
    import datasets
    from recsys.data import split_binary

    rss_before = peak_rss_mib()
    spec = datasets.load_feature_spec(dataset_path=directory)
    train = dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(
        train_batch_size=BATCH_SIZE, eval_batch_size=BATCH_SIZE, check_values=check_values)).train
    start = time.perf_counter()
    samples = sum(int(labels.shape[0]) for _, labels in train)
    python_loop = time.perf_counter() - start

    @tf.function
    def take_batch(batches: tf.data.Iterator) -> tf.Tensor:
        _, labels = next(batches)
        return tf.shape(labels, out_type=tf.int64)[0]

    take_batch(iter(train.take(1)))  # traced before the clock starts, as the trainer's step is
    batches = iter(train)
    start = time.perf_counter()
    pulled = [take_batch(batches) for _ in range(int(train.cardinality()))]
    train_next_samples = int(sum(int(size) for size in pulled))  # one wait at the end, as the trainer's
    train_next_loop = time.perf_counter() - start
    start = time.perf_counter()
    in_graph = int(train.reduce(np.int64(0), lambda total, element: total + tf.shape(
        element[1], out_type=tf.int64)[0]))
    graph_loop = time.perf_counter() - start
    assert samples == train_next_samples == in_graph == num_samples // BATCH_SIZE * BATCH_SIZE
    reader = split_binary.SplitBinaryReader(spec, "train", BATCH_SIZE, check_values=check_values)
    start = time.perf_counter()
    for batch in range(len(reader)):
        reader.read_batch(batch)
    read_batch_loop = time.perf_counter() - start
    return {"samples_per_s": samples / python_loop, "train_next_samples_per_s": samples / train_next_loop,
            "in_graph_samples_per_s": samples / graph_loop,
            "read_batch_samples_per_s": len(reader) * BATCH_SIZE / read_batch_loop, "core": core,
            "rss_before_reading_mib": rss_before, "peak_rss_mib": peak_rss_mib()}


def run_role(role: str, directory: str, num_samples: int) -> dict:
    """Run one measurement in a fresh process, so neither pollutes the other's RSS or caches."""
    output = subprocess.run([sys.executable, "-m", "bench.loader", f"--role={role}", f"--data_dir={directory}",
                             f"--num_samples={num_samples}"], check=True, capture_output=True, cwd=REPO_ROOT,
                            text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def best_of(rounds: int, directory: str, num_samples: int) -> dict:
    """Alternate the roles, so a busy machine slows each alike; per role the best rate of each
    measure over the rounds, and the highest peak RSS."""
    runs: dict = {role: [] for role in ROLES}
    for _ in range(rounds):
        for role in ROLES:
            runs[role].append(run_role(role, directory, num_samples))
    best = {}
    for role, results in runs.items():
        best[role] = {key: (max(r[key] for r in results) if key.endswith("per_s") or key.startswith("peak")
                            else results[0][key]) for key in results[0]}
    return best


def train_step_seconds_per_sample() -> dict:
    """A training step's time per sample from bench/results/train.json (batch 4096, no XLA, pool)."""
    runs = json.loads(TRAIN_RESULTS.read_text())["runs"]
    run = next(r for r in runs if r["batch_size"] == 4096 and not r["xla"] and not r["low_memory_allocator"])
    return {"train_batch_size": run["batch_size"], "train_step_time_ms": run["step_time_ms"],
            "train_seconds_per_sample": run["step_time_ms"] / 1000 / run["batch_size"]}


# (name in the JSON, rate measured by measure_pipeline, row of the table)
MEASURES = (("python_loop", "samples_per_s", "pipeline, Python loop"),
            ("train_next", "train_next_samples_per_s", "pipeline, as the trainer takes it"),
            ("in_graph", "in_graph_samples_per_s", "pipeline, in-graph loop"),
            ("read_batch", "read_batch_samples_per_s", "read_batch calls"))
ROLES = ("raw", "pipeline", "unchecked")


def check_costs(checked: dict, unchecked: dict, train_seconds_per_sample: float) -> dict:
    """Seconds per sample the value checks add, per measure, and as a fraction of a training step."""
    costs = {}
    for name, rate, _ in MEASURES:
        added = 1 / checked[rate] - 1 / unchecked[rate]
        costs[f"check_{name}_seconds_per_sample"] = added
        costs[f"check_{name}_fraction_of_train_step"] = added / train_seconds_per_sample
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", help="dataset directory (default: a temporary one, removed)")
    parser.add_argument("--train_batches", type=int, default=264,
                        help="full train batches to write (264 x 65536 samples = 2.27 GB)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds")
    parser.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    parser.add_argument("--num_samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "raw":
        print(json.dumps(measure_raw(args.data_dir, args.num_samples)))
        return
    if args.role:
        print(json.dumps(measure_pipeline(args.data_dir, args.num_samples, args.role == "pipeline")))
        return

    directory = args.data_dir or tempfile.mkdtemp(prefix="dlrm_loader_bench_")
    try:
        if not os.path.exists(os.path.join(directory, "feature_spec.yaml")):
            write_dataset(directory, args.train_batches)
        dataset_bytes = sum(os.path.getsize(p) for p in train_files(directory))
        num_samples = os.path.getsize(os.path.join(directory, "train", "label.bin"))
        warm_page_cache(directory)
        load_before = os.getloadavg()[0]
        best = best_of(args.rounds, directory, num_samples)
    finally:
        if not args.data_dir:
            shutil.rmtree(directory, ignore_errors=True)
    raw, pipeline, unchecked = best["raw"], best["pipeline"], best["unchecked"]
    train = train_step_seconds_per_sample()
    result = {
        "shape": f"{NUM_NUMERICAL} numerical float16, {NUM_CATEGORICAL} categorical int32, bool label",
        "batch_size": BATCH_SIZE, "train_samples": num_samples, "dataset_bytes": dataset_bytes,
        "cores": 1, "load_average_1min_before": load_before, "load_average_1min": os.getloadavg()[0],
        **raw, "core": pipeline["core"], "rss_before_reading_mib": pipeline["rss_before_reading_mib"],
        "peak_rss_mib": pipeline["peak_rss_mib"],
        "pipeline_samples_per_s": pipeline["samples_per_s"],
        "pipeline_train_next_samples_per_s": pipeline["train_next_samples_per_s"],
        "pipeline_in_graph_samples_per_s": pipeline["in_graph_samples_per_s"],
        "read_batch_samples_per_s": pipeline["read_batch_samples_per_s"],
        "unchecked_pipeline_samples_per_s": unchecked["samples_per_s"],
        "unchecked_pipeline_train_next_samples_per_s": unchecked["train_next_samples_per_s"],
        "unchecked_pipeline_in_graph_samples_per_s": unchecked["in_graph_samples_per_s"],
        "unchecked_read_batch_samples_per_s": unchecked["read_batch_samples_per_s"],
        "ratio": pipeline["train_next_samples_per_s"] / raw["raw_read_samples_per_s"],
        "ratio_python_loop": pipeline["samples_per_s"] / raw["raw_read_samples_per_s"],
        "ratio_in_graph": pipeline["in_graph_samples_per_s"] / raw["raw_read_samples_per_s"],
        "batch_bytes": dataset_bytes // num_samples * BATCH_SIZE,
        **train, **check_costs(pipeline, unchecked, train["train_seconds_per_sample"]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    million = 1e6
    print(f"{'dataset':<34}{dataset_bytes / 1e9:.2f} GB, {num_samples} samples, batch {BATCH_SIZE}")
    print(f"{'raw numpy.fromfile (1 core)':<34}{raw['raw_read_samples_per_s'] / million:8.2f} M samples/s")
    print(f"{'M samples/s (1 core)':<34}{'checked':>8}{'unchecked':>10}{'check ns/sample':>17}"
          f"{'% of train step':>17}")
    for name, rate, label in MEASURES:
        print(f"{label:<34}{pipeline[rate] / million:8.2f}{unchecked[rate] / million:10.2f}"
              f"{result[f'check_{name}_seconds_per_sample'] * 1e9:17.2f}"
              f"{result[f'check_{name}_fraction_of_train_step'] * 100:16.4f}%")
    print(f"{'train step (results/train.json)':<34}{train['train_step_time_ms']:8.1f} ms at batch "
          f"{train['train_batch_size']} = {train['train_seconds_per_sample'] * 1e9:.0f} ns/sample")
    print(f"{'ratio (as the trainer takes it / raw)':<34}{result['ratio']:8.2f}")
    print(f"{'ratio (Python loop / raw)':<34}{result['ratio_python_loop']:8.2f}")
    print(f"{'peak RSS while reading':<34}{pipeline['peak_rss_mib']:8.0f} MiB "
          f"(before reading {pipeline['rss_before_reading_mib']:.0f} MiB)")
    print(f"{'load average (1 min)':<34}{load_before:.2f} before, {result['load_average_1min']:.2f} after")
    print(f"wrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()

"""Benchmark of reading HugeCTR raw and SOK split data against the split-binary they convert to.

Writes Criteo-shaped HugeCTR raw files (label, 13 dense int32 counts, 26 ids; 160-byte records),
the same samples as SOK's split layout (label.bin, dense.bin, category.bin) and, converted by
`dataloading.transcribe`, as split-binary; warms the page cache; then, in one process pinned to one
core, times epochs of bare `read_batch` calls at batch 65536 (best of --rounds, layouts alternating
so a busy machine slows each alike). The HugeCTR and SOK readers do more per sample than the
split-binary one: the dense log transform to float16 and the [features, rows] transpose of the
ids, which the conversion does once. Writes bench/results/hugectr_data.json and prints a table,
with the 1-minute load average before and after (others share the machine).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = Path(__file__).resolve().parent.parent

import numpy as np  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "hugectr_data.json"
CARDINALITIES = [100_000] * 26
BATCH_SIZE = 65536
LAYOUTS = (("hugectr_raw", "raw"), ("sok_split", "sok"), ("tf_raw", "binary"))


def write_layouts(directory: str, train_batches: int) -> None:
    """The same random samples as HugeCTR raw, SOK split and (converted) split-binary folders."""
    from dataloading import transcribe

    rng = np.random.default_rng(0)
    for name in ("raw", "sok/train", "sok/test"):
        os.makedirs(os.path.join(directory, name))
    for mapping, batches in (("train", train_batches), ("test", 1)):
        records = np.column_stack([rng.integers(0, 2, batches * BATCH_SIZE),
                                   rng.integers(-3, 5000, (batches * BATCH_SIZE, 13)),
                                   rng.integers(0, CARDINALITIES[0], (batches * BATCH_SIZE, 26))]).astype("<i4")
        records.tofile(os.path.join(directory, "raw", f"{mapping}_data.bin"))
        sok = os.path.join(directory, "sok", mapping)
        for name, columns in (("label.bin", slice(0, 1)), ("dense.bin", slice(1, 14)), ("category.bin", slice(14, 40))):
            np.ascontiguousarray(records[:, columns]).tofile(os.path.join(sok, name))
        with open(os.path.join(sok, "metadata.json"), "w") as f:
            json.dump({"vocab_sizes": CARDINALITIES, "label_raw_type": "int32", "dense_raw_type": "int32",
                       "category_raw_type": "int32", "dense_log": True}, f)
    transcribe.transcribe("hugectr_raw", os.path.join(directory, "raw"), os.path.join(directory, "binary"), "tf_raw",
                          src_batch_size=BATCH_SIZE, hugectr_cardinalities=CARDINALITIES)


def warm_page_cache(directory: str) -> int:
    """Read every file once; return the bytes of the HugeCTR raw train file."""
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(64 << 20):
                    pass
    return os.path.getsize(os.path.join(directory, "raw", "train_data.bin"))


def read_epoch_seconds(reader) -> float:
    start = time.perf_counter()
    for batch in range(len(reader)):
        reader.read_batch(batch)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_batches", type=int, default=64,
                        help="train batches of 65536 samples to write (64: 671 MB of HugeCTR raw)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds")
    args = parser.parse_args()
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    import datasets
    from recsys.data import split_binary
    from recsys.data import hugectr_data

    directory = tempfile.mkdtemp(prefix="dlrm_hugectr_bench_")
    try:
        write_layouts(directory, args.train_batches)
        raw_bytes = warm_page_cache(directory)
        load_before = os.getloadavg()[0]
        readers = {}
        for dataset_type, name in LAYOUTS:
            spec = datasets.load_feature_spec(dataset_type=dataset_type, dataset_path=os.path.join(directory, name),
                                                hugectr_cardinalities=CARDINALITIES if name == "raw" else None)
            reader_type = hugectr_data.RecordReader if name != "binary" else split_binary.SplitBinaryReader
            readers[dataset_type] = reader_type(spec, "train", BATCH_SIZE)
        best = {name: float("inf") for name in readers}
        for _ in range(args.rounds):
            for name, reader in readers.items():
                best[name] = min(best[name], read_epoch_seconds(reader))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    samples = args.train_batches * BATCH_SIZE
    rates = {name: samples / seconds for name, seconds in best.items()}
    result = {"shape": "label, 13 dense int32 (log to float16), 26 int32 ids", "batch_size": BATCH_SIZE,
              "train_samples": samples, "hugectr_raw_bytes": raw_bytes, "cores": 1, "core": core,
              "load_average_1min_before": load_before, "load_average_1min": os.getloadavg()[0],
              **{f"{name}_read_batch_samples_per_s": rate for name, rate in rates.items()}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'dataset':<36}{raw_bytes / 1e9:.2f} GB of HugeCTR raw, {samples} samples, batch {BATCH_SIZE}")
    for name, rate in rates.items():
        print(f"{name + ' read_batch (1 core)':<36}{rate / 1e6:8.2f} M samples/s "
              f"({rates['tf_raw'] / rate:.1f}x the split-binary time)")
    print(f"{'load average (1 min)':<36}{load_before:.2f} before, {result['load_average_1min']:.2f} after")
    print(f"wrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()

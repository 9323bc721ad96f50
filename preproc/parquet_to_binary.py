"""Convert the Spark parquet output of each split into one packed binary file (reference §5.4).

Each row becomes 40 little-endian 4-byte values: label (int32), 13 numericals (float32 bits) and
26 categorical ids (int32). Part files are converted in parallel into `<intermediate>/<split>/`
and concatenated in part-file order (which is the row order Spark wrote) into
`<dst>/<split>_data.bin`.
"""
from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import shutil
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow.parquet as pq

SPLITS = ("train", "test", "validation")
NUM_INTEGER_FEATURES = 13
NUM_CATEGORICAL_FEATURES = 26
COLUMNS = [f"_c{i}" for i in range(1 + NUM_INTEGER_FEATURES + NUM_CATEGORICAL_FEATURES)]
RECORD_BYTES = 4 * len(COLUMNS)
READ_BATCH_ROWS = 1 << 20


def part_files(split_dir: str) -> List[str]:
    """Parquet part files of one Spark output folder, in the order Spark numbered them."""
    if not os.path.isfile(os.path.join(split_dir, "_SUCCESS")):
        raise FileNotFoundError(f"{split_dir}: no complete Spark output here (_SUCCESS is missing)")
    return sorted(glob.glob(os.path.join(split_dir, "part-*.parquet")))


def pack_rows(batch) -> np.ndarray:
    """A record batch with columns `_c0`..`_c39` -> int32 array [rows, 40] (numericals as float32 bits)."""
    packed = np.empty((batch.num_rows, len(COLUMNS)), dtype=np.int32)
    packed[:, 0] = batch.column(0).to_numpy(zero_copy_only=False)
    for i in range(1, 1 + NUM_INTEGER_FEATURES):
        packed[:, i] = batch.column(i).to_numpy(zero_copy_only=False).astype(np.float32).view(np.int32)
    for i in range(1 + NUM_INTEGER_FEATURES, len(COLUMNS)):
        packed[:, i] = batch.column(i).to_numpy(zero_copy_only=False)
    return packed


def convert_part(source: str, destination: str) -> int:
    """Write one parquet part as packed records; returns the number of rows."""
    rows = 0
    with open(destination, "wb") as out:
        for batch in pq.ParquetFile(source).iter_batches(batch_size=READ_BATCH_ROWS, columns=COLUMNS):
            out.write(pack_rows(batch).astype("<i4", copy=False).tobytes())
            rows += batch.num_rows
    return rows


def _convert_part_task(paths: Sequence[str]) -> int:
    return convert_part(*paths)


def convert_dataset(src_dir: str, intermediate_dir: str, dst_dir: str, parallel_jobs: int) -> Dict[str, int]:
    """Convert every part of every split (one process pool for all) and concatenate each split's
    parts into `<dst_dir>/<split>_data.bin`; returns rows per split."""
    os.makedirs(dst_dir, exist_ok=True)
    tasks: Dict[str, List[Tuple[str, str]]] = {}
    for split in SPLITS:
        split_intermediate = os.path.join(intermediate_dir, split)
        os.makedirs(split_intermediate, exist_ok=True)
        tasks[split] = [(part, os.path.join(split_intermediate, f"{index:05d}.bin"))
                        for index, part in enumerate(part_files(os.path.join(src_dir, split)))]
    everything = [task for split in SPLITS for task in tasks[split]]
    with multiprocessing.get_context("spawn").Pool(max(1, min(parallel_jobs, len(everything)))) as pool:
        counts = dict(zip(everything, pool.map(_convert_part_task, everything)))
    for split in SPLITS:
        with open(os.path.join(dst_dir, f"{split}_data.bin"), "wb") as out:
            for _, packed in tasks[split]:
                with open(packed, "rb") as f:
                    shutil.copyfileobj(f, out, length=16 << 20)
                os.remove(packed)
    return {split: sum(counts[task] for task in tasks[split]) for split in SPLITS}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src_dir", required=True, help="Spark output folder with train/, test/, validation/")
    parser.add_argument("--intermediate_dir", required=True, help="scratch folder for per-part files")
    parser.add_argument("--dst_dir", required=True, help="where <split>_data.bin files are written")
    parser.add_argument("--parallel_jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        rows = convert_dataset(args.src_dir, args.intermediate_dir, args.dst_dir, args.parallel_jobs)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(", ".join(f"{split}: {n} rows" for split, n in rows.items()) + f" -> {args.dst_dir}/<split>_data.bin")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Convert the Spark parquet output of each split into one packed binary file (reference §5.4).

Each row becomes 40 little-endian 4-byte values: label (int32), 13 numericals (float32 bits) and
26 categorical ids (int32). Part files are converted in parallel into a temporary folder inside
`--intermediate_dir` and concatenated in part-file order (which is the row order Spark wrote) into
`<dst>/<split>_data.bin`. The destination is checked first (never one of the inputs; existing
output only with --overwrite), built beside itself and renamed into place, and the per-part files
are always removed, so a failure leaves neither partial output nor scratch files.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import multiprocessing
import os
import shutil
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from recsys.runtime.cli import bad_input  # noqa: E402
from recsys.runtime.safe_io import atomic_directory, check_output_dir, check_replaceable, refuse_overlap  # noqa: E402

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
    try:
        with open(destination, "wb") as out:
            for batch in pq.ParquetFile(source).iter_batches(batch_size=READ_BATCH_ROWS, columns=COLUMNS):
                out.write(pack_rows(batch).astype("<i4", copy=False).tobytes())
                rows += batch.num_rows
    except pa.ArrowException as error:
        raise ValueError(f"{source}: unreadable parquet part ({' '.join(str(error).split())})") from None
    return rows


def _convert_part_task(paths: Sequence[str]) -> int:
    return convert_part(*paths)


@contextlib.contextmanager
def _scratch_folder(parent: str):
    """A fresh folder inside `parent`, always removed; so is `parent` when this created it."""
    created = not os.path.isdir(parent)
    os.makedirs(parent, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".parts-", dir=parent) as scratch:
            yield scratch
    finally:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(parent)


def convert_dataset(src_dir: str, intermediate_dir: str, dst_dir: str, parallel_jobs: int,
                    overwrite: bool = False) -> Dict[str, int]:
    """Convert every part of every split (one process pool for all) and concatenate each split's
    parts into `<dst_dir>/<split>_data.bin`, all or nothing; returns rows per split."""
    refuse_overlap(dst_dir, "--dst_dir", {"--src_dir": src_dir, "--intermediate_dir": intermediate_dir})
    refuse_overlap(intermediate_dir, "--intermediate_dir", {"--src_dir": src_dir})
    check_output_dir(intermediate_dir, "--intermediate_dir")
    replace = check_replaceable(dst_dir, "--dst_dir", [f"{split}_data.bin" for split in SPLITS], overwrite)
    parts = {split: part_files(os.path.join(src_dir, split)) for split in SPLITS}
    with _scratch_folder(intermediate_dir) as scratch, atomic_directory(dst_dir, replace) as staging:
        tasks: Dict[str, List[Tuple[str, str]]] = {}
        for split in SPLITS:
            os.mkdir(os.path.join(scratch, split))
            tasks[split] = [(part, os.path.join(scratch, split, f"{index:05d}.bin"))
                            for index, part in enumerate(parts[split])]
        everything = [task for split in SPLITS for task in tasks[split]]
        with multiprocessing.get_context("spawn").Pool(max(1, min(parallel_jobs, len(everything)))) as pool:
            counts = dict(zip(everything, pool.map(_convert_part_task, everything)))
            # The workers leave by themselves: the context's terminate() alone may kill one holding the
            # task queue's lock, and the pool then waits forever for the other (seen under load).
            pool.close()
            pool.join()
        for split in SPLITS:
            with open(os.path.join(staging, f"{split}_data.bin"), "wb") as out:
                for _, packed in tasks[split]:
                    with open(packed, "rb") as f:
                        shutil.copyfileobj(f, out, length=16 << 20)
                    os.remove(packed)
    return {split: sum(counts[task] for task in tasks[split]) for split in SPLITS}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src_dir", required=True, help="Spark output folder with train/, test/, validation/")
    parser.add_argument("--intermediate_dir", required=True,
                        help="scratch space for per-part files (a temporary folder inside it is always removed)")
    parser.add_argument("--dst_dir", required=True, help="folder written with the <split>_data.bin files")
    parser.add_argument("--parallel_jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --dst_dir (refused while it holds other files)")
    args = parser.parse_args(argv)
    if args.parallel_jobs < 1:
        parser.error(f"--parallel_jobs must be at least 1, got {args.parallel_jobs}")
    try:
        rows = convert_dataset(args.src_dir, args.intermediate_dir, args.dst_dir, args.parallel_jobs,
                               args.overwrite)
    except (ValueError, OSError) as error:  # OutputPathError, unreadable parts
        return bad_input(error)
    print(", ".join(f"{split}: {n} rows" for split, n in rows.items()) + f" -> {args.dst_dir}/<split>_data.bin")
    return 0


if __name__ == "__main__":
    sys.exit(main())

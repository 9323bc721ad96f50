"""What a Criteo preprocessing run will cost before it starts: wall time, peak disk, peak memory.

A plain formula over the measurements of `python -m bench.preproc` (bench/results/preproc.json,
commit f3334de: a quiet 2-core AMD EPYC, 4 days of synthetic_criteo.py lines at 600,000 and
2,400,000 lines, frequency threshold 15). Each stage's seconds at the two sizes give a line,
seconds = fixed + per_line * lines (4x the lines took 3.05x the time with DuckDB, 2.27x with
Spark: a fixed part and a per-line part, nothing growing faster than the lines at these sizes).
Each stage then scales with the cores that run it:

- `cluster`: Spark's jobs, over every executor core of the cluster;
- `machine`: work spread over one machine's cores (DuckDB's scan and grouped counts; the parquet
  conversion, PARALLEL_JOBS processes on the driver machine);
- `serial`: kept at its measured rate whatever the cores (DuckDB's writer: rows written row group
  by row group by one Python thread, a batch's ids looked up in numpy on the engine's threads;
  split_dataset.py);
- `fixed`: start-up.

Assumptions, each a limit of the estimate: per-core rates hold on any core count and any input
size (measured on 2 cores up to 2.4M lines; the input was in the page cache, so the disk is
assumed to keep up); a real line costs what a synthetic one does (257 bytes against Criteo's
about 300); the output holds every line. Disk and memory follow from what each engine writes
(see `estimate`). Run `python -m preproc.estimate --criteo1tb` for docs/preprocessing.md's
table, or `--input_folder DIR --num_days N --engine E` for one input (prepare_dataset.sh does).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

# bench/results/preproc.json ("engines" -> runs at scale 1 and 4): input lines, and each stage's
# seconds (stage_seconds) at those sizes on MEASURED_CORES cores; peak_rss_mb at those sizes.
MEASURED_CORES = 2
MEASURED_LINES = (600_000, 2_400_000)
MEASURED_BYTES = (154_180_159, 616_700_560)
MEASURED_STAGE_SECONDS: Dict[str, Dict[str, Tuple[float, float]]] = {
    "duckdb": {"startup": (0.450, 0.473), "parse": (1.805, 6.422), "dictionary": (0.138, 0.411),
              "train": (0.782, 2.378), "test": (0.094, 0.334), "validation": (0.224, 0.599)},
    "spark": {"startup": (6.039, 6.153), "dictionary": (18.782, 41.743), "train": (17.996, 34.586),
             "test": (9.401, 11.367), "validation": (9.191, 9.636), "to_binary": (0.849, 1.856),
             "split_dataset": (0.312, 0.722)},
}
MEASURED_PEAK_RSS_MIB: Dict[str, Tuple[float, float]] = {"duckdb": (671.5, 1540.8), "spark": (7256.5, 5150.6)}
# Which cores run each stage (see the module docstring).
STAGE_SCALING: Dict[str, Dict[str, str]] = {
    "duckdb": {"startup": "fixed", "parse": "machine", "dictionary": "machine", "train": "serial",
               "test": "serial", "validation": "serial"},
    "spark": {"startup": "fixed", "dictionary": "cluster", "train": "cluster", "test": "cluster",
              "validation": "cluster", "to_binary": "machine", "split_dataset": "serial"},
}
ENGINES = tuple(MEASURED_STAGE_SECONDS)
# The measured runs' last day (test + validation) held a quarter of the lines; the train stage
# reads the other days' lines, test and validation the last day's, every other stage all lines.
MEASURED_LAST_DAY_SHARE = 1 / 4
LAST_DAY_STAGES = ("test", "validation")

# Bytes per line of DuckDB's parsed table (duckdb_pipeline.py keeps it in memory when it takes under
# a third of the memory limit, else in its database file in the scratch folder).
PARSED_BYTES_PER_LINE = 300
# A packed row of the Spark path (parquet_to_binary.py): 40 four-byte values; also the most a
# parquet row of 40 int32/float32 columns takes before compression.
PACKED_BYTES_PER_ROW = 40 * 4
# Spark's shuffle scratch (SPARK_LOCAL_DIRS): the reference README's "about 3 TB" for Criteo 1TB,
# per line of its input.
CRITEO_1TB_LINES = 4_370_000_000  # 24 day files; "about 4.37 billion lines"
CRITEO_1TB_BYTES = 1_300_000_000_000  # "about 1.3 TB" of uncompressed TSV
CRITEO_1TB_DAYS = 24
SHUFFLE_BYTES_PER_LINE = 3e12 / CRITEO_1TB_LINES
# An output row: label (bool), 13 float16 numericals, 26 ids of their cardinality's dtype (int32 at most).
NUM_NUMERICALS, NUM_CATEGORICALS = 13, 26
# A kept value in memory: its uint64 value and int32 id (duckdb_pipeline.Dictionary).
DICTIONARY_BYTES_PER_VALUE = 8 + 4

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_bytes(limit: Optional[str]) -> int:
    """A DuckDB memory limit such as '8GB' or '512MiB' in bytes; None: DuckDB's default, 80% of RAM."""
    if not limit:
        return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    number = limit.strip().lower()
    digits = number.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = number[len(digits):].strip() or "b"
    if unit not in _UNITS or not digits:
        raise ValueError(f"--memory_limit {limit!r} is not a size such as 8GB or 512MiB")
    return int(float(digits) * _UNITS[unit])


def estimate_lines(paths: Sequence[str], sample_bytes: int = 1 << 20) -> int:
    """Lines in the files, from the mean line length of each file's first `sample_bytes`."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            head = f.read(sample_bytes)
        per_line = len(head) / max(head.count(b"\n"), 1)
        total += int(os.path.getsize(path) / max(per_line, 1))
    return total


def _fit(points: Tuple[float, float]) -> Tuple[float, float]:
    """(fixed, per_line) of the line through the two measured sizes."""
    per_line = (points[1] - points[0]) / (MEASURED_LINES[1] - MEASURED_LINES[0])
    return points[0] - per_line * MEASURED_LINES[0], per_line


def stage_seconds(engine: str, lines: int, cores: int, cluster_cores: Optional[int] = None,
                  last_day_share: float = MEASURED_LAST_DAY_SHARE) -> Dict[str, float]:
    """Each stage's expected seconds for `lines` (the last day holding `last_day_share` of them) on
    `cores` cores per machine and `cluster_cores` executor cores in all (Spark; default `cores`).
    Start-up keeps its larger measured value."""
    available = {"machine": cores, "cluster": cluster_cores or cores, "serial": MEASURED_CORES}
    share = {stage: last_day_share / MEASURED_LAST_DAY_SHARE for stage in LAST_DAY_STAGES}
    share["train"] = (1 - last_day_share) / (1 - MEASURED_LAST_DAY_SHARE)
    seconds = {}
    for stage, points in MEASURED_STAGE_SECONDS[engine].items():
        scaling = STAGE_SCALING[engine][stage]
        if scaling == "fixed":
            seconds[stage] = max(points)
            continue
        fixed, per_line = _fit(points)
        seconds[stage] = max(fixed, 0.0) + per_line * share.get(stage, 1.0) * lines * MEASURED_CORES / available[scaling]
    return seconds


def output_bytes_per_row(cardinalities: Optional[Sequence[int]] = None) -> int:
    """Bytes of one row of the split-binary output; without cardinalities, every id as int32 (the most)."""
    if cardinalities is None:
        id_bytes = 4 * NUM_CATEGORICALS
    else:
        from recsys.data.feature_spec import get_categorical_feature_type
        id_bytes = sum({"int8": 1, "int16": 2, "int32": 4}[get_categorical_feature_type(c)] for c in cardinalities)
    return 1 + 2 * NUM_NUMERICALS + id_bytes


@dataclass(frozen=True)
class Estimate:
    """One run's expected cost. `peak_memory`: bytes per machine, None for a Spark cluster (its
    executors use the memory they are given and spill beyond); `spills`: DuckDB's parsed table
    goes to disk; `in_memory_need`: the bytes DuckDB would hold to keep everything in memory."""

    engine: str
    lines: int
    seconds: float
    stages: Dict[str, float]
    peak_disk: int
    peak_memory: Optional[int]
    spills: bool
    in_memory_need: int


def _rss_fit(engine: str) -> Tuple[float, float]:
    """(fixed, per_line) bytes of resident memory. Where the larger run measured less (a JVM grows its
    heap towards --driver-memory as it likes, not with the lines), the larger measurement, flat."""
    points = MEASURED_PEAK_RSS_MIB[engine]
    fixed, per_line = _fit(points)
    if per_line < 0:
        fixed, per_line = max(points), 0.0
    return fixed * 2**20, per_line * 2**20


def estimate(engine: str, lines: int, input_bytes: int, last_day_bytes: int, cores: int,
             cluster_cores: Optional[int] = None, memory_limit: Optional[int] = None,
             cardinalities: Optional[Sequence[int]] = None) -> Estimate:
    """The cost of preprocessing `lines` lines (`input_bytes` on disk, the last day `last_day_bytes`).

    Disk, at its peak, beside the input: DuckDB: the output, and the parsed table
    (PARSED_BYTES_PER_LINE) when it does not fit a third of `memory_limit` (the pipeline's rule).
    Spark: the larger of its jobs (a copy of the last day in halves, the shuffle scratch at the
    reference's 3 TB per Criteo 1TB, the parquet output at most PACKED_BYTES_PER_ROW a row) and
    the conversion (the parquet output, the packed rows, the output).
    Memory per machine: DuckDB: the measured resident-memory line (fixed + per line) when the
    table stays in memory, else `memory_limit` (it spills beyond). Spark on one machine: its own
    measured line, at most `memory_limit`; a cluster: None.
    `memory_limit`: DuckDB's memory limit (default 80% of this machine's RAM)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: use {' or '.join(ENGINES)}")
    stages = stage_seconds(engine, lines, cores, cluster_cores, last_day_bytes / max(input_bytes, 1))
    output = lines * output_bytes_per_row(cardinalities)
    fixed, per_line = _rss_fit(engine)
    in_memory_need = int(fixed + per_line * lines)
    limit = memory_bytes(None) if memory_limit is None else memory_limit
    if engine == "duckdb":
        spills = lines * PARSED_BYTES_PER_LINE >= limit // 3
        peak_disk = input_bytes + output + (lines * PARSED_BYTES_PER_LINE if spills else 0)
        peak_memory: Optional[int] = limit if spills else in_memory_need
    else:
        spills = False
        parquet = lines * PACKED_BYTES_PER_ROW
        jobs = last_day_bytes + int(lines * SHUFFLE_BYTES_PER_LINE) + parquet
        conversion = parquet + lines * PACKED_BYTES_PER_ROW + output
        peak_disk = input_bytes + max(jobs, conversion)
        peak_memory = None if cluster_cores and cluster_cores > cores else min(in_memory_need, limit)
    return Estimate(engine, lines, sum(stages.values()), stages, peak_disk, peak_memory, spills, in_memory_need)


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e6:.2f} MB"


def _duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def summary_line(e: Estimate, num_days: int, cores: int, cluster_cores: Optional[int] = None) -> str:
    """The one line prepare_dataset.sh prints before it starts."""
    where = f"{cores} cores" if not cluster_cores or cluster_cores == cores else f"{cluster_cores} executor cores"
    memory = "the executors' memory (it spills beyond)" if e.peak_memory is None else _size(e.peak_memory)
    if e.spills:
        memory += " (its limit; the parsed table spills to disk)"
    return (f"estimate: {e.lines:,} lines ({num_days} days) on {where} with {e.engine}: about "
            f"{_duration(e.seconds)}, peak disk {_size(e.peak_disk)}, peak memory {memory} "
            f"(measured rates: preproc/estimate.py)")


def criteo_t15_cardinalities() -> List[int]:
    """Criteo 1TB's cardinalities at frequency threshold 15 (reference §4.12), kept values + 1."""
    from recsys.data.feature_spec import CRITEO_VARIANTS
    return list(CRITEO_VARIANTS["criteo_t15_synthetic"])


def criteo1tb_rows(machine_cores: int = 128, clusters: Sequence[int] = (8, 32)) -> List[Tuple[str, Estimate]]:
    """Criteo 1TB at frequency threshold 15 (the reference's cardinalities) on one machine of
    `machine_cores` cores with DuckDB (its memory limit taken as 1 TB: it spills either way) and
    on Spark clusters of `clusters` such machines."""
    cardinalities = criteo_t15_cardinalities()
    common = dict(lines=CRITEO_1TB_LINES, input_bytes=CRITEO_1TB_BYTES,
                  last_day_bytes=CRITEO_1TB_BYTES // CRITEO_1TB_DAYS, cores=machine_cores, cardinalities=cardinalities)
    rows = [(f"1 machine, {machine_cores} cores, DuckDB", estimate("duckdb", memory_limit=10**12, **common))]
    for machines in clusters:
        rows.append((f"Spark, {machines} machines ({machines * machine_cores} cores)",
                     estimate("spark", cluster_cores=machines * machine_cores, **common)))
    return rows


def criteo1tb_table() -> str:
    """docs/preprocessing.md's table (markdown)."""
    lines = ["| setup | hours | slowest stage | peak disk | peak memory per machine | DuckDB in memory would need |",
             "|---|---|---|---|---|---|"]
    for name, e in criteo1tb_rows():
        slowest = max(e.stages, key=e.stages.get)
        memory = ("its limit (spills)" if e.spills else _size(e.peak_memory)) if e.peak_memory is not None \
            else "its executors' (spills)"
        need = _size(e.in_memory_need) if e.engine == "duckdb" else "-"
        lines.append(f"| {name} | {e.seconds / 3600:.2f} | {slowest} ({e.stages[slowest] / 3600:.2f} h) | "
                     f"{_size(e.peak_disk)} | {memory} | {need} |")
    cardinalities = criteo_t15_cardinalities()
    kept = sum(cardinalities) - len(cardinalities)
    row = output_bytes_per_row(cardinalities)
    lines += ["", f"Output: {row} bytes a row, {_size(CRITEO_1TB_LINES * row)}; dictionaries: {kept:,} kept values, "
                  f"{_size(kept * DICTIONARY_BYTES_PER_VALUE)} in memory."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--criteo1tb", action="store_true", help="print the Criteo 1TB table of the docs")
    parser.add_argument("--input_folder", help="folder holding day_0 .. day_<N-1>")
    parser.add_argument("--num_days", type=int, default=24)
    parser.add_argument("--engine", choices=ENGINES, default="duckdb")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores of this machine")
    parser.add_argument("--cluster_cores", type=int, help="Spark: executor cores of the whole cluster")
    parser.add_argument("--memory_limit", help="DuckDB's memory limit (8GB, 512MiB; default 80%% of RAM)")
    args = parser.parse_args(argv)
    if args.criteo1tb:
        print(criteo1tb_table())
        return 0
    if not args.input_folder:
        parser.error("give --input_folder (or --criteo1tb)")
    paths = [os.path.join(args.input_folder, f"day_{day}") for day in range(args.num_days)]
    try:
        limit = memory_bytes(args.memory_limit) if args.memory_limit else None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    e = estimate(args.engine, estimate_lines(paths), sum(os.path.getsize(p) for p in paths),
                 os.path.getsize(paths[-1]), args.cores, args.cluster_cores, limit)
    print(summary_line(e, args.num_days, args.cores, args.cluster_cores))
    return 0


if __name__ == "__main__":
    sys.exit(main())

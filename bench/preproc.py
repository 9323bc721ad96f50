"""Throughput of the CPU preprocessing pipeline (preproc/prepare_dataset.sh CPU) in local mode.

For 1x and 4x the data (NUM_DAYS days of tests/criteo_synth.py lines each, 4x = 4 times the lines
per day), it generates the day files once into a scratch folder (not timed), then times
`prepare_dataset.sh CPU <threshold>` end to end on the wall clock: verification, the four Spark
jobs (each with its own JVM start), the parquet -> binary conversion and the split into the final
layout. Spark runs as local[2] (TOTAL_CORES=2) with the default JVM flags (no quick-JIT test flag).

Reported per size: input lines, seconds, lines/s, lines/s/core (cores = the 2 Spark local cores),
CPU seconds of the pipeline's processes, the seconds of each stage (from the markers the scripts
print, time-stamped as they arrive), and the 1-, 5- and 15-minute load averages before and after
the run (the machine is shared: numbers are noisy). Then the 4x/1x time ratio against the bound of
issue 7 (4x the data in no more than 4.5x the time).

The default size, 4 days x 150,000 lines (600,000 lines; 2.4 million at 4x, about 620 MB), keeps
the whole run near 12 minutes on a 2-core machine while data work, not the four JVM/Spark
start-ups (about 20-30 s each), is a large part of the 1x time. Each size's scratch folder is
removed after its run. Writes bench/results/preproc.json and prints
a table. Usage: python bench/preproc.py [--quick] [--lines_per_day N] [--threshold T]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
RESULTS = os.path.join(REPO, "bench", "results", "preproc.json")
SCRIPT = os.path.join(REPO, "preproc", "prepare_dataset.sh")

NUM_DAYS = 4
CORES = 2
SCALE = 4
MAX_RATIO = 4.5
SEED = 0

# A stage starts when the scripts print its marker and ends at the next stage's marker; "train"
# includes the head/tail split of the last day's file, "to_binary" is parquet_to_binary.py and
# "split_dataset" is split_dataset.py plus the final rename.
STAGE_MARKERS: List[Tuple[str, "re.Pattern[str]"]] = [
    ("dictionary", re.compile(r"^\+ spark-submit .*--mode generate_models")),
    ("train", re.compile(r"^\+ spark-submit .*--output_ordering total_random")),
    ("test", re.compile(r"^\+ spark-submit .*/temp/test ")),
    ("validation", re.compile(r"^\+ spark-submit .*/temp/validation ")),
    ("to_binary", re.compile(r"^Spark output complete")),
    ("split_dataset", re.compile(r"rows -> .*/packed/<split>_data\.bin")),
    ("end", re.compile(r"^Dataset ready")),
]


def _write_day(task: Tuple[str, int, int]) -> int:
    """Worker: one day file of criteo_synth lines (same content as criteo_synth.write_days); returns bytes."""
    import criteo_synth

    directory, day, lines_per_day = task
    text = "\n".join(criteo_synth.good_lines(lines_per_day, day, SEED)) + "\n"
    with open(os.path.join(directory, f"day_{day}"), "w") as f:
        f.write(text)
    return len(text)


def generate_days(directory: str, lines_per_day: int) -> int:
    """day_0 .. day_{NUM_DAYS-1} into `directory`, two days at a time; returns the total bytes."""
    os.makedirs(directory, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(CORES) as pool:
        return sum(pool.map(_write_day, [(directory, day, lines_per_day) for day in range(NUM_DAYS)]))


def pipeline_environment(scratch: str) -> Dict[str, str]:
    """The test suite's invocation (venv first on PATH, every path under `scratch`), without quick JIT."""
    env = dict(os.environ)
    venv_bin = os.path.join(REPO, ".venv", "bin")
    python = os.path.join(venv_bin, "python")
    env["PATH"] = os.pathsep.join([venv_bin, os.path.dirname(sys.executable), env.get("PATH", "")])
    env.pop("SPARK_DRIVER_JAVA_OPTIONS", None)
    env.update(download_dir=os.path.join(scratch, "raw"), spark_output_path=os.path.join(scratch, "spark"),
               conversion_intermediate_dir=os.path.join(scratch, "intermediate"),
               final_output_dir=os.path.join(scratch, "final"), SPARK_LOCAL_DIRS=os.path.join(scratch, "spark_tmp"),
               NUM_DAYS=str(NUM_DAYS), TOTAL_CORES=str(CORES), PARALLEL_JOBS=str(CORES),
               PYTHON=python if os.path.exists(python) else sys.executable, PYTHONUNBUFFERED="1")
    return env


def stage_seconds(marks: Dict[str, float], total: float) -> Dict[str, float]:
    """Seconds between consecutive markers that appeared; "startup" is from the start to the first one."""
    found = [(name, marks[name]) for name, _ in STAGE_MARKERS if name in marks]
    if not found:
        return {}
    stages = {"startup": found[0][1]}
    for (name, start), (_, stop) in zip(found, found[1:] + [("", total)]):
        if name != "end":
            stages[name] = stop - start
    return stages


def run_pipeline(scratch: str, threshold: str) -> dict:
    """prepare_dataset.sh CPU <threshold>, timed; output lines are time-stamped as they arrive."""
    env = pipeline_environment(scratch)
    load_before = os.getloadavg()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(["bash", SCRIPT, "CPU", threshold], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1)
    marks: Dict[str, float] = {}
    tail: List[str] = []
    for line in process.stdout:
        now = time.perf_counter() - start
        for name, pattern in STAGE_MARKERS:
            if name not in marks and pattern.search(line):
                marks[name] = now
        tail = (tail + [line])[-60:]
    returncode = process.wait()
    seconds = time.perf_counter() - start
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    if returncode != 0:
        raise SystemExit(f"prepare_dataset.sh failed (exit {returncode}):\n{''.join(tail)}")
    cpu = (children_after.ru_utime - children_before.ru_utime) + (children_after.ru_stime - children_before.ru_stime)
    return {"seconds": seconds, "cpu_seconds": cpu, "stage_seconds": stage_seconds(marks, seconds),
            "load_average_before": list(load_before), "load_average_after": list(load_after)}


def measure(lines_per_day: int, threshold: str) -> dict:
    """Generate (untimed), run the pipeline (timed), check the line count, remove everything."""
    scratch = tempfile.mkdtemp(prefix="bench_preproc_")
    try:
        start = time.perf_counter()
        input_bytes = generate_days(os.path.join(scratch, "raw"), lines_per_day)
        generation = time.perf_counter() - start
        run = run_pipeline(scratch, threshold)
        with open(os.path.join(scratch, "final", "preprocessing_summary.json")) as f:
            summary = json.load(f)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = NUM_DAYS * lines_per_day
    if summary["total"]["input_lines"] != lines:
        raise SystemExit(f"the pipeline counted {summary['total']['input_lines']} input lines, {lines} were generated")
    lines_per_s = lines / run["seconds"]
    return {"num_days": NUM_DAYS, "lines_per_day": lines_per_day, "input_lines": lines, "input_bytes": input_bytes,
            "output_rows": summary["total"]["rows"], "rejected_lines": summary["total"]["rejected_lines"],
            "sum_of_cardinalities": sum(summary["cardinalities"]),
            "generation_seconds": generation, **run, "lines_per_s": lines_per_s,
            "lines_per_s_per_core": lines_per_s / CORES, "cpu_utilisation_cores": run["cpu_seconds"] / run["seconds"]}


def versions() -> Dict[str, Optional[str]]:
    def first_line(command: List[str]) -> Optional[str]:
        try:
            out = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        text = (out.stdout or out.stderr).strip()
        return text.splitlines()[0] if text else None

    env = pipeline_environment(tempfile.gettempdir())
    return {"commit": first_line(["git", "rev-parse", "HEAD"]), "java": first_line(["java", "-version"]),
            "pyspark": first_line([env["PYTHON"], "-c", "import pyspark; print(pyspark.__version__)"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (10,000 lines per day at 1x)")
    parser.add_argument("--lines_per_day", type=int, default=None, help="lines per day at 1x (default 150,000)")
    parser.add_argument("--threshold", default="15", help="frequency threshold passed to the script (default 15)")
    args = parser.parse_args()
    lines_per_day = args.lines_per_day or (10_000 if args.quick else 150_000)

    runs = []
    for scale in (1, SCALE):
        runs.append(dict(scale=scale, **measure(scale * lines_per_day, args.threshold)))
        r = runs[-1]
        print(f"{scale}x: {r['input_lines']} lines in {r['seconds']:.1f} s", flush=True)
    ratio = runs[1]["seconds"] / runs[0]["seconds"]
    result = {"pipeline": "preproc/prepare_dataset.sh CPU " + args.threshold, "quick": args.quick,
              "spark_master": f"local[{CORES}]", "cores": CORES, "num_days": NUM_DAYS, "machine_cpus": os.cpu_count(),
              "threshold": args.threshold, **versions(), "runs": runs,
              "time_ratio_4x_over_1x": ratio, "max_time_ratio": MAX_RATIO, "linear": ratio <= MAX_RATIO,
              "command": " ".join(["python", "bench/preproc.py", *sys.argv[1:]])}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=1)

    print(f"{'scale':>5} {'lines':>10} {'MB':>7} {'seconds':>8} {'lines/s':>9} {'lines/s/core':>12} "
          f"{'CPU s':>7} {'cores used':>10} {'load before':>16} {'load after':>16}")
    for r in runs:
        load = lambda values: "/".join(f"{v:.1f}" for v in values)  # noqa: E731
        print(f"{str(r['scale']) + 'x':>5} {r['input_lines']:>10} {r['input_bytes'] / 1e6:>7.0f} {r['seconds']:>8.1f} "
              f"{r['lines_per_s']:>9.0f} {r['lines_per_s_per_core']:>12.0f} {r['cpu_seconds']:>7.0f} "
              f"{r['cpu_utilisation_cores']:>10.2f} {load(r['load_average_before']):>16} "
              f"{load(r['load_average_after']):>16}")
    names = [name for name in ["startup"] + [n for n, _ in STAGE_MARKERS] if name != "end"]
    print("stage seconds: " + "  ".join(f"{n}" for n in names))
    for r in runs:
        print(f"{str(r['scale']) + 'x':>5}: " + "  ".join(f"{n}={r['stage_seconds'].get(n, float('nan')):.1f}"
                                                       for n in names))
    print(f"4x/1x time ratio {ratio:.2f} (bound {MAX_RATIO}): {'linear' if result['linear'] else 'NOT linear'}")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()

"""Throughput of both preprocessing engines (preproc/prepare_dataset.sh --engine duckdb|spark CPU),
each beside a plain job of its own engine doing the same transform on the same lines (issue 40).

For 1x and 4x the data (NUM_DAYS days of synthetic_criteo.py lines each, 4x = 4 times the lines
per day), it generates the day files once per size into a scratch folder (not timed), then, per
engine and `--repeats` times, one after the other, times on the wall clock:
  * the engine: `prepare_dataset.sh --engine E CPU <threshold>` end to end: the embedded DuckDB
    engine (one process) or Spark (one application, local[2], default JVM flags) with the parquet ->
    binary conversion and split that follow it; every line checked and accounted for;
  * its plain peer (PLAIN_DUCKDB, PLAIN_SPARK): one script written the obvious way by a user of that
    engine, a fresh process: typed CSV read, per-column counts over all days, ids by descending
    count (ties by value), the log rule, 26 left joins, train ordered by the same md5 key, the last
    day's halves as test and validation, parquet out; no line accounting.
Both use 2 cores. The fastest run of each counts; engine/plain is the ratio of their lines/s.

Reported per engine and size: input lines, seconds, lines/s, the plain job's seconds and lines/s,
engine/plain, CPU seconds, the peak resident memory of the largest process (the JVM or the Python
process running DuckDB), the seconds of each stage (from the markers the scripts print,
time-stamped as they arrive), and the load averages before and after the run (on a shared machine
the numbers are noisy: compare engine and plain only within one run). Then each engine's 4x/1x
time ratio against the bound of issue 40 (4x the data in at most 4.2x the time), the goals (engine
>= 0.8x its plain peer at both sizes; Spark >= 20,000 lines/s at 4x; the embedded engine >= 160,000
lines/s at 4x), and whether both engines wrote the same dataset (sha256 of every file but the
summary).

The default size is 4 days x 150,000 lines at 1x (2.4 million lines, about 620 MB, at 4x). Each
size's scratch folder is removed after its runs. Writes bench/results/preproc.json and prints a
table. Usage: python -m bench.preproc [--quick] [--lines_per_day N] [--threshold T] [--engines E,E]
[--repeats R]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from recsys.runtime.cpu_settings import cpu_model_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "preproc.json")
SCRIPT = os.path.join(REPO, "preproc", "prepare_dataset.sh")

NUM_DAYS = 4
CORES = 2
SCALE = 4
MAX_RATIO = 4.2  # 4x the lines in at most 4.2x the time (issue 40)
MIN_OVER_PLAIN = 0.8  # each engine's lines/s against its plain peer's, same lines, same run (issue 40)
SHUFFLE_SEED = 12345
SEED = 0
ENGINES = ("duckdb", "spark")
GOALS = {"duckdb": 160_000, "spark": 20_000}  # lines/s end to end at 4x (issues 16 and 40)

# A stage starts when the scripts print its marker and ends at the next stage's marker ("startup"
# is what comes before the first). Spark: "to_binary" is parquet_to_binary.py, "split_dataset" is
# split_dataset.py plus the final rename; the embedded engine writes the final layout itself.
STAGE_MARKERS: Dict[str, List[Tuple[str, "re.Pattern[str]"]]] = {
    engine: [(stage, re.compile(rf"^\[{engine}\] stage {stage}: "))
             for stage in (("parse",) if engine == "duckdb" else ()) + ("dictionary", "train", "test", "validation")]
    + ([("to_binary", re.compile(r"^Spark output complete")),
        ("split_dataset", re.compile(r"rows -> .*/packed/<split>_data\.bin"))] if engine == "spark" else [])
    + [("end", re.compile(r"^Dataset ready"))]
    for engine in ENGINES}


# The plain peers: the same transform written the obvious way by a user of each engine (typed CSV
# read, one grouped count per column or one exploded count, ids by a window, 26 left joins, the md5
# order, parquet out), no line accounting. Arguments: input folder, days, threshold, seed, output
# folder, threads, scratch folder. Their rows equal the engines' (checked when they were written).
PLAIN_DUCKDB = r"""
import sys, duckdb
src, num_days, limit, seed, out, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
last = num_days - 1
ints = [f"i{i}" for i in range(1, 14)]
cats = [f"c{i}" for i in range(1, 27)]
columns = {"label": "INTEGER", **{c: "BIGINT" for c in ints}, **{c: "VARCHAR" for c in cats}}
con = duckdb.connect()
con.execute(f"SET threads = {threads}")
read = lambda day: f"read_csv('{src}/day_{day}', delim='\t', header=false, quote='', escape='', columns={columns})"
con.execute("CREATE TABLE train AS " + " UNION ALL ".join(f"SELECT {d} AS day, * FROM {read(d)}" for d in range(last)))
con.execute(f"CREATE TABLE last AS SELECT row_number() OVER () AS line, * FROM {read(last)}")
half = con.execute("SELECT count(*) // 2 FROM last").fetchone()[0]
for c in cats:
    con.execute(f'''CREATE TABLE d_{c} AS SELECT v, row_number() OVER (ORDER BY n DESC, xor(v, 9223372036854775808::UBIGINT)) AS id
        FROM (SELECT ('0x' || {c})::UBIGINT AS v, count(*) AS n FROM (SELECT {c} FROM train UNION ALL SELECT {c} FROM last)
              WHERE {c} IS NOT NULL GROUP BY 1) WHERE n >= {limit}''')
values = ", ".join(["t.label", *[f"CAST(coalesce(ln(greatest(t.{i}, -2) + 3), 0) AS FLOAT) AS {i}" for i in ints],
                    *[f"coalesce(d_{c}.id, 0)::INTEGER AS {c}" for c in cats]])
joins = " ".join(f"LEFT JOIN d_{c} ON d_{c}.v = ('0x' || t.{c})::UBIGINT" for c in cats)
text = ", ".join(f"coalesce(t.{x}::VARCHAR, '')" for x in ["label", *ints, *cats])
con.execute(f"COPY (SELECT {values} FROM train t {joins} ORDER BY md5(concat_ws(E'\\t', '{seed}', t.day, {text}))) "
            f"TO '{out}/train.parquet' (FORMAT parquet)")
for split, where in (("test", f"t.line <= {half}"), ("validation", f"t.line > {half}")):
    con.execute(f"COPY (SELECT {values} FROM last t {joins} WHERE {where} ORDER BY t.line) TO '{out}/{split}.parquet' (FORMAT parquet)")
"""

PLAIN_SPARK = r"""
import sys
from pyspark.sql import SparkSession, Window, functions as F
src, num_days, limit, seed, out, threads, scratch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7]
last = num_days - 1
ints = [f"i{i}" for i in range(1, 14)]
cats = [f"c{i}" for i in range(1, 27)]
spark = (SparkSession.builder.master(f"local[{threads}]").config("spark.driver.memory", "8g")
         .config("spark.sql.shuffle.partitions", 4 * threads).config("spark.local.dir", scratch)
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("WARN")
schema = ", ".join(["label INT", *[f"{i} LONG" for i in ints], *[f"{c} STRING" for c in cats]])
read = lambda day: spark.read.csv(f"{src}/day_{day}", sep="\t", schema=schema).withColumn("day", F.lit(day))
train = read(0)
for day in range(1, last):
    train = train.unionByName(read(day))
test_day = read(last).withColumn("pos", F.monotonically_increasing_id())
values = train.select(cats).unionByName(test_day.select(cats))
counts = (values.select(F.explode(F.array(*[F.struct(F.lit(c).alias("col"), F.col(c).alias("hex")) for c in cats])).alias("p"))
          .where(F.col("p.hex").isNotNull())
          .groupBy(F.col("p.col").alias("col"), F.conv(F.col("p.hex"), 16, -10).cast("long").alias("v")).count()
          .where(F.col("count") >= limit))
ids = counts.select("col", "v", F.row_number().over(Window.partitionBy("col").orderBy(F.desc("count"), "v")).alias("id")).cache()

def transform(rows):
    for c in cats:
        rows = rows.join(F.broadcast(ids.where(F.col("col") == c).select(F.col("v").alias(f"v_{c}"), F.col("id").alias(f"id_{c}"))),
                         F.conv(F.col(c), 16, -10).cast("long") == F.col(f"v_{c}"), "left")
    return rows

def output(rows):
    return rows.select("label", *[F.coalesce(F.log(F.greatest(F.col(i), F.lit(-2)) + 3), F.lit(0.0)).cast("float").alias(i) for i in ints],
                       *[F.coalesce(F.col(f"id_{c}"), F.lit(0)).cast("int").alias(c) for c in cats])

text = F.concat_ws("\t", F.lit(seed), F.col("day").cast("string"), *[F.coalesce(F.col(x).cast("string"), F.lit("")) for x in ["label", *ints, *cats]])
output(transform(train.withColumn("key", F.md5(text))).orderBy("key")).write.parquet(f"{out}/train")
numbered = test_day.withColumn("line", F.row_number().over(Window.orderBy("pos")))
half = test_day.count() // 2
for split, where in (("test", F.col("line") <= half), ("validation", F.col("line") > half)):
    output(transform(numbered.where(where)).orderBy("line")).write.parquet(f"{out}/{split}")
spark.stop()
"""
PLAIN_JOBS = {"duckdb": PLAIN_DUCKDB, "spark": PLAIN_SPARK}


def _write_day(task: Tuple[str, int, int]) -> int:
    """Worker: one day file of synthetic_criteo lines (same content as synthetic_criteo.write_days); returns bytes."""
    from preproc import synthetic_criteo

    directory, day, lines_per_day = task
    text = "\n".join(synthetic_criteo.good_lines(lines_per_day, day, SEED)) + "\n"
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
               PYTHON=python if os.path.exists(python) else sys.executable, PYTHONUNBUFFERED="1",
               RANDOM_SEED=str(SHUFFLE_SEED))
    return env


def stage_seconds(engine: str, marks: Dict[str, float], total: float) -> Dict[str, float]:
    """Seconds between consecutive markers that appeared; "startup" is from the start to the first one."""
    found = [(name, marks[name]) for name, _ in STAGE_MARKERS[engine] if name in marks]
    if not found:
        return {}
    stages = {"startup": found[0][1]}
    for (name, start), (_, stop) in zip(found, found[1:] + [("", total)]):
        if name != "end":
            stages[name] = stop - start
    return stages


def run_pipeline(scratch: str, engine: str, threshold: str) -> dict:
    """prepare_dataset.sh --engine <engine> CPU <threshold>, timed; output lines are time-stamped as
    they arrive. The CPU time and peak memory come from wait4 on the script (its whole process tree)."""
    env = pipeline_environment(scratch)
    load_before = os.getloadavg()
    start = time.perf_counter()
    process = subprocess.Popen(["bash", SCRIPT, "--engine", engine, "CPU", threshold], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    marks: Dict[str, float] = {}
    tail: List[str] = []
    for line in process.stdout:
        now = time.perf_counter() - start
        for name, pattern in STAGE_MARKERS[engine]:
            if name not in marks and pattern.search(line):
                marks[name] = now
        tail = (tail + [line])[-60:]
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    load_after = os.getloadavg()
    if process.returncode != 0:
        raise SystemExit(f"prepare_dataset.sh --engine {engine} failed (exit {process.returncode}):\n{''.join(tail)}")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024, "stage_seconds": stage_seconds(engine, marks, seconds),
            "load_average_before": list(load_before), "load_average_after": list(load_after)}


def dataset_digest(final: str) -> str:
    """sha256 over every file of a dataset but the summary (which names the engine), in path order."""
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(final)):
        dirs.sort()
        for name in sorted(files):
            if name != "preprocessing_summary.json":
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, final).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def run_plain(scratch: str, engine: str, threshold: int) -> float:
    """The plain peer of `engine` on the day files in `scratch`/raw, timed on the wall clock (a fresh
    process, as the engine's); its output is removed."""
    env = pipeline_environment(scratch)
    out = os.path.join(scratch, "plain")
    os.makedirs(out)
    start = time.perf_counter()
    result = subprocess.run([env["PYTHON"], "-c", PLAIN_JOBS[engine], os.path.join(scratch, "raw"), str(NUM_DAYS),
                             str(threshold), env["RANDOM_SEED"], out, str(CORES), os.path.join(scratch, "plain_tmp")],
                            env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(os.path.join(scratch, "plain_tmp"), ignore_errors=True)
    if result.returncode:
        raise SystemExit(f"the plain {engine} job failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return seconds


def measure(lines_per_day: int, threshold: str, engines: List[str], repeats: int) -> Dict[str, dict]:
    """Generate (untimed), then per engine `repeats` times the engine and its plain peer, one after
    the other (timed), check the line count, remove everything. The fastest run of each counts."""
    scratch = tempfile.mkdtemp(prefix="bench_preproc_")
    results = {}
    lines = NUM_DAYS * lines_per_day
    try:
        start = time.perf_counter()
        input_bytes = generate_days(os.path.join(scratch, "raw"), lines_per_day)
        generation = time.perf_counter() - start
        for engine in engines:
            runs, plain = [], []
            for _ in range(repeats):
                work = os.path.join(scratch, engine)
                os.makedirs(work)
                os.symlink(os.path.join(scratch, "raw"), os.path.join(work, "raw"))
                run = run_pipeline(work, engine, threshold)
                with open(os.path.join(work, "final", "preprocessing_summary.json")) as f:
                    summary = json.load(f)
                run["dataset_sha256"] = dataset_digest(os.path.join(work, "final"))
                shutil.rmtree(work, ignore_errors=True)
                if summary["total"]["input_lines"] != lines:
                    raise SystemExit(f"{engine}: the pipeline counted {summary['total']['input_lines']} input lines, "
                                     f"{lines} were generated")
                runs.append(run)
                plain.append(run_plain(scratch, engine, int(threshold)))
                print(f"{engine}: {lines} lines: engine {run['seconds']:.1f} s, plain {plain[-1]:.1f} s", flush=True)
            run = min(runs, key=lambda r: r["seconds"])
            lines_per_s, plain_lines_per_s = lines / run["seconds"], lines / min(plain)
            results[engine] = {
                "num_days": NUM_DAYS, "lines_per_day": lines_per_day, "input_lines": lines, "input_bytes": input_bytes,
                "output_rows": summary["total"]["rows"], "rejected_lines": summary["total"]["rejected_lines"],
                "sum_of_cardinalities": sum(summary["cardinalities"]), "generation_seconds": generation, **run,
                "lines_per_s": lines_per_s, "lines_per_s_per_core": lines_per_s / CORES,
                "cpu_utilisation_cores": run["cpu_seconds"] / run["seconds"],
                "all_seconds": [r["seconds"] for r in runs], "plain_seconds": min(plain), "plain_all_seconds": plain,
                "plain_lines_per_s": plain_lines_per_s, "engine_over_plain": lines_per_s / plain_lines_per_s}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


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
            "pyspark": first_line([env["PYTHON"], "-c", "import pyspark; print(pyspark.__version__)"]),
            "duckdb": first_line([env["PYTHON"], "-c", "import duckdb; print(duckdb.__version__)"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (10,000 lines per day at 1x)")
    parser.add_argument("--lines_per_day", type=int, default=None, help="lines per day at 1x (default 150,000)")
    parser.add_argument("--threshold", default="15", help="frequency threshold passed to the script (default 15)")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma list of engines (default duckdb,spark)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each engine and its plain peer (the fastest counts)")
    args = parser.parse_args()
    if not args.threshold.isdigit():
        parser.error(f"--threshold must be one whole number (the plain jobs take no per-column limits), got {args.threshold!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    lines_per_day = args.lines_per_day or (10_000 if args.quick else 150_000)
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}: use {', '.join(ENGINES)}")

    by_scale = {scale: measure(scale * lines_per_day, args.threshold, engines, args.repeats) for scale in (1, SCALE)}
    runs = {engine: [dict(scale=scale, **by_scale[scale][engine]) for scale in (1, SCALE)] for engine in engines}
    summary = {}
    for engine, (small, large) in runs.items():
        ratio = large["seconds"] / small["seconds"]
        summary[engine] = {"time_ratio_4x_over_1x": ratio, "linear": ratio <= MAX_RATIO,
                           "lines_per_s_4x": large["lines_per_s"], "goal_lines_per_s": GOALS[engine],
                           "goal_met": large["lines_per_s"] >= GOALS[engine],
                           "engine_over_plain": {f"{r['scale']}x": r["engine_over_plain"] for r in (small, large)},
                           "over_plain_met": min(small["engine_over_plain"], large["engine_over_plain"]) >= MIN_OVER_PLAIN}
    same = {scale: len({r["dataset_sha256"] for r in by_scale[scale].values()}) == 1 for scale in (1, SCALE)}
    result = {"pipeline": "preproc/prepare_dataset.sh --engine <engine> CPU " + args.threshold, "quick": args.quick,
              "spark_master": f"local[{CORES}]", "cores": CORES, "num_days": NUM_DAYS, "machine_cpus": os.cpu_count(),
              "threshold": args.threshold, **versions(), "engines": runs, "summary": summary,
              "max_time_ratio": MAX_RATIO, "min_engine_over_plain": MIN_OVER_PLAIN,
              "cpu_model": cpu_model_name(), "repeats": args.repeats, "engines_wrote_the_same_dataset": all(same.values()) if len(engines) > 1 else None,
              "command": " ".join(["python", "bench/preproc.py", *sys.argv[1:]])}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=1)

    load = lambda values: "/".join(f"{v:.1f}" for v in values)  # noqa: E731
    print(f"{'engine':>7} {'scale':>5} {'lines':>10} {'MB':>6} {'seconds':>8} {'lines/s':>9} {'plain s':>8} "
          f"{'plain l/s':>9} {'e/plain':>7} {'CPU s':>7} {'peak MB':>8} {'load before':>15} {'load after':>15}")
    for engine, rows in runs.items():
        for r in rows:
            print(f"{engine:>7} {str(r['scale']) + 'x':>5} {r['input_lines']:>10} {r['input_bytes'] / 1e6:>6.0f} "
                  f"{r['seconds']:>8.1f} {r['lines_per_s']:>9.0f} {r['plain_seconds']:>8.1f} {r['plain_lines_per_s']:>9.0f} "
                  f"{r['engine_over_plain']:>7.2f} {r['cpu_seconds']:>7.0f} {r['peak_rss_mb']:>8.0f} "
                  f"{load(r['load_average_before']):>15} {load(r['load_average_after']):>15}")
    print("stage seconds (4x | 1x):")
    for engine, (small, large) in runs.items():
        names = ["startup"] + [n for n, _ in STAGE_MARKERS[engine] if n != "end"]
        print(f"{engine:>7}: " + "  ".join(f"{n}={large['stage_seconds'].get(n, float('nan')):.1f}"
                                             f"|{small['stage_seconds'].get(n, float('nan')):.1f}" for n in names))
    for engine, s in summary.items():
        print(f"{engine:>7}: 4x/1x time ratio {s['time_ratio_4x_over_1x']:.2f} (bound {MAX_RATIO}: "
              f"{'met' if s['linear'] else 'NOT met'}); {s['lines_per_s_4x']:,.0f} lines/s at 4x "
              f"(goal {s['goal_lines_per_s']:,}: {'met' if s['goal_met'] else 'NOT met'}); engine/plain "
              + " ".join(f"{v:.2f} at {k}" for k, v in s["engine_over_plain"].items())
              + f" (goal >= {MIN_OVER_PLAIN}: {'met' if s['over_plain_met'] else 'NOT met'})")
    print(f"CPU: {result['cpu_model']}, {CORES} cores; the load averages above show how busy the machine was")
    if len(engines) > 1:
        print(f"both engines wrote the same dataset: {result['engines_wrote_the_same_dataset']}")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()

"""The Wide & Deep preprocessing driver, the same for both engines: check the input files, run the
SQL of `sql.py` on the engine, account for every input line, and write the records (`records.py`)
into a new output folder built beside itself and renamed into place.

Output folder: `train/part-r-NNNNN`, `eval/part-r-NNNNN` (TFRecords of 4096-row Examples),
`metadata.json` (row counts, for the reader) and `preproc_summary.json` (every input line
accounted for: per file its lines by reason, per split its rows, its displays and those without a
clicked ad, which MAP@12 leaves out; the settings). Both engines write the same bytes in every file.
A header line repeated inside a file (a file pasted twice) is refused: its rows would count twice.
A stop signal removes the temporary folder (the entry point's `run_stopping_at_once`); one a killed
run left is removed by the next run.
"""
from __future__ import annotations

import math
import os
import shutil
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from recsys.runtime.safe_io import atomic_directory, remove_stale_temporaries
from wide_and_deep.outbrain_rules import ASPECTS, INPUT_FILES
from wide_and_deep.preprocessing import records, sql


class InputError(ValueError):
    """Bad input: the message names the file."""


def input_paths(input_dir: str) -> Dict[str, str]:
    """The input files (`<stem>.csv` in `input_dir`), each checked to exist and to start with its
    header line naming the expected columns."""
    paths = {}
    for stem, columns in INPUT_FILES.items():
        path = os.path.join(input_dir, f"{stem}.csv")
        if not os.path.isfile(path):
            raise InputError(f"{path}: input file not found (the Outbrain {stem}.csv is needed)")
        with open(path, "rb") as f:
            header = f.readline().rstrip(b"\r\n").decode("utf-8", errors="replace").split(",")
        missing = [c for c in columns if c not in header]
        if missing or header != list(columns):
            problem = f"missing column(s) {', '.join(missing)}" if missing else "columns in another order"
            raise InputError(f"{path}: {problem}; its header is {','.join(header)!r}, expected "
                             f"{','.join(columns)!r}")
        paths[stem] = path
    return paths


class DuckDBEngine:
    """The embedded engine: one in-process DuckDB database, tables in memory (spilling to
    `scratch_dir` under `memory_limit`)."""
    dialect = sql.DUCKDB

    def __init__(self, threads: Optional[int] = None, memory_limit: Optional[str] = None,
                 scratch_dir: Optional[str] = None) -> None:
        import duckdb
        self.error = duckdb.Error
        self.con = duckdb.connect()
        self.con.execute("SET preserve_insertion_order = true")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        if memory_limit:
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
        if scratch_dir:
            self.con.execute(f"SET temp_directory = '{scratch_dir}'")

    def lines(self, name: str, path: str) -> None:
        """Register a file's lines as view `name` (column `text`, '' for a blank line)."""
        quoted = "'" + path.replace("'", "''") + "'"
        self.con.execute(f"CREATE VIEW {name} AS SELECT coalesce(text, '') AS text FROM read_csv({quoted}, "
                         f"columns={{'text': 'VARCHAR'}}, delim=E'\\x01\\x02\\x03\\x04', quote='', escape='', "
                         f"header=false, auto_detect=false, strict_mode=false)")

    def table(self, name: str, select: str) -> None:
        self.con.execute(f"CREATE TEMP TABLE {name} AS {select}")

    def query(self, select: str) -> List[tuple]:
        return [tuple(row) for row in self.con.execute(select).fetchall()]

    def undecodable_lines(self, view: str) -> int:
        """Lines of a file view that were not UTF-8: none here, DuckDB's reader refuses such a file."""
        return 0

    def values(self, name: str, rows: Sequence[Tuple[str, Optional[float]]]) -> None:
        """A table `name` (aspect STRING, idf DOUBLE) of the given rows."""
        frame = pa.table({"aspect": pa.array([r[0] for r in rows], pa.string()),
                          "idf": pa.array([r[1] for r in rows], pa.float64())})
        self.con.register(f"{name}_arrow", frame)
        self.table(name, f"SELECT * FROM {name}_arrow")
        self.con.unregister(f"{name}_arrow")

    def batches(self, select: str, work_dir: str) -> Iterator[pa.RecordBatch]:
        """The rows of a SELECT, in its order."""
        yield from self.con.sql(select).to_arrow_reader(1 << 16)

    def close(self) -> None:
        self.con.close()


class SparkEngine:
    """The reference's engine: PySpark (local[*] unless SPARK_MASTER says otherwise; the driver's
    extra JVM options from SPARK_DRIVER_JAVA_OPTIONS), ANSI mode off and the session time zone UTC;
    results pass through ordered parquet files in `work_dir`."""
    dialect = sql.SPARK

    def __init__(self, threads: Optional[int] = None) -> None:
        from pyspark.sql import SparkSession
        from pyspark.errors import PySparkException
        self.error = PySparkException
        master = os.environ.get("SPARK_MASTER", f"local[{threads}]" if threads else "local[*]")
        builder = SparkSession.builder.master(master).appName("wide-and-deep-preprocessing")
        if os.environ.get("SPARK_DRIVER_JAVA_OPTIONS"):
            builder = builder.config("spark.driver.extraJavaOptions", os.environ["SPARK_DRIVER_JAVA_OPTIONS"])
        self.spark = (builder
                      .config("spark.sql.ansi.enabled", "false").config("spark.sql.session.timeZone", "UTC")
                      .config("spark.sql.shuffle.partitions", str(max(2, 2 * (threads or os.cpu_count() or 1))))
                      .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        self.spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))

    def lines(self, name: str, path: str) -> None:
        self.spark.read.text(path).withColumnRenamed("value", "text").createOrReplaceTempView(name)

    def table(self, name: str, select: str) -> None:
        self.spark.sql(select).cache().createOrReplaceTempView(name)

    def query(self, select: str) -> List[tuple]:
        return [tuple(row) for row in self.spark.sql(select).collect()]

    def undecodable_lines(self, view: str) -> int:
        """Lines of a file view that are not UTF-8. Spark keeps the bytes it read and decodes them
        (invalid sequences to U+FFFD) only where a function needs characters: a line's bytes survive
        a decode and re-encode unchanged exactly when they are valid (as preproc/spark_data_utils)."""
        return int(self.query(f"SELECT count(*) FROM {view} WHERE encode(text, 'UTF-8') <> CAST(text AS BINARY)")[0][0])

    def values(self, name: str, rows: Sequence[Tuple[str, Optional[float]]]) -> None:
        self.spark.createDataFrame(list(rows), "aspect STRING, idf DOUBLE").createOrReplaceTempView(name)

    def batches(self, select: str, work_dir: str) -> Iterator[pa.RecordBatch]:
        folder = os.path.join(work_dir, "rows")
        shutil.rmtree(folder, ignore_errors=True)
        self.spark.sql(select).write.parquet(folder)
        for part in sorted(p for p in os.listdir(folder) if p.startswith("part-")):
            yield from pq.ParquetFile(os.path.join(folder, part)).iter_batches(1 << 16)
        shutil.rmtree(folder)

    def close(self) -> None:
        self.spark.stop()


def make_engine(name: str, threads: Optional[int] = None):
    """The engine called `name` ('duckdb' or 'spark')."""
    if name == "duckdb":
        return DuckDBEngine(threads)
    if name == "spark":
        return SparkEngine(threads)
    raise ValueError(f"unknown engine {name!r} (duckdb or spark)")


def inverse_document_frequencies(rows: Sequence[tuple]) -> List[Tuple[str, Optional[float]]]:
    """(aspect, ln(ln(N / df))) from (aspect, df, N) rows, sorted by aspect; None where N = df
    (ln 0: the reference's NaN)."""
    return [(aspect, math.log(math.log(n / df)) if n > df else None) for aspect, df, n in sorted(rows)]


def repeated_header_line(path: str) -> int:
    """The 1-based number of the first line after the first that repeats `path`'s header line (0: none);
    read only once the engine has counted more than one header line, to name it."""
    with open(path, "rb") as f:
        header = f.readline().rstrip(b"\r\n")
        for number, line in enumerate(f, start=2):
            if line.rstrip(b"\r\n") == header:
                return number
    return 0


def _line_accounting(engine, stem: str, path: str) -> Dict[str, int]:
    counts = {sql.HEADER: 0, sql.MALFORMED: 0}
    counts.update({reason: 0 for reason in sql.FILE_REASONS.get(stem, ())})
    for reason, n in engine.query(sql.accounting_sql(stem)):
        counts["used" if reason is None else reason] = int(n)
    counts.setdefault("used", 0)
    counts["lines"] = sum(counts.values())
    return counts


def preprocess(engine, input_dir: str, output: str, seed: int = 0, num_train_files: int = 40,
               num_eval_files: int = 40, strict: bool = False) -> Dict[str, object]:
    """Preprocess the Outbrain CSVs of `input_dir` into a new folder `output`; returns the summary.
    Raises InputError for bad input (nothing is left at `output` then)."""
    if num_train_files < 1 or num_eval_files < 1:
        raise ValueError("the numbers of output files must be at least 1")
    paths = input_paths(input_dir)
    d = engine.dialect
    remove_stale_temporaries(output)  # a killed run's (a stop signal removes its own)
    with atomic_directory(output) as staging:
        for stem, path in paths.items():
            engine.lines(f"raw_{stem}", path)
        for (name, select), stem in zip(sql.parse_statements(d), paths):
            try:
                engine.table(name, select)
            except engine.error as error:
                text = str(error)
                reason = " (not UTF-8)" if "utf-8" in text.lower() else ""
                raise InputError(f"{paths[stem]}: cannot be read{reason}: {text.splitlines()[0]}") from None
            undecodable = engine.undecodable_lines(f"raw_{stem}")
            if undecodable:
                raise InputError(f"{paths[stem]}: cannot be read (not UTF-8): {undecodable} line(s) hold bytes "
                                 f"that are not UTF-8")
        lines = {stem: _line_accounting(engine, stem, path) for stem, path in paths.items()}
        for stem, counts in lines.items():
            if counts[sql.HEADER] > 1:
                raise InputError(f"{paths[stem]}: line {repeated_header_line(paths[stem])} repeats the header line "
                                 f"(two files pasted together?); its rows would count twice")
            if strict and counts[sql.MALFORMED]:
                raise InputError(f"{paths[stem]}: {counts[sql.MALFORMED]} malformed line(s) (wrong number of fields "
                                 f"or a field of the wrong form); without --strict they are counted and skipped")
        for stem, keys, where in sql.UNIQUE_KEYS:
            for *key, n in engine.query(sql.duplicate_sql(stem, keys, where)):
                raise InputError(f"{paths[stem]}: {keys} {', '.join(map(str, key))} occurs {n} times; "
                                 f"each must occur once")
        for _, stem in ASPECTS:
            engine.values(f"idf_{stem}", inverse_document_frequencies(engine.query(sql.aspect_frequency_sql(stem))))
        for name, select in sql.join_statements(d, seed):
            engine.table(name, select)
        clicks = {reason: 0 for reason in sql.FILE_REASONS["clicks_train"] + records.SPLITS}
        clicks.update({reason: int(n) for reason, n in engine.query(sql.click_accounting_sql())})
        lines["clicks_train"].pop("used")
        lines["clicks_train"].update(clicks)
        for split in records.SPLITS:
            if not clicks[split]:
                raise InputError(f"{paths['clicks_train']}: the {split} split is empty: no click line joined "
                                 f"with a kept event and a known ad falls in it")
        displays = {split: {"displays": 0, "without_click": 0} for split in records.SPLITS}
        for split, total, unclicked in engine.query(sql.display_accounting_sql()):
            displays[split] = {"displays": int(total), "without_click": int(unclicked or 0)}
        bound_values = engine.query(sql.count_bounds_sql())[0]
        bounds = {column: (float(bound_values[2 * i] or 0), float(bound_values[2 * i + 1] or 0))
                  for i, (_, column) in enumerate(sql.COUNTS)}
        work = os.path.join(staging, ".work")
        os.makedirs(work)
        files = {}
        for split in records.SPLITS:
            files[split] = records.write_split(os.path.join(staging, split),
                                               engine.batches(sql.split_sql(split == "eval"), work),
                                               clicks[split], num_train_files if split == "train" else num_eval_files,
                                               bounds)
        shutil.rmtree(work)
        summary = {"files": lines, "rows": {split: clicks[split] for split in records.SPLITS},
                   "displays": displays, "output_files": files, "seed": seed, "strict": strict, "count_bounds": bounds}
        records.write_json(os.path.join(staging, records.METADATA_NAME),
                           records.metadata(clicks["train"], clicks["eval"]))
        records.write_json(os.path.join(staging, records.SUMMARY_NAME), summary)
    return summary

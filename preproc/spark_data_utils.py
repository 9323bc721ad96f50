"""Criteo 1TB preprocessing on Spark (reference §5.3), one Spark application for the whole run:

  1. one pass over all days validates every line (criteo_rules.GOOD_LINE, one regular expression per
     line; the reason, bytes that are not UTF-8 first, then field by field, only for lines that fail it), counts lines and rejections per
     day and reason, and counts every categorical value of the valid lines in one grouped
     aggregation over all 26 columns; the kept values get ids by a range-partitioned sort and
     per-partition offsets (no single-partition window) and are written to `models/`;
  2. train (days 0..N-2): the valid lines, ids applied by joins (broadcast for small dictionaries),
     written in the order of the seeded md5 key of criteo_rules.py: rows are partitioned into key
     ranges by a computed partition number and sorted within each, so the part files concatenate
     into one globally sorted sequence (no sampling job);
  3. test and validation (the halves of the last day, split beforehand by the driver script) in
     input order, partitioned the same way by file block.

Every per-row step is a Spark SQL expression (no Python UDFs) so the JVM does all per-row work; the
rules, and so the output bytes, are those of the embedded engine (duckdb_pipeline.py).

Outputs are checked before Spark starts (never an input; an existing one only with
`--write_mode overwrite`). Local output folders are written beside themselves and renamed into
place, so a failed job leaves neither part files nor a deleted previous output.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, DataFrameWriter, Observation, SparkSession
from pyspark.sql import functions as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from recsys.runtime.cli import bad_input  # noqa: E402
from recsys.data.numerical_rule import NUMERICAL_CLAMP_MIN, NUMERICAL_LOG_SHIFT  # noqa: E402
from criteo_rules import (CATEGORICAL_COLUMNS, FIRST_CATEGORICAL_INDEX, GOOD_LINE, INTEGER_COLUMNS,  # noqa: E402,F401
                          INTEGER_PATTERN, LABEL_COLUMN, NOT_UTF8, NUM_FIELDS,
                          REJECTION_REASONS, InputError, column_limits, day_file_paths,
                          parse_frequency_limit, rejection_summary, strict_error)
from progress import Progress  # noqa: E402
from recsys.runtime.safe_io import (OutputPathError, atomic_directory, atomic_file, check_output_dir,  # noqa: E402
                     refuse_overlap)

ORDERINGS = ("total_random", "input")
# Helper columns added while parsing; never written out.
DAY = "_day"
BLOCK_START = "_block_start"
POSITION = "_position"
FILE_PATH = "_file_path"
FILE_SIZE = "_file_size"
REASON = "_reason"  # 1-based index into REJECTION_REASONS, null for a valid line
KEY1, KEY2 = "_k1", "_k2"
FIELDS = "_fields"
# Dictionary files: one parquet folder partitioned by `column`; the schema is given, not inferred.
DICTIONARY_SCHEMA = "data long, id int, model_count long, column string"
# The first 15 and the next 15 hex digits of the md5 shuffle key, as non-negative longs.
KEY_BITS = 60


# ----------------------------------------------------------------------------- parsing
def _try_cast(column: Column, type_name: str) -> Column:
    """`column` as `type_name`, null where a value does not convert (a rejected line's fields).

    Spark 4 has `Column.try_cast` (its ANSI-mode `cast` raises instead). Spark 3.5, which the GPU
    image runs for the RAPIDS Accelerator, lacks it, but there `cast` returns null on failure, as
    long as ANSI mode is off (its default; the session builder keeps it off).
    """
    return column.try_cast(type_name) if hasattr(Column, "try_cast") else column.cast(type_name)


def read_day_files(spark: SparkSession, paths: Sequence[str], day: Optional[int] = None) -> DataFrame:
    """Raw lines plus the keys that restore input order: day (from the file name unless given), file
    block start, position in the partition, file path and size."""
    # day_<N>: the text after the name's last "_" (a per-row regular expression cost seconds per day)
    day_column = (F.lit(day) if day is not None
                  else _try_cast(F.substring_index(F.col("_metadata.file_name"), "_", -1), "int"))
    return spark.read.text(list(paths)).select(
        F.col("value"), day_column.cast("int").alias(DAY),
        F.col("_metadata.file_block_start").alias(BLOCK_START),
        F.monotonically_increasing_id().alias(POSITION),
        F.col("_metadata.file_path").alias(FILE_PATH),
        F.col("_metadata.file_size").alias(FILE_SIZE),
    )


def _field(fields: Column, i: int) -> Column:
    """Field i of a split line, null past its end."""
    return F.try_element_at(fields, F.lit(i + 1))


def is_utf8(value: Column) -> Column:
    """Whether a raw line's bytes are valid UTF-8. Spark keeps the bytes it read and decodes them,
    replacing invalid sequences by U+FFFD, only where a string function needs characters: the bytes
    survive a decode and re-encode unchanged exactly when they are valid (Spark 3.5 and 4)."""
    return F.encode(value, "UTF-8") == value.cast("binary")


def reason_code(value: Column, fields: Column) -> Column:
    """The 1-based rejection reason of a line that failed GOOD_LINE, from its text and split fields."""
    integer_bad = F.lit(False)
    for i in range(1, FIRST_CATEGORICAL_INDEX):
        field = _field(fields, i)
        integer_bad = integer_bad | F.coalesce((field != F.lit("")) & ~field.rlike(f"^{INTEGER_PATTERN}\\z"),
                                               F.lit(False))
    return (F.when(~is_utf8(value), F.lit(1))
            .when(F.size(fields) != NUM_FIELDS, F.lit(2))
            .when(~_field(fields, 0).isin("0", "1"), F.lit(3))
            .when(integer_bad, F.lit(4))
            .otherwise(F.lit(5)))


def categorical_value(field: Column) -> Column:
    """The value of 1-16 hex digits (either case, leading zeros or not) as the 64-bit two's-complement
    integer of its digits, null when empty: the grouping and join key of a categorical value. A long
    key keeps the aggregation and the dictionary joins on Spark's fixed-width hash maps."""
    return F.when(field != F.lit(""), F.conv(field, 16, -10).cast("long"))


def parse_lines(raw: DataFrame, seed: Optional[int] = None, take_log: bool = True) -> DataFrame:
    """Validate and type the raw lines: `_c0` (int), `_c1`..`_c13` (float, transformed, 0 when
    missing), `_c14`..`_c39` (categorical_value; null when empty), REASON (null for a valid line), with
    `seed` the shuffle key (KEY1, KEY2), and the input-order keys. A rejected line's values are null.

    The line regex runs once, in its own projection: the valid text (null for a rejected line) is
    what gets split and typed."""
    keys = [DAY, BLOCK_START, POSITION, FILE_PATH, FILE_SIZE]
    checked = raw.select("value", F.when(F.col("value").rlike(f"^{GOOD_LINE}\\z"), F.col("value")).alias("_valid"),
                         *keys)
    split = checked.select(
        "value", F.split(F.col("_valid"), "\t", -1).alias(FIELDS),
        F.when(F.col("_valid").isNull(), reason_code(F.col("value"), F.split(F.col("value"), "\t", -1))).alias(REASON),
        *([] if seed is None else [F.md5(F.concat_ws("\t", F.lit(str(seed)), F.col(DAY).cast("string"),
                                                     F.col("_valid"))).alias("_digest")]),
        *keys)
    fields = F.col(FIELDS)
    integers = [transform_numerical(F.when(fields[i] != F.lit(""), fields[i].cast("double")), take_log)
                .alias(INTEGER_COLUMNS[i - 1]) for i in range(1, FIRST_CATEGORICAL_INDEX)]
    categoricals = [categorical_value(fields[i]).alias(CATEGORICAL_COLUMNS[i - FIRST_CATEGORICAL_INDEX])
                    for i in range(FIRST_CATEGORICAL_INDEX, NUM_FIELDS)]
    extra = []
    if seed is not None:
        digest = F.col("_digest")
        extra = [F.conv(F.substring(digest, 1, 15), 16, 10).cast("long").alias(KEY1),
                 F.conv(F.substring(digest, 16, 15), 16, 10).cast("long").alias(KEY2)]
    return split.select(fields[0].cast("int").alias(LABEL_COLUMN), *integers, *categoricals, REASON, *extra,
                        "value", *keys)


def transform_numerical(value: Column, take_log: bool) -> Column:
    """ln(max(x, -2) + 3) as float32 (or x itself without the log); missing -> 0.

    For integers this equals the reference's ln(x + 3) with invalid logs (x <= -3) set to 0.
    """
    if take_log:
        value = F.log(F.greatest(value, F.lit(NUMERICAL_CLAMP_MIN)) + F.lit(NUMERICAL_LOG_SHIFT))
    return F.coalesce(value, F.lit(0.0)).cast("float")


# ----------------------------------------------------------------------------- progress
def task_fraction(spark: SparkSession) -> Callable[[], float]:
    """The completed share of the tasks of Spark's running stages."""
    tracker = spark.sparkContext.statusTracker()

    def fraction() -> float:
        done = total = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return done / total if total else 0.0
    return fraction


# ----------------------------------------------------------------------------- ordering
def partition_representatives(spark: SparkSession, partitions: int) -> List[int]:
    """For each partition p < `partitions`, a long whose Spark hash partitioning (pmod of the seeded
    Murmur3 hash, as `repartition(n, column)` computes it) sends it to p."""
    found: Dict[int, int] = {}
    span = 64 * partitions
    start = 0
    while len(found) < partitions:
        rows = (spark.range(start, start + span)
                .select(F.col("id"), F.expr(f"pmod(hash(id), {partitions})").alias("p"))
                .groupBy("p").agg(F.min("id").alias("id")).collect())
        for row in rows:
            found.setdefault(int(row["p"]), int(row["id"]))
        start += span
    return [found[p] for p in range(partitions)]


def ordered_partitions(rows: DataFrame, bucket: Column, partitions: int, order: Sequence[str],
                       representatives: Sequence[int]) -> DataFrame:
    """Rows in partition `bucket` (0..partitions-1, non-decreasing in `order`), sorted by `order`
    within each: partitions written in index order give one sorted sequence, without the sampling
    job of a range partitioning."""
    target = F.element_at(F.array(*[F.lit(r).cast("long") for r in representatives]), bucket.cast("int") + 1)
    return rows.repartition(partitions, target.alias("_target")).sortWithinPartitions(*order)


def key_bucket(partitions: int) -> Column:
    """Partition of a train row: the key range its KEY1 falls in."""
    width = -(-(1 << KEY_BITS) // partitions)
    return F.floor(F.col(KEY1) / F.lit(width))


def block_bucket(partitions: int) -> Column:
    """Partition of a test/validation row: the part of its file its block starts in."""
    return F.least(F.floor(F.col(BLOCK_START) * F.lit(partitions) / F.greatest(F.col(FILE_SIZE), F.lit(1))),
                   F.lit(partitions - 1))


# ----------------------------------------------------------------------------- dictionaries
# A result several jobs read is kept (memory, then disk), not checkpointed locally: a block lost with its
# executor (a worker's host gone) is computed again from its lineage, where a local checkpoint's loss
# fails the run. Both such results are deterministic (totally ordered, or aggregates), so the
# recomputed block equals the lost one.
REUSED = StorageLevel.MEMORY_AND_DISK


def count_pass(parsed: DataFrame) -> DataFrame:
    """One aggregation: (column, data, model_count) of the valid lines' categorical keys (column
    index 0..25), plus one row per (day, reason) with column -1 - reason (0 = valid), data = the
    day. (A rejected line's categorical keys are null.)"""
    pairs = [(-1 - F.coalesce(F.col(REASON), F.lit(0)), F.col(DAY).cast("long"))]
    pairs += [(F.lit(j), F.col(name)) for j, name in enumerate(CATEGORICAL_COLUMNS)]
    # stack, not explode of an array of structs: half the aggregation's time (flat generated code).
    stacked = parsed.select(F.stack(F.lit(len(pairs)), *[c for pair in pairs for c in pair]))
    return (stacked.select(F.col("col0").alias("column"), F.col("col1").alias("data")).where(F.col("data").isNotNull())
            .groupBy("column", "data").agg(F.count(F.lit(1)).alias("model_count")))


def line_counts(counts: DataFrame) -> Dict[Tuple[int, str], int]:
    """{(day, 'lines' or reason): count} from the rows count_pass adds for lines."""
    found: Dict[Tuple[int, str], int] = {}
    for row in counts.where(F.col("column") < 0).collect():
        day, code, n = int(row["data"]), -1 - int(row["column"]), int(row["model_count"])
        found[(day, "lines")] = found.get((day, "lines"), 0) + n
        if code:
            found[(day, REJECTION_REASONS[code - 1])] = n
    return found


def assign_ids(spark: SparkSession, counts: DataFrame, limits: Sequence[int], partitions: int) -> DataFrame:
    """(column, data, id, model_count): per column the values (data: categorical_value) counted at
    least its limit times, ids 1, 2, ... by descending count, ties by ascending value. A
    range-partitioned sort and per-partition offsets computed on the driver number them, so no
    single task sees a whole column."""
    limit = F.element_at(F.array(*[F.lit(n) for n in limits]), F.col("column") + 1)
    order = [F.col("column"), F.col("model_count").desc(), F.col("value")]
    kept = (counts.where((F.col("column") >= 0) & (F.col("model_count") >= limit))
            .select("column", F.col("data").alias("value"), "model_count"))
    ranked = (kept.repartitionByRange(partitions, *order).sortWithinPartitions(*order)
              .select("*", F.spark_partition_id().alias("_part"), F.monotonically_increasing_id().alias("_pos"))
              .persist(REUSED))
    starts: Dict[Tuple[int, int], int] = {}
    seen: Dict[int, int] = {}
    for row in (ranked.groupBy("_part", "column").agg(F.count(F.lit(1)).alias("n"), F.min("_pos").alias("first"))
                .orderBy("_part").collect()):
        column = int(row["column"])
        starts[(int(row["_part"]), column)] = seen.get(column, 0) + 1 - int(row["first"])
        seen[column] = seen.get(column, 0) + int(row["n"])
    # A literal table (no Python on the executors, unlike createDataFrame from Python rows).
    offsets = spark.range(1).select(F.inline(F.array(*[
        F.struct(F.lit(p).cast("int").alias("_part"), F.lit(c).cast("int").alias("column"),
                 F.lit(o).cast("long").alias("_offset")) for (p, c), o in (starts or {(-1, -1): 0}).items()])))
    return (ranked.join(F.broadcast(offsets), ["_part", "column"])
            .select(F.concat(F.lit("_c"), (F.col("column") + FIRST_CATEGORICAL_INDEX).cast("string")).alias("column"),
                    F.col("value").alias("data"), (F.col("_pos") + F.col("_offset")).cast("int").alias("id"),
                    "model_count"))


def read_dictionary(spark: SparkSession, model_folder: str) -> DataFrame:
    return spark.read.schema(DICTIONARY_SCHEMA).parquet(model_folder)


def dictionary_sizes(dictionary: DataFrame) -> Dict[str, int]:
    """Largest id per categorical column (0 when nothing was kept); cardinality is this + 1."""
    found = {row["column"]: int(row["size"])
             for row in dictionary.groupBy("column").agg(F.max("id").alias("size")).collect()}
    return {name: found.get(name, 0) for name in CATEGORICAL_COLUMNS}


def apply_dictionary(rows: DataFrame, dictionary: DataFrame, sizes: Dict[str, int],
                     broadcast_max_rows: int) -> DataFrame:
    """Replace each categorical value by its id; rare, missing and unseen values become 0.

    One left join per column on its long value: dictionaries of at most `broadcast_max_rows` entries
    are broadcast (Spark's long-keyed hash relation), larger ones joined with a shuffle."""
    for name in CATEGORICAL_COLUMNS:
        column = dictionary.where(F.col("column") == name).select(F.col("data").alias(f"_lookup{name}"),
                                                                 F.col("id").alias(f"_id{name}"))
        if sizes[name] <= broadcast_max_rows:
            column = F.broadcast(column)
        rows = rows.join(column, how="left", on=F.col(f"_lookup{name}") == F.col(name))
    keep = [F.col(c) for c in rows.columns if c not in CATEGORICAL_COLUMNS and not c.startswith(("_lookup", "_id_c"))]
    return rows.select(*keep, *[F.coalesce(F.col(f"_id{name}"), F.lit(0)).alias(name) for name in CATEGORICAL_COLUMNS])


def output_columns() -> List[Column]:
    return ([F.col(LABEL_COLUMN).cast("int")] + [F.col(name) for name in INTEGER_COLUMNS]
            + [F.col(name).cast("int") for name in CATEGORICAL_COLUMNS])


# ----------------------------------------------------------------------------- strict mode
def first_rejected_line(parsed: DataFrame) -> Optional[Dict[str, object]]:
    """File, 1-based line number, text (None when not UTF-8) of the first bad line in input order
    (parsed: one file), or None."""
    order = [BLOCK_START, POSITION]
    first = (parsed.where(F.col(REASON).isNotNull())
             .select(F.min(F.struct(*order, FILE_PATH)).alias("first")).first()["first"])
    if first is None:
        return None
    block, position = first[BLOCK_START], first[POSITION]
    here = (F.col(BLOCK_START) == block) & (F.col(POSITION) == position)
    earlier = (F.col(BLOCK_START) < block) | ((F.col(BLOCK_START) == block) & (F.col(POSITION) < position))
    found = parsed.where(here).select("value", REASON).first()
    text = None if REJECTION_REASONS[found[REASON] - 1] == NOT_UTF8 else found["value"]
    location = urllib.parse.urlparse(first[FILE_PATH])
    file_path = urllib.parse.unquote(location.path) if location.scheme == "file" else first[FILE_PATH]
    return {"file": file_path, "line": parsed.where(earlier).count() + 1, "text": text}


# ----------------------------------------------------------------------------- the run
def prepare(spark: SparkSession, input_folder: str, num_days: int, halves_folder: str, output_folder: str,
            frequency_limit: str, seed: int, take_log: bool, broadcast_max_rows: int, partitions: int,
            test_partitions: int, strict: bool, progress_interval: float = 10.0) -> Dict[str, Dict[str, object]]:
    """The whole Spark run into `output_folder` (models/, train/, test/, validation/,
    model_size.json); `halves_folder` holds test/day_<N-1> and validation/day_<N-1>, the two halves
    of the last day. Returns the summaries (dictionary, train, test, validation)."""
    limits = column_limits(frequency_limit)
    days = list(range(num_days))
    last = days[-1]
    paths = day_file_paths(input_folder, days)
    progress = Progress("spark", progress_interval)
    tasks = task_fraction(spark)
    of_tasks = " of the running Spark stages' tasks"
    # The partition counts are chosen, not adapted: the train order relies on `partitions` key ranges.
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    total_bytes = sum(os.path.getsize(p) for p in paths if not is_cluster_path(p))
    with progress.stage("dictionary", int(total_bytes / 256), tasks, of_tasks):
        counts = count_pass(parse_lines(read_day_files(spark, paths))).persist(REUSED)
        lines = line_counts(counts)
    if strict:
        for path, day in zip(paths, days):
            if any(lines.get((day, r)) for r in REJECTION_REASONS):
                bad = first_rejected_line(parse_lines(read_day_files(spark, [path], day)))
                raise strict_error(bad["file"], bad["line"], bad["text"])
    models = os.path.join(output_folder, "models")
    write_parquet(assign_ids(spark, counts, limits, partitions).write.partitionBy("column"), models, "overwrite")
    dictionary = read_dictionary(spark, models).cache()  # read by the 26 joins of each split
    sizes = dictionary_sizes(dictionary)
    write_json(os.path.join(output_folder, "model_size.json"), sizes)
    summaries: Dict[str, Dict[str, object]] = {
        "dictionary": {**rejection_summary(lines, days), "engine": "spark", "days": f"0-{last}",
                       "frequency_limit": frequency_limit, "dictionary_sizes": sizes}}
    train_lines = sum(lines.get((day, "lines"), 0) for day in days[:-1])
    with progress.stage("train", train_lines, tasks, of_tasks):
        parsed = parse_lines(read_day_files(spark, paths[:-1]), seed, take_log)
        rows = apply_dictionary(parsed.where(F.col(REASON).isNull()), dictionary, sizes, broadcast_max_rows)
        ordered = ordered_partitions(rows, key_bucket(partitions), partitions, [KEY1, KEY2],
                                     partition_representatives(spark, partitions))
        write_parquet(ordered.select(*output_columns()).write, os.path.join(output_folder, "train"), "overwrite")
    summaries["train"] = rejection_summary(lines, days[:-1])
    representatives = partition_representatives(spark, test_partitions)
    for split in ("test", "validation"):
        path = os.path.join(halves_folder, split, f"day_{last}")
        observation = Observation(split)
        parsed = parse_lines(read_day_files(spark, [path], last), None, take_log).observe(
            observation, F.count(F.lit(1)).alias("lines"),
            *[F.sum(F.when(F.col(REASON) == code, 1).otherwise(0)).alias(reason)
              for code, reason in enumerate(REJECTION_REASONS, start=1)])
        with progress.stage(split, lines.get((last, "lines"), 0) // 2, tasks, of_tasks):
            rows = apply_dictionary(parsed.where(F.col(REASON).isNull()), dictionary, sizes, broadcast_max_rows)
            ordered = ordered_partitions(rows, block_bucket(test_partitions), test_partitions,
                                         [BLOCK_START, POSITION], representatives)
            write_parquet(ordered.select(*output_columns()).write, os.path.join(output_folder, split), "overwrite")
        metrics = observation.get
        summaries[split] = rejection_summary({(last, "lines"): int(metrics["lines"] or 0),
                                              **{(last, r): int(metrics[r] or 0) for r in REJECTION_REASONS}},
                                             [last])
    for summary in summaries.values():
        summary["input_folder"] = input_folder
    return summaries


def is_cluster_path(path: str) -> bool:
    """A URL such as hdfs://... or s3a://...: Spark writes it, the local file system cannot rename it."""
    return "://" in path


def write_parquet(writer: DataFrameWriter, path: str, write_mode: str) -> None:
    """Run the job that writes a parquet folder. A local folder is written beside itself and renamed
    into place: a failed job leaves nothing, and 'overwrite' replaces the old output only once the
    new one is complete. A cluster path relies on Spark's own output commit."""
    if is_cluster_path(path):
        writer.mode(write_mode).parquet(path)
        return
    with atomic_directory(path, replace=write_mode == "overwrite") as staging:
        writer.mode("overwrite").parquet(staging)


def write_json(path: str, content: Dict[str, object]) -> None:
    """Write JSON atomically (temporary file + rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_file(path) as f:
        json.dump(content, f, indent=2)
        f.write("\n")


def check_outputs(args: argparse.Namespace) -> None:
    """Before Spark starts: the output folder is usable, is no input, and exists only if it may be
    replaced (`--write_mode overwrite`). Raises OutputPathError naming the flag."""
    inputs = {name: path for name, path in (("--input_folder", args.input_folder),
                                            ("--halves_folder", args.halves_folder))
              if not is_cluster_path(path)}
    path = args.output_folder
    if is_cluster_path(path):
        return
    refuse_overlap(path, "--output_folder", inputs)
    check_output_dir(path, "--output_folder")
    if args.write_mode == "errorifexists" and os.path.lexists(path) and os.listdir(path):
        raise OutputPathError(f"--output_folder {path} already holds files; refusing to overwrite them "
                              f"(--write_mode overwrite replaces them)")


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input_folder", required=True, help="folder holding day_0 .. day_<N-1>")
    parser.add_argument("--num_days", type=int, required=True, help="N: days 0..N-2 train, day N-1 test/validation")
    parser.add_argument("--halves_folder", required=True,
                        help="folder holding test/day_<N-1> and validation/day_<N-1>, the halves of the last day")
    parser.add_argument("--output_folder", required=True,
                        help="writes models/, train/, test/, validation/ (parquet), model_size.json and summary/")
    parser.add_argument("--write_mode", choices=("overwrite", "errorifexists"), default="errorifexists")
    parser.add_argument("--frequency_limit", default="0",
                        help="N, col:N or a comma list of both (col = raw column 14..39); keep values seen >= N times")
    parser.add_argument("--no_numeric_log_col", action="store_true", help="keep raw numericals (no log)")
    parser.add_argument("--random_seed", type=int, default=12345, help="seed of the train shuffle")
    parser.add_argument("--broadcast_max_rows", type=int, default=1_000_000,
                        help="broadcast dictionaries up to this many entries; shuffle-join larger ones")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the dictionary and train stages")
    parser.add_argument("--test_partitions", type=int, default=2, help="partitions of the test and validation stages")
    parser.add_argument("--progress_interval", type=float, default=10.0, help="seconds between progress lines (0: none)")
    parser.add_argument("--strict", action="store_true", help="fail on the first malformed line")
    return parser


def spark_failure(error: Exception) -> str:
    """The gist of a failed Spark job in one line: its first line that is not py4j's call site."""
    lines = [line.strip(" :") for line in str(error).splitlines()]
    gist = next((line for line in lines if line and not line.startswith("An error occurred while calling")), "")
    return (gist or type(error).__name__)[:400]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.num_days < 2 or args.partitions < 1 or args.test_partitions < 1:
        return bad_input("--num_days must be at least 2, --partitions and --test_partitions at least 1")
    try:
        check_outputs(args)
        parse_frequency_limit(args.frequency_limit)
    except (OutputPathError, InputError) as error:
        return bad_input(error)
    builder = SparkSession.builder.appName("dlrm-criteo-preprocessing")
    if not hasattr(Column, "try_cast"):  # Spark 3: _try_cast relies on the non-ANSI cast
        builder = builder.config("spark.sql.ansi.enabled", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    try:
        summaries = prepare(spark, args.input_folder, args.num_days, args.halves_folder, args.output_folder,
                            args.frequency_limit, args.random_seed, not args.no_numeric_log_col,
                            args.broadcast_max_rows, args.partitions, args.test_partitions, args.strict,
                            args.progress_interval)
    except (InputError, OutputPathError) as error:
        return bad_input(error)
    except (Py4JJavaError, PySparkException) as error:  # Spark's own log above holds the details
        print(f"error: the Spark job failed: {spark_failure(error)}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    for name, summary in summaries.items():
        summary["strict"] = args.strict
        write_json(os.path.join(args.output_folder, "summary", f"{name}.json"), summary)
    for name in ("train", "test", "validation"):
        summary = summaries[name]
        reasons = ", ".join(f"{reason}: {n}" for reason, n in summary["rejected_by_reason"].items() if n)
        print(f"{name}: {summary['input_lines']} lines, {summary['rejected_lines']} rejected"
              + (f" ({reasons})" if reasons else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

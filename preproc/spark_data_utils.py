"""Criteo 1TB preprocessing on Spark (reference §5.3): build categorical dictionaries, then
transform raw day files into parquet with categorical ids and log-transformed numericals.

Every step uses Spark SQL expressions (no Python UDFs) so the JVM does all per-row work.

Raw line: 40 tab-separated fields, `_c0` label (0/1), `_c1`..`_c13` integers, `_c14`..`_c39`
hexadecimal categoricals; any field but the label may be empty. A line that breaks these rules is
rejected: it is counted per day file and per reason in the summary file, or with `--strict` it stops
the job with an error naming the file and line.

Outputs are checked before Spark starts (never an input; an existing one only with
`--write_mode overwrite`). Local output folders are written beside themselves and renamed into
place, so a failed job leaves neither part files nor a deleted previous output.
"""
from __future__ import annotations

import argparse
import functools
import json
import operator
import os
import sys
import urllib.parse
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from pyspark.sql import Column, DataFrame, DataFrameWriter, Observation, SparkSession, Window
from pyspark.sql import functions as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from safe_io import (OutputPathError, atomic_directory, atomic_file, check_output_dir,  # noqa: E402
                     check_output_file, refuse_overlap)

NUM_INTEGER_FEATURES = 13
NUM_CATEGORICAL_FEATURES = 26
NUM_FIELDS = 1 + NUM_INTEGER_FEATURES + NUM_CATEGORICAL_FEATURES
LABEL_COLUMN = "_c0"
INTEGER_COLUMNS = [f"_c{i}" for i in range(1, 1 + NUM_INTEGER_FEATURES)]
CATEGORICAL_COLUMNS = [f"_c{i}" for i in range(1 + NUM_INTEGER_FEATURES, NUM_FIELDS)]
FIRST_CATEGORICAL_INDEX = 1 + NUM_INTEGER_FEATURES

REJECTION_REASONS = ("wrong_field_count", "bad_label", "non_integer_numerical", "non_hex_categorical")
INTEGER_PATTERN = r"^-?[0-9]+$"
HEX_PATTERN = r"^[0-9a-fA-F]{1,16}$"
LABEL_PATTERN = r"^[01]$"
# Values at or below this are clamped before the log, so ln(max(x, -2) + 3) >= 0 for every integer.
NUMERICAL_CLAMP_MIN = -2.0
NUMERICAL_LOG_SHIFT = 3.0
ORDERINGS = ("total_random", "input", "any")

# Helper columns added while parsing; never written out.
DAY = "_day"
BLOCK_START = "_block_start"
POSITION = "_position"
FILE_PATH = "_file_path"
REASON = "_rejection_reason"
DETAIL = "_rejection_detail"
RANDOM_KEY = "_random_key"
# Dictionary files: one parquet folder partitioned by `column`; the schema is given, not inferred.
DICTIONARY_SCHEMA = "data long, id int, model_count long, column string"


class InputError(ValueError):
    """Raw input is missing, empty or (in strict mode) malformed; the message names the file."""


# ----------------------------------------------------------------------------- arguments
def parse_days(days: str) -> List[int]:
    """'a-b' (inclusive) or a single day 'a' -> [a, ..., b]."""
    first, _, last = days.partition("-")
    try:
        start, end = int(first), int(last or first)
    except ValueError:
        raise InputError(f"--days must look like 0-23, got {days!r}") from None
    if start < 0 or end < start:
        raise InputError(f"--days must be a non-empty range of non-negative days, got {days!r}")
    return list(range(start, end + 1))


def parse_frequency_limit(spec: str) -> Tuple[int, Dict[str, int]]:
    """'N' and/or 'col:N' items, comma separated -> (default limit, {'_cK': limit}).

    `col` is the raw column index 14..39 (as in the reference), with or without the `_c` prefix.
    A value is kept in the dictionary when it occurs at least `limit` times; 0 keeps everything.
    """
    default, per_column = 0, {}
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        column, sep, value = item.rpartition(":")
        try:
            limit = int(value)
        except ValueError:
            raise InputError(f"frequency limit item {item!r} is not N or col:N") from None
        if limit < 0:
            raise InputError(f"frequency limit item {item!r} is negative")
        if not sep:
            default = limit
            continue
        name = column if column.startswith("_c") else f"_c{column}"
        if name not in CATEGORICAL_COLUMNS:
            raise InputError(f"frequency limit item {item!r}: the column must be a categorical column "
                             f"index {FIRST_CATEGORICAL_INDEX}..{NUM_FIELDS - 1}")
        per_column[name] = limit
    return default, per_column


def day_file_paths(input_folder: str, days: Iterable[int]) -> List[str]:
    """Paths of `day_<k>` files; local ones must exist and be non-empty (one error lists all)."""
    paths = [os.path.join(input_folder, f"day_{day}") for day in days]
    local = [p for p in paths if "://" not in p]
    missing = [p for p in local if not os.path.isfile(p)]
    empty = [p for p in local if os.path.isfile(p) and os.path.getsize(p) == 0]
    problems = [f"{p} is missing" for p in missing] + [f"{p} is empty" for p in empty]
    if problems:
        raise InputError("raw Criteo input is incomplete: " + "; ".join(problems))
    return paths


# ----------------------------------------------------------------------------- parsing
def _try_cast(column: Column, type_name: str) -> Column:
    """`column` as `type_name`, null where a value does not convert (a rejected line's fields).

    Spark 4 has `Column.try_cast` (its ANSI-mode `cast` raises instead). Spark 3.5, which the GPU
    image runs for the RAPIDS Accelerator, lacks it, but there `cast` returns null on failure, as
    long as ANSI mode is off (its default; the session builder keeps it off).
    """
    return column.try_cast(type_name) if hasattr(Column, "try_cast") else column.cast(type_name)


def read_day_files(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Raw lines plus the keys that restore input order: day, file block start, position in block."""
    return spark.read.text(list(paths)).select(
        F.col("value"),
        _try_cast(F.regexp_extract(F.col("_metadata.file_name"), r"day_(\d+)$", 1), "int").alias(DAY),
        F.col("_metadata.file_block_start").alias(BLOCK_START),
        F.monotonically_increasing_id().alias(POSITION),
        F.col("_metadata.file_path").alias(FILE_PATH),
    )


def _first_match(conditions: Sequence[Tuple[Column, Column]]) -> Column:
    """The value of the first (condition, value) pair whose condition holds, else null."""
    return F.coalesce(*[F.when(condition, value) for condition, value in conditions])


def _any(conditions: Iterable[Column]) -> Column:
    return functools.reduce(operator.or_, conditions)


def parse_lines(raw: DataFrame) -> DataFrame:
    """Split, validate and type the raw lines.

    Adds `_c0` (int), `_c1`..`_c13` (double, null when empty), `_c14`..`_c39` (long: the hex value
    read as a 64-bit two's-complement integer, null when empty), the rejection reason (null for a
    good line) and a human-readable detail of the first bad field.
    """
    keys = [DAY, BLOCK_START, POSITION, FILE_PATH]
    # Separate projections so that the split and each field check run once per line.
    split = raw.select(F.split(F.col("value"), "\t", -1).alias("fields"), *keys)
    names = [f"_raw{i}" for i in range(NUM_FIELDS)]
    elements = [F.try_element_at(F.col("fields"), F.lit(i + 1)) for i in range(NUM_FIELDS)]
    fields = split.select(F.size("fields").alias("field_count"), *keys, *[  # an empty field is null
        F.when(element != F.lit(""), element).alias(name) for element, name in zip(elements, names)])
    raw_field = [F.col(name) for name in names]
    integer_bad = [raw_field[i].isNotNull() & ~raw_field[i].rlike(INTEGER_PATTERN)
                   for i in range(1, FIRST_CATEGORICAL_INDEX)]
    hex_ok = [raw_field[i].rlike(HEX_PATTERN) for i in range(FIRST_CATEGORICAL_INDEX, NUM_FIELDS)]
    checked = fields.select("*", (F.col("field_count") != NUM_FIELDS).alias("wrong_count"),
                            (raw_field[0].isNull() | ~raw_field[0].rlike(LABEL_PATTERN)).alias("label_bad"),
                            *[bad.alias(f"_bad{i}") for i, bad in enumerate(integer_bad, start=1)],
                            *[ok.alias(f"_hex{i}") for i, ok in enumerate(hex_ok, start=FIRST_CATEGORICAL_INDEX)])
    integer_bad = [(F.col(f"_bad{i}"), i) for i in range(1, FIRST_CATEGORICAL_INDEX)]
    categorical_bad = [(raw_field[i].isNotNull() & ~F.col(f"_hex{i}"), i)
                       for i in range(FIRST_CATEGORICAL_INDEX, NUM_FIELDS)]
    wrong_count, label_bad = F.col("wrong_count"), F.col("label_bad")

    reason = (F.when(wrong_count, F.lit(REJECTION_REASONS[0]))
              .when(label_bad, F.lit(REJECTION_REASONS[1]))
              .when(_any(bad for bad, _ in integer_bad), F.lit(REJECTION_REASONS[2]))
              .when(_any(bad for bad, _ in categorical_bad), F.lit(REJECTION_REASONS[3])))
    detail = (F.when(wrong_count, F.format_string(f"%d tab-separated fields, expected {NUM_FIELDS}",
                                                  F.col("field_count")))
              .when(label_bad, F.format_string("label '%s' is not 0 or 1", F.coalesce(raw_field[0], F.lit(""))))
              .otherwise(_first_match(
                  [(bad, F.format_string(f"column {i} value '%s' is not an integer", raw_field[i]))
                   for bad, i in integer_bad]
                  + [(bad, F.format_string(f"column {i} value '%s' is not 1-16 hex digits", raw_field[i]))
                     for bad, i in categorical_bad])))

    integers = [_try_cast(raw_field[i], "double").alias(INTEGER_COLUMNS[i - 1])
                for i in range(1, FIRST_CATEGORICAL_INDEX)]
    categoricals = [_try_cast(F.when(F.col(f"_hex{i}"), F.conv(raw_field[i], 16, -10)), "long")
                    .alias(CATEGORICAL_COLUMNS[i - FIRST_CATEGORICAL_INDEX])
                    for i in range(FIRST_CATEGORICAL_INDEX, NUM_FIELDS)]
    return checked.select(_try_cast(raw_field[0], "int").alias(LABEL_COLUMN), *integers, *categoricals,
                          reason.alias(REASON), detail.alias(DETAIL), *keys)


# ----------------------------------------------------------------------------- rejections
@dataclass
class RejectionCounter:
    """Counts input lines and rejections per day and reason while another action runs (no extra pass)."""

    observation: Observation
    days: List[int]

    @classmethod
    def attach(cls, parsed: DataFrame, days: Sequence[int], name: str) -> Tuple["RejectionCounter", DataFrame]:
        observation = Observation(name)
        metrics = []
        for day in days:
            in_day = F.col(DAY) == day
            metrics.append(F.sum(F.when(in_day, 1).otherwise(0)).alias(f"lines|{day}"))
            metrics.extend(F.sum(F.when(in_day & (F.col(REASON) == reason), 1).otherwise(0)).alias(f"{reason}|{day}")
                           for reason in REJECTION_REASONS)
        return cls(observation, list(days)), parsed.observe(observation, *metrics)

    def summary(self) -> Dict[str, object]:
        """Totals and per-day breakdown; valid only after the observed action has run."""
        values = self.observation.get
        by_day: Dict[str, Dict[str, int]] = {}
        for day in self.days:
            counts = {reason: int(values[f"{reason}|{day}"] or 0) for reason in REJECTION_REASONS}
            by_day[f"day_{day}"] = {"input_lines": int(values[f"lines|{day}"] or 0),
                                    "rejected": {r: n for r, n in counts.items() if n}}
        by_reason = {reason: sum(d["rejected"].get(reason, 0) for d in by_day.values()) for reason in REJECTION_REASONS}
        input_lines = sum(d["input_lines"] for d in by_day.values())
        rejected = sum(by_reason.values())
        return {"input_lines": input_lines, "rejected_lines": rejected, "output_rows": input_lines - rejected,
                "rejected_by_reason": by_reason, "by_day": by_day}


def first_rejected_line(parsed: DataFrame) -> Optional[Dict[str, object]]:
    """File, 1-based line number, reason and detail of the first bad line in input order, or None.

    Costs one scan (plus one more over the offending file when there is a bad line).
    """
    order = [DAY, BLOCK_START, POSITION]
    first = (parsed.where(F.col(REASON).isNotNull())
             .select(F.min(F.struct(*order, REASON, DETAIL, FILE_PATH)).alias("first")).first()["first"])
    if first is None:
        return None
    day, block, position = first[DAY], first[BLOCK_START], first[POSITION]
    earlier = parsed.where((F.col(DAY) == day) & ((F.col(BLOCK_START) < block)
                                                  | ((F.col(BLOCK_START) == block) & (F.col(POSITION) < position))))
    location = urllib.parse.urlparse(first[FILE_PATH])
    file_path = urllib.parse.unquote(location.path) if location.scheme == "file" else first[FILE_PATH]
    return {"file": file_path, "line": earlier.count() + 1, "reason": first[REASON], "detail": first[DETAIL]}


def fail_on_first_rejected_line(parsed: DataFrame) -> None:
    """Strict mode: raise InputError naming the first bad line, if any."""
    bad = first_rejected_line(parsed)
    if bad is not None:
        raise InputError(f"{bad['file']}: line {bad['line']}: {bad['reason']}: {bad['detail']} "
                         f"(strict mode; run without --strict to count and skip such lines)")


# ----------------------------------------------------------------------------- dictionaries
def build_dictionary(valid: DataFrame, default_limit: int, per_column_limits: Dict[str, int]) -> DataFrame:
    """Columns (column, data, id, model_count): per categorical column, the values seen at least
    `limit` times, with 1-based ids by descending count, ties broken by ascending value."""
    pairs = valid.select(F.explode(F.array(*[
        F.struct(F.lit(name).alias("column"), F.col(name).alias("data")) for name in CATEGORICAL_COLUMNS
    ])).alias("pair")).select("pair.column", "pair.data").where(F.col("data").isNotNull())
    counts = pairs.groupBy("column", "data").agg(F.count(F.lit(1)).alias("model_count"))
    limit = F.lit(default_limit)
    for name, column_limit in per_column_limits.items():
        limit = F.when(F.col("column") == name, F.lit(column_limit)).otherwise(limit)
    by_frequency = Window.partitionBy("column").orderBy(F.desc("model_count"), F.asc("data"))
    return (counts.where(F.col("model_count") >= limit)
            .withColumn("id", F.row_number().over(by_frequency).cast("int"))
            .select("column", "data", "id", "model_count"))


def read_dictionary(spark: SparkSession, model_folder: str) -> DataFrame:
    return spark.read.schema(DICTIONARY_SCHEMA).parquet(model_folder)


def dictionary_sizes(dictionary: DataFrame) -> Dict[str, int]:
    """Largest id per categorical column (0 when nothing was kept); cardinality is this + 1."""
    found = {row["column"]: int(row["size"])
             for row in dictionary.groupBy("column").agg(F.max("id").alias("size")).collect()}
    return {name: found.get(name, 0) for name in CATEGORICAL_COLUMNS}


def apply_dictionary(valid: DataFrame, dictionary: DataFrame, sizes: Dict[str, int],
                     broadcast_max_rows: int) -> DataFrame:
    """Replace each categorical value by its id; rare, missing and unseen values become 0.

    The dictionaries of all columns with at most `broadcast_max_rows` entries form one lookup table
    keyed by (column, value); it is broadcast once and joined once per column. Larger dictionaries
    are joined with a shuffle, one per column.
    """
    key = F.struct(F.col("column"), F.col("data"))
    small = [name for name in CATEGORICAL_COLUMNS if sizes[name] <= broadcast_max_rows]
    lookup = F.broadcast(dictionary.where(F.col("column").isin(small)).select(key.alias("key"), "id"))
    rows = valid
    for name in CATEGORICAL_COLUMNS:
        mapping = f"dictionary{name}"
        if name in small:
            rows = rows.join(lookup.alias(mapping), how="left", on=F.col(f"{mapping}.key") == F.struct(
                F.lit(name).alias("column"), F.col(name).alias("data")))
        else:
            column_dictionary = dictionary.where(F.col("column") == name).select("data", "id").alias(mapping)
            rows = rows.join(column_dictionary, how="left", on=F.col(f"{mapping}.data") == F.col(name))
    keep = [c for c in valid.columns if c not in CATEGORICAL_COLUMNS]
    return rows.select(*keep, *[F.coalesce(F.col(f"dictionary{name}.id"), F.lit(0)).cast("int").alias(name)
                               for name in CATEGORICAL_COLUMNS])


def transform_numerical(value: Column, take_log: bool) -> Column:
    """ln(max(x, -2) + 3) as float32 (or x itself without the log); missing -> 0.

    For integers this equals the reference's ln(x + 3) with invalid logs (x <= -3) set to 0.
    """
    if take_log:
        value = F.log(F.greatest(value, F.lit(NUMERICAL_CLAMP_MIN)) + F.lit(NUMERICAL_LOG_SHIFT))
    return F.coalesce(value, F.lit(0.0)).cast("float")


def order_rows(rows: DataFrame, ordering: str) -> DataFrame:
    """total_random: shuffled by the seeded key; input: the order of the raw lines; any: as Spark likes."""
    if ordering == "total_random":
        return rows.repartition(F.col(RANDOM_KEY)).sortWithinPartitions(RANDOM_KEY, DAY, BLOCK_START, POSITION)
    if ordering == "input":
        return rows.orderBy(DAY, BLOCK_START, POSITION)
    return rows


def output_columns() -> List[Column]:
    return ([F.col(LABEL_COLUMN).cast("int")] + [F.col(name) for name in INTEGER_COLUMNS]
            + [F.col(name).cast("int") for name in CATEGORICAL_COLUMNS])


# ----------------------------------------------------------------------------- modes
def generate_models(spark: SparkSession, paths: Sequence[str], days: Sequence[int], model_folder: str,
                    frequency_limit: str, write_mode: str, strict: bool) -> Dict[str, object]:
    """Count categorical values over the given days and write the dictionaries (parquet, partitioned
    by column); returns the summary."""
    default_limit, per_column_limits = parse_frequency_limit(frequency_limit)
    parsed = parse_lines(read_day_files(spark, paths))
    if strict:
        fail_on_first_rejected_line(parsed)
    counter, observed = RejectionCounter.attach(parsed, days, "generate_models")
    dictionary = build_dictionary(observed.where(F.col(REASON).isNull()), default_limit, per_column_limits)
    write_parquet(dictionary.write.partitionBy("column"), model_folder, write_mode)
    summary = counter.summary()
    summary["dictionary_sizes"] = dictionary_sizes(read_dictionary(spark, model_folder))
    return summary


def transform(spark: SparkSession, paths: Sequence[str], days: Sequence[int], model_folder: str,
              output_folder: str, ordering: str, take_log: bool, seed: int, broadcast_max_rows: int,
              write_mode: str, strict: bool) -> Dict[str, object]:
    """Apply the dictionaries and the numerical transform; write parquet `_c0`..`_c39` in the
    requested order; returns the summary.

    Lines are counted after the ordering, rejected ones dropped only then: the sort of 'input'
    ordering samples its input in a job of its own, which would count every line twice.
    """
    parsed = parse_lines(read_day_files(spark, paths)).withColumn(RANDOM_KEY, F.rand(seed))
    if strict:
        fail_on_first_rejected_line(parsed)
    dictionary = read_dictionary(spark, model_folder)
    sizes = dictionary_sizes(dictionary)
    lines = parsed.select(
        LABEL_COLUMN, *[transform_numerical(F.col(name), take_log).alias(name) for name in INTEGER_COLUMNS],
        *CATEGORICAL_COLUMNS, DAY, BLOCK_START, POSITION, RANDOM_KEY, REASON)
    ordered = order_rows(apply_dictionary(lines, dictionary, sizes, broadcast_max_rows), ordering)
    counter, observed = RejectionCounter.attach(ordered, days, "transform")
    write_parquet(observed.where(F.col(REASON).isNull()).select(*output_columns()).write, output_folder,
                  write_mode)
    summary = counter.summary()
    summary["dictionary_sizes"] = sizes
    return summary


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
    """Before Spark starts: every local output is usable, is no input, and exists only if it may be
    replaced (`--write_mode overwrite`). Raises OutputPathError naming the flag."""
    inputs = {"--input_folder": args.input_folder}
    folders = {}
    if args.mode == "generate_models":
        folders["--model_folder"] = args.model_folder
    else:
        inputs["--model_folder"] = args.model_folder
        folders["--output_folder"] = args.output_folder
    files = {"--model_size_file": args.model_size_file, "--summary_file": args.summary_file}
    for name, path in {**folders, **files}.items():
        if path and not is_cluster_path(path):
            refuse_overlap(path, name, {k: v for k, v in inputs.items() if not is_cluster_path(v)})
    for name, path in folders.items():
        if is_cluster_path(path):
            continue
        check_output_dir(path, name)
        if args.write_mode == "errorifexists" and os.path.lexists(path):
            raise OutputPathError(f"{name} {path} already exists; refusing to overwrite it "
                                  f"(--write_mode overwrite replaces it)")
    for name, path in files.items():
        if path and not is_cluster_path(path):
            check_output_file(path, name)


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", required=True, choices=("generate_models", "transform"))
    parser.add_argument("--days", required=True, help="inclusive range of day files, e.g. 0-22")
    parser.add_argument("--input_folder", required=True, help="folder holding day_<k> files")
    parser.add_argument("--output_folder", help="transform: parquet output folder")
    parser.add_argument("--model_folder", required=True, help="dictionary folder (written by generate_models)")
    parser.add_argument("--model_size_file", help="transform: write {column: largest id} JSON here")
    parser.add_argument("--summary_file", help="write input/rejected line counts (JSON) here")
    parser.add_argument("--write_mode", choices=("overwrite", "errorifexists"), default="errorifexists")
    parser.add_argument("--frequency_limit", default="0",
                        help="N, col:N or a comma list of both (col = raw column 14..39); keep values seen >= N times")
    parser.add_argument("--no_numeric_log_col", action="store_true", help="keep raw numericals (no log)")
    parser.add_argument("--output_ordering", choices=ORDERINGS, default="total_random")
    parser.add_argument("--random_seed", type=int, default=12345, help="seed of the total_random ordering")
    parser.add_argument("--broadcast_max_rows", type=int, default=1_000_000,
                        help="broadcast dictionaries up to this many entries; shuffle-join larger ones")
    parser.add_argument("--strict", action="store_true", help="fail on the first malformed line")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.mode == "transform" and not args.output_folder:
        print("error: --output_folder is required with --mode transform", file=sys.stderr)
        return 2
    try:
        check_outputs(args)
    except OutputPathError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    builder = SparkSession.builder.appName(f"dlrm-criteo-{args.mode}")
    if not hasattr(Column, "try_cast"):  # Spark 3: _try_cast relies on the non-ANSI cast
        builder = builder.config("spark.sql.ansi.enabled", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        days = parse_days(args.days)
        paths = day_file_paths(args.input_folder, days)
        if args.mode == "generate_models":
            summary = generate_models(spark, paths, days, args.model_folder, args.frequency_limit,
                                      args.write_mode, args.strict)
        else:
            summary = transform(spark, paths, days, args.model_folder, args.output_folder, args.output_ordering,
                                not args.no_numeric_log_col, args.random_seed, args.broadcast_max_rows,
                                args.write_mode, args.strict)
            if args.model_size_file:
                write_json(args.model_size_file, summary["dictionary_sizes"])
    except (InputError, OutputPathError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    summary.update(mode=args.mode, days=args.days, input_folder=args.input_folder,
                   frequency_limit=args.frequency_limit, strict=args.strict)
    if args.summary_file:
        write_json(args.summary_file, summary)
    reasons = ", ".join(f"{reason}: {n}" for reason, n in summary["rejected_by_reason"].items() if n)
    print(f"{args.mode} days {args.days}: {summary['input_lines']} lines, {summary['rejected_lines']} rejected"
          + (f" ({reasons})" if reasons else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

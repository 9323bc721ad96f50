"""Criteo preprocessing on one machine with DuckDB (embedded, no JVM): raw day files straight to the
split-binary dataset that `prepare_dataset.sh` builds with Spark, with the same rules
(criteo_rules.py) and the same bytes in every output file.

  1. dictionary pass over all days: one scan validates every line (one regular expression per line;
     the field-by-field reason only for lines that fail it), counts lines and rejections per day and
     reason, and counts every categorical value of the valid lines in one grouped pass;
     then per column the values seen at least `limit` times get ids 1, 2, ... by descending count
     (ties: ascending 64-bit value). Lines that are not UTF-8 stop DuckDB's CSV reader: the scan then
     runs once more, the reader skipping and recording them (line numbers included) in the files
     that hold them, found by one pass over the bytes (`not_utf8_files`); clean input pays nothing;
  2. train (days 0..N-2): valid lines transformed, ordered by the seeded md5 key of
     criteo_rules.py and written to `train/` (under a small memory limit the sort runs over
     consecutive ranges of the key, one after another: the same order in less memory);
  3. the last day, numbered line by line: its first floor(lines/2) lines -> `test/`, the rest ->
     `validation/`, in input order.

The output folder is built beside itself and renamed into place (nothing half-written on a failure).
DuckDB's working database and its spill files live in `--scratch_dir`; `--memory_limit` bounds its
memory (larger intermediate results spill there).
"""
from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Collection, Dict, Iterator, List, Optional, Sequence, Tuple

try:
    import duckdb
except ImportError:  # prepare_dataset.sh leaves this check to the engine (one interpreter start less)
    print(f"error: the duckdb engine needs the duckdb package for {sys.executable} (pip install duckdb)", file=sys.stderr)
    sys.exit(2)
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from recsys.runtime.cli import bad_input, failure  # noqa: E402
from recsys.data.numerical_rule import NUMERICAL_CLAMP_MIN, NUMERICAL_LOG_SHIFT  # noqa: E402
from criteo_rules import (CATEGORICAL_COLUMNS, FIRST_CATEGORICAL_INDEX, GOOD_LINE,  # noqa: E402
                          INTEGER_PATTERN, NUM_FIELDS,
                          NOT_UTF8, REJECTION_REASONS, InputError, column_limits, day_file_paths,
                          rejection_summary, strict_error)
from recsys.data.feature_spec import FeatureSpec  # noqa: E402
from estimate import PARSED_BYTES_PER_LINE, estimate_lines, memory_bytes  # noqa: E402
from progress import Progress  # noqa: E402
from recsys.runtime.safe_io import OutputPathError, atomic_directory, check_replaceable, refuse_overlap  # noqa: E402
from split_dataset import SUMMARY_NAME, build_summary, output_entries, write_split  # noqa: E402

BATCH_ROWS = 1 << 17
# Read buffer of the CSV scanner (DuckDB: 32 MiB per scan): 4 MiB, or down to 1 MiB under a small
# memory limit (a sixteenth of it); 1 MiB costs about 6% of the end-to-end rate.
CSV_BUFFER_BYTES = 4 << 20
MIN_CSV_BUFFER_BYTES = 1 << 20
# The field delimiter given to DuckDB's CSV reader, so that a whole line is one field (blank lines
# included, which a multi-column read would skip).
LINE_DELIMITER = "\\x01\\x02\\x03\\x04"
# Rows per row group of the working tables (DuckDB: 122,880); each thread fills one in memory.
ROW_GROUP_ROWS = 16384
# The reason code of a line the CSV reader refuses as invalid UTF-8 (k = REJECTION_REASONS[k - 1]).
NOT_UTF8_CODE = 1 + REJECTION_REASONS.index(NOT_UTF8)
SIGN_BIT = "9223372036854775808::UBIGINT"
# The train shuffle key k1 takes 15 hex digits of the md5: 0 <= k1 < 2**60.
KEY_RANGE = 1 << 60


# ----------------------------------------------------------------------------- SQL pieces
def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def csv_buffer_bytes(memory_limit: Optional[str]) -> int:
    """The CSV scanner's buffer under `memory_limit`."""
    return int(min(CSV_BUFFER_BYTES, max(MIN_CSV_BUFFER_BYTES, memory_bytes(memory_limit) // 16)))


def scan_sql(path: str, day: int, buffer_bytes: int, rejects: Optional[str] = None, numbered: bool = False) -> str:
    """The lines of one day file: day, the line text ('' for a blank line) and, if `numbered`, the
    1-based number among the lines read (needs preserve_insertion_order). Each line is one field:
    the delimiter is the 4-byte sequence LINE_DELIMITER, which no Criteo line holds (a line that did
    would be cut there). A line that is not UTF-8 fails the scan, or with `rejects` is skipped and
    recorded in the tables `rejects`_errors and `rejects`_scans (`refused_lines`); only for files
    that `not_utf8_files` found, since DuckDB's reader then also drops a line longer than twice its
    buffer without a word."""
    number = ", row_number() OVER () AS line" if numbered else ""
    record = f", store_rejects=true, rejects_table='{rejects}_errors', rejects_scan='{rejects}_scans'" if rejects else ""
    return (f"SELECT {int(day)}::SMALLINT AS day, coalesce(text, '') AS text{number} "
            f"FROM read_csv({_quote(path)}, columns={{'text': 'VARCHAR'}}, delim=E'{LINE_DELIMITER}', "
            f"quote='', escape='', header=false, auto_detect=false, strict_mode=false, "
            f"buffer_size={int(buffer_bytes)}{record})")


def _chunks(path: str, size: int = 1 << 24) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def longest_line(path: str) -> int:
    """Bytes of the longest line of a file, lines ending at a newline or a carriage return (as DuckDB's
    reader splits them)."""
    longest = run = 0
    for chunk in _chunks(path):
        codes = np.frombuffer(chunk, dtype=np.uint8)
        breaks = np.flatnonzero((codes == 10) | (codes == 13))
        if not len(breaks):
            run += len(codes)
            continue
        longest = max(longest, run + int(breaks[0]), int(np.diff(breaks).max(initial=1)) - 1)
        run = len(codes) - int(breaks[-1]) - 1
    return max(longest, run)


def not_utf8_files(paths: Sequence[str], buffer_bytes: int) -> List[str]:
    """The files holding bytes that are not UTF-8 (one pass over the bytes, run only after such a
    file failed a scan). Raises InputError for one with a line over `buffer_bytes`: DuckDB's reader
    cannot skip and count its other lines then (it would drop the long one unnoticed)."""
    found = []
    for path in paths:
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            for chunk in _chunks(path):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            longest = longest_line(path)
            if longest > buffer_bytes:
                raise InputError(f"{path} holds lines that are not UTF-8 and a line of {longest:,} bytes; the "
                                 f"embedded engine counts lines that are not UTF-8 only in files whose lines are "
                                 f"at most {buffer_bytes:,} bytes (--engine spark reads it)") from None
            found.append(path)
    return found


def refused_lines(con: duckdb.DuckDBPyConnection, rejects: str, paths: Sequence[str], days: Sequence[int]) -> str:
    """A query of (day, line): the lines of `paths` that the scans recording into `rejects` (see
    scan_sql) refused as not UTF-8, numbered within their file. Any other refusal is an InputError
    naming the file and line."""
    files = ", ".join(f"({_quote(path)}, {int(day)})" for path, day in zip(paths, days))
    refused = (f"{rejects}_errors e JOIN {rejects}_scans s USING (scan_id, file_id) "
               f"JOIN (VALUES {files}) f(path, day) ON s.file_path = f.path")
    other = con.execute(f"SELECT f.path, e.line, e.error_message FROM {refused} "
                        f"WHERE e.error_type != 'INVALID ENCODING' ORDER BY f.day, e.line LIMIT 1").fetchone()
    if other:
        raise InputError(f"{other[0]}: line {other[1]}: {' '.join(str(other[2]).split())}")
    return f"SELECT f.day, e.line FROM {refused} WHERE e.error_type = 'INVALID ENCODING'"


def file_line_sql(column: str, refused: str) -> str:
    """The line number in the file of the line numbered `column` among those read, when the reader
    refused the lines of query `refused` (one file): it comes after every refused line r_i (i-th in
    order) with r_i - i < `column` lines read before it."""
    return (f"{column} + (SELECT count(*) FROM (SELECT line - row_number() OVER (ORDER BY line) AS before "
            f"FROM ({refused})) WHERE before < {column})")


def _field(i: int) -> str:
    return f"fields[{i + 1}]"


def reason_code_sql() -> str:
    """The 1-based rejection reason of a line read as text that failed GOOD_LINE (needs `fields`)."""
    integer_bad = " OR ".join(f"({_field(i)} != '' AND NOT regexp_full_match({_field(i)}, {_quote(INTEGER_PATTERN)}))"
                              for i in range(1, FIRST_CATEGORICAL_INDEX))
    code = {reason: k for k, reason in enumerate(REJECTION_REASONS, start=1)}
    return (f"CASE WHEN len(fields) != {NUM_FIELDS} THEN {code['wrong_field_count']} "
            f"WHEN fields[1] NOT IN ('0', '1') THEN {code['bad_label']} "
            f"WHEN {integer_bad} THEN {code['non_integer_numerical']} ELSE {code['non_hex_categorical']} END")


def categorical_sql(i: int) -> str:
    """Field i as the unsigned 64-bit value of its hex digits (null when empty)."""
    return f"TRY_CAST('0x' || nullif({_field(i)}, '') AS UBIGINT)"


def numerical_sql(i: int, take_log: bool) -> str:
    """Field i transformed as float32: ln(max(x, -2) + 3) (or x), missing -> 0."""
    value = f"TRY_CAST(nullif({_field(i)}, '') AS DOUBLE)"
    if take_log:
        value = f"ln(greatest({value}, {NUMERICAL_CLAMP_MIN}) + {NUMERICAL_LOG_SHIFT})"
    return f"CAST(coalesce({value}, 0) AS FLOAT)"


def good_sql() -> str:
    return f"regexp_full_match(text, {_quote(GOOD_LINE)})"


# ----------------------------------------------------------------------------- progress
def query_fraction(con: duckdb.DuckDBPyConnection) -> Callable[[], float]:
    """DuckDB's own progress of the running query, as a fraction."""
    def fraction() -> float:
        try:
            return max(con.query_progress(), 0.0) / 100.0
        except duckdb.Error:
            return 0.0
    return fraction


# ----------------------------------------------------------------------------- passes
def connect(database: str, temp_directory: str, threads: int, memory_limit: Optional[str]) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection whose tables live in `database` and whose spill files go to `temp_directory`."""
    con = duckdb.connect()
    con.execute(f"ATTACH {_quote(database)} AS work (ROW_GROUP_SIZE {ROW_GROUP_ROWS})")
    con.execute("USE work")
    con.execute(f"SET threads = {int(threads)}")
    con.execute(f"SET temp_directory = {_quote(temp_directory)}")
    if memory_limit:
        con.execute(f"SET memory_limit = {_quote(memory_limit)}")
    con.execute("SET enable_progress_bar = true")  # progress tracking for query_progress(); printing off below
    con.execute("SET enable_progress_bar_print = false")
    con.execute("SET preserve_insertion_order = false")
    return con


def parse_pass(con: duckdb.DuckDBPyConnection, paths: Sequence[str], days: Sequence[int], seed: int,
               take_log: bool, in_memory: bool, buffer_bytes: int, refusing: Collection[str] = ()) -> None:
    """One scan of every day file into table `typed`: day, line (last day only), reason code (null
    for a valid line), the train shuffle key (k1, k2: the first 30 hex digits of the md5 of
    criteo_rules.py, train days only), label, transformed numericals and the categorical values
    (unsigned 64-bit; null when empty). In the files of `refusing`, a line that is not UTF-8 becomes
    a row with its day, line and reason only (elsewhere it fails the scan). `in_memory`: a temporary table (faster; it cannot spill), else
    one in the working database file (spills)."""
    last = days[-1]
    hex_key = f"md5(concat_ws(E'\\t', {int(seed)}, day, text))"
    # Only the valid rows (reason null) are ever used; the others' values are whatever TRY_CAST makes.
    numericals = [f"{numerical_sql(i, take_log)} AS _c{i}" for i in range(1, FIRST_CATEGORICAL_INDEX)]
    values = [f"{categorical_sql(i)} AS v{name}"
              for i, name in zip(range(FIRST_CATEGORICAL_INDEX, NUM_FIELDS), CATEGORICAL_COLUMNS)]
    select = (f"SELECT day, line, CASE WHEN NOT good THEN {reason_code_sql()} END::TINYINT AS reason, "
              f"('0x' || hex_key[1:15])::BIGINT AS k1, ('0x' || hex_key[16:30])::BIGINT AS k2, "
              f"TRY_CAST(fields[1] AS INTEGER) AS _c0, {', '.join(numericals)}, {', '.join(values)} "
              f"FROM (SELECT day, line, fields, good, CASE WHEN good AND day < {last} THEN {hex_key} END AS hex_key "
              f"FROM (SELECT day, line, text, string_split(text, E'\\t') AS fields, {good_sql()} AS good "
              f"FROM (@SCANS@)))")
    train_files = list(zip(paths[:-1], days[:-1]))
    train = " UNION ALL ".join(
        f"SELECT *, NULL::BIGINT AS line FROM ({scan_sql(path, day, buffer_bytes, 'train' if path in refusing else None)})"
        for path, day in train_files)
    kind = "TEMP TABLE" if in_memory else "TABLE"
    con.execute(f"CREATE OR REPLACE {kind} typed AS {select.replace('@SCANS@', train)}")
    refused_train = [(path, day) for path, day in train_files if path in refusing]
    if refused_train:
        con.execute(f"INSERT INTO typed (day, reason) SELECT day, {NOT_UTF8_CODE} "
                    f"FROM ({refused_lines(con, 'train', *zip(*refused_train))})")
    rejects = "last" if paths[-1] in refusing else None
    # row_number() OVER () numbers the lines in file order, on one thread: only the numbering runs
    # there (into a table of the last day's lines), the parse of those lines on every thread.
    con.execute("SET preserve_insertion_order = true")
    try:
        con.execute(f"CREATE OR REPLACE {kind} last_lines AS {scan_sql(paths[-1], last, buffer_bytes, rejects, numbered=True)}")
    finally:
        con.execute("SET preserve_insertion_order = false")
    con.execute(f"INSERT INTO typed {select.replace('@SCANS@', 'SELECT * FROM last_lines')}")
    con.execute("DROP TABLE last_lines")
    if rejects:  # the lines read are numbered as in the file, and the refused ones added
        refused = refused_lines(con, rejects, paths[-1:], [last])
        con.execute(f"UPDATE typed SET line = {file_line_sql('typed.line', refused)} WHERE day = {last}")
        con.execute(f"INSERT INTO typed (day, line, reason) SELECT day, line, {NOT_UTF8_CODE} FROM ({refused})")
    if not in_memory:
        con.execute("CHECKPOINT")  # written out now, its blocks can leave memory


def line_counts(con: duckdb.DuckDBPyConnection, condition: str = "true") -> Dict[Tuple[int, str], int]:
    """{(day, 'lines' or reason): count} of the rows of `typed` that meet `condition`."""
    counts: Dict[Tuple[int, str], int] = {}
    for day, code, n in con.execute(f"SELECT day, reason, count(*) FROM typed WHERE {condition} "
                                    f"GROUP BY day, reason").fetchall():
        counts[(day, "lines")] = counts.get((day, "lines"), 0) + int(n)
        if code is not None:
            counts[(day, REJECTION_REASONS[code - 1])] = int(n)
    return counts


@dataclass
class Dictionary:
    """One column's kept values, sorted (uint64), and their ids (int32), for vectorised lookups."""

    values: np.ndarray
    ids: np.ndarray

    def lookup(self, column: pa.Array) -> np.ndarray:
        """Ids of an arrow uint64 column: 0 for nulls and for values not in the dictionary."""
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        if not len(self.values):
            return np.zeros(len(values), dtype=np.int32)
        at = np.minimum(np.searchsorted(self.values, values), len(self.values) - 1)
        found = (self.values[at] == values) & column.is_valid().to_numpy(zero_copy_only=False)
        return np.where(found, self.ids[at], 0).astype(np.int32, copy=False)


def build_dictionaries(con: duckdb.DuckDBPyConnection, limits: Sequence[int]) -> List[Dictionary]:
    """Per categorical column, the values of valid lines seen at least `limit` times with ids 1, 2, ...
    by descending count (ties: ascending signed 64-bit value); one grouped query per column."""
    dictionaries = []
    for name, limit in zip(CATEGORICAL_COLUMNS, limits):
        kept = con.execute(f"""
            SELECT val, id FROM (
                SELECT val, (row_number() OVER (ORDER BY n DESC, xor(val, {SIGN_BIT})))::INTEGER AS id
                FROM (SELECT v{name} AS val, count(*) AS n FROM typed WHERE reason IS NULL AND v{name} IS NOT NULL
                      GROUP BY v{name})
                WHERE n >= {int(limit)})
            ORDER BY val""").fetchnumpy()
        dictionaries.append(Dictionary(np.asarray(kept["val"], dtype=np.uint64), np.asarray(kept["id"], dtype=np.int32)))
    return dictionaries


def rows_sql(condition: str, order: str) -> str:
    """Label, 13 transformed numericals and the 26 raw categorical values of the valid rows of
    `typed` that meet `condition`, ordered by `order` (the ids are looked up in numpy)."""
    columns = ["_c0", *[f"_c{i}" for i in range(1, FIRST_CATEGORICAL_INDEX)], *[f"v{name}" for name in CATEGORICAL_COLUMNS]]
    return f"SELECT {', '.join(columns)} FROM typed WHERE reason IS NULL AND {condition} ORDER BY {order}"


def packed_batches(reader, dictionaries: Sequence[Dictionary], on_rows: Callable[[int], None],
                   threads: int = 1) -> Iterator[np.ndarray]:
    """Arrow record batches of rows_sql -> [rows, 40] int32 chunks (numericals as float32 bits, ids).
    The 26 lookups of a batch run on `threads` threads (numpy and arrow release the GIL in them)."""
    def fill(packed: np.ndarray, batch: pa.RecordBatch, i: int) -> None:
        if i < FIRST_CATEGORICAL_INDEX:
            packed[:, i] = batch.column(i).to_numpy(zero_copy_only=False).astype("<f4").view("<i4")
        else:
            packed[:, i] = dictionaries[i - FIRST_CATEGORICAL_INDEX].lookup(batch.column(i))

    with ThreadPoolExecutor(threads) as pool:
        for batch in reader:
            packed = np.empty((batch.num_rows, NUM_FIELDS), dtype="<i4")
            packed[:, 0] = batch.column(0).to_numpy(zero_copy_only=False)
            for done in [pool.submit(fill, packed, batch, i) for i in range(1, NUM_FIELDS)]:
                done.result()
            on_rows(batch.num_rows)
            yield packed


def train_queries(last: int, num_parts: int) -> List[str]:
    """The train rows in shuffle-key order as `num_parts` queries over consecutive ranges of k1 (a
    60-bit hash, so the ranges hold about equal shares): each sorts only its share, which bounds the
    sort's memory, and their outputs in sequence are the one ordering by (k1, k2)."""
    bounds = [part * KEY_RANGE // num_parts for part in range(num_parts + 1)]
    return [rows_sql(f"day < {last} AND k1 >= {low} AND k1 < {high}", "k1, k2")
            for low, high in zip(bounds[:-1], bounds[1:])]


def sort_parts(rows: int, memory_limit: Optional[str]) -> int:
    """How many key ranges the train sort needs so that one range's rows take at most a quarter of
    the memory limit (1 unless the limit is small against the data)."""
    per_part = max(memory_bytes(memory_limit) // 4, 1)
    return max(1, -(-rows * PARSED_BYTES_PER_LINE // per_part))


def write_query(con: duckdb.DuckDBPyConnection, queries: Sequence[str], dictionaries: Sequence[Dictionary],
                output_dir: str, progress: Progress, stage: str, rows: int, threads: int = 1) -> int:
    """Run `queries` one after another and write their rows in order as one split folder; returns
    the row count."""
    written = [0]
    finished = [0]
    cardinalities = [len(d.ids) + 1 for d in dictionaries]
    query_done = query_fraction(con)

    def fraction() -> float:
        return 0.5 * (finished[0] + query_done()) / len(queries) + 0.5 * written[0] / max(rows, 1)

    def record_batches() -> Iterator[pa.RecordBatch]:
        for query in queries:
            yield from con.sql(query).to_arrow_reader(BATCH_ROWS)
            finished[0] += 1

    def count(n: int) -> None:
        written[0] += n

    with progress.stage(stage, rows, fraction, " (queries and rows written)"):
        return write_split(packed_batches(record_batches(), dictionaries, count, threads), output_dir, f"{stage} rows",
                           FIRST_CATEGORICAL_INDEX - 1, cardinalities)


def first_bad_line(con: duckdb.DuckDBPyConnection, path: str, day: int, buffer_bytes: int,
                   refusing: bool = False) -> Tuple[int, Optional[str]]:
    """(1-based line number, text; None when not UTF-8) of the first line of a day file that breaks
    the rules; `refusing`: the file holds lines that are not UTF-8 (see not_utf8_files)."""
    rejects = "strict" if refusing else None
    con.execute("SET preserve_insertion_order = true")
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE bad_lines AS SELECT line, text FROM "
                    f"({scan_sql(path, day, buffer_bytes, rejects, numbered=True)}) WHERE NOT {good_sql()}")
    finally:
        con.execute("SET preserve_insertion_order = false")
    if not rejects:
        return con.execute("SELECT line, text FROM bad_lines ORDER BY line LIMIT 1").fetchone()
    refused = refused_lines(con, rejects, [path], [day])
    return con.execute(f"SELECT line, text FROM (SELECT {file_line_sql('bad_lines.line', refused)} AS line, text "
                       f"FROM bad_lines UNION ALL SELECT line, NULL FROM ({refused})) ORDER BY line LIMIT 1").fetchone()


# ----------------------------------------------------------------------------- the run
def finished_run(output_dir: str, params: str) -> bool:
    """Whether `output_dir` holds a complete dataset whose summary records the same `params`."""
    try:
        with open(os.path.join(output_dir, SUMMARY_NAME)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return False
    complete = all(os.path.isdir(os.path.join(output_dir, split)) for split in ("train", "test", "validation"))
    return bool(params) and summary.get("params") == params and complete and os.path.isfile(
        os.path.join(output_dir, "feature_spec.yaml"))


def prepare(input_folder: str, num_days: int, frequency_limit: str, output_dir: str, scratch_dir: str, seed: int,
            strict: bool = False, take_log: bool = True, threads: int = 1, memory_limit: Optional[str] = None,
            overwrite: bool = False, progress_interval: float = 10.0, params: str = "") -> Dict[str, object]:
    """Raw day files -> the split-binary dataset in `output_dir` (all or nothing); returns the summary.
    `params` is stored in the summary: `finished_run` recognises a dataset built with the same."""
    if num_days < 2:
        raise InputError(f"the number of days must be at least 2 (train days and a test day), got {num_days}")
    limits = column_limits(frequency_limit)
    refuse_overlap(output_dir, "--output", {"--input_folder": input_folder, "--scratch_dir": scratch_dir})
    replace = check_replaceable(output_dir, "--output", output_entries(with_summary=True), overwrite)
    days = list(range(num_days))
    paths = day_file_paths(input_folder, days)
    os.makedirs(scratch_dir, exist_ok=True)
    progress = Progress("duckdb", progress_interval, sys.stderr)
    con = connect(os.path.join(scratch_dir, "work.duckdb"), os.path.join(scratch_dir, "spill"), threads, memory_limit)
    try:
        start = time.monotonic()
        estimated_lines = estimate_lines(paths)
        # The parsed table stays in memory when it takes under a third of the budget, else it spills.
        in_memory = estimated_lines * PARSED_BYTES_PER_LINE < memory_bytes(memory_limit) // 3
        buffer_bytes = csv_buffer_bytes(memory_limit)
        refusing: List[str] = []
        with progress.stage("parse", estimated_lines, query_fraction(con)):
            try:
                parse_pass(con, paths, days, seed, take_log, in_memory, buffer_bytes)
            except duckdb.InvalidInputException:  # once more, counting the lines that are not UTF-8 if that was it
                refusing = not_utf8_files(paths, buffer_bytes)
                if not refusing:
                    raise
                progress.say(f"lines that are not UTF-8 in {', '.join(refusing)}: counted and skipped")
                parse_pass(con, paths, days, seed, take_log, in_memory, buffer_bytes, refusing)
        counts = line_counts(con)
        if strict:
            first = next((day for day in days if any(counts.get((day, r)) for r in REJECTION_REASONS)), None)
            if first is not None:
                line, text = first_bad_line(con, paths[first], first, buffer_bytes, paths[first] in refusing)
                raise strict_error(paths[first], line, text)
        last, train_days = days[-1], days[:-1]
        last_lines = counts.get((last, "lines"), 0)
        if last_lines < 2:
            raise InputError(f"{paths[-1]} has {last_lines} line(s); the last day needs at least 2 to split "
                             f"into test and validation")
        half = last_lines // 2
        with progress.stage("dictionary", sum(n for (_, kind), n in counts.items() if kind == "lines"),
                            query_fraction(con)):
            dictionaries = build_dictionaries(con, limits)
        cardinalities = [len(d.ids) + 1 for d in dictionaries]
        halves = {"test": f"day = {last} AND line <= {half}", "validation": f"day = {last} AND line > {half}"}
        split_counts = {"train": rejection_summary(counts, train_days),
                        **{split: rejection_summary(line_counts(con, condition), [last])
                           for split, condition in halves.items()}}
        train_rows = sum(n for (day, kind), n in counts.items() if kind == "lines" and day < last)
        queries = {"train": train_queries(last, sort_parts(train_rows, memory_limit)),
                   **{split: [rows_sql(condition, "line")] for split, condition in halves.items()}}
        with atomic_directory(output_dir, replace) as staging:
            rows = {split: write_query(con, queries[split], dictionaries, os.path.join(staging, split), progress,
                                       split, split_counts[split]["input_lines"], threads)
                    for split in queries}
            for counted in split_counts.values():
                counted["input_folder"] = input_folder
            FeatureSpec.get_default_feature_spec(FIRST_CATEGORICAL_INDEX - 1, cardinalities, staging).to_yaml()
            dictionary = {"engine": "duckdb", "frequency_limit": frequency_limit, "days": f"0-{last}"}
            summary = build_summary(split_counts, dictionary, rows, cardinalities)
            summary["params"] = params
            with open(os.path.join(staging, SUMMARY_NAME), "w") as f:
                json.dump(summary, f, indent=2)
                f.write("\n")
        progress.say(f"done in {time.monotonic() - start:.1f} s: " + ", ".join(f"{s}: {n:,} rows" for s, n in rows.items()))
        return summary
    finally:
        con.close()


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input_folder", required=True, help="folder holding day_0 .. day_<N-1>")
    parser.add_argument("--num_days", type=int, required=True, help="N: days 0..N-2 train, day N-1 test/validation")
    parser.add_argument("--frequency_limit", default="0",
                        help="N, col:N or a comma list of both (col = raw column 14..39); keep values seen >= N times")
    parser.add_argument("--output", required=True, help="the dataset folder (feature_spec.yaml, train/, test/, validation/)")
    parser.add_argument("--scratch_dir", required=True, help="DuckDB's working database and spill files")
    parser.add_argument("--random_seed", type=int, default=12345, help="seed of the train shuffle")
    parser.add_argument("--strict", action="store_true", help="fail on the first malformed line")
    parser.add_argument("--no_numeric_log_col", action="store_true", help="keep raw numericals (no log)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--memory_limit", help="DuckDB memory limit, e.g. 8GB (default: DuckDB's, 80%% of RAM)")
    parser.add_argument("--progress_interval", type=float, default=10.0, help="seconds between progress lines (0: none)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --output (refused while it holds other files)")
    parser.add_argument("--params", default="",
                        help="a line identifying the run, kept in the summary; with --reuse, an output with the same "
                             "line is kept as it is")
    parser.add_argument("--reuse", action="store_true", help="keep an --output built with the same --params")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.threads < 1:
        return bad_input(f"--threads must be at least 1, got {args.threads}")
    if args.reuse and finished_run(args.output, args.params):
        print(f"Reusing the dataset in {args.output} (same input, NUM_DAYS, threshold and seed)")
        return 0
    try:
        summary = prepare(args.input_folder, args.num_days, args.frequency_limit, args.output, args.scratch_dir,
                          args.random_seed, args.strict, not args.no_numeric_log_col, args.threads, args.memory_limit,
                          args.overwrite, args.progress_interval, args.params)
    except (InputError, OutputPathError, ValueError) as error:
        return bad_input(error)
    except (OSError, duckdb.Error) as error:  # a lost disk, an engine failure
        return failure(error)
    by_reason = {r: sum(split["rejected_by_reason"][r] for split in summary["splits"].values())
                 for r in REJECTION_REASONS}
    reasons = ", ".join(f"{r}: {n}" for r, n in by_reason.items() if n)
    total = summary["total"]
    print(f"{total['input_lines']} lines, {total['rejected_lines']} rejected" + (f" ({reasons})" if reasons else "")
          + f", {total['rows']} rows -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

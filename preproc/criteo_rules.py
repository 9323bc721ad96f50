"""The Criteo preprocessing rules both engines follow (Spark: spark_data_utils.py, the embedded
engine: duckdb_pipeline.py), kept in one place so that they produce the same dataset.

Raw line: 40 tab-separated fields, `_c0` label (0/1), `_c1`..`_c13` integers, `_c14`..`_c39`
hexadecimal categoricals; any field but the label may be empty. A line is valid when it matches
`GOOD_LINE` as a whole (one regular expression per line, the cheap test); only lines that fail it
are examined field by field for the rejection reason (`REJECTION_REASONS`, in order of checks). The
first check is on the bytes: a line that is not valid UTF-8 (random bytes, a latin-1 value) is
`not_utf8` whatever else it holds, since the embedded engine's reader cannot give it as text.

Train rows are ordered by `md5("<seed>\\t<day>\\t<line text>")` (hex, ascending): a seeded
shuffle that both engines compute the same way. Two lines with the same key have the same day and
text, hence the same output row, so the written bytes do not depend on how ties are broken.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


NUM_INTEGER_FEATURES = 13
NUM_CATEGORICAL_FEATURES = 26
NUM_FIELDS = 1 + NUM_INTEGER_FEATURES + NUM_CATEGORICAL_FEATURES
FIRST_CATEGORICAL_INDEX = 1 + NUM_INTEGER_FEATURES
LABEL_COLUMN = "_c0"
INTEGER_COLUMNS = [f"_c{i}" for i in range(1, FIRST_CATEGORICAL_INDEX)]
CATEGORICAL_COLUMNS = [f"_c{i}" for i in range(FIRST_CATEGORICAL_INDEX, NUM_FIELDS)]

NOT_UTF8 = "not_utf8"
REJECTION_REASONS = (NOT_UTF8, "wrong_field_count", "bad_label", "non_integer_numerical", "non_hex_categorical")
INTEGER_PATTERN = "-?[0-9]+"
HEX_PATTERN = "[0-9a-fA-F]{1,16}"
# A whole valid line (no anchors: each engine anchors it its own way). A tab never occurs inside a
# field, so this also fixes the field count at 40.
GOOD_LINE = (r"[01](\t(" + INTEGER_PATTERN + r")?){" + str(NUM_INTEGER_FEATURES) + r"}"
             r"(\t[0-9a-fA-F]{0,16}){" + str(NUM_CATEGORICAL_FEATURES) + r"}")
SPLITS = ("train", "test", "validation")


class InputError(ValueError):
    """Raw input is missing, empty or (in strict mode) malformed; the message names the file."""


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


def column_limits(frequency_limit: str) -> List[int]:
    """The frequency limit of each categorical column, in column order."""
    default, per_column = parse_frequency_limit(frequency_limit)
    return [per_column.get(name, default) for name in CATEGORICAL_COLUMNS]


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


_INTEGER = re.compile(INTEGER_PATTERN)
_HEX = re.compile(HEX_PATTERN)


def describe_bad_line(text: Optional[str]) -> Optional[Tuple[str, str]]:
    """(reason, detail) of the first rule a raw line breaks, or None for a valid line. `text` None:
    the line's bytes are not UTF-8 (an engine's reader cannot give it as text)."""
    if text is None:
        return NOT_UTF8, "the line is not valid UTF-8 text"
    fields = text.split("\t")
    if len(fields) != NUM_FIELDS:
        return REJECTION_REASONS[1], f"{len(fields)} tab-separated fields, expected {NUM_FIELDS}"
    if fields[0] not in ("0", "1"):
        return REJECTION_REASONS[2], f"label '{fields[0]}' is not 0 or 1"
    for i in range(1, FIRST_CATEGORICAL_INDEX):
        if fields[i] and not _INTEGER.fullmatch(fields[i]):
            return REJECTION_REASONS[3], f"column {i} value '{fields[i]}' is not an integer"
    for i in range(FIRST_CATEGORICAL_INDEX, NUM_FIELDS):
        if fields[i] and not _HEX.fullmatch(fields[i]):
            return REJECTION_REASONS[4], f"column {i} value '{fields[i]}' is not 1-16 hex digits"
    return None


def strict_error(file_path: str, line: int, text: Optional[str]) -> InputError:
    """The strict-mode error for a bad line (1-based line number; `text` None: not UTF-8)."""
    reason, detail = describe_bad_line(text) or ("unknown", "the line is valid")
    return InputError(f"{file_path}: line {line}: {reason}: {detail} "
                      f"(strict mode; run without --strict to count and skip such lines)")


def rejection_summary(counts: Dict[Tuple[int, str], int], days: Sequence[int]) -> Dict[str, object]:
    """The summary of one split from {(day, reason or 'lines'): count}: totals, reasons, per day."""
    by_day: Dict[str, Dict[str, object]] = {}
    for day in days:
        rejected = {reason: counts.get((day, reason), 0) for reason in REJECTION_REASONS}
        by_day[f"day_{day}"] = {"input_lines": counts.get((day, "lines"), 0),
                                "rejected": {r: n for r, n in rejected.items() if n}}
    by_reason = {reason: sum(counts.get((day, reason), 0) for day in days) for reason in REJECTION_REASONS}
    input_lines = sum(d["input_lines"] for d in by_day.values())
    rejected_lines = sum(by_reason.values())
    return {"input_lines": input_lines, "rejected_lines": rejected_lines, "output_rows": input_lines - rejected_lines,
            "rejected_by_reason": by_reason, "by_day": by_day}


def shuffle_key_text(seed: int, day: int, text: str) -> str:
    """The string whose md5 orders train rows (the engines build it in SQL; this is for tests)."""
    return f"{seed}\t{day}\t{text}"

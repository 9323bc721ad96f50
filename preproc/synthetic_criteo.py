"""Raw Criteo-format day files (the click logs `preproc/prepare_dataset.sh` reads), small and synthetic.

Each line: label, 13 integers, 26 eight-digit hex hashes, tab separated. Realistic quirks: empty
fields, negative integers, hashes drawn from a skewed per-column vocabulary shared by all days
(many repeats) plus one-off hashes (rare), and optionally malformed lines at chosen positions.

Labels are 1 with probability 0.25, independent of the features (what the preprocessing tests
need), or, with `teacher=True`, drawn from a logistic "teacher" over the features, so that a model
trained on the preprocessed data can learn them (what `make demo` needs): every vocabulary value
of a column has a weight, one-off and empty values have none, and each integer column adds a weight
times its preprocessed value ln(max(x, -2) + 3). The teacher's own AUC on the test split (the
first half of the last day) is the best a model can reach.

  python preproc/synthetic_criteo.py --output /data/criteo --days 4 --lines_per_day 100000 --teacher
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Collection, Dict, List, Mapping, Optional, Tuple

import numpy as np

from recsys.runtime.cli import bad_input
from recsys.runtime.safe_io import atomic_directory, atomic_file, check_output_file, check_replaceable, refuse_overlap

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
# Vocabulary size per categorical column: small ones test heavy repeats, large ones rare values.
VOCABULARY_SIZES = [4, 30, 500, 3000, 12, 200, 2, 60, 1500, 8000, 40, 7, 900,
                    100, 3, 5000, 25, 300, 10, 2000, 150, 6, 700, 50, 9, 400]
BASE_RATE = 0.25  # the share of positive labels without a teacher
TEACHER_SEED_OFFSET = 1 << 20  # the teacher's random stream: [seed, this], apart from every day's [seed, day]
TEACHER_BIAS = -1.6  # about a quarter of the labels positive, as in the click logs

# Malformed line kinds and how each is built from a good line's fields.
BAD_LINE_KINDS = ("wrong_field_count", "bad_label", "non_integer_numerical", "non_hex_categorical")


@dataclass
class Day:
    """One day's lines, and with a teacher each line's click probability (None without one)."""
    lines: List[str]
    probabilities: Optional[np.ndarray]


def _vocabularies(seed: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.choice(2**32, size=size, replace=False) for size in VOCABULARY_SIZES]


def _teacher_weights(seed: int) -> Tuple[List[np.ndarray], np.ndarray]:
    """Per categorical column a weight for each vocabulary rank; per integer column one weight."""
    rng = np.random.default_rng([seed, TEACHER_SEED_OFFSET])
    categorical = [rng.normal(0.0, 0.3, size) for size in VOCABULARY_SIZES]
    return categorical, rng.normal(0.0, 0.15, NUM_INTEGER)


def _categorical_column(rng: np.random.Generator, vocabulary: np.ndarray, num_lines: int,
                        empty_rate: float) -> Tuple[List[str], np.ndarray]:
    """The column's text, and each line's vocabulary rank (-1 for a one-off or empty value)."""
    ranks = np.arange(1, len(vocabulary) + 1, dtype=np.float64)
    weights = 1.0 / ranks ** 1.1
    index = rng.choice(len(vocabulary), size=num_lines, p=weights / weights.sum())
    values = vocabulary[index]
    one_off = rng.random(num_lines) < 0.03
    values[one_off] = rng.integers(0, 2**32, size=int(one_off.sum()))
    index[one_off] = -1
    text = [f"{v:08x}" for v in values]
    for i in np.flatnonzero(rng.random(num_lines) < empty_rate):
        text[i] = ""
        index[i] = -1
    return text, index


def _integer_column(rng: np.random.Generator, num_lines: int,
                    empty_rate: float) -> Tuple[List[str], np.ndarray]:
    """The column's text, and each line's preprocessed value ln(max(x, -2) + 3) (0 when empty)."""
    values = rng.geometric(0.05, size=num_lines) - 1
    large = rng.random(num_lines) < 0.01
    values[large] = rng.integers(10_000, 5_000_000, size=int(large.sum()))
    negative = rng.random(num_lines) < 0.04
    values[negative] = rng.choice([-1, -2, -3, -7], size=int(negative.sum()))
    text = [str(v) for v in values]
    logs = np.log(np.maximum(values, -2) + 3.0)
    for i in np.flatnonzero(rng.random(num_lines) < empty_rate):
        text[i] = ""
        logs[i] = 0.0
    return text, logs


def generate_day(num_lines: int, day: int, seed: int = 0, teacher: bool = False) -> Day:
    """`num_lines` well-formed lines for one day; the vocabulary (and teacher) depend only on `seed`."""
    vocabularies = _vocabularies(seed)
    rng = np.random.default_rng([seed, day])
    draws = rng.random(num_lines)  # a line is a click when its draw is below its probability
    integers = [_integer_column(rng, num_lines, empty_rate=0.05 * (j % 5)) for j in range(NUM_INTEGER)]
    categoricals = [_categorical_column(rng, vocab, num_lines, empty_rate=0.04 * (j % 4))
                    for j, vocab in enumerate(vocabularies)]
    probabilities = None
    if teacher:
        categorical_weights, integer_weights = _teacher_weights(seed)
        logits = np.full(num_lines, TEACHER_BIAS)
        for weight, (_, logs) in zip(integer_weights, integers):
            logits += weight * (logs - 3.0)  # ln(x + 3) is about 3 for a typical count
        for weights, (_, index) in zip(categorical_weights, categoricals):
            logits += np.where(index >= 0, weights[np.maximum(index, 0)], 0.0)
        probabilities = 1.0 / (1.0 + np.exp(-logits))
    labels = (draws < (BASE_RATE if probabilities is None else probabilities)).astype(int).astype(str)
    columns = [list(labels)] + [text for text, _ in integers] + [text for text, _ in categoricals]
    return Day(["\t".join(fields) for fields in zip(*columns)], probabilities)


def good_lines(num_lines: int, day: int, seed: int = 0) -> List[str]:
    """`num_lines` well-formed lines for one day with feature-independent labels."""
    return generate_day(num_lines, day, seed).lines


def make_bad_line(line: str, kind: str) -> str:
    """Turn a good line into a malformed one of the given kind."""
    fields = line.split("\t")
    if kind == "wrong_field_count":
        return "\t".join(fields[:-1])
    if kind == "bad_label":
        fields[0] = "2"
    elif kind == "non_integer_numerical":
        fields[5] = "3.5"
    elif kind == "non_hex_categorical":
        fields[20] = "zz12xy"
    else:
        raise ValueError(f"unknown bad line kind {kind!r}")
    return "\t".join(fields)


def write_days(directory: str, num_days: int, lines_per_day: int, seed: int = 0,
               bad_lines: Optional[Mapping[int, Mapping[int, str]]] = None, teacher: bool = False) -> Dict[int, Day]:
    """Write `day_0`..`day_<num_days-1>`; `bad_lines` maps day -> {line index: kind}. Returns the days."""
    os.makedirs(directory, exist_ok=True)
    written = {}
    for day in range(num_days):
        generated = generate_day(lines_per_day, day, seed, teacher)
        for index, kind in (bad_lines or {}).get(day, {}).items():
            generated.lines[index] = make_bad_line(generated.lines[index], kind)
        with open(os.path.join(directory, f"day_{day}"), "w") as f:
            f.write("\n".join(generated.lines) + "\n")
        written[day] = generated
    return written


def spread_bad_lines(num_days: int, lines_per_day: int, per_day: int, seed: int) -> Dict[int, Dict[int, str]]:
    """`per_day` malformed lines at random positions of every day, of each kind in turn over all days."""
    rng = np.random.default_rng([seed, TEACHER_SEED_OFFSET + 1])
    return {day: {int(index): BAD_LINE_KINDS[(day * per_day + k) % len(BAD_LINE_KINDS)]
                  for k, index in enumerate(rng.choice(lines_per_day, per_day, replace=False))}
            for day in range(num_days)}


def teacher_test_auc(last_day: Day, malformed: Collection[int]) -> float:
    """The teacher's AUC on the test split: the first floor(n/2) lines of the last day, less the
    `malformed` ones (the preprocessing rejects them)."""
    from recsys.runtime import metrics

    valid = [i for i in range(len(last_day.lines) // 2) if i not in malformed]
    labels = np.array([int(last_day.lines[i][0]) for i in valid], np.float64)
    return float(metrics.exact_auc(labels, last_day.probabilities[valid]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="folder for day_0 .. day_<days-1> (new, or empty)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier output holding only day files")
    parser.add_argument("--days", type=int, default=4, help="day files, at least 2: the last is test + validation")
    parser.add_argument("--lines_per_day", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--teacher", action="store_true", help="learnable labels from a logistic teacher")
    parser.add_argument("--malformed_per_day", type=int, default=0,
                        help="malformed lines per day (the preprocessing counts and rejects them)")
    parser.add_argument("--summary", help="write {'lines', 'malformed', 'teacher_auc'} here as JSON")
    args = parser.parse_args()
    try:
        if args.days < 2 or args.lines_per_day < 2 or not 0 <= args.malformed_per_day <= args.lines_per_day // 2:
            raise ValueError(f"need --days >= 2, --lines_per_day >= 2 and 0 <= --malformed_per_day <= half a day, "
                             f"got {args.days}, {args.lines_per_day}, {args.malformed_per_day}")
        day_files = {f"day_{day}" for day in range(args.days)}
        replace = check_replaceable(args.output, "--output", day_files, args.overwrite)
        if args.summary:
            refuse_overlap(args.summary, "--summary", {"--output": args.output})
            check_output_file(args.summary, "--summary")
    except ValueError as error:  # OutputPathError too
        return bad_input(error)
    bad = spread_bad_lines(args.days, args.lines_per_day, args.malformed_per_day, args.seed)
    with atomic_directory(args.output, replace=replace) as staging:
        written = write_days(staging, args.days, args.lines_per_day, args.seed, bad, args.teacher)
    summary = {"lines": args.days * args.lines_per_day, "malformed": args.days * args.malformed_per_day}
    if args.teacher:
        summary["teacher_auc"] = teacher_test_auc(written[args.days - 1], bad[args.days - 1])
    if args.summary:
        with atomic_file(args.summary) as handle:
            json.dump(summary, handle)
    print(f"wrote {args.days} day files of {args.lines_per_day:,} lines ({args.malformed_per_day} malformed each) "
          f"to {args.output}" + (f"; teacher AUC on the test split {summary['teacher_auc']:.4f}"
                                 if args.teacher else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

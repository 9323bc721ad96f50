"""Small Criteo-format day files for the preprocessing tests.

Each line: label, 13 integers, 26 eight-digit hex hashes, tab separated. Realistic quirks: empty
fields, negative integers, hashes drawn from a skewed per-column vocabulary shared by all days
(many repeats) plus one-off hashes (rare), and optionally malformed lines at chosen positions.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping

import numpy as np

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
# Vocabulary size per categorical column: small ones test heavy repeats, large ones rare values.
VOCABULARY_SIZES = [4, 30, 500, 3000, 12, 200, 2, 60, 1500, 8000, 40, 7, 900,
                    100, 3, 5000, 25, 300, 10, 2000, 150, 6, 700, 50, 9, 400]

# Malformed line kinds and how each is built from a good line's fields.
BAD_LINE_KINDS = ("wrong_field_count", "bad_label", "non_integer_numerical", "non_hex_categorical")


def _vocabularies(seed: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.choice(2**32, size=size, replace=False) for size in VOCABULARY_SIZES]


def _categorical_column(rng: np.random.Generator, vocabulary: np.ndarray, num_lines: int,
                        empty_rate: float) -> List[str]:
    ranks = np.arange(1, len(vocabulary) + 1, dtype=np.float64)
    weights = 1.0 / ranks ** 1.1
    values = rng.choice(vocabulary, size=num_lines, p=weights / weights.sum())
    one_off = rng.random(num_lines) < 0.03
    values[one_off] = rng.integers(0, 2**32, size=int(one_off.sum()))
    text = [f"{v:08x}" for v in values]
    for i in np.flatnonzero(rng.random(num_lines) < empty_rate):
        text[i] = ""
    return text


def _integer_column(rng: np.random.Generator, num_lines: int, empty_rate: float) -> List[str]:
    values = rng.geometric(0.05, size=num_lines) - 1
    large = rng.random(num_lines) < 0.01
    values[large] = rng.integers(10_000, 5_000_000, size=int(large.sum()))
    negative = rng.random(num_lines) < 0.04
    values[negative] = rng.choice([-1, -2, -3, -7], size=int(negative.sum()))
    text = [str(v) for v in values]
    for i in np.flatnonzero(rng.random(num_lines) < empty_rate):
        text[i] = ""
    return text


def good_lines(num_lines: int, day: int, seed: int = 0) -> List[str]:
    """`num_lines` well-formed lines for one day; the vocabulary depends only on `seed`."""
    vocabularies = _vocabularies(seed)
    rng = np.random.default_rng([seed, day])
    labels = (rng.random(num_lines) < 0.25).astype(int).astype(str)
    integers = [_integer_column(rng, num_lines, empty_rate=0.05 * (j % 5)) for j in range(NUM_INTEGER)]
    categoricals = [_categorical_column(rng, vocab, num_lines, empty_rate=0.04 * (j % 4))
                    for j, vocab in enumerate(vocabularies)]
    columns = [list(labels)] + integers + categoricals
    return ["\t".join(fields) for fields in zip(*columns)]


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
               bad_lines: Mapping[int, Mapping[int, str]] = None) -> Dict[int, List[str]]:
    """Write `day_0`..`day_<num_days-1>`; `bad_lines` maps day -> {line index: kind}. Returns the lines."""
    os.makedirs(directory, exist_ok=True)
    written = {}
    for day in range(num_days):
        lines = good_lines(lines_per_day, day, seed)
        for index, kind in (bad_lines or {}).get(day, {}).items():
            lines[index] = make_bad_line(lines[index], kind)
        with open(os.path.join(directory, f"day_{day}"), "w") as f:
            f.write("\n".join(lines) + "\n")
        written[day] = lines
    return written

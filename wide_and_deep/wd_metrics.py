"""MAP@12 of Wide & Deep (reference §7), the reference's way and exactly, and the other eval metrics.

Average precision of a display (a group of rows with one display_id) that has a click: 1 / (1 + the
position of its first clicked row among the group's rows sorted by prediction, ties to the earlier
row), or 0 when that position is 12 or more. MAP@12 is the mean over displays with a click.

- `map12_sums` is the reference's count: it groups rows within one batch only (a display cut by a
  record, batch or rank boundary counts as separate displays), returns (sum of APs, displays); the
  reference sums these over a rank's batches, divides, then averages the ranks' MAPs unweighted.
  Its rows are sorted by display_id stably (TensorFlow's argsort is a top-k, which keeps ties in
  order). Unlike the reference it accepts a display of more than 30 rows (its padding fails there).
- `exact_map12` groups every row of a display, wherever it was read.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

TOP_K = 12
PROBABILITY_CLIP = 1e-7  # Keras's BinaryCrossentropy clips probabilities to [eps, 1 - eps]


def map12_sums(display_ids: np.ndarray, labels: np.ndarray, predictions: np.ndarray) -> Tuple[float, int]:
    """(sum of average precisions, number of displays with a click) over the rows given, grouped by display_id."""
    display_ids = np.asarray(display_ids).reshape(-1)
    labels = np.asarray(labels).reshape(-1) > 0
    predictions = np.asarray(predictions, np.float64).reshape(-1)
    order = np.argsort(display_ids, kind="stable")
    ids, labels, predictions = display_ids[order], labels[order], predictions[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    group = np.cumsum(np.r_[True, ids[1:] != ids[:-1]]) - 1
    clicked = np.flatnonzero(labels)
    if clicked.size == 0:
        return 0.0, 0
    first_click = np.full(len(starts), -1)
    first_click[group[clicked[::-1]]] = clicked[::-1]  # later writes win: the first click of each group
    kept = first_click >= 0
    target = first_click[group]  # each row's group's target row (-1: the group has no click)
    has_target = target >= 0
    target_prediction = predictions[np.where(has_target, target, 0)]
    rows = np.arange(len(ids))
    ahead = has_target & ((predictions > target_prediction) | ((predictions == target_prediction) & (rows < target)))
    position = np.bincount(group, weights=ahead, minlength=len(starts))[kept]
    precision = np.where(position < TOP_K, 1.0 / (1.0 + position), 0.0)
    return float(precision.sum()), int(kept.sum())


def exact_map12(display_ids: np.ndarray, labels: np.ndarray, predictions: np.ndarray) -> float:
    """MAP@12 over whole displays (pass every eval row, from every rank); NaN without any click."""
    total, count = map12_sums(display_ids, labels, predictions)
    return total / count if count else float("nan")


def binary_accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Share of rows whose probability is on the label's side of 0.5 (Keras BinaryAccuracy)."""
    labels = np.asarray(labels).reshape(-1) > 0
    return float(np.mean((np.asarray(predictions).reshape(-1) > 0.5) == labels)) if labels.size else float("nan")


def bce(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities, clipped as Keras does."""
    y = np.asarray(labels, np.float64).reshape(-1)
    p = np.clip(np.asarray(predictions, np.float64).reshape(-1), PROBABILITY_CLIP, 1 - PROBABILITY_CLIP)
    return float(np.mean(-(y * np.log(p) + (1 - y) * np.log1p(-p)))) if y.size else float("nan")

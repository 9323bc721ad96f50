"""Evaluation metrics over all samples: exact rank AUC, the reference's threshold AUC, log loss."""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC from ranks (Mann-Whitney U), tied scores sharing their average rank.

    Exact over every sample, unlike the reference's 8000-threshold approximation. NaN when the
    labels hold only one class.
    """
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise ValueError(f"labels {labels.shape} and scores {scores.shape} differ in length")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, first_index, counts = np.unique(scores[order], return_index=True, return_counts=True)
    average_rank = first_index + (counts + 1) / 2.0
    ranks = np.repeat(average_rank, counts)
    positive_rank_sum = ranks[labels[order]].sum()
    return float((positive_rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def threshold_auc(labels: np.ndarray, logits: np.ndarray, num_thresholds: int,
                  chunk: int = 1 << 20) -> float:
    """The reference's approximation: Keras AUC with `num_thresholds` buckets over sigmoid(logits)."""
    metric = tf.keras.metrics.AUC(num_thresholds=num_thresholds, curve="ROC",
                                  summation_method="interpolation", from_logits=True)
    labels = np.asarray(labels, np.float32).reshape(-1)
    logits = np.asarray(logits, np.float32).reshape(-1)
    for start in range(0, labels.size, chunk):
        metric.update_state(labels[start:start + chunk], logits[start:start + chunk])
    return float(metric.result().numpy())


def log_loss_from_logits(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of sigmoid(logits), computed stably from the logits."""
    y = np.asarray(labels, np.float64).reshape(-1)
    x = np.asarray(logits, np.float64).reshape(-1)
    return float(np.mean(np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))))

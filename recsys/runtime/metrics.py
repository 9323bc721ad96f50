"""Evaluation metrics over all samples: exact rank AUC, the reference's threshold AUC, log loss."""
from __future__ import annotations

from typing import Optional

import numpy as np


def exact_auc(labels: np.ndarray, scores: np.ndarray, sample_weight: Optional[np.ndarray] = None) -> float:
    """ROC AUC over every sample: the probability that a positive outscores a negative, ties
    counting one half (Mann-Whitney U), optionally with per-sample weights.

    Exact, unlike the reference's 8000-threshold approximation. NaN when one class is absent.
    """
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    weights = (np.ones(labels.size) if sample_weight is None
               else np.asarray(sample_weight, np.float64).reshape(-1))
    if not labels.shape == scores.shape == weights.shape:
        raise ValueError(f"labels {labels.shape}, scores {scores.shape} and weights {weights.shape} differ in length")
    _, group = np.unique(scores, return_inverse=True)
    positives = np.bincount(group, weights=weights * labels)
    negatives = np.bincount(group, weights=weights * ~labels)
    total_positive, total_negative = positives.sum(), negatives.sum()
    if total_positive == 0 or total_negative == 0:
        return float("nan")
    negatives_below = np.cumsum(negatives) - negatives
    wins = np.sum(positives * (negatives_below + 0.5 * negatives))
    return float(wins / (total_positive * total_negative))


def threshold_auc(labels: np.ndarray, logits: np.ndarray, num_thresholds: int,
                  chunk: int = 1 << 20) -> float:
    """The reference's approximation: Keras AUC with `num_thresholds` buckets over sigmoid(logits).
    TensorFlow is imported here, so that the exact metrics load without it (the data tools use them)."""
    import tensorflow as tf

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

"""Evaluation metrics over all samples: exact rank AUC, the reference's threshold AUC, log loss, and
the quality a model owner checks before serving (`quality_metrics`: log loss, normalized entropy,
calibration, as TorchRec's metrics define them)."""
from __future__ import annotations

from typing import Dict, Optional

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


# Probabilities are clipped to [PROBABILITY_CLIP, 1 - PROBABILITY_CLIP] in a log loss (Keras's epsilon):
# a float32 probability of exactly 0 or 1 would otherwise cost an infinite loss.
PROBABILITY_CLIP = 1e-7


def base_entropy(labels: np.ndarray) -> float:
    """The binary entropy (nats) of the mean label, the base CTR: the log loss of a model that predicts
    the base CTR for every sample. 0 when one class is absent (no sample, or all labels equal)."""
    y = np.asarray(labels, np.float64).reshape(-1)
    ctr = float(np.mean(y)) if y.size else 0.0
    if ctr <= 0.0 or ctr >= 1.0:
        return 0.0
    return float(-(ctr * np.log(ctr) + (1.0 - ctr) * np.log1p(-ctr)))


def quality_metrics(labels: np.ndarray, probabilities: Optional[np.ndarray] = None,
                    logits: Optional[np.ndarray] = None) -> Dict[str, float]:
    """The metrics beside AUC a model owner checks before serving, over every sample, from the model's
    `logits` (exact log loss) or its `probabilities` (clipped to PROBABILITY_CLIP):

    - `log_loss`: mean binary cross-entropy;
    - `normalized_entropy`: log loss / `base_entropy(labels)` (TorchRec's NE: below 1 the model beats
      predicting the base CTR; NaN when one class is absent);
    - `calibration`: sum of predicted CTRs / sum of labels (TorchRec's calibration: 1 is calibrated,
      above 1 over-predicts clicks; NaN without a positive label).
    """
    if (probabilities is None) == (logits is None):
        raise ValueError("give probabilities or logits (one of them)")
    y = np.asarray(labels, np.float64).reshape(-1)
    if logits is not None:
        x = np.asarray(logits, np.float64).reshape(-1)
        p = np.exp(-np.logaddexp(0.0, -x))
        loss = log_loss_from_logits(y, x) if y.size else float("nan")
    else:
        p = np.asarray(probabilities, np.float64).reshape(-1)
        clipped = np.clip(p, PROBABILITY_CLIP, 1.0 - PROBABILITY_CLIP)
        loss = float(np.mean(-(y * np.log(clipped) + (1.0 - y) * np.log1p(-clipped)))) if y.size else float("nan")
    if y.shape != p.shape:
        raise ValueError(f"labels {y.shape} and predictions {p.shape} differ in length")
    entropy, positives = base_entropy(y), float(np.sum(y))
    return {"log_loss": loss, "normalized_entropy": loss / entropy if entropy > 0 else float("nan"),
            "calibration": float(np.sum(p)) / positives if positives > 0 else float("nan")}


def serving_scores(labels: np.ndarray, probabilities: np.ndarray) -> Dict[str, float]:
    """AUC beside log loss, normalized entropy and calibration: what the export's check and the
    served score report for a model's probabilities."""
    return {"auc": exact_auc(labels, probabilities), **quality_metrics(labels, probabilities)}

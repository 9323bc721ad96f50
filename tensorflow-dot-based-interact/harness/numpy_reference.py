"""Float64 NumPy reference of the dot interaction and its gradients (no TensorFlow)."""
from __future__ import annotations

import numpy as np


def output_width(num_vectors: int, dim: int) -> int:
    """D + F(F-1)/2 rounded up to a multiple of 8."""
    return -(-(dim + num_vectors * (num_vectors - 1) // 2) // 8) * 8


def interaction_reference(values: np.ndarray, upstream: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output, input gradient (pass-through folded into row 0) and bottom-MLP gradient.

    `values` is [B, F, D], `upstream` the [B, W] gradient of the output.
    """
    values = values.astype(np.float64)
    upstream = upstream.astype(np.float64)
    batch, num_vectors, dim = values.shape
    rows, cols = np.tril_indices(num_vectors, k=-1)
    output = np.zeros((batch, output_width(num_vectors, dim)))
    output[:, :dim] = values[:, 0, :]
    output[:, dim:dim + rows.size] = np.einsum("bid,bjd->bij", values, values)[:, rows, cols]
    pair_grads = np.zeros((batch, num_vectors, num_vectors))
    pair_grads[:, rows, cols] = upstream[:, dim:dim + rows.size]
    grad = np.einsum("bij,bjd->bid", pair_grads + pair_grads.transpose(0, 2, 1), values)
    grad[:, 0, :] += upstream[:, :dim]
    return output, grad, upstream[:, :dim]


def max_scaled_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Largest |actual - expected| / (|expected| + RMS(expected)): relative, robust to cancellation."""
    expected = expected.astype(np.float64)
    scale = float(np.sqrt(np.mean(np.square(expected)))) or 1.0
    return float(np.max(np.abs(actual.astype(np.float64) - expected) / (np.abs(expected) + scale)))

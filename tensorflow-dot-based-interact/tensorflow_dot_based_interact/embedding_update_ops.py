"""Python wrappers of the fused sparse embedding updates (`EmbeddingSparseSgd`,
`EmbeddingSparseAdam`, `EmbeddingSparseAdagrad`), CPU kernels in the same library as the dot
interaction.

Each call updates the touched rows of every given table in one op, spread over the intra-op
threads. Tables and slots are float32 resource variables [rows, dim] on the CPU; `indices` are one
vector per table (cast to int64 here) and `gradients` one [len(indices), dim] float32 tensor per
table.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tensorflow_dot_based_interact.dot_based_interact_ops import load_op_library


def _handles(variables: Sequence[tf.Variable]) -> list:
    return [variable.handle for variable in variables]


def _indices(indices: Sequence[tf.Tensor]) -> list:
    return [tf.cast(index, tf.int64) for index in indices]


def sparse_sgd_update(tables: Sequence[tf.Variable], indices: Sequence[tf.Tensor], gradients: Sequence[tf.Tensor],
                      learning_rate: tf.Tensor) -> tf.Operation:
    """tables[i][indices[i][j]] -= learning_rate * gradients[i][j], repeated rows once per index."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_sgd(
            tables=_handles(tables), indices=_indices(indices), gradients=list(gradients),
            learning_rate=tf.cast(learning_rate, tf.float32))


def sparse_adam_update(tables: Sequence[tf.Variable], first_moments: Sequence[tf.Variable],
                       second_moments: Sequence[tf.Variable], indices: Sequence[tf.Tensor],
                       gradients: Sequence[tf.Tensor], step_size: tf.Tensor, beta_1: float, beta_2: float,
                       epsilon: float) -> tf.Operation:
    """Lazy Adam on the touched rows (each distinct row once, with the sum of its gradients);
    `step_size` is the learning rate with Adam's bias correction."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_adam(
            tables=_handles(tables), first_moments=_handles(first_moments), second_moments=_handles(second_moments),
            indices=_indices(indices), gradients=list(gradients), step_size=tf.cast(step_size, tf.float32),
            beta_1=float(beta_1), beta_2=float(beta_2), epsilon=float(epsilon))


def sparse_adagrad_update(tables: Sequence[tf.Variable], accumulators: Sequence[tf.Variable],
                          indices: Sequence[tf.Tensor], gradients: Sequence[tf.Tensor], learning_rate: tf.Tensor,
                          epsilon: float) -> tf.Operation:
    """Adagrad on the touched rows (each distinct row once, with the sum of its gradients)."""
    with tf.device("/CPU:0"):
        return load_op_library().embedding_sparse_adagrad(
            tables=_handles(tables), accumulators=_handles(accumulators), indices=_indices(indices),
            gradients=list(gradients), learning_rate=tf.cast(learning_rate, tf.float32), epsilon=float(epsilon))

"""Python wrapper of `ReadFileRows`, the CPU op that reads, checks and converts a batch's rows
from files of fixed-width rows (the split-binary layout), in the same library as the dot
interaction. Its kernel opens the files once, when first run.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tensorflow_dot_based_interact.dot_based_interact_ops import load_op_library

CHECKS = ("none", "label", "finite", "ids")


def read_file_rows(first_rows: tf.Tensor, num_rows: tf.Tensor, *, paths: Sequence[str], row_widths: Sequence[int],
                   stored_types: Sequence[tf.DType], checks: Sequence[str], bounds: Sequence[int],
                   out_types: Sequence[tf.DType], error_tag: str) -> list:
    """Read i: rows [first_rows[i], first_rows[i] + num_rows[i]) of paths[i] as a
    [num_rows[i], row_widths[i]] tensor of out_types[i], every value checked by checks[i]
    ("label": a byte 0 or 1; "finite": a finite half; "ids": in [0, bounds[i]); "none").
    A bad value or a short file fails with InvalidArgument
    "<error_tag>] [<read>] [<label|finite|ids|eof>] [<sample>] [<column>] [<value>]"."""
    with tf.device("/CPU:0"):
        return load_op_library().read_file_rows(
            first_rows=tf.cast(first_rows, tf.int64), num_rows=tf.cast(num_rows, tf.int64), paths=list(paths),
            row_widths=[int(w) for w in row_widths], stored_types=list(stored_types), checks=list(checks),
            bounds=[int(b) for b in bounds], out_types=list(out_types), error_tag=error_tag)

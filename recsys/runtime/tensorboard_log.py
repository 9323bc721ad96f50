"""TensorBoard scalars of a training run (`--tensorboard_dir`), written by rank 0.

The training loop hands over its scalars only at progress lines and evaluations, where the host
has read the loss anyway, so writing them adds no synchronisation to the steps. Each scalar is
tagged `<group>/<name>` (`train/loss`, `eval/auc`, ...) at the global step. Open the folder with
`tensorboard --logdir DIR`.
"""
from __future__ import annotations

from typing import Mapping

import tensorflow as tf


class TensorBoardScalars:
    """An event file in `logdir` (created if missing) that takes scalars at a step."""

    def __init__(self, logdir: str) -> None:
        with tf.device("/CPU:0"):
            self._writer = tf.summary.create_file_writer(logdir)

    def write(self, step: int, group: str, scalars: Mapping[str, float]) -> None:
        """One point of each scalar, tagged `group/name`."""
        with tf.device("/CPU:0"), self._writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(f"{group}/{name}", float(value))

    def close(self) -> None:
        """Flush the events to disk and close the file."""
        self._writer.close()

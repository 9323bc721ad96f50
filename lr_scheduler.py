"""Warmup + polynomial-decay learning rate (reference §2.10), clamped at 0 after the decay ends.

The reference let the rate rise again quadratically after `decay_start_step + decay_steps`;
here it stays 0 (docs/architecture.md, deliberate differences).
"""
from __future__ import annotations

import tensorflow as tf


def learning_rate_at(step: tf.Tensor, base_learning_rate: float, warmup_steps: int,
                     decay_start_step: int, decay_steps: int) -> tf.Tensor:
    """LR for a 0-based step: linear warmup from 0, flat, then (remaining/decay_steps)^2 down to 0."""
    step = tf.cast(step, tf.float32)
    base = tf.constant(base_learning_rate, tf.float32)
    warmup = base * step / float(max(warmup_steps, 1))
    decay_end = float(decay_start_step + decay_steps)
    remaining = tf.maximum(decay_end - step, 0.0) / float(max(decay_steps, 1))
    decayed = base * tf.square(remaining)
    return tf.where(step < float(warmup_steps), warmup,
                    tf.where(step < float(decay_start_step), base, decayed))


class LearningRateScheduler:
    """Owns the training step counter; `advance()` returns this step's LR and counts the step.

    The counter is a variable so a checkpoint stores it and a resumed run continues the schedule.
    """

    def __init__(self, base_learning_rate: float, warmup_steps: int, decay_start_step: int,
                 decay_steps: int) -> None:
        self.base_learning_rate = base_learning_rate
        self.warmup_steps = warmup_steps
        self.decay_start_step = decay_start_step
        self.decay_steps = decay_steps
        with tf.device("/CPU:0"):
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="lr_schedule_step")

    def advance(self) -> tf.Tensor:
        """LR for the current step (read before the increment, as the reference does)."""
        learning_rate = learning_rate_at(self.step, self.base_learning_rate, self.warmup_steps,
                                         self.decay_start_step, self.decay_steps)
        self.step.assign_add(1)
        return learning_rate

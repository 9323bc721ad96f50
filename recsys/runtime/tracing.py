"""How the project's compiled functions are traced: as written, without AutoGraph.

The training steps, the evaluation forward passes and Wide & Deep's record parser branch and loop
on Python values only (feature lists, flags, micro-batch counts), never on a tensor, so AutoGraph's
source rewrite changes nothing in their graphs; it only cost time: rewriting the ~80 functions a
DLRM step calls took longer than the trace itself (a 2-rank job of the tests' size: 17 s to 10.5 s
from launch to exit without it). A branch on a tensor inside them fails at trace time, loudly.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf


def traced(fn: Optional[Callable] = None, **options: Any) -> Any:
    """`tf.function(fn, **options)` without AutoGraph; like tf.function, a decorator when `fn` is None."""
    return tf.function(fn, autograph=False, **options)

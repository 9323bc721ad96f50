"""The Criteo numerical rule, the one place it is written in Python: what the preprocessing engines
spell in SQL and Spark from these constants (preproc/criteo_rules.py), and what readers of data that
still needs it (HugeCTR raw, SOK folders with `dense_log`) apply."""
from __future__ import annotations

import numpy as np

# Values at or below this are clamped before the log, so ln(max(x, -2) + 3) >= 0 for every integer.
NUMERICAL_CLAMP_MIN = -2.0
NUMERICAL_LOG_SHIFT = 3.0


def transform_numericals(values: np.ndarray, take_log: bool = True) -> np.ndarray:
    """The numerical rule applied to present values, as `numerical.bin` stores them: ln(max(x, -2) + 3)
    in float64 (x itself without the log), then float32 (the engines' FLOAT), then float16 (round to
    nearest even). The engines write the same rule in SQL and Spark; readers of data that still
    needs it (HugeCTR raw, SOK) call this. NaN stays NaN, for the caller's finiteness check."""
    values = np.asarray(values)
    if take_log:  # one float64 array, updated in place (integers convert to float64 exactly)
        values = np.maximum(values, NUMERICAL_CLAMP_MIN, dtype=np.float64)
        np.add(values, NUMERICAL_LOG_SHIFT, out=values)
        np.log(values, out=values)
    with np.errstate(over="ignore"):
        return values.astype(np.float32).astype(np.float16)

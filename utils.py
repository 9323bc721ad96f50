"""DLRM's run reporting (reference: `utils.py`): the final record of a run with each metric's
format, and a flag as `--help` shows it. The logger itself, rank-aware printing and the step timer
are the runtime's (`recsys.runtime.logger`), shared with Wide & Deep.
"""
from __future__ import annotations

from typing import Any

from absl import flags

from recsys.runtime.logger import DllLogger


def log_final(logger: DllLogger, data: dict) -> None:
    """The run's last record: `data`, each metric with its printed format (and latencies in seconds)."""
    formats = {"auc": ":.5f", "validation_loss": ":.5f", "train_loss": ":.5f", "test_loss": ":.5f",
               "normalized_entropy": ":.5f", "calibration": ":.5f",
               "throughput": ":.2e", "mean_step_time_ms": ":.3f", "mean_inference_throughput": ":.2e"}
    for metric, value in data.items():
        if metric in formats:
            logger.metadata(metric, {"format": formats[metric]})
        elif "latency" in metric:
            logger.metadata(metric, {"unit": "s", "format": ":.5f"})
    logger.log(step=(), data=data)


def describe_flag(flag: Any) -> str:
    """One flag as --help shows it: the name, the help text wrapped, the default."""
    name = f"--[no]{flag.name}" if flag.flag_type() == "bool" else f"--{flag.name}"
    text = flags.text_wrap(f"{name}: {flag.help}", indent="    ", firstline_indent="  ")
    default = flag.default_as_str if flag.default is not None else "none"
    return f"{text}\n    (default: {default})"

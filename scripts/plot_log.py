"""Plot a training run's dllogger log (`--log_path` of main.py): loss and AUC against the step, as a PNG.

For users without TensorBoard. Training writes a record at every progress line (`loss`) and after
every evaluation (`auc`), each with the global step; this draws the loss in the upper panel and the
AUC in the lower one. The PNG is written to a temporary sibling and renamed into place.

Usage: python scripts/plot_log.py LOG.json [--output PLOT.png] [--width 1200] [--height 800]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Tuple

from safe_io import OutputPathError, atomic_file, check_output_file, refuse_overlap
from utils import read_dllogger_file

DPI = 100
Series = Tuple[List[int], List[float]]


class LogError(ValueError):
    """The log cannot be plotted; the message names the file."""


def training_series(log_path: str) -> Dict[str, Series]:
    """Steps and values of `loss` and `auc` from the per-step LOG records (those with an integer step)."""
    series: Dict[str, Series] = {"loss": ([], []), "auc": ([], [])}
    try:
        records = list(read_dllogger_file(log_path))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise LogError(f"{log_path}: cannot read a dllogger log ({error})") from None
    if not records:
        raise LogError(f"{log_path}: no DLLL records; is it the --log_path of a main.py run?")
    for record in records:
        step = record.get("step")
        if record.get("type") != "LOG" or not isinstance(step, int):
            continue
        for name, (steps, values) in series.items():
            if name in record["data"]:
                steps.append(step)
                values.append(float(record["data"][name]))
    if not any(steps for steps, _ in series.values()):
        raise LogError(f"{log_path}: no training record with a loss or an AUC (the run ended before its first "
                       f"progress line and evaluation, or the log is not a training log)")
    return series


def plot(series: Dict[str, Series], title: str, output: str, width: int, height: int) -> None:
    """Two panels, loss and AUC against the step, `width` x `height` pixels."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (loss_axes, auc_axes) = pyplot.subplots(2, 1, sharex=True, figsize=(width / DPI, height / DPI), dpi=DPI)
    for axes, name, label in ((loss_axes, "loss", "training loss"), (auc_axes, "auc", "test AUC")):
        steps, values = series[name]
        if steps:
            axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3)
        else:
            axes.text(0.5, 0.5, f"no {label} records", ha="center", va="center", transform=axes.transAxes)
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    auc_axes.set_xlabel("step")
    loss_axes.set_title(title)
    with atomic_file(output, "wb") as handle:
        figure.savefig(handle, format="png", dpi=DPI)
    pyplot.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="dllogger log of a training run (main.py --log_path)")
    parser.add_argument("--output", help="PNG to write (default: the log's path with .png)")
    parser.add_argument("--width", type=int, default=1200, help="pixels (default 1200)")
    parser.add_argument("--height", type=int, default=800, help="pixels (default 800)")
    args = parser.parse_args()
    output = args.output or os.path.splitext(args.log)[0] + ".png"
    try:
        for name in ("width", "height"):
            if not 100 <= getattr(args, name) <= 10000:
                raise LogError(f"--{name} must be between 100 and 10000 pixels, got {getattr(args, name)}")
        if not os.path.isfile(args.log):
            raise LogError(f"{args.log}: no such file")
        refuse_overlap(output, "--output", {"LOG": args.log})
        check_output_file(output, "--output")
        series = training_series(args.log)
        plot(series, os.path.basename(args.log), output, args.width, args.height)
    except (LogError, OutputPathError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"plot written to {output} ({len(series['loss'][0])} loss points, {len(series['auc'][0])} AUC points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

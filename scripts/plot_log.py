"""Plot a training run's dllogger log (`--log_path` of main.py): loss and AUC against the step, as a PNG.

For users without TensorBoard. Training writes a record at every progress line (`loss`) and after
every evaluation (`auc`), each with the global step; this draws the loss in the upper panel and the
AUC in the lower one. A Wide & Deep log (wide_and_deep/main.py's `--results_dir/log.json`: steps as
[step, steps in all], evaluations as `auc_val` and `exact_map_val`, the training records' `auc` being
one batch's) gets its evaluation AUC and MAP@12 in the lower panel. The PNG is written to a temporary
sibling and renamed into place.

A log holding several runs (recsys/runtime/run_record.py: each run's PARAMETER record names its
history; a resumed run continues its history) is refused unless `--run N` picks one: two runs are never
drawn stacked. Within a history, a resume from an earlier checkpoint than the last record replaces
the abandoned records from its first step on.

Usage: python scripts/plot_log.py LOG.json [--run N] [--output PLOT.png] [--width 1200] [--height 800]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Tuple

from recsys.runtime.safe_io import OutputPathError, atomic_file, check_output_file, refuse_overlap
from recsys.runtime.run_record import read_runs

DPI = 100
Series = Tuple[List[int], List[float]]


class LogError(ValueError):
    """The log cannot be plotted; the message names the file."""


EVALUATION_KEYS = {"auc_val": "auc", "exact_map_val": "map12"}  # Wide & Deep's keys -> the series


def _step(record: dict) -> int | None:
    """A training record's global step: an integer (DLRM), or the first of [step, steps in all] (W&D)."""
    step = record.get("step")
    if isinstance(step, list) and len(step) == 2 and all(isinstance(s, int) for s in step):
        return step[0]
    return step if isinstance(step, int) else None


def chosen_run(log_path: str, run: Optional[int]) -> List[dict]:
    """The records of the log's one run, or of run `run` (1-based) of several; a log of several runs
    without `run` is refused, naming where each starts."""
    try:
        runs = read_runs(log_path)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise LogError(f"{log_path}: cannot read a dllogger log ({error})") from None
    if not runs:
        raise LogError(f"{log_path}: no DLLL records; is it the --log_path of a main.py run?")
    if run is None and len(runs) > 1:
        starts = ", ".join(str(r.first_record) for r in runs)
        raise LogError(f"{log_path}: holds {len(runs)} runs (starting at records {starts}), which drawn together "
                       f"would mix; plot one with --run 1..{len(runs)}")
    if run is not None and not 1 <= run <= len(runs):
        raise LogError(f"--run {run}: {log_path} holds {len(runs)} run(s)")
    return runs[(run or 1) - 1].records


def training_series(log_path: str, run: Optional[int] = None) -> Dict[str, Series]:
    """Steps and values of `loss`, `auc` and `map12` from one run's per-step LOG records (those with a
    step; chosen_run): `auc` from DLRM's evaluations, or from W&D's `auc_val` when the log has those (its
    `auc` is one training batch's); `map12` from W&D's `exact_map_val`. A step at or before a series'
    last one (a resume from an earlier checkpoint) drops the points it replaces."""
    series: Dict[str, Series] = {"loss": ([], []), "auc": ([], []), "map12": ([], [])}
    records = chosen_run(log_path, run)
    training = [(step, record["data"]) for record in records
                if record.get("type") == "LOG" and (step := _step(record)) is not None]
    wide_and_deep = any("auc_val" in data for _, data in training)
    keys = {"loss": "loss", **(EVALUATION_KEYS if wide_and_deep else {"auc": "auc"})}
    for step, data in training:
        for key, name in keys.items():
            if key in data:
                while series[name][0] and series[name][0][-1] >= step:
                    series[name][0].pop()
                    series[name][1].pop()
                series[name][0].append(step)
                series[name][1].append(float(data[key]))
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
    for axes, names, label in ((loss_axes, ("loss",), "training loss"), (auc_axes, ("auc", "map12"), "test AUC")):
        drawn = [name for name in names if series[name][0]]
        for name in drawn:
            steps, values = series[name]
            axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3,
                      label={"map12": "test MAP@12"}.get(name, label))
        if not drawn:
            axes.text(0.5, 0.5, f"no {label} records", ha="center", va="center", transform=axes.transAxes)
        if len(drawn) > 1:
            axes.legend()
        axes.set_ylabel(label if len(drawn) < 2 else "test AUC, MAP@12")
        axes.grid(True, alpha=0.3)
    auc_axes.set_xlabel("step")
    loss_axes.set_title(title)
    with atomic_file(output, "wb") as handle:
        figure.savefig(handle, format="png", dpi=DPI)
    pyplot.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="dllogger log of a training run (main.py --log_path)")
    parser.add_argument("--run", type=int, help="which run of a log holding several (1 = the first)")
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
        series = training_series(args.log, args.run)
        plot(series, os.path.basename(args.log), output, args.width, args.height)
    except (LogError, OutputPathError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    maps = f", {len(series['map12'][0])} MAP@12 points" if series["map12"][0] else ""
    print(f"plot written to {output} ({len(series['loss'][0])} loss points, {len(series['auc'][0])} AUC points{maps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

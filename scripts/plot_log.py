"""Plot a training run's dllogger log (`--log_path` of main.py): loss and AUC against the step, as a PNG.

For users without TensorBoard. Training writes a record at every progress line (`loss`, the last
step's, and `mean_loss`, the mean over the steps since the previous line) and after every evaluation
(`auc`), each with the global step; this draws the mean loss (a log without `mean_loss`: `loss`) in
the upper panel, a trend where single steps' losses read as noise, and the AUC in the lower one. A
Wide & Deep log (wide_and_deep/main.py's `--results_dir/log.json`: steps as [step, steps in all],
evaluations as `auc_val` and `exact_map_val`, the training records' `auc` being one batch's) gets its
evaluation AUC and MAP@12 in the lower panel. `--teacher_auc` and `--teacher_map` draw a dashed line
there at the AUC or MAP@12 of the teacher that labelled synthetic data (the demos': the ceiling a
model can reach). The PNG is written to a temporary sibling and renamed into place.

A log holding several runs (recsys/runtime/run_record.py: each run's PARAMETER record names its
history; a resumed run continues its history) is refused unless `--run N` picks one: two runs are never
drawn stacked. Within a history, a resume from an earlier checkpoint than the last record replaces
the abandoned records from its first step on.

Usage: python scripts/plot_log.py LOG.json [--run N] [--output PLOT.png] [--width 1200] [--height 800]
                                  [--teacher_auc AUC] [--teacher_map MAP]
"""
from __future__ import annotations

import argparse
import math
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
LABELS = {"mean_loss": "training loss (mean of each interval)", "loss": "training loss", "auc": "test AUC",
          "map12": "test MAP@12"}  # each series' label; the teacher's lines name the last word


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
    step; chosen_run): `mean_loss`, the mean over each progress interval, or `loss` (the last step's)
    where the log has no `mean_loss` (an older one), the other series left empty; `auc` from DLRM's evaluations,
    or from W&D's `auc_val` when the log has those (its `auc` is one training batch's); `map12` from
    W&D's `exact_map_val`. A step at or before a series' last one (a resume from an earlier
    checkpoint) drops the points it replaces."""
    series: Dict[str, Series] = {name: ([], []) for name in LABELS}
    records = chosen_run(log_path, run)
    training = [(step, record["data"]) for record in records
                if record.get("type") == "LOG" and (step := _step(record)) is not None]
    wide_and_deep = any("auc_val" in data for _, data in training)
    loss_key = "mean_loss" if any("mean_loss" in data for _, data in training) else "loss"
    keys = {loss_key: loss_key, **(EVALUATION_KEYS if wide_and_deep else {"auc": "auc"})}
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


def plot(series: Dict[str, Series], title: str, output: str, width: int, height: int,
         teacher: Optional[Dict[str, float]] = None) -> None:
    """Two panels, loss and AUC (W&D: and MAP@12) against the step, `width` x `height` pixels;
    `teacher` ({"auc" or "map12": value}) draws each as a dashed line in the colour of its series."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    teacher = teacher or {}
    figure, (loss_axes, auc_axes) = pyplot.subplots(2, 1, sharex=True, figsize=(width / DPI, height / DPI), dpi=DPI)
    for axes, names in ((loss_axes, ("mean_loss", "loss")), (auc_axes, ("auc", "map12"))):
        drawn = [name for name in names if series[name][0]]
        colours = {}
        for name in drawn:
            steps, values = series[name]
            (line,) = axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3,
                                label=LABELS[name])
            colours[name] = line.get_color()
        for name in names:
            if name in teacher:
                axes.axhline(teacher[name], color=colours.get(name, "grey"), linestyle="--", linewidth=1,
                             label=f"teacher {LABELS[name].split()[-1]} {teacher[name]:.4f}")
        if not drawn:
            axes.text(0.5, 0.5, f"no {LABELS[names[-1]]} records", ha="center", va="center", transform=axes.transAxes)
        if len(drawn) + len([name for name in names if name in teacher]) > 1:
            axes.legend()
        axes.set_ylabel(", ".join(LABELS[name] for name in drawn) or LABELS[names[-1]])
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
    parser.add_argument("--teacher_auc", type=float,
                        help="a dashed line at this AUC: the teacher's that labelled synthetic data")
    parser.add_argument("--teacher_map", type=float,
                        help="a dashed line at this MAP@12 (Wide & Deep): the teacher's")
    args = parser.parse_args()
    output = args.output or os.path.splitext(args.log)[0] + ".png"
    teacher = {name: value for name, value in (("auc", args.teacher_auc), ("map12", args.teacher_map))
               if value is not None}
    try:
        for name in ("width", "height"):
            if not 100 <= getattr(args, name) <= 10000:
                raise LogError(f"--{name} must be between 100 and 10000 pixels, got {getattr(args, name)}")
        for name, value in (("teacher_auc", args.teacher_auc), ("teacher_map", args.teacher_map)):
            if value is not None and not (math.isfinite(value) and 0 <= value <= 1):
                raise LogError(f"--{name} must be between 0 and 1, got {value}")
        if not os.path.isfile(args.log):
            raise LogError(f"{args.log}: no such file")
        refuse_overlap(output, "--output", {"LOG": args.log})
        check_output_file(output, "--output")
        series = training_series(args.log, args.run)
        plot(series, os.path.basename(args.log), output, args.width, args.height, teacher)
    except (LogError, OutputPathError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    maps = f", {len(series['map12'][0])} MAP@12 points" if series["map12"][0] else ""
    losses = len(series["mean_loss"][0] or series["loss"][0])
    print(f"plot written to {output} ({losses} loss points, {len(series['auc'][0])} AUC points{maps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

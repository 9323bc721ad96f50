"""One benchmark run at two commits, interleaved on this machine: before, after, before, after, ...

Each commit is checked out once into a temporary git worktree (the compiled op library of this tree
copied in, so both run the same kernels), and the benchmark command runs there in turns, so a change
of the machine's load touches both alike. After each run the JSON file the benchmark writes is read
and the numbers named by `--metric` are kept; the table shows each commit's median and the ratio
after / before. Writes bench/results/before_after_<name>.json.

Usage: python -m bench.before_after --before REV [--after REV] --rounds N --results FILE
         --metric KEY.PATH [--metric ...] -- python -m bench.train --only onednn --quick
A metric is a dotted path into the results file (list items by index), e.g. rows.ours.samples_per_s.
A command starting with `python` runs with this interpreter (the project's venv).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parent.parent
OP_LIBRARY = Path("tensorflow-dot-based-interact") / "tensorflow_dot_based_interact"


def lookup(document: Any, path: str) -> float:
    """The number at dotted `path` of a JSON document (integers index lists)."""
    value = document
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return float(value)


def checkout(revision: str, folder: Path) -> str:
    """A detached worktree of `revision` at `folder`, with this tree's op library; its commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), commit], check=True,
                   capture_output=True)
    for library in (REPO / OP_LIBRARY).glob("_dot_based_interact_ops.*"):
        shutil.copy2(library, folder / OP_LIBRARY / library.name)
    return commit


def run_once(folder: Path, command: List[str], results: str, metrics: List[str]) -> Dict[str, float]:
    """The command in `folder` (its own modules first on the path), then the metrics of its results."""
    env = {**os.environ, "PYTHONPATH": str(folder)}
    if command[0] == "python":
        command = [sys.executable, *command[1:]]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed in {folder} ({done.returncode}):\n{done.stderr[-3000:]}")
    with open(folder / results) as f:
        document = json.load(f)
    return {metric: lookup(document, metric) for metric in metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--after", default="HEAD", help="the later commit (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each commit, alternating")
    parser.add_argument("--results", required=True, help="the JSON file the command writes, relative to the repo")
    parser.add_argument("--metric", action="append", required=True, help="dotted path of a number in it")
    parser.add_argument("--output", help="the report (default bench/results/before_after_<results name>.json)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.rounds < 1:
        parser.error("give a command after -- and --rounds >= 1")
    samples: Dict[str, Dict[str, List[float]]] = {"before": {m: [] for m in args.metric},
                                                  "after": {m: [] for m in args.metric}}
    with tempfile.TemporaryDirectory(prefix="before_after_") as temporary:
        folders = {side: Path(temporary) / side for side in samples}
        commits = {side: checkout(getattr(args, side), folders[side]) for side in samples}
        try:
            for round_number in range(args.rounds):
                for side in ("before", "after") if round_number % 2 == 0 else ("after", "before"):
                    for metric, value in run_once(folders[side], command, args.results, args.metric).items():
                        samples[side][metric].append(value)
                    print(f"round {round_number + 1} {side}: " + ", ".join(
                        f"{m} {samples[side][m][-1]:,.1f}" for m in args.metric), flush=True)
        finally:
            for folder in folders.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)],
                               capture_output=True)
    medians = {side: {m: statistics.median(v) for m, v in values.items()} for side, values in samples.items()}
    report = {"command": command, "commits": commits, "rounds": args.rounds, "load_average": os.getloadavg(),
              "samples": samples, "medians": medians,
              "after_over_before": {m: medians["after"][m] / medians["before"][m] for m in args.metric}}
    output = Path(args.output or REPO / "bench" / "results" / f"before_after_{Path(args.results).stem}.json")
    with open(output.with_suffix(".tmp"), "w") as f:
        json.dump(report, f, indent=1)
    os.replace(output.with_suffix(".tmp"), output)
    print(f"{'metric':48} {'before':>12} {'after':>12} {'after/before':>13}")
    for metric in args.metric:
        print(f"{metric:48} {medians['before'][metric]:12,.1f} {medians['after'][metric]:12,.1f} "
              f"{report['after_over_before'][metric]:13.3f}")
    print(f"before {commits['before'][:10]}, after {commits['after'][:10]}; wrote {output}")


if __name__ == "__main__":
    sys.exit(main())

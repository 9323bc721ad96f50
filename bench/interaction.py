"""Benchmark of the dot interaction on the CPU: compiled op vs the TF-ops implementation.

Times forward+backward (and forward alone) of each implementation in a tf.function at the
Criteo shape, in float32, float16 and bfloat16 (the --amp dtype on a CPU), after warm-up, and writes bench/results/interaction.json with `speedup_vs_tf`
= median TF-ops wall-clock time / median custom-op time for fp32 forward+backward. The same
ratio of process CPU time is recorded too: on a shared machine it varies less with other load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = Path(__file__).resolve().parent.parent

import tensorflow as tf  # noqa: E402

import interaction  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "interaction.json"


def make_step(fn: interaction.Interaction, backward: bool) -> tf.types.experimental.GenericFunction:
    """A tf.function running `fn`, plus its gradient w.r.t. the input when `backward`."""
    @tf.function
    def step(inputs: tf.Tensor) -> tf.Tensor:
        if not backward:
            return fn(inputs)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(fn(inputs))
        return tape.gradient(loss, inputs)
    return step


def time_alternating(steps: dict[str, tf.types.experimental.GenericFunction], inputs: tf.Tensor, warmup: int,
                     repeats: int, budget_s: float) -> dict[str, list[tuple[float, float]]]:
    """(wall-clock, process CPU) seconds per call of each step, the steps taking turns so that
    load from other processes hits all alike. Up to `repeats` rounds (at least 3, then until
    `budget_s` of wall-clock is spent), after `warmup` untimed rounds (at least 1: it traces)."""
    for _ in range(max(1, warmup)):
        for step in steps.values():
            step(inputs)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    rounds = 0
    while rounds < repeats and (rounds < 3 or sum(wall for runs in times.values() for wall, _ in runs) < budget_s):
        for name, step in steps.items():
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            step(inputs)  # eager execution is synchronous: the result is computed on return
            times[name].append((time.perf_counter() - wall_start, time.process_time() - cpu_start))
        rounds += 1
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=3, default=[2048, 27, 128], metavar=("B", "F", "D"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timed rounds per case, once 3 rounds are done")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not interaction.custom_op_available():
        sys.exit(f"custom op not built: {interaction.BUILD_HINT}")

    implementations = {"tensorflow": interaction.make_interaction("tensorflow"),
                       "custom_cpu": interaction.make_interaction("custom_cpu")}
    rows = []
    for dtype in (tf.float32, tf.float16, tf.bfloat16):
        inputs = tf.cast(tf.random.uniform(args.shape, -1.0, 1.0, seed=0), dtype)
        for mode in ("forward+backward", "forward"):
            steps = {name: make_step(fn, mode != "forward") for name, fn in implementations.items()}
            for name, times in time_alternating(steps, inputs, args.warmup, args.repeats, args.budget).items():
                wall, cpu = zip(*times)
                rows.append({"implementation": name, "dtype": dtype.name, "mode": mode, "repeats": len(times),
                             "median_ms": 1e3 * statistics.median(wall), "min_ms": 1e3 * min(wall),
                             "median_cpu_ms": 1e3 * statistics.median(cpu)})

    def median(name: str, dtype: str, mode: str, key: str = "median_ms") -> float:
        return next(r[key] for r in rows if (r["implementation"], r["dtype"], r["mode"]) == (name, dtype, mode))

    for row in rows:
        row["speedup_vs_tf"] = median("tensorflow", row["dtype"], row["mode"]) / row["median_ms"]
        row["cpu_time_speedup_vs_tf"] = (median("tensorflow", row["dtype"], row["mode"], "median_cpu_ms")
                                         / row["median_cpu_ms"])
    result = {
        "benchmark": "dot interaction, CPU",
        "shape": args.shape,
        "warmup": args.warmup,
        "cpu_threads": os.cpu_count(),
        "tensorflow": tf.__version__,
        "load_average_1min": os.getloadavg()[0],
        "speedup_vs_tf": median("tensorflow", "float32", "forward+backward")
        / median("custom_cpu", "float32", "forward+backward"),
        "cpu_time_speedup_vs_tf": median("tensorflow", "float32", "forward+backward", "median_cpu_ms")
        / median("custom_cpu", "float32", "forward+backward", "median_cpu_ms"),
        "speedup_target": 2.0,
        "runs": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")

    print(f"dot interaction on CPU, shape {tuple(args.shape)}, {os.cpu_count()} CPUs")
    print(f"{'implementation':<12} {'dtype':<8} {'mode':<17} {'runs':>5} {'median ms':>10} {'min ms':>8} "
          f"{'cpu ms':>8} {'speedup':>8} {'cpu speedup':>12}")
    for row in rows:
        print(f"{row['implementation']:<12} {row['dtype']:<8} {row['mode']:<17} {row['repeats']:>5} "
              f"{row['median_ms']:>10.2f} {row['min_ms']:>8.2f} {row['median_cpu_ms']:>8.2f} "
              f"{row['speedup_vs_tf']:>7.2f}x {row['cpu_time_speedup_vs_tf']:>11.2f}x")
    print(f"speedup_vs_tf (fp32 forward+backward, wall-clock medians): {result['speedup_vs_tf']:.2f}x, "
          f"CPU time: {result['cpu_time_speedup_vs_tf']:.2f}x (load average {result['load_average_1min']:.1f}) "
          f"-> {args.output}")


if __name__ == "__main__":
    main()

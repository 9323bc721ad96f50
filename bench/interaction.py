"""Benchmark of the dot interaction on the CPU: compiled op vs the TF-ops implementation.

Times forward+backward (and forward alone) of each implementation in a tf.function at the Criteo
shape, in float32, float16 and bfloat16 (the --amp dtype on a CPU), after warm-up, and writes
bench/results/interaction.json with `speedup_vs_tf` = median TF-ops wall-clock time / median
custom-op time for fp32 forward+backward. Each timed call runs the step --chain times back to back,
each run on its own input, and times are per run: a call's fixed cost (`call_overhead_ms`, about
0.3 ms on a 2-core VM) is not the op's, and inside a training step the op runs between other ops.
The same ratio of process CPU time is recorded too: on a shared machine it varies less with other
load. Beside the fp32 forward pass it times a plain copy of the input (read and write, on
TensorFlow's threads) and records what share of that bandwidth the op reaches for the bytes it
must move. The CPU's model and kind are recorded with the result.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = Path(__file__).resolve().parent.parent

import tensorflow as tf  # noqa: E402

import interaction  # noqa: E402
from recsys.runtime.cpu_settings import cpu_kind, cpu_model_name, host_cpu_flags  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "interaction.json"


def chained(run: Callable[[tf.Tensor], tf.Tensor]) -> tf.types.experimental.GenericFunction:
    """A tf.function calling `run` once on each of its inputs in turn, where `run` returns a scalar
    corner of what it computed: each run waits for the one before (a control dependency), and every
    corner is returned, so that the graph optimizer neither merges nor prunes runs. One call then
    pays TensorFlow's per-call overhead (about 0.3 ms on a 2-core VM, `call_overhead_ms`) once for
    several runs, as an op does inside a training step."""
    @tf.function
    def runs(inputs: list[tf.Tensor]) -> list[tf.Tensor]:
        corners: list[tf.Tensor] = []
        for run_input in inputs:
            with tf.control_dependencies(corners[-1:]):
                run_input = tf.identity(run_input)
            corners.append(run(run_input))
        return corners
    return runs


def make_step(fn: interaction.Interaction, backward: bool) -> tf.types.experimental.GenericFunction:
    """`fn`, plus its gradient w.r.t. the input when `backward`, chained over the inputs. Each run
    yields the loss beside the gradient: a function returning only the gradient of a sum would have
    its forward pass pruned (the sum's gradient needs no forward value), timing the backward pass
    alone."""
    def run(run_input: tf.Tensor) -> tf.Tensor:
        if not backward:
            return fn(run_input)[0, 0]
        with tf.GradientTape() as tape:
            tape.watch(run_input)
            loss = tf.reduce_sum(fn(run_input))
        return loss + tf.cast(tape.gradient(loss, run_input)[0, 0, 0], loss.dtype)
    return chained(run)


def make_copy() -> tf.types.experimental.GenericFunction:
    """A read of each input and a write of a new tensor of the same size (a multiply by a variable,
    which the graph optimizer cannot fold away) on TensorFlow's threads, chained as the steps are:
    the machine's copy bandwidth as a TensorFlow op reaches it, through the same call overhead."""
    scale = tf.Variable(1.0)
    return chained(lambda run_input: (run_input * tf.cast(scale, run_input.dtype))[0, 0, 0])


def call_overhead_ms(calls: int = 200) -> float:
    """Median wall-clock ms of calling a tf.function that does almost nothing: what every timed
    call pays once, whatever it runs."""
    @tf.function
    def trivial(inputs: tf.Tensor) -> tf.Tensor:
        return inputs + 1.0
    value = tf.constant(0.0)
    for _ in range(10):
        trivial(value)
    walls = []
    for _ in range(calls):
        start = time.perf_counter()
        trivial(value)
        walls.append(time.perf_counter() - start)
    return 1e3 * statistics.median(walls)


def bytes_moved(shape: list[int], itemsize: int, mode: str) -> int:
    """Bytes the interaction must read and write at least: the forward pass reads the input and
    writes the output; the backward pass reads the input and the output's gradient and writes the
    input's gradient."""
    batch, vectors, dim = shape
    input_bytes = batch * vectors * dim * itemsize
    output_bytes = batch * interaction.interaction_output_width(vectors, dim) * itemsize
    forward = input_bytes + output_bytes
    return forward if mode == "forward" else forward + 2 * input_bytes + output_bytes


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
    gc.collect()
    gc.disable()  # as timeit does: a collection of TensorFlow's many Python objects lands in one timing
    try:
        while rounds < repeats and (rounds < 3 or sum(wall for runs in times.values() for wall, _ in runs) < budget_s):
            for name, step in steps.items():
                wall_start, cpu_start = time.perf_counter(), time.process_time()
                step(inputs)  # eager execution is synchronous: the result is computed on return
                times[name].append((time.perf_counter() - wall_start, time.process_time() - cpu_start))
            rounds += 1
    finally:
        gc.enable()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=3, default=[2048, 27, 128], metavar=("B", "F", "D"))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timed rounds per case, once 3 rounds are done")
    parser.add_argument("--chain", type=int, default=4,
                        help="runs of each step per timed call, each on its own input (times are per run)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"],
                        choices=["float32", "float16", "bfloat16"], help="float32 is needed for the ratios")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not interaction.custom_op_available():
        sys.exit(f"custom op not built: {interaction.BUILD_HINT}")

    implementations = {"tensorflow": interaction.make_interaction("tensorflow"),
                       "custom_cpu": interaction.make_interaction("custom_cpu")}
    overhead_ms = call_overhead_ms()
    rows = []
    copy_bandwidth = {}
    if args.chain < 1:
        parser.error(f"--chain must be at least 1, got {args.chain}")
    if "float32" not in args.dtypes:
        parser.error("--dtypes must include float32: the recorded ratios and the copy bandwidth are fp32's")
    for dtype in (tf.as_dtype(name) for name in args.dtypes):
        inputs = [tf.cast(tf.random.uniform(args.shape, -1.0, 1.0, seed=run), dtype) for run in range(args.chain)]
        for mode in ("forward+backward", "forward"):
            steps = {name: make_step(fn, mode != "forward") for name, fn in implementations.items()}
            if dtype == tf.float32 and mode == "forward":
                steps["copy"] = make_copy()
            for name, times in time_alternating(steps, inputs, args.warmup, args.repeats, args.budget).items():
                wall, cpu = ([seconds / args.chain for seconds in column] for column in zip(*times))
                if name == "copy":  # timed beside the fp32 forward pass, in the same rounds
                    copy_bandwidth = {"bytes": 2 * inputs[0].shape.num_elements() * 4,
                                      "median_ms": 1e3 * statistics.median(wall)}
                    copy_bandwidth["gb_per_s"] = copy_bandwidth["bytes"] / copy_bandwidth["median_ms"] / 1e6
                    continue
                rows.append({"implementation": name, "dtype": dtype.name, "mode": mode, "repeats": len(times),
                             "median_ms": 1e3 * statistics.median(wall), "min_ms": 1e3 * min(wall),
                             "median_cpu_ms": 1e3 * statistics.median(cpu)})

    def median(name: str, dtype: str, mode: str, key: str = "median_ms") -> float:
        return next(r[key] for r in rows if (r["implementation"], r["dtype"], r["mode"]) == (name, dtype, mode))

    for row in rows:
        row["speedup_vs_tf"] = median("tensorflow", row["dtype"], row["mode"]) / row["median_ms"]
        row["cpu_time_speedup_vs_tf"] = (median("tensorflow", row["dtype"], row["mode"], "median_cpu_ms")
                                         / row["median_cpu_ms"])
        if row["dtype"] == "float32":
            row["bytes_moved"] = bytes_moved(args.shape, 4, row["mode"])
            row["share_of_copy_bandwidth"] = row["bytes_moved"] / row["median_ms"] / 1e6 / copy_bandwidth["gb_per_s"]
    result = {
        "benchmark": "dot interaction, CPU",
        "shape": args.shape,
        "warmup": args.warmup,
        "chain": args.chain,
        "call_overhead_ms": overhead_ms,
        "cpu": {"model": cpu_model_name(), "kind": cpu_kind(host_cpu_flags())},
        "cpu_threads": os.cpu_count(),
        "tensorflow": tf.__version__,
        "load_average_1min": os.getloadavg()[0],
        "speedup_vs_tf": median("tensorflow", "float32", "forward+backward")
        / median("custom_cpu", "float32", "forward+backward"),
        "cpu_time_speedup_vs_tf": median("tensorflow", "float32", "forward+backward", "median_cpu_ms")
        / median("custom_cpu", "float32", "forward+backward", "median_cpu_ms"),
        "speedup_target": 4.0,
        "copy_bandwidth": copy_bandwidth,
        "share_of_copy_bandwidth": {mode: next(r["share_of_copy_bandwidth"] for r in rows
                                               if (r["implementation"], r["dtype"], r["mode"])
                                               == ("custom_cpu", "float32", mode))
                                    for mode in ("forward+backward", "forward")},
        "share_of_copy_bandwidth_target": 0.8,
        "runs": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")

    print(f"dot interaction on CPU ({result['cpu']['model']}, {result['cpu']['kind']}), shape {tuple(args.shape)}, "
          f"{os.cpu_count()} CPUs; times per run, {args.chain} "
          f"runs per call (a call alone costs {overhead_ms:.2f} ms)")
    print(f"{'implementation':<12} {'dtype':<8} {'mode':<17} {'runs':>5} {'median ms':>10} {'min ms':>8} "
          f"{'cpu ms':>8} {'speedup':>8} {'cpu speedup':>12}")
    for row in rows:
        print(f"{row['implementation']:<12} {row['dtype']:<8} {row['mode']:<17} {row['repeats']:>5} "
              f"{row['median_ms']:>10.2f} {row['min_ms']:>8.2f} {row['median_cpu_ms']:>8.2f} "
              f"{row['speedup_vs_tf']:>7.2f}x {row['cpu_time_speedup_vs_tf']:>11.2f}x")
    print(f"speedup_vs_tf (fp32 forward+backward, wall-clock medians): {result['speedup_vs_tf']:.2f}x, "
          f"CPU time: {result['cpu_time_speedup_vs_tf']:.2f}x (load average {result['load_average_1min']:.1f}) "
          f"-> {args.output}")
    print(f"copy bandwidth (a multiply by a variable, read + write): {copy_bandwidth['gb_per_s']:.1f} GB/s; "
          "the fp32 op moves its least bytes at "
          + ", ".join(f"{share:.0%} of it ({mode})" for mode, share in result["share_of_copy_bandwidth"].items()))


if __name__ == "__main__":
    main()

"""Training and inference speed of the "cpu-bench" config on this machine's CPU.

cpu-bench: 26 tables of 100,000 rows, dim 128, bottom MLP 512-256-128, top MLP
1024-1024-512-256-1, SGD. For batch 2048 and 4096, in fp32 (with and without XLA) and in bf16
(`--amp` on the CPU: bfloat16 compute, float32 tables and master weights), it reports samples/s
and model-FLOP utilisation: per-sample FLOPs (2*in*out per dense layer plus F*F*D for the
interaction, x3 for forward and backward) times samples/s, divided by the matmul FLOP/s of a
2048^3 TF matmul of the same precision measured in the same run (the best of every worker's
measurement).
With --dlrm_repo (a clone of facebookresearch/dlrm; see bench/reference/pytorch_dlrm.py) the PyTorch
reference DLRM trains the same config in the same run, and each row shows its speed against it.
Also inference latency at batch 2048 and the host-memory ratio (training peak RSS - RSS of the
runtime before the model exists) / (parameters + optimizer state + two batches), with where it
goes: the RSS of the TensorFlow runtime before the model exists, the RSS once the tables are
built, and the peak while training.

TensorFlow's CPU allocator keeps every page it has touched (a best-fit pool), so the peak is the
live memory plus what the pool retains. The "low-memory" rows run the same training with the
system allocator returning every large block (TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1,
MALLOC_MMAP_THRESHOLD_=131072): their peak is the live memory, paid for in page faults.

Each configuration runs in its own process (XLA and the allocator are chosen by environment
before TF loads).
Writes bench/results/train.json and prints a table.
Usage: python bench/train.py [--quick] [--dlrm_repo PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench", "reference"))
RESULTS = os.path.join(REPO, "bench", "results", "train.json")

import pytorch_dlrm  # noqa: E402

CARDINALITIES = [100_000] * 26
DIM = 128
BOTTOM = [512, 256, 128]
TOP = [1024, 1024, 512, 256, 1]
NUM_NUMERICAL = 13


def flops_per_sample() -> int:
    """Forward+backward FLOPs of one sample: 3 x (dense layers 2*in*out + interaction F*F*D)."""
    num_vectors = len(CARDINALITIES) + 1
    widths_in = [(NUM_NUMERICAL + 7) // 8 * 8] + BOTTOM[:-1]
    dense = sum(2 * i * o for i, o in zip(widths_in, BOTTOM))
    top_in = (DIM + num_vectors * (num_vectors - 1) // 2 + 7) // 8 * 8
    dense += sum(2 * i * o for i, o in zip([top_in] + TOP[:-1], TOP))
    return 3 * (dense + num_vectors * num_vectors * DIM)


def matmul_flops_per_s(tf, dtype) -> float:
    """Best-of-several throughput of a 2048^3 matmul in `dtype` (the machine's practical peak)."""
    a = tf.cast(tf.random.uniform([2048, 2048]), dtype)
    b = tf.cast(tf.random.uniform([2048, 2048]), dtype)
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * 2048 ** 3 / best


LOW_MEMORY_ENV = {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1", "MALLOC_MMAP_THRESHOLD_": "131072",
                  "MALLOC_TRIM_THRESHOLD_": "131072"}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(batch_size: int, xla: bool, low_memory: bool, precision: str, steps: int) -> dict:
    """One configuration, in this process: train steps, then inference at batch 2048."""
    import tensorflow as tf

    from dataloader import PipelineConfig, create_input_pipelines, load_feature_spec
    from factory import ModelOptions, build_trainer
    from interaction import resolve_interaction_name
    from sharding import MemoryBudget, plan_sharding
    from trainer import Evaluator, percentiles

    tf.keras.utils.set_random_seed(0)
    compute_dtype = tf.bfloat16 if precision == "bf16" else tf.float32
    if precision == "bf16":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    warmup = 5
    spec = load_feature_spec(dataset_type="synthetic", num_numerical_features=NUM_NUMERICAL,
                             cardinalities=CARDINALITIES)
    pipelines = create_input_pipelines(spec, PipelineConfig(
        dataset_type="synthetic", train_batch_size=batch_size, eval_batch_size=2048,
        synthetic_train_batches=warmup + steps, synthetic_eval_batches=40, seed=0))
    plan = plan_sharding(CARDINALITIES, DIM, 1, budget=MemoryBudget(device_bytes=0))  # the CPU: host memory
    options = ModelOptions(num_numerical_features=NUM_NUMERICAL, bottom_mlp_dims=BOTTOM, top_mlp_dims=TOP,
                           interaction=resolve_interaction_name("auto"), learning_rate=0.01, warmup_steps=0,
                           decay_start_step=10**9, decay_steps=1, compute_dtype=compute_dtype)
    runtime_rss = rss_bytes()
    trainer = build_trainer(plan, 0, plan.reads(0), options)
    model = trainer.model
    built_rss = rss_bytes()
    batches = list(pipelines.train)
    for features, labels in batches[:warmup]:
        trainer.train_step(features, labels)[0].numpy()
    start = time.perf_counter()
    for features, labels in batches[warmup:]:
        loss = trainer.train_step(features, labels)[0]
    loss.numpy()
    step_time = (time.perf_counter() - start) / steps
    training_peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    samples_per_s = batch_size / step_time
    achieved = flops_per_sample() * samples_per_s
    latencies, _ = Evaluator.for_model(model).benchmark_inference(pipelines.test, max_batches=40, warmup_batches=10)
    stats = percentiles(latencies)
    # Last, so its 2048^3 operands do not sit in the allocator pool during the training peak.
    peak_matmul = matmul_flops_per_s(tf, compute_dtype)
    parameter_bytes = sum(v.shape.num_elements() * v.dtype.size for v in model.variables)
    batch_bytes = batch_size * (NUM_NUMERICAL * 4 + len(CARDINALITIES) * 4 + 4)
    state_bytes = parameter_bytes + 2 * batch_bytes
    return {"batch_size": batch_size, "xla": xla, "low_memory_allocator": low_memory, "precision": precision,
            "interaction": options.interaction,
            "samples_per_s": samples_per_s, "step_time_ms": step_time * 1000,
            "flops_per_sample": flops_per_sample(), "achieved_flops_per_s": achieved,
            "matmul_flops_per_s": peak_matmul,
            "inference_batch_size": 2048, "inference_p99_latency_ms": stats["p99"] * 1000,
            "inference_mean_latency_ms": stats["mean"] * 1000,
            "inference_samples_per_s": 2048 / stats["mean"],
            "runtime_rss_bytes": runtime_rss, "built_rss_bytes": built_rss,
            "peak_rss_bytes": training_peak_rss, "model_state_bytes": state_bytes,
            "rss_ratio": (training_peak_rss - runtime_rss) / state_bytes}


# (batch size, XLA, low-memory allocator, precision)
VARIANTS = [(2048, False, False, "fp32"), (2048, True, False, "fp32"), (4096, False, False, "fp32"),
            (4096, True, False, "fp32"), (2048, False, False, "bf16"), (4096, False, False, "bf16"),
            (2048, False, True, "fp32"), (4096, False, True, "fp32")]


def run_worker(batch_size: int, xla: bool, low_memory: bool, precision: str, steps: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    if xla:
        env["TF_XLA_FLAGS"] = "--tf_xla_auto_jit=fusible --tf_xla_cpu_global_jit"
    if low_memory:
        env.update(LOW_MEMORY_ENV)
    out = subprocess.run([sys.executable, __file__, "--worker", str(batch_size), str(int(xla)), str(int(low_memory)),
                          precision, str(steps)], env=env, capture_output=True, text=True, check=False)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"benchmark worker failed (batch {batch_size}, xla {xla}, low memory {low_memory}, "
                         f"{precision}):\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 timed steps per configuration instead of 20")
    parser.add_argument("--dlrm_repo", default=os.environ.get("DLRM_PYTORCH_REPO"),
                        help="a clone of facebookresearch/dlrm: run the PyTorch reference beside (default: "
                             "$DLRM_PYTORCH_REPO; without it the reference rows are left out, with the reason)")
    return parser.parse_args()


def reference_runs(repo: str, steps: int) -> dict:
    """{batch size: the PyTorch reference's result}, or {} with the reason printed."""
    reason = pytorch_dlrm.unavailable_reason(repo)
    if reason:
        print(f"PyTorch reference left out: {reason}")
        return {}
    return {batch: pytorch_dlrm.measure(repo, batch, steps, os.cpu_count() or 1)
            for batch in sorted({variant[0] for variant in VARIANTS})}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        batch_size, xla, low_memory = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
        print("RESULT " + json.dumps(worker(batch_size, xla, low_memory, sys.argv[5], int(sys.argv[6]))), flush=True)
        return
    args = parse_args()
    steps = 5 if args.quick else 20
    runs = [run_worker(batch_size, xla, low_memory, precision, steps)
            for batch_size, xla, low_memory, precision in VARIANTS]
    reference = reference_runs(args.dlrm_repo, steps)
    # The machine's peak per precision is the best 2048^3 matmul rate of that precision any
    # worker of this run measured: one worker's measurement can be disturbed, which would
    # inflate its MFU.
    peaks = {precision: max(r["matmul_flops_per_s"] for r in runs if r["precision"] == precision)
             for precision in {r["precision"] for r in runs}}
    for r in runs:
        r["machine_matmul_flops_per_s"] = peaks[r["precision"]]
        r["mfu"] = r["achieved_flops_per_s"] / peaks[r["precision"]]
        if r["batch_size"] in reference:
            r["pytorch_reference_samples_per_s"] = reference[r["batch_size"]]["samples_per_s"]
            r["speedup_vs_pytorch_fp32"] = r["samples_per_s"] / r["pytorch_reference_samples_per_s"]
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"config": "cpu-bench", "threads": os.cpu_count(), "load_average": os.getloadavg(),
                   "command": "python bench/train.py" + (" --quick" if args.quick else "")
                              + (" --dlrm_repo <facebookresearch/dlrm clone>" if reference else ""),
                   "runs": runs, "pytorch_reference": list(reference.values())}, f, indent=1)
    gib = float(1 << 30)
    print(f"{'batch':>6} {'prec':>5} {'xla':>5} {'alloc':>7} {'samples/s':>10} {'step ms':>8} {'GFLOP/s':>8} "
          f"{'peak':>7} {'MFU':>6} {'vs torch':>8} {'inf p99 ms':>10} {'inf samples/s':>13} {'runtime':>8} "
          f"{'built':>6} {'peak':>6} {'mem ratio':>9}")
    for r in runs:
        versus = f"{r['speedup_vs_pytorch_fp32']:>7.2f}x" if "speedup_vs_pytorch_fp32" in r else f"{'-':>8}"
        print(f"{r['batch_size']:>6} {r['precision']:>5} {str(r['xla']):>5} "
              f"{'low-mem' if r['low_memory_allocator'] else 'pool':>7} "
              f"{r['samples_per_s']:>10.0f} {r['step_time_ms']:>8.1f} {r['achieved_flops_per_s'] / 1e9:>8.1f} "
              f"{r['machine_matmul_flops_per_s'] / 1e9:>7.1f} {r['mfu']:>6.1%} {versus} "
              f"{r['inference_p99_latency_ms']:>10.2f} "
              f"{r['inference_samples_per_s']:>13.0f} {r['runtime_rss_bytes'] / gib:>7.2f}G "
              f"{r['built_rss_bytes'] / gib:>5.2f}G {r['peak_rss_bytes'] / gib:>5.2f}G {r['rss_ratio']:>9.2f}")
    for result in reference.values():
        print(f"PyTorch reference DLRM (torch {result['torch']}, fp32, {result['threads']} threads): batch "
              f"{result['batch_size']}: {result['samples_per_s']:.0f} samples/s, {result['step_time_ms']:.1f} ms/step")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()

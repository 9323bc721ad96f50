"""Training and inference speed of the "cpu-bench" config on this machine's CPU.

cpu-bench: 26 tables of 100,000 rows, dim 128, bottom MLP 512-256-128, top MLP
1024-1024-512-256-1, fp32, SGD. For batch 2048 and 4096, with and without XLA, it reports
samples/s and model-FLOP utilisation: per-sample FLOPs (2*in*out per dense layer plus F*F*D for
the interaction, x3 for forward and backward) times samples/s, divided by the fp32 matmul FLOP/s
of a 2048^3 TF matmul measured in the same run (the best of every worker's measurement).
Also inference latency at batch 2048 and the peak RSS against the bytes of parameters +
optimizer state + two batches.

Each configuration runs in its own process (XLA is chosen by environment before TF loads).
Writes bench/results/train.json and prints a table. Usage: python bench/train.py [--quick]
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
RESULTS = os.path.join(REPO, "bench", "results", "train.json")

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


def matmul_flops_per_s(tf) -> float:
    """Best-of-several fp32 throughput of a 2048^3 matmul (the machine's practical peak)."""
    a = tf.random.uniform([2048, 2048])
    b = tf.random.uniform([2048, 2048])
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * 2048 ** 3 / best


def worker(batch_size: int, xla: bool, steps: int) -> dict:
    """One configuration, in this process: train steps, then inference at batch 2048."""
    import tensorflow as tf

    from dataloader import create_input_pipelines
    from interaction import resolve_interaction_name
    from lr_scheduler import LearningRateScheduler
    from model import Dlrm, DlrmConfig
    from optimizers import make_optimizers
    from trainer import Evaluator, Trainer, percentiles

    tf.keras.utils.set_random_seed(0)
    peak_matmul = matmul_flops_per_s(tf)
    warmup = 5
    pipelines = create_input_pipelines(dataset_type="synthetic", train_batch_size=batch_size,
                                       eval_batch_size=2048, num_train_batches=warmup + steps,
                                       num_eval_batches=40, cardinalities=CARDINALITIES,
                                       num_numerical_features=NUM_NUMERICAL, seed=0)
    config = DlrmConfig(num_numerical_features=NUM_NUMERICAL, cardinalities=CARDINALITIES, embedding_dim=DIM,
                        bottom_mlp_dims=BOTTOM, top_mlp_dims=TOP, interaction=resolve_interaction_name("auto"),
                        embedding_device_budget_bytes=0)
    model = Dlrm(config)
    model.build_weights()
    optimizers = make_optimizers("sgd")
    trainer = Trainer(model, *optimizers, LearningRateScheduler(0.01, 0, 10**9, 1))
    batches = list(pipelines.train)
    for features, labels in batches[:warmup]:
        trainer.train_step(features, labels)[0].numpy()
    start = time.perf_counter()
    for features, labels in batches[warmup:]:
        loss = trainer.train_step(features, labels)[0]
    loss.numpy()
    step_time = (time.perf_counter() - start) / steps
    samples_per_s = batch_size / step_time
    achieved = flops_per_sample() * samples_per_s
    latencies, _ = Evaluator.for_model(model).benchmark_inference(pipelines.test, max_batches=40, warmup_batches=10)
    stats = percentiles(latencies)
    parameter_bytes = sum(v.shape.num_elements() * v.dtype.size for v in model.variables)
    batch_bytes = batch_size * (NUM_NUMERICAL * 4 + len(CARDINALITIES) * 4 + 4)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"batch_size": batch_size, "xla": xla, "interaction": config.interaction,
            "samples_per_s": samples_per_s, "step_time_ms": step_time * 1000,
            "flops_per_sample": flops_per_sample(), "achieved_flops_per_s": achieved,
            "matmul_flops_per_s": peak_matmul,
            "inference_batch_size": 2048, "inference_p99_latency_ms": stats["p99"] * 1000,
            "inference_mean_latency_ms": stats["mean"] * 1000,
            "inference_samples_per_s": 2048 / stats["mean"],
            "peak_rss_bytes": peak_rss, "model_state_bytes": parameter_bytes + 2 * batch_bytes,
            "rss_ratio": peak_rss / (parameter_bytes + 2 * batch_bytes)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        batch_size, xla, steps = int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
        print("RESULT " + json.dumps(worker(batch_size, xla, steps)), flush=True)
        return
    steps = 5 if "--quick" in sys.argv else 20
    runs = []
    for batch_size in (2048, 4096):
        for xla in (False, True):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
            if xla:
                env["TF_XLA_FLAGS"] = "--tf_xla_auto_jit=fusible --tf_xla_cpu_global_jit"
            out = subprocess.run([sys.executable, __file__, "--worker", str(batch_size), "1" if xla else "0",
                                  str(steps)], env=env, capture_output=True, text=True, check=False)
            lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                raise SystemExit(f"benchmark worker failed (batch {batch_size}, xla {xla}):\n{out.stderr[-3000:]}")
            runs.append(json.loads(lines[-1][len("RESULT "):]))
    # The machine's peak is the best 2048^3 matmul rate any worker of this run measured: one
    # worker's measurement can be disturbed, which would inflate its MFU.
    peak = max(r["matmul_flops_per_s"] for r in runs)
    for r in runs:
        r["machine_matmul_flops_per_s"] = peak
        r["mfu"] = r["achieved_flops_per_s"] / peak
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"config": "cpu-bench", "threads": os.cpu_count(), "load_average": os.getloadavg(),
                   "runs": runs}, f, indent=1)
    print(f"{'batch':>6} {'xla':>5} {'samples/s':>10} {'step ms':>8} {'GFLOP/s':>8} {'peak':>7} {'MFU':>6} "
          f"{'inf p99 ms':>10} {'inf samples/s':>13} {'RSS/state':>9}")
    for r in runs:
        print(f"{r['batch_size']:>6} {str(r['xla']):>5} {r['samples_per_s']:>10.0f} {r['step_time_ms']:>8.1f} "
              f"{r['achieved_flops_per_s'] / 1e9:>8.1f} {r['machine_matmul_flops_per_s'] / 1e9:>7.1f} {r['mfu']:>6.1%} "
              f"{r['inference_p99_latency_ms']:>10.2f} {r['inference_samples_per_s']:>13.0f} {r['rss_ratio']:>9.2f}")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()

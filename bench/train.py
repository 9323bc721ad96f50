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
goes: the RSS of the TensorFlow runtime and the input pipeline (here its in-memory synthetic
data) before the model exists, the RSS once the tables are built, and the peak while training.

TensorFlow's CPU allocator keeps every page it has touched (a best-fit pool), so the peak is the
live memory plus what the pool retains. The "low-memory" rows run the same training with the
system allocator returning every large block (TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1,
MALLOC_MMAP_THRESHOLD_=131072): their peak is the live memory, paid for in page faults.

Each configuration runs in its own process (XLA and the allocator are chosen by environment
before TF loads), twice, as does the PyTorch reference: a row is the faster run (a shared VM's speed
drifts by several percent between runs) with the larger memory ratio of the two.

The TensorBoard rows run the real epoch loop (trainer.train_loop, batch 2048, no evaluation) with
a progress line every PRINT_FREQ steps, without and with --tensorboard_dir's writer, and compare
the loop's mean step time (its timer's windows, which include each progress point's work). The
progress points are far denser than a real run's (--print_freq 100 or 1000), so any cost of the
writes shows; the difference is within the machine's noise when it costs nothing.
The multi-hot DCNv2 row trains the MLPerf DLRM-DCNv2 shape at this machine's scale: the 26
cpu-bench tables with MLPerf's multi-hot sizes (214 ids per sample, sum pooling, fixed `[b, h]`
ids), the cross interaction (3 layers, projection 512), the cpu-bench MLPs and Adagrad, fp32,
batch 2048. Its MFU counts the matmuls only (MLPs and cross layers, x3 for forward and backward;
the pooled lookups are gathers and sums, not matmuls).
The results name the CPU (model and bf16 units): the same targets read differently on a CPU with
AMX than on one with AVX512-BF16 only.
Where the step goes (the `breakdown` rows, a third table): for batch 2048 and 4096 in fp32 and bf16,
the same step in a process of its own with one inter-op thread (TF_NUM_INTEROP_THREADS=1: one op at a
time, each on every core), timed, then profiled by TensorFlow's profiler over BREAKDOWN_STEPS steps
(bench.step_profile): the serialized step's time by embedding forward, backward and update,
interaction, each MLP forward and backward, dense optimizer, loss, input, collectives and idle (no op
running). With several inter-op threads the real step overlaps ops, and an op's span then holds its
wait for the cores, so only the serialized step gives each part its own cost; the real step's time
(TensorFlow's default inter-op threads, timed in the same run, in turns) beside it shows what the
overlap gains.
Writes bench/results/train.json and prints the tables; `--only multihot_dcnv2` runs that row alone
and replaces it in an existing bench/results/train.json.
`--only onednn` measures fp32 at batch 4096 with oneDNN off and on and records it under the CPU's
model (the project's default, oneDNN on, is decided from these rows). `--only threads` measures fp32
at global batch 4096 on 1 process and on 2 ranks of this host with TensorFlow's inter- and intra-op
thread counts at their defaults, at 1 inter-op thread, and (2 ranks) at the cores shared out among
the ranks, and records it under the CPU's kind (the run shell's thread choice is decided from these rows).
The 2-rank rows (`--only ranks` alone) train the cpu-bench model at global batch 4096 in fp32 and bf16
on 2 horovodrun ranks of this host (bench.hybrid's worker: the tables split between the ranks) with
the thread counts the run shell would choose, and profile the serialized step on every rank: the
same parts as the breakdown (Horovod runs the collectives outside TensorFlow's ops: the step's wait for
them is idle time there).
`--only mfu` reruns the batch-4096 fp32 and bf16 rows (and their matmul peaks) and replaces them,
keeping the PyTorch reference the last full run measured.
Usage: python -m bench.train [--quick] [--dlrm_repo PATH] [--only multihot_dcnv2|onednn|threads|ranks|mfu|breakdown]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "train.json")

from bench.reference import pytorch_dlrm  # noqa: E402
from bench.step_profile import profile_breakdown  # noqa: E402
from recsys.data.feature_spec import MLPERF_HOTNESS  # noqa: E402

BREAKDOWN_STEPS = 5  # profiled after the timed steps
BREAKDOWN_CONFIGS = ((2048, "fp32"), (4096, "fp32"), (2048, "bf16"), (4096, "bf16"))
# The breakdown table's columns: each a sum of bench.step_profile categories.
BREAKDOWN_COLUMNS = {"emb fwd": ("embedding forward",), "emb bwd+upd": ("embedding backward", "embedding update"),
                     "interact": ("interaction forward", "interaction backward"),
                     "bot MLP": ("bottom MLP forward", "bottom MLP backward"),
                     "top fwd": ("top MLP forward",), "top bwd": ("top MLP backward",),
                     "dense opt": ("dense optimizer",), "rest": ("input", "loss", "collectives", "other"),
                     "idle": ("idle",)}

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


CROSS_LAYERS, CROSS_PROJECTION = 3, 512
MULTIHOT_BATCH = 2048


def dense_flops(widths_in: list, widths_out: list) -> int:
    return sum(2 * i * o for i, o in zip(widths_in, widths_out))


def cross_flops_per_sample() -> int:
    """Forward+backward matmul FLOPs of one sample of the multi-hot DCNv2 model: 3 x (MLPs + per
    cross layer the two low-rank matmuls, 2*d*r each, d the concatenated width)."""
    bottom = dense_flops([(NUM_NUMERICAL + 7) // 8 * 8] + BOTTOM[:-1], BOTTOM)
    width = BOTTOM[-1] + DIM * len(CARDINALITIES)
    cross = CROSS_LAYERS * 2 * (2 * width * CROSS_PROJECTION)
    top = dense_flops([(width + 7) // 8 * 8] + TOP[:-1], TOP)
    return 3 * (bottom + cross + top)


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


def cpu_description() -> dict:
    """The CPU the rows ran on: its model name and what bf16 units it has (the targets are relative to
    the same run, but the speed-ups depend on the machine: AMX makes bf16 far faster than AVX512-BF16)."""
    from recsys.runtime.cpu_settings import cpu_kind, cpu_model_name, host_cpu_flags
    from recsys.runtime.precision import host_cpu_bf16_support

    return {"model": cpu_model_name(), "kind": cpu_kind(host_cpu_flags()),
            "bf16": host_cpu_bf16_support().evidence}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_pipelines(batch_size: int, train_batches: int, precision: str = "fp32"):
    """The cpu-bench synthetic pipelines (in memory), numericals in the compute dtype of `precision`."""
    import tensorflow as tf

    from dataloader import PipelineConfig, create_input_pipelines
    from datasets import load_feature_spec

    spec = load_feature_spec(dataset_type="synthetic", num_numerical_features=NUM_NUMERICAL,
                             cardinalities=CARDINALITIES)
    return create_input_pipelines(spec, PipelineConfig(
        dataset_type="synthetic", train_batch_size=batch_size, eval_batch_size=2048,
        synthetic_train_batches=train_batches, synthetic_eval_batches=40, seed=0,
        compute_dtype=tf.bfloat16 if precision == "bf16" else tf.float32))


def build_bench_trainer(precision: str = "fp32"):
    """The cpu-bench model and optimizer on one process in `precision` (fp32, or bf16 as --amp on
    the CPU), and its options."""
    import tensorflow as tf

    from factory import ModelOptions, build_trainer

    from recsys.training.model_config import DlrmSettings, TrainingSettings
    from interaction import resolve_interaction_name
    from recsys.sparse.sharding import MemoryBudget, plan_sharding

    tf.keras.utils.set_random_seed(0)
    compute_dtype = tf.bfloat16 if precision == "bf16" else tf.float32
    if precision == "bf16":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    plan = plan_sharding(CARDINALITIES, (DIM,) * len(CARDINALITIES), 1,
                         budget=MemoryBudget(device_bytes=0))  # the CPU: host memory
    options = ModelOptions(num_numerical_features=NUM_NUMERICAL, compute_dtype=compute_dtype,
                           model=DlrmSettings(bottom_mlp_dims=BOTTOM, top_mlp_dims=TOP,
                                              interaction=resolve_interaction_name("auto")),
                           training=TrainingSettings(learning_rate=0.01, warmup_steps=0, decay_start_step=10**9,
                                                     decay_steps=1))
    return build_trainer(plan, 0, plan.reads(0), options), options


def worker(batch_size: int, xla: bool, low_memory: bool, precision: str, steps: int) -> dict:
    """One configuration, in this process: train steps, then inference at batch 2048."""
    import tensorflow as tf

    from recsys.training.trainer import Evaluator, percentiles

    warmup = 5
    pipelines = bench_pipelines(batch_size, warmup + steps, precision)
    # The batches are taken before the model exists (the step times exclude the pipeline): with the
    # runtime they are the input side of the baseline, not a cost of the model.
    batches = list(pipelines.train)
    runtime_rss = rss_bytes()  # the runtime and the input pipeline (in-memory data here), no model yet
    trainer, options = build_bench_trainer(precision)
    model = trainer.model
    built_rss = rss_bytes()
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
    peak_matmul = matmul_flops_per_s(tf, options.compute_dtype)
    parameter_bytes = sum(v.shape.num_elements() * v.dtype.size for v in model.variables)
    batch_bytes = batch_size * (NUM_NUMERICAL * 4 + len(CARDINALITIES) * 4 + 4)
    state_bytes = parameter_bytes + 2 * batch_bytes
    return {"batch_size": batch_size, "xla": xla, "low_memory_allocator": low_memory, "precision": precision,
            "interaction": options.model.interaction,
            "samples_per_s": samples_per_s, "step_time_ms": step_time * 1000,
            "flops_per_sample": flops_per_sample(), "achieved_flops_per_s": achieved,
            "matmul_flops_per_s": peak_matmul,
            "inference_batch_size": 2048, "inference_p99_latency_ms": stats["p99"] * 1000,
            "inference_mean_latency_ms": stats["mean"] * 1000,
            "inference_samples_per_s": 2048 / stats["mean"],
            "runtime_rss_bytes": runtime_rss, "built_rss_bytes": built_rss,
            "peak_rss_bytes": training_peak_rss, "model_state_bytes": state_bytes,
            "rss_ratio": (training_peak_rss - runtime_rss) / state_bytes}


def multihot_worker(steps: int) -> dict:
    """The multi-hot DCNv2 row in this process: fixed-hotness ids drawn uniformly, Adagrad."""
    import numpy as np
    import tensorflow as tf

    from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
    from factory import ModelOptions, build_trainer
    from recsys.training.model_config import DlrmSettings, TrainingSettings
    from recsys.sparse.sharding import MemoryBudget, plan_sharding

    tf.keras.utils.set_random_seed(0)
    plan = plan_sharding(CARDINALITIES, (DIM,) * len(CARDINALITIES), 1, budget=MemoryBudget(device_bytes=0),
                         hotness=MLPERF_HOTNESS)
    trainer = build_trainer(plan, 0, plan.reads(0), ModelOptions(
        num_numerical_features=NUM_NUMERICAL,
        model=DlrmSettings(bottom_mlp_dims=BOTTOM, top_mlp_dims=TOP, interaction="cross",
                           num_cross_layers=CROSS_LAYERS, cross_layer_projection_dim=CROSS_PROJECTION),
        training=TrainingSettings(optimizer="adagrad", learning_rate=0.005, warmup_steps=0, decay_start_step=10**9,
                                  decay_steps=1)))
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(4):
        ids = tuple(tf.constant(rng.integers(0, rows, (MULTIHOT_BATCH, h), dtype=np.int32) if h > 1 else
                                rng.integers(0, rows, MULTIHOT_BATCH, dtype=np.int32))
                    for rows, h in zip(CARDINALITIES, MLPERF_HOTNESS))
        batches.append(({NUMERICAL_KEY: tf.constant(rng.random((MULTIHOT_BATCH, NUM_NUMERICAL), dtype=np.float32)),
                         CATEGORICAL_KEY: ids},
                        tf.constant((rng.random((MULTIHOT_BATCH, 1)) < 0.3).astype(np.float32))))
    warmup = 3
    for i in range(warmup):
        trainer.train_step(*batches[i % len(batches)])[0].numpy()
    start = time.perf_counter()
    for i in range(steps):
        loss = trainer.train_step(*batches[i % len(batches)])[0]
    loss.numpy()
    step_time = (time.perf_counter() - start) / steps
    samples_per_s = MULTIHOT_BATCH / step_time
    peak = matmul_flops_per_s(tf, tf.float32)
    return {"config": "multihot_dcnv2", "batch_size": MULTIHOT_BATCH, "precision": "fp32", "optimizer": "adagrad",
            "interaction": f"cross {CROSS_LAYERS} layers, projection {CROSS_PROJECTION}",
            "hotness": list(MLPERF_HOTNESS), "ids_per_sample": sum(MLPERF_HOTNESS), "measured_steps": steps,
            "samples_per_s": samples_per_s, "step_time_ms": step_time * 1000,
            "flops_per_sample": cross_flops_per_sample(),
            "achieved_flops_per_s": cross_flops_per_sample() * samples_per_s, "matmul_flops_per_s": peak,
            "mfu": cross_flops_per_sample() * samples_per_s / peak}


def part_totals(parts_ms: dict) -> list:
    """A profiled step's ms per BREAKDOWN_COLUMNS column (each a sum of bench.step_profile categories)."""
    return [sum(parts_ms[category] for category in categories) for categories in BREAKDOWN_COLUMNS.values()]


def print_breakdown(rows: list) -> None:
    """Per breakdown row, the serialized step's time by part (bench.step_profile), beside the real
    step's time (`step_time_ms`, several inter-op threads)."""
    print("\nwhere the step goes: the step with one op at a time (ms per step; idle: no op running), "
          "beside the real step")
    print(f"{'batch':>6} {'prec':>5} {'real ms':>8} {'serial ms':>9} " + " ".join(f"{name:>11}" for name in BREAKDOWN_COLUMNS))
    for r in rows:
        print(f"{r['batch_size']:>6} {r['precision']:>5} {r['step_time_ms']:>8.1f} "
              f"{r['serialized_step_time_ms']:>9.1f} " + " ".join(f"{part:>11.1f}" for part in part_totals(r["parts_ms"])))


def breakdown_worker(batch_size: int, precision: str, steps: int, profile: bool) -> dict:
    """The step of one configuration under this process's thread settings: its time, and with
    `profile` its parts (bench.step_profile)."""
    warmup = 5
    pipelines = bench_pipelines(batch_size, warmup + steps + BREAKDOWN_STEPS, precision)
    batches = list(pipelines.train)
    trainer, _ = build_bench_trainer(precision)
    for features, labels in batches[:warmup]:
        trainer.train_step(features, labels)[0].numpy()
    start = time.perf_counter()
    for features, labels in batches[warmup:warmup + steps]:
        loss = trainer.train_step(features, labels)[0]
    loss.numpy()
    step_time = (time.perf_counter() - start) / steps
    result = {"batch_size": batch_size, "precision": precision, "step_time_ms": step_time * 1000}
    if profile:
        profiled = iter(batches[warmup + steps:])
        result["parts_ms"] = profile_breakdown(lambda: trainer.train_step(*next(profiled))[0].numpy(), BREAKDOWN_STEPS)
    return result


def run_breakdown_rows(steps: int) -> list:
    """Per configuration, in processes of their own, REPEATS times in turn: the serialized step (one
    inter-op thread) profiled, and the real step (TensorFlow's default inter-op threads) timed; the
    faster of each."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    env.pop("TF_NUM_INTEROP_THREADS", None)
    rows = []
    for batch, precision in BREAKDOWN_CONFIGS:
        serial, real = [], []
        for _ in range(REPEATS):
            serial.append(run_subprocess(["--breakdown-worker", str(batch), precision, str(steps), "1"],
                                         dict(env, TF_NUM_INTEROP_THREADS="1"), f"breakdown, batch {batch}, {precision}"))
            real.append(run_subprocess(["--breakdown-worker", str(batch), precision, str(steps), "0"], env,
                                       f"step, batch {batch}, {precision}"))
        fastest = min(serial, key=lambda row: row["step_time_ms"])
        rows.append({"batch_size": batch, "precision": precision, "parts_ms": fastest["parts_ms"],
                     "serialized_step_time_ms": fastest["step_time_ms"],
                     "step_time_ms": min(row["step_time_ms"] for row in real)})
    return rows


def run_multihot_row(steps: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    return run_subprocess(["--multihot-worker", str(steps)], env, "multi-hot DCNv2")


def print_multihot_row(row: dict) -> None:
    print(f"\nmulti-hot DCNv2 (MLPerf hotness, {row['ids_per_sample']} ids/sample, {row['interaction']}, "
          f"{row['optimizer']}, {row['precision']}, batch {row['batch_size']}): {row['samples_per_s']:.0f} samples/s, "
          f"{row['step_time_ms']:.1f} ms/step, {row['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s of matmuls, "
          f"MFU {row['mfu']:.1%} (peak {row['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s)")


TENSORBOARD_BATCH = 2048


def loop_worker(tensorboard: bool, print_freq: int, steps: int) -> dict:
    """The epoch loop for 2 x print_freq warm-up steps plus `steps`, a progress point every
    `print_freq` steps, with or without the TensorBoard writer (into a scratch folder)."""
    from recsys.runtime.tensorboard_log import TensorBoardScalars
    from recsys.training.trainer import Evaluator, LoopConfig, train_loop

    total = 2 * print_freq + steps
    pipelines = bench_pipelines(TENSORBOARD_BATCH, total)
    trainer, _ = build_bench_trainer()
    config = LoopConfig(epochs=1, steps_per_epoch=total, global_batch_size=TENSORBOARD_BATCH, evals_per_epoch=0,
                        print_freq=print_freq)
    with tempfile.TemporaryDirectory() as logdir:
        writer = TensorBoardScalars(logdir) if tensorboard else None
        result = train_loop(trainer, Evaluator.for_model(trainer.model), pipelines.train, pipelines.test, config,
                            record_scalars=(lambda step, group, scalars: writer.write(step, group, scalars))
                            if writer else None)
        if writer:
            writer.close()
        events = sum(os.path.getsize(os.path.join(logdir, name)) for name in os.listdir(logdir))
    return {"tensorboard": tensorboard, "batch_size": TENSORBOARD_BATCH, "print_freq": print_freq,
            "measured_steps": steps, "step_time_ms": result.mean_step_time_s * 1000,
            "samples_per_s": TENSORBOARD_BATCH / result.mean_step_time_s, "event_bytes": events}


# (batch size, XLA, low-memory allocator, precision)
VARIANTS = [(2048, False, False, "fp32"), (2048, True, False, "fp32"), (4096, False, False, "fp32"),
            (4096, True, False, "fp32"), (2048, False, False, "bf16"), (4096, False, False, "bf16"),
            (2048, False, True, "fp32"), (4096, False, True, "fp32")]
MFU_VARIANTS = [(4096, False, False, "fp32"), (4096, False, False, "bf16")]  # --only mfu: batch 4096, no XLA


def run_worker(batch_size: int, xla: bool, low_memory: bool, precision: str, steps: int,
               extra_env: dict = None) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO, **(extra_env or {}))
    if xla:
        env["TF_XLA_FLAGS"] = "--tf_xla_auto_jit=fusible --tf_xla_cpu_global_jit"
    if low_memory:
        env.update(LOW_MEMORY_ENV)
    return run_subprocess(["--worker", str(batch_size), str(int(xla)), str(int(low_memory)), precision, str(steps)],
                          env, f"batch {batch_size}, xla {xla}, low memory {low_memory}, {precision}")


def run_subprocess(args: list, env: dict, what: str) -> dict:
    """This file with `args` in a fresh process; the dict its RESULT line carries."""
    out = subprocess.run([sys.executable, "-m", "bench.train", *args], env=env, capture_output=True, text=True, check=False, cwd=REPO)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"benchmark worker failed ({what}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run_tensorboard_rows(print_freq: int, steps: int) -> list:
    """Without and with the writer, each in its own process, alternating twice; the faster of each pair."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    rows = {}
    for _ in range(2):
        for tensorboard in (False, True):
            row = run_subprocess(["--loop-worker", str(int(tensorboard)), str(print_freq), str(steps)], env,
                                 f"epoch loop, tensorboard {tensorboard}")
            if tensorboard not in rows or row["step_time_ms"] < rows[tensorboard]["step_time_ms"]:
                rows[tensorboard] = row
    return [rows[False], rows[True]]


def load_results() -> dict:
    """bench/results/train.json as the last run left it (the `--only` runs replace parts of it); one
    line and exit 1 where there is none."""
    if not os.path.exists(RESULTS):
        sys.exit(f"error: {RESULTS} does not exist: run `python -m bench.train` once (the --only runs replace "
                 "parts of its results)")
    with open(RESULTS) as f:
        return json.load(f)


def save_results(results: dict) -> None:
    """Write bench/results/train.json."""
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=1)


def run_onednn_rows(steps: int) -> None:
    """fp32 training at batch 4096 with oneDNN off and on (TF_ENABLE_ONEDNN_OPTS; TensorFlow 2.15 turns
    it on by itself only on CPUs with AVX-512), interleaved, the faster of REPEATS each; recorded in
    the results under this CPU's kind (recsys/runtime/cpu_settings.py, whose ONEDNN_MEASURED holds
    the choice the run shell makes from it)."""
    rows = {}
    for _ in range(REPEATS):
        for onednn in ("0", "1"):
            row = run_worker(4096, False, False, "fp32", steps, {"TF_ENABLE_ONEDNN_OPTS": onednn})
            if onednn not in rows or row["samples_per_s"] > rows[onednn]["samples_per_s"]:
                rows[onednn] = row
    cpu = cpu_description()
    entry = {"cpu": cpu, "load_average": os.getloadavg(), "command": "python -m bench.train --only onednn",
             "off_samples_per_s": rows["0"]["samples_per_s"], "on_samples_per_s": rows["1"]["samples_per_s"]}
    entry["on_vs_off"] = entry["on_samples_per_s"] / entry["off_samples_per_s"]
    results = load_results()
    results.setdefault("onednn", {})[cpu["kind"]] = entry
    save_results(results)
    print(f"{cpu['model']} ({cpu['kind']}): fp32 batch 4096, oneDNN off {entry['off_samples_per_s']:,.0f} samples/s, "
          f"on {entry['on_samples_per_s']:,.0f} ({entry['on_vs_off']:.3f}x); set ONEDNN_MEASURED in "
          f"recsys/runtime/cpu_settings.py from it")


def hybrid_options(batch_size: int, precision: str, steps: int) -> dict:
    """The cpu-bench model as bench.hybrid's worker takes it (global batch `batch_size`)."""
    return {"cardinalities": CARDINALITIES, "dim": DIM, "batch": batch_size, "bottom": BOTTOM, "top": TOP,
            "steps": steps, "exchange_runs": 0, "precision": precision}


def slowest_median_s(per_rank: list) -> float:
    """The largest of the ranks' median step times (s): the step of a synchronous job."""
    return max(sorted(r["step_times_s"])[len(r["step_times_s"]) // 2] for r in per_rank)


RANK_CONFIGS = ((4096, "fp32"), (4096, "bf16"))  # global batch, precision of the 2-rank rows


def run_two_rank_rows(steps: int) -> list:
    """The cpu-bench step on 2 horovodrun ranks of this host (bench.hybrid's worker: the hybrid-parallel
    step, tables split between the ranks), per RANK_CONFIGS, REPEATS times in turn: the real step with
    the thread counts the run shell chooses for 2 ranks on this host, timed, and the serialized step
    (one inter-op thread) profiled on every rank (bench.step_profile; waits for collectives are idle); the
    faster of each, the slowest rank's."""
    from bench import hybrid
    from recsys.runtime.cpu_settings import host_thread_choice

    choice = host_thread_choice(2)
    real_env = {"TF_NUM_INTEROP_THREADS": str(choice.inter), "TF_NUM_INTRAOP_THREADS": str(choice.intra)}
    rows = []
    for batch, precision in RANK_CONFIGS:
        options = hybrid_options(batch, precision, steps)
        real_s, serial = [], []
        for _ in range(REPEATS):
            real_s.append(slowest_median_s(hybrid.run_job("cpu_bench", options, 2, real_env)["ranks"]))
            per_rank = hybrid.run_job("cpu_bench", options | {"profile_steps": BREAKDOWN_STEPS}, 2,
                                      dict(real_env, TF_NUM_INTEROP_THREADS="1"))["ranks"]
            serial.append(max(per_rank, key=lambda r: sum(r["parts_ms"].values())))
        fastest = min(serial, key=lambda r: sum(r["parts_ms"].values()))
        step_s = min(real_s)
        rows.append({"ranks": 2, "batch_size": batch, "precision": precision, "threads": choice.line,
                     "step_time_ms": step_s * 1000, "samples_per_s": batch / step_s,
                     "achieved_flops_per_s": flops_per_sample() * batch / step_s,
                     "serialized_step_time_ms": sum(fastest["parts_ms"].values()), "parts_ms": fastest["parts_ms"]})
    return rows


def matmul_peaks(runs: list) -> dict:
    """The machine's peak per precision: the best 2048^3 matmul rate of that precision any worker of
    the run measured (one worker's measurement can be disturbed, which would inflate its MFU)."""
    return {precision: max(r["matmul_flops_per_s"] for r in runs if r["precision"] == precision)
            for precision in {r["precision"] for r in runs}}


def run_mfu_rows(steps: int) -> None:
    """The MFU_VARIANTS rows again (REPEATS each, with their own matmul peaks), in place of the last
    full run's, which keep its PyTorch reference."""
    results = load_results()
    fresh = [repeated_row(lambda variant=variant: run_worker(*variant, steps)) for variant in MFU_VARIANTS]
    add_mfu(fresh, matmul_peaks(fresh))
    for row in fresh:
        key = (row["batch_size"], row["xla"], row["low_memory_allocator"], row["precision"])
        old = next(r for r in results["runs"]
                   if (r["batch_size"], r["xla"], r["low_memory_allocator"], r["precision"]) == key)
        if "pytorch_reference_samples_per_s" in old:  # the reference as the last full run measured it
            row["pytorch_reference_samples_per_s"] = old["pytorch_reference_samples_per_s"]
            row["speedup_vs_pytorch_fp32"] = row["samples_per_s"] / row["pytorch_reference_samples_per_s"]
        row["load_average"] = os.getloadavg()
        results["runs"][results["runs"].index(old)] = row
    save_results(results)
    for row in fresh:
        print(f"batch {row['batch_size']} {row['precision']}: {row['samples_per_s']:,.0f} samples/s, "
              f"{row['step_time_ms']:.1f} ms, peak {row['machine_matmul_flops_per_s'] / 1e9:.1f} GFLOP/s, "
              f"MFU {row['mfu']:.3f}")


def add_mfu(rows: list, peaks: dict) -> list:
    """`rows` with the machine's matmul peak of their precision and their model-FLOP utilisation of it.

    Exits before anything is saved when a row would exceed 1: every worker's peak measurement of
    that precision was then disturbed (seen once on a shared VM: a bf16 peak of 215 GFLOP/s where
    the same hour measured 362-406), and the row would record a utilisation that cannot be."""
    for r in rows:
        r["machine_matmul_flops_per_s"] = peaks[r["precision"]]
        r["mfu"] = r["achieved_flops_per_s"] / peaks[r["precision"]]
    impossible = [r for r in rows if r["mfu"] > 1.0]
    if impossible:
        r = impossible[0]
        sys.exit(f"bench.train: the {r['precision']} matmul peak measured {peaks[r['precision']] / 1e9:.1f} GFLOP/s, "
                 f"below the {r['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s the batch-{r['batch_size']} step reached "
                 f"(MFU {r['mfu']:.2f}): the peak measurements were disturbed; nothing was saved, rerun on a quiet machine")
    return rows


def print_two_rank_rows(rows: list) -> None:
    """The 2-rank rows: step, samples/s, MFU and the serialized step's parts."""
    print("\n2 ranks on this host (global batch; ms per step; parts of the serialized step as above; Horovod's "
          "collectives run outside TensorFlow's ops, so the step's wait for them shows as idle)")
    print(f"{'batch':>6} {'prec':>5} {'real ms':>8} {'samples/s':>10} {'MFU':>5} {'serial ms':>9} "
          + " ".join(f"{name:>11}" for name in BREAKDOWN_COLUMNS))
    for r in rows:
        print(f"{r['batch_size']:>6} {r['precision']:>5} {r['step_time_ms']:>8.1f} {r['samples_per_s']:>10,.0f} "
              f"{r.get('mfu', float('nan')):>5.2f} {r['serialized_step_time_ms']:>9.1f} "
              + " ".join(f"{part:>11.1f}" for part in part_totals(r["parts_ms"])))


# (ranks on this host, TF_NUM_INTEROP_THREADS, TF_NUM_INTRAOP_THREADS), 0 for TensorFlow's default (as
# many as the process may use cores); "share" (cpu_settings.SHARE) divides the cores among the ranks.
THREAD_VARIANTS = [(1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0), (2, 0, "share"), (2, 1, "share")]
THREADS_NOISE = 1.02  # a setting must beat the defaults by more than this to be chosen over them


def run_thread_rows(steps: int) -> None:
    """fp32 cpu-bench training at global batch 4096 on 1 process and on 2 horovodrun ranks of this
    host (the hybrid-parallel step, bench.hybrid's worker), with each THREAD_VARIANTS thread setting,
    interleaved, the faster of REPEATS each (the slowest rank's median step); recorded in the results
    under this CPU's kind (recsys/runtime/cpu_settings.py, whose THREADS_MEASURED holds the choice
    the run shell makes from it)."""
    from bench import hybrid
    from recsys.runtime.cpu_settings import SHARE, share_of_cores

    cores = len(os.sched_getaffinity(0))
    options = hybrid_options(4096, "fp32", steps)
    rows = {}
    for _ in range(REPEATS):
        for ranks, inter, intra in THREAD_VARIANTS:
            intra = share_of_cores(cores, os.cpu_count() or cores, ranks) if intra == SHARE else intra
            env = {"TF_NUM_INTEROP_THREADS": str(inter), "TF_NUM_INTRAOP_THREADS": str(intra)}
            step_s = slowest_median_s(hybrid.run_job("cpu_bench", options, ranks, env)["ranks"])
            key = (ranks, inter, intra)
            if key not in rows or step_s < rows[key]["step_time_ms"] / 1e3:
                rows[key] = {"ranks": ranks, "inter_op_threads": inter, "intra_op_threads": intra,
                             "step_time_ms": step_s * 1e3, "samples_per_s": options["batch"] / step_s}
    cpu = cpu_description()
    entry = {"cpu": cpu, "cores": cores, "load_average": os.getloadavg(), "command": "python -m bench.train --only threads",
             "global_batch": options["batch"], "rows": list(rows.values())}
    for ranks in sorted({r["ranks"] for r in entry["rows"]}):
        candidates = [r for r in entry["rows"] if r["ranks"] == ranks]
        default = next(r for r in candidates if (r["inter_op_threads"], r["intra_op_threads"]) == (0, 0))
        best = max(candidates, key=lambda r: r["samples_per_s"])
        if best["samples_per_s"] < THREADS_NOISE * default["samples_per_s"]:
            best = default  # within the machine's run-to-run noise: keep TensorFlow's defaults
        entry[f"best_{ranks}_ranks"] = {"inter_op_threads": best["inter_op_threads"],
                                        "intra_op_threads": best["intra_op_threads"],
                                        "over_default": best["samples_per_s"] / default["samples_per_s"]}
    results = load_results()
    results.setdefault("thread_counts", {})[cpu["kind"]] = entry
    save_results(results)
    print(f"{cpu['model']} ({cpu['kind']}), {cores} cores: fp32 cpu-bench, global batch 4096 "
          "(threads 0: TensorFlow's default)")
    print("| ranks | inter-op | intra-op | step ms | samples/s |\n|---|---|---|---|---|")
    for row in entry["rows"]:
        print(f"| {row['ranks']} | {row['inter_op_threads']} | {row['intra_op_threads']} | {row['step_time_ms']:.1f} | "
              f"{row['samples_per_s']:,.0f} |")
    print("set THREADS_MEASURED in recsys/runtime/cpu_settings.py from the best_*_ranks entries")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 timed steps per configuration instead of 20")
    parser.add_argument("--only", choices=["multihot_dcnv2", "onednn", "threads", "ranks", "mfu", "breakdown"],
                        help="run only these rows and replace them in an existing results file (onednn: fp32 at "
                             "batch 4096 with TF_ENABLE_ONEDNN_OPTS=0 and =1, recorded under this CPU's kind; "
                             "threads: fp32 at global batch 4096 on 1 process and 2 ranks with each inter-/intra-op "
                             "thread setting, recorded under this CPU's kind; ranks: the 2-rank rows, their MFU "
                             "against the last full run's matmul peaks; mfu: the batch-4096 fp32 and bf16 rows "
                             "again, with their matmul peaks; "
                             "breakdown: the serialized steps' parts beside the real steps)")
    parser.add_argument("--dlrm_repo", default=os.environ.get("DLRM_PYTORCH_REPO"),
                        help="a clone of facebookresearch/dlrm: run the PyTorch reference beside (default: "
                             "$DLRM_PYTORCH_REPO; without it the reference rows are left out, with the reason)")
    return parser.parse_args()


REPEATS = 2  # runs of every configuration, ours and the reference's alike
PER_KIND_KEYS = ("onednn", "thread_counts")  # kept when a full run rewrites the results
MEMORY_KEYS = ("runtime_rss_bytes", "built_rss_bytes", "peak_rss_bytes", "model_state_bytes", "rss_ratio")


def repeated_row(measure, repeats: int = REPEATS) -> dict:
    """The fastest of `repeats` runs of `measure()` (a shared VM's speed drifts by several percent from
    one run to the next), with every run's rate, and for a training row the largest memory ratio
    of them all, so that noise can flatter the speed but not the memory."""
    rows = [measure() for _ in range(repeats)]
    best = dict(max(rows, key=lambda row: row["samples_per_s"]))
    best["repeat_samples_per_s"] = [row["samples_per_s"] for row in rows]
    if "rss_ratio" in best:
        best["repeat_rss_ratio"] = [row["rss_ratio"] for row in rows]
        largest = max(rows, key=lambda row: row["rss_ratio"])
        best.update({key: largest[key] for key in MEMORY_KEYS})
    return best


def reference_runs(repo: str, steps: int) -> dict:
    """{batch size: the PyTorch reference's result (the fastest of REPEATS)}, or {} with the reason printed."""
    reason = pytorch_dlrm.unavailable_reason(repo)
    if reason:
        print(f"PyTorch reference left out: {reason}")
        return {}
    return {batch: repeated_row(lambda batch=batch: pytorch_dlrm.measure(repo, batch, steps, os.cpu_count() or 1))
            for batch in sorted({variant[0] for variant in VARIANTS})}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        batch_size, xla, low_memory = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
        print("RESULT " + json.dumps(worker(batch_size, xla, low_memory, sys.argv[5], int(sys.argv[6]))), flush=True)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--loop-worker":
        tensorboard, print_freq, steps = sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
        print("RESULT " + json.dumps(loop_worker(tensorboard, print_freq, steps)), flush=True)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--breakdown-worker":
        print("RESULT " + json.dumps(breakdown_worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1")),
              flush=True)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--multihot-worker":
        print("RESULT " + json.dumps(multihot_worker(int(sys.argv[2]))), flush=True)
        return
    args = parse_args()
    quick = args.quick
    steps = 5 if quick else 20
    if args.only == "onednn":
        run_onednn_rows(steps)
        return
    if args.only == "threads":
        run_thread_rows(steps)
        return
    if args.only == "mfu":
        run_mfu_rows(steps)
        return
    if args.only == "ranks":
        results = load_results()
        peaks = {r["precision"]: r["machine_matmul_flops_per_s"] for r in results["runs"]}  # the last full run's
        results["two_ranks"] = add_mfu(run_two_rank_rows(steps), peaks)
        results["two_ranks_load_average"] = os.getloadavg()
        save_results(results)
        print_two_rank_rows(results["two_ranks"])
        return
    if args.only == "breakdown":
        results = load_results()
        results["breakdown"] = run_breakdown_rows(steps)
        results["breakdown_load_average"] = os.getloadavg()
        save_results(results)
        print_breakdown(results["breakdown"])
        return
    if args.only:
        results = load_results()
        results["multihot_dcnv2"] = run_multihot_row(steps) | {"load_average": os.getloadavg(),
                                                               "command": " ".join(["python -m bench.train",
                                                                                    *sys.argv[1:]])}
        save_results(results)
        print_multihot_row(results["multihot_dcnv2"])
        return
    multihot = run_multihot_row(steps)
    runs = [repeated_row(lambda variant=variant: run_worker(*variant, steps)) for variant in VARIANTS]
    breakdown = run_breakdown_rows(steps)
    two_ranks = run_two_rank_rows(steps)
    reference = reference_runs(args.dlrm_repo, steps)
    print_freq, loop_steps = (5, 20) if quick else (10, 100)
    tensorboard_rows = run_tensorboard_rows(print_freq, loop_steps)
    overhead = tensorboard_rows[1]["step_time_ms"] / tensorboard_rows[0]["step_time_ms"] - 1
    add_mfu(runs + two_ranks, matmul_peaks(runs))
    for r in runs:
        if r["batch_size"] in reference:
            r["pytorch_reference_samples_per_s"] = reference[r["batch_size"]]["samples_per_s"]
            r["speedup_vs_pytorch_fp32"] = r["samples_per_s"] / r["pytorch_reference_samples_per_s"]
    cpu = cpu_description()
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    # the per-CPU-kind measurements (--only onednn, --only threads) of this and other machines stay
    kept = {key: value for key, value in load_results().items() if key in PER_KIND_KEYS} \
        if os.path.exists(RESULTS) else {}
    save_results({"config": "cpu-bench", "threads": os.cpu_count(), "cpu": cpu, "load_average": os.getloadavg(),
                  "command": "python -m bench.train" + (" --quick" if quick else "")
                             + (" --dlrm_repo <facebookresearch/dlrm clone>" if reference else ""),
                  "runs": runs, "breakdown": breakdown, "two_ranks": two_ranks, "multihot_dcnv2": multihot,
                  "pytorch_reference": list(reference.values()),
                  "tensorboard": {"runs": tensorboard_rows, "step_time_overhead": overhead}} | kept)
    gib = float(1 << 30)
    print(f"CPU: {cpu['model']}, {os.cpu_count()} threads; bf16: {cpu['bf16']}")
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
    print_breakdown(breakdown)
    print_two_rank_rows(two_ranks)
    for result in reference.values():
        print(f"PyTorch reference DLRM (torch {result['torch']}, fp32, {result['threads']} threads): batch "
              f"{result['batch_size']}: {result['samples_per_s']:.0f} samples/s, {result['step_time_ms']:.1f} ms/step")
    print(f"\nepoch loop, batch {TENSORBOARD_BATCH}, a progress point every {print_freq} steps, "
          f"{loop_steps} measured steps (the faster of 2 runs each)")
    print(f"{'tensorboard':>11} {'samples/s':>10} {'step ms':>8} {'event bytes':>11}")
    for r in tensorboard_rows:
        print(f"{str(r['tensorboard']):>11} {r['samples_per_s']:>10.0f} {r['step_time_ms']:>8.1f} "
              f"{r['event_bytes']:>11}")
    print(f"step time with the writer: {overhead:+.1%}")
    print_multihot_row(multihot)
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()

"""Hybrid-parallel embeddings on this machine's CPU: exchange bytes, step time, memory per rank.

Three jobs, each run on 1 process (plain python) and on 2 ranks (horovodrun over Gloo):
1. exchange bytes: one training step run eagerly with Horovod's collectives wrapped, so every
   byte the embedding layer sends to another rank in the forward pass is counted; compared, per
   ordered rank pair, with the minimum (destination's local batch x the width the source holds x
   dtype size) and with the communication model (`recsys.sparse.comm_model`). For data-parallel input the
   id exchange is counted too (source's local batch x tables the destination holds x 4 bytes).
   Multi-hot (MULTIHOT: every mid table 4 ids per sample, `[b, h]`, sum pooling, two of them
   row-sliced): the pooled outputs still move one vector per sample and table (the one-hot
   minimum), the data-parallel id exchange moves local batch x hotness ids, and a row-sliced
   table moves, per rank pair, 4 bytes per id the destination owns and one partial sum per
   sample with ids there (compared with the per-id vectors it would otherwise send back).
2. step time: the "mid" config (8 tables of 100k rows, dim 64, batch 8192, small MLPs, SGD),
   median of the timed steps after warm-up, on 1 process and on 2 ranks with the same global
   batch; plus the forward and backward exchanges alone (alltoall of the same buffers in a
   tf.function) and their share of the 2-rank step time.
3. memory: 12 tables of 1M rows x dim 128 fp32 (about 6 GB), a few SGD steps at batch 1024;
   every process's peak RSS, and the ratio of the 2-rank per-rank peak to the 1-process peak.
The runs are sequential (never two jobs at once). Writes bench/results/hybrid.json and prints a
table. Usage: python -m bench.hybrid [--quick]
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence

if TYPE_CHECKING:
    from recsys.sparse.sharding import ShardingPlan
    from recsys.training.trainer import Trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from recsys.data.batch import local_sizes, local_slice  # noqa: E402  (plain Python: no TensorFlow in the parent)

RESULTS = os.path.join(REPO, "bench", "results", "hybrid.json")
NUM_NUMERICAL = 13
WARMUP_STEPS = 5

FULL = {
    "mid": {"cardinalities": [100_000] * 8, "dim": 64, "batch": 8192, "bottom": [128, 64],
            "top": [256, 128, 1], "steps": 40, "exchange_runs": 100},
    "memory": {"cardinalities": [1_000_000] * 12, "dim": 128, "batch": 1024, "bottom": [256, 128],
               "top": [256, 1], "steps": 3, "exchange_runs": 0},
}
QUICK = {
    "mid": {"cardinalities": [10_000] * 8, "dim": 16, "batch": 1024, "bottom": [32, 16],
            "top": [32, 1], "steps": 5, "exchange_runs": 10},
    "memory": {"cardinalities": [100_000] * 12, "dim": 32, "batch": 256, "bottom": [64, 32],
               "top": [32, 1], "steps": 2, "exchange_runs": 0},
}


# the multi-hot variant of "mid": ids per sample of every table, and the row-slicing threshold
# (elements) that cuts its two largest tables by rows
MULTIHOT = {"hotness": 4, "row_sliced_cardinality": 200_000}


def multihot_options(options: dict) -> dict:
    """`options` with MULTIHOT's hotness and two tables made large enough to be row-sliced."""
    cardinalities = list(options["cardinalities"])
    cardinalities[:2] = [MULTIHOT["row_sliced_cardinality"]] * 2
    return dict(options, cardinalities=cardinalities, hotness=[MULTIHOT["hotness"]] * len(cardinalities),
                row_slice_threshold=MULTIHOT["row_sliced_cardinality"] * options["dim"])


# ---------------------------------------------------------------------------- worker side
def minimum_bytes(plan: ShardingPlan, global_batch: int, dtype_size: int, data_parallel_ids: bool) -> List[List[int]]:
    """[source][destination] bytes that must cross between ranks (0 on the diagonal).

    Outputs: destination's local batch x the columns the source holds. Ids (data-parallel input):
    source's local batch x the hotness of each table the destination holds.
    """
    rows = local_sizes(global_batch, plan.world_size)
    return [[0 if s == d else
             (rows[s] * sum(plan.hotness[t] for t in plan.model_parallel_tables_on(d)) if data_parallel_ids
              else rows[d] * plan.width_on(s)) * dtype_size for d in range(plan.world_size)]
            for s in range(plan.world_size)]


def row_slice_bytes(plan: ShardingPlan, table: int, local_ids, rank: int) -> Dict[str, List[int]]:
    """What routing this rank's `[b, h]` ids of row-sliced `table` moves with each rank (0 with
    itself): out, 4 bytes per id that rank owns; back from it, one partial sum (dim x 4 bytes) per
    sample with ids there, and what one vector per id would have cost."""
    import numpy as np

    owners = np.searchsorted(np.asarray(plan.row_starts(table)[1:-1]), local_ids, side="right")
    out = {"ids": [], "partial_sums": [], "per_id_vectors": []}
    for destination in range(plan.world_size):
        mine = owners == destination
        remote = destination != rank
        out["ids"].append(int(mine.sum()) * 4 * remote)
        out["partial_sums"].append(int(mine.any(axis=1).sum()) * plan.dims[table] * 4 * remote)
        out["per_id_vectors"].append(int(mine.sum()) * plan.dims[table] * 4 * remote)
    return out


@contextlib.contextmanager
def recording_collectives() -> Iterator[Dict[str, List[int]]]:
    """Wrap Horovod's alltoall, allreduce, grouped_allreduce and allgather (eager only): per
    collective name, the bytes this rank hands over. An all-to-all: per destination rank (0 to
    itself), the backward passes' `<name>_grad` included; a reduction or gather: its buffer, one
    entry (the fused dense gradients as `dense_gradients`, float16 under fp16 compression).
    """
    import numpy as np

    from recsys.runtime import distributed

    distributed.init()
    hvd = distributed._hvd
    real = {name: getattr(hvd, name) for name in ("alltoall", "allreduce", "grouped_allreduce", "allgather")}
    sent: Dict[str, List[int]] = {}

    def add(name: str, counts) -> None:
        previous = sent.setdefault(name, [0] * len(counts))
        sent[name] = [int(a + b) for a, b in zip(previous, counts)]

    def alltoall(tensor, splits=None, name=None, **kwargs):
        per_rank = np.asarray(splits).astype(np.int64) * tensor.shape[1:].num_elements() * tensor.dtype.size
        per_rank[distributed.rank()] = 0
        add(name, per_rank)
        return real["alltoall"](tensor, splits=splits, name=name, **kwargs)

    def allreduce(tensor, *args, name=None, **kwargs):
        add(name, [tf_bytes(tensor)])
        return real["allreduce"](tensor, *args, name=name, **kwargs)

    def grouped_allreduce(tensors, *args, compression=hvd.Compression.none, **kwargs):
        half = compression is hvd.Compression.fp16
        add("dense_gradients", [sum(int(t.shape.num_elements()) * (2 if half and t.dtype.is_floating else t.dtype.size)
                                    for t in tensors)])
        return real["grouped_allreduce"](tensors, *args, compression=compression, **kwargs)

    def allgather(tensor, name=None, **kwargs):
        add(name, [tf_bytes(tensor)])
        return real["allgather"](tensor, name=name, **kwargs)

    def tf_bytes(tensor) -> int:
        return int(tensor.shape.num_elements()) * tensor.dtype.size

    wrappers = {"alltoall": alltoall, "allreduce": allreduce, "grouped_allreduce": grouped_allreduce,
                "allgather": allgather}
    for name, wrapper in wrappers.items():
        setattr(hvd, name, wrapper)
    try:
        yield sent
    finally:
        for name, function in real.items():
            setattr(hvd, name, function)


def build(options: dict, data_parallel_input: bool) -> tuple:
    """Plan, what this rank reads, and the SGD trainer for this process's rank and world size (in
    `options["precision"]`: fp32, the default, or bf16 as --amp on the CPU)."""
    import tensorflow as tf

    from recsys.runtime import distributed as dist
    from factory import ModelOptions, build_trainer
    from recsys.training.model_config import DlrmSettings, TrainingSettings
    from interaction import resolve_interaction_name
    from recsys.sparse.sharding import plan_sharding

    plan = plan_sharding(options["cardinalities"], (options["dim"],) * len(options["cardinalities"]), dist.size(),
                         "memory_balanced",
                         row_slice_threshold=options.get("row_slice_threshold"), hotness=options.get("hotness"))
    reads = plan.reads(dist.rank(), data_parallel_input)
    if options.get("precision") == "bf16":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    trainer = build_trainer(plan, dist.rank(), reads, ModelOptions(
        num_numerical_features=NUM_NUMERICAL, compute_dtype=compute_dtype(options),
        model=DlrmSettings(bottom_mlp_dims=options["bottom"], top_mlp_dims=options["top"],
                           interaction=resolve_interaction_name("auto")),
        training=TrainingSettings(learning_rate=0.01, warmup_steps=0, decay_start_step=10**9, decay_steps=1)), name="hybrid_dp" if data_parallel_input else "hybrid_mp")
    return plan, reads, trainer


def compute_dtype(options: dict):
    """The compute dtype of `options["precision"]` (fp32 unless bf16)."""
    import tensorflow as tf

    return tf.bfloat16 if options.get("precision") == "bf16" else tf.float32


def rank_batches(options: dict, reads, count: int) -> list:
    """`count` random global batches cut as this rank's loader would give them (tests/hybrid_worker.py)."""
    import numpy as np
    import tensorflow as tf

    from recsys.runtime import distributed as dist
    from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY

    rank, size, batch = dist.rank(), dist.size(), options["batch"]
    start, end = local_slice(batch, rank, size)
    id_start, id_end = reads.rows(batch, rank, size)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        numerical = rng.random((batch, NUM_NUMERICAL), dtype=np.float32)
        hotness = options.get("hotness") or [1] * len(options["cardinalities"])
        categorical = [rng.integers(0, c, (batch, h) if h > 1 else batch, dtype=np.int32)
                       for c, h in zip(options["cardinalities"], hotness)]
        labels = (rng.random((batch, 1)) < 0.3).astype(np.float32)
        ids = tuple(tf.constant(categorical[t][id_start:id_end]) for t in reads.tables)
        batches.append(({NUMERICAL_KEY: tf.constant(numerical[start:end], compute_dtype(options)), CATEGORICAL_KEY: ids},
                        tf.constant(labels[start:end])))
    return batches


def eager_step_bytes(trainer: Trainer, batch: tuple) -> Dict[str, List[int]]:
    """Bytes each collective of one eagerly run training step sends from this rank to each rank."""
    import tensorflow as tf

    tf.config.run_functions_eagerly(True)
    try:
        with recording_collectives() as sent:
            trainer.train_step(*batch)[0].numpy()
    finally:
        tf.config.run_functions_eagerly(False)
    return sent


def timed_steps(trainer: Trainer, batches: Sequence, steps: int) -> List[float]:
    """Seconds of each of `steps` graph-mode steps after WARMUP_STEPS (synchronised by the loss)."""
    times = []
    for i in range(WARMUP_STEPS + steps):
        start = time.perf_counter()
        trainer.train_step(*batches[i % len(batches)])[0].numpy()
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
    return times


def exchange_times(plan: ShardingPlan, global_batch: int, runs: int) -> List[float]:
    """Seconds of the forward + backward output exchanges alone: the step's buffers, twice."""
    import tensorflow as tf

    from recsys.runtime import distributed as dist

    rank = dist.rank()
    send = tf.random.uniform([global_batch * plan.width_on(rank)])
    splits = tf.constant(local_sizes(global_batch, plan.world_size), tf.int32) * plan.width_on(rank)

    @tf.function
    def forward_and_backward(values: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
        received, received_counts = dist.alltoall(values, splits=counts, name="bench_forward")
        returned, _ = dist.alltoall(received, splits=received_counts, name="bench_backward")
        return returned

    times = []
    for i in range(WARMUP_STEPS + runs):
        dist.barrier()
        start = time.perf_counter()
        forward_and_backward(send, splits).numpy()
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
    return times


def worker(job: str, options: dict) -> dict:
    """One job in this process (one rank of a horovodrun job, or the single process)."""
    import tensorflow as tf

    from recsys.runtime import distributed as dist
    from recsys.runtime.cpu_affinity import AUTO, apply_affinity
    from recsys.sparse.comm_model import StepLayout, step_collectives

    dist.init()
    apply_affinity(AUTO, dist.local_rank(), dist.local_size())  # as the run shell binds DLRM's ranks by default
    tf.keras.utils.set_random_seed(0)
    rank, size = dist.rank(), dist.size()
    result: Dict[str, object] = {"rank": rank}
    plan, reads, trainer = build(options, data_parallel_input=False)
    result["table_bytes_on_rank"] = sum(plan.memory_per_rank()[rank])
    result["peak_rss_after_build_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    batches = rank_batches(options, reads, 2)
    if job == "mid" and size > 1:
        result["model_parallel_sent"] = eager_step_bytes(trainer, batches[0])
    result["step_times_s"] = timed_steps(trainer, batches, options["steps"])
    if options.get("profile_steps"):  # every rank profiles the same steps (their collectives pair up)
        from bench.step_profile import profile_breakdown

        profiled = iter(batches * options["profile_steps"])
        result["parts_ms"] = profile_breakdown(lambda: trainer.train_step(*next(profiled))[0].numpy(),
                                               options["profile_steps"])
    if job == "mid" and size > 1:
        result["exchange_times_s"] = exchange_times(plan, options["batch"], options["exchange_runs"])
        _, dp_reads, dp_trainer = build(options, data_parallel_input=True)
        result["data_parallel_sent"] = eager_step_bytes(dp_trainer, rank_batches(options, dp_reads, 1)[0])
        outputs = next(c for c in step_collectives(plan, StepLayout(options["batch"])) if c.name == "embeddings")
        result["formula_bytes"] = sum(map(sum, outputs.sends))
        result["minimum_output_bytes"] = minimum_bytes(plan, options["batch"], 4, data_parallel_ids=False)
        result["minimum_id_bytes"] = minimum_bytes(plan, options["batch"], 4, data_parallel_ids=True)
        result["multihot"] = multihot_bytes(multihot_options(options))
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"ranks": dist.allgather_object(result)}


def multihot_bytes(options: dict) -> dict:
    """One eager multi-hot step in each input mode: every collective's bytes from this rank, the
    minimum of the outputs and ids, and the row-sliced tables' bytes for this rank's ids."""
    from recsys.runtime import distributed as dist
    from recsys.data.batch import CATEGORICAL_KEY

    result = {}
    for mode, data_parallel in (("model_parallel", False), ("data_parallel", True)):
        plan, reads, trainer = build(options, data_parallel_input=data_parallel)
        batch = rank_batches(options, reads, 1)[0]
        result[f"{mode}_sent"] = eager_step_bytes(trainer, batch)
        result["minimum_output_bytes"] = minimum_bytes(plan, options["batch"], 4, data_parallel_ids=False)
        result["minimum_id_bytes"] = minimum_bytes(plan, options["batch"], 4, data_parallel_ids=True)
        if not data_parallel:
            lo, hi = local_slice(options["batch"], dist.rank(), dist.size())
            result["row_sliced"] = {str(t): row_slice_bytes(plan, t, batch[0][CATEGORICAL_KEY][reads.tables.index(t)]
                                                            .numpy()[lo:hi], dist.rank())
                                    for t in plan.row_sliced}
    return result


# ---------------------------------------------------------------------------- parent side
def mem_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def wait_for_memory(needed: int, patience_s: float = 120.0) -> None:
    """Start a memory-heavy run only when the machine has room (others may be running tests)."""
    deadline = time.monotonic() + patience_s
    while mem_available_bytes() < needed:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {mem_available_bytes() / 2**30:.1f} GiB available, the memory run needs "
                             f"{needed / 2**30:.1f} GiB; rerun when the machine is quieter")
        time.sleep(5)


def run_job(job: str, options: dict, ranks: int, extra_env: Optional[Dict[str, str]] = None) -> dict:
    """Run a job on 1 process or on `ranks` horovodrun ranks (with `extra_env` on top of this
    process's environment); return every rank's result (as gathered)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])), **(extra_env or {}))
    command = [sys.executable, "-m", "bench.hybrid", "--worker", job, json.dumps(options)]
    if ranks > 1:
        launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [launcher, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *command]
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = [l.split("RESULT ", 1)[1] for l in out.stdout.splitlines() if "RESULT " in l]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"benchmark job {job} on {ranks} process(es) failed (exit {out.returncode}):\n"
                         f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1])


def exchange_report(ranks: List[dict]) -> dict:
    """Measured vs minimum bytes per ordered rank pair, for outputs (both input modes) and ids."""
    first = ranks[0]

    def matrix(key: str, name: str) -> List[List[int]]:
        return [r[key][name] for r in ranks]

    report = {}
    for label, measured, minimum in (
            ("outputs_model_parallel_input", matrix("model_parallel_sent", "embeddings"), first["minimum_output_bytes"]),
            ("outputs_data_parallel_input", matrix("data_parallel_sent", "embeddings"), first["minimum_output_bytes"]),
            ("ids_data_parallel_input", matrix("data_parallel_sent", "ids"), first["minimum_id_bytes"])):
        total = sum(map(sum, measured))
        report[label] = {"measured_bytes": total, "minimum_bytes": sum(map(sum, minimum)),
                         "measured_per_pair": measured, "minimum_per_pair": minimum,
                         "equal": measured == minimum}
    report["outputs_model_parallel_input"]["comm_model_bytes"] = first["formula_bytes"]
    report["outputs_model_parallel_input"]["formula_equal"] = first["formula_bytes"] == sum(map(sum, first["minimum_output_bytes"]))
    report["collectives_recorded"] = sorted(set(first["model_parallel_sent"]) | set(first["data_parallel_sent"]))
    report["multihot"] = multihot_report([r["multihot"] for r in ranks])
    return report


def multihot_report(ranks: List[dict]) -> dict:
    """Measured vs minimum bytes of the multi-hot step: outputs, ids, and each row-sliced table's
    ids and partial sums (with the per-id vectors they replace)."""
    first = ranks[0]
    report = {}
    for label, mode, name, minimum in (("outputs_model_parallel_input", "model_parallel", "embeddings",
                                        first["minimum_output_bytes"]),
                                       ("ids_data_parallel_input", "data_parallel", "ids", first["minimum_id_bytes"])):
        measured = [r[f"{mode}_sent"][name] for r in ranks]
        report[label] = {"measured_bytes": sum(map(sum, measured)), "minimum_bytes": sum(map(sum, minimum)),
                         "equal": measured == minimum}
    for table in first["row_sliced"]:
        for part, collective in (("ids", "ids"), ("partial_sums", "vectors")):
            measured = [r["model_parallel_sent"][f"row_sliced_table_{table}_{collective}"] for r in ranks]
            minimum = [r["row_sliced"][table][part] for r in ranks]  # [requester][owner]
            if part == "partial_sums":  # sent by the owner to the requester
                minimum = [list(column) for column in zip(*minimum)]
            report[f"row_sliced_table_{table}_{part}"] = {
                "measured_bytes": sum(map(sum, measured)), "minimum_bytes": sum(map(sum, minimum)),
                "equal": measured == minimum}
        report[f"row_sliced_table_{table}_partial_sums"]["per_id_vectors_bytes"] = sum(
            sum(r["row_sliced"][table]["per_id_vectors"]) for r in ranks)
    return report


def median_ms(times: Sequence[float]) -> float:
    return statistics.median(times) * 1000


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print("RESULT " + json.dumps(worker(sys.argv[2], json.loads(sys.argv[3]))), flush=True)
        return
    quick = "--quick" in sys.argv
    configs = QUICK if quick else FULL
    load_start = os.getloadavg()
    started = time.monotonic()
    mid_single = run_job("mid", configs["mid"], 1)["ranks"]
    mid_pair = run_job("mid", configs["mid"], 2)["ranks"]
    memory = configs["memory"]
    table_bytes = sum(memory["cardinalities"]) * memory["dim"] * 4
    wait_for_memory(int(table_bytes * 1.3) + 2 * 2**30)
    memory_single = run_job("memory", memory, 1)["ranks"]
    wait_for_memory(int(table_bytes * 0.8) + 3 * 2**30)
    memory_pair = run_job("memory", memory, 2)["ranks"]

    single_ms = median_ms(mid_single[0]["step_times_s"])
    pair_ms = max(median_ms(r["step_times_s"]) for r in mid_pair)
    exchange_ms = max(median_ms(r["exchange_times_s"]) for r in mid_pair)
    single_peak = memory_single[0]["peak_rss_bytes"]
    pair_peak = max(r["peak_rss_bytes"] for r in memory_pair)
    results = {
        "quick": quick, "threads": os.cpu_count(), "transport": "gloo", "dtype": "float32",
        "strategy": "memory_balanced", "input": "model parallel unless stated", "optimizer": "sgd",
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "wall_s": time.monotonic() - started, "configs": configs,
        "exchange_bytes": exchange_report(mid_pair),
        "step_time": {"global_batch": configs["mid"]["batch"], "warmup_steps": WARMUP_STEPS,
                      "single_process_median_ms": single_ms, "two_ranks_median_ms": pair_ms,
                      "speedup": single_ms / pair_ms,
                      "single_process_min_ms": min(mid_single[0]["step_times_s"]) * 1000,
                      "two_ranks_min_ms": max(min(r["step_times_s"]) for r in mid_pair) * 1000,
                      "exchange_median_ms": exchange_ms, "exchange_share_of_step": exchange_ms / pair_ms,
                      "per_rank_median_ms": [median_ms(r["step_times_s"]) for r in mid_pair],
                      "per_rank_exchange_median_ms": [median_ms(r["exchange_times_s"]) for r in mid_pair]},
        "memory": {"table_bytes_total": table_bytes,
                   "table_bytes_per_rank": [r["table_bytes_on_rank"] for r in memory_pair],
                   "single_process_peak_rss_bytes": single_peak,
                   "single_process_peak_rss_after_build_bytes": memory_single[0]["peak_rss_after_build_bytes"],
                   "two_ranks_peak_rss_after_build_bytes": [r["peak_rss_after_build_bytes"] for r in memory_pair],
                   "two_ranks_peak_rss_bytes": [r["peak_rss_bytes"] for r in memory_pair],
                   "ratio": pair_peak / single_peak, "target_ratio": 0.6, "meets_target": pair_peak / single_peak < 0.6},
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=1)
    exchange = results["exchange_bytes"]
    print(f"{'all-to-all (forward, 2 ranks)':<34} {'measured B':>12} {'minimum B':>12} {'equal':>6}")
    for label in ("outputs_model_parallel_input", "outputs_data_parallel_input", "ids_data_parallel_input"):
        e = exchange[label]
        print(f"{label:<34} {e['measured_bytes']:>12} {e['minimum_bytes']:>12} {str(e['equal']):>6}")
    print(f"communication model: {exchange['outputs_model_parallel_input']['comm_model_bytes']}")
    print(f"multi-hot ({MULTIHOT['hotness']} ids per sample, 2 row-sliced tables):")
    for label, e in exchange["multihot"].items():
        per_id = f" (per-id vectors: {e['per_id_vectors_bytes']})" if "per_id_vectors_bytes" in e else ""
        print(f"  {label:<32} {e['measured_bytes']:>12} {e['minimum_bytes']:>12} {str(e['equal']):>6}{per_id}")
    print(f"step time, global batch {configs['mid']['batch']}: 1 process {single_ms:.1f} ms, 2 ranks {pair_ms:.1f} ms "
          f"(x{single_ms / pair_ms:.2f}); exchanges alone {exchange_ms:.1f} ms = {exchange_ms / pair_ms:.1%} of the step")
    pair_peaks = ", ".join(f"{r['peak_rss_bytes'] / 2**30:.2f}" for r in memory_pair)
    print(f"peak RSS, {table_bytes / 1e9:.2f} GB of tables: 1 process {single_peak / 2**30:.2f} GiB, "
          f"2 ranks {pair_peaks} GiB; "
          f"ratio {pair_peak / single_peak:.3f} (target < 0.6)")
    print(f"load average {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}; results: {RESULTS}")


if __name__ == "__main__":
    main()

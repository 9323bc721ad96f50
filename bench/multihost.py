"""Exchange/compute overlap of the hybrid-parallel step on several hosts (any horovodrun host list).

One horovodrun job (default `-H localhost:3`; on a cluster, e.g. `--hosts h1:1,h2:1,h3:1` and the
links' rate as `--link_mbit`) runs the worker on every rank. With data-parallel input (so every
step has an id exchange), the same model and batches, each rank times, as the median of the timed
steps after warm-up:
- `step_ms`, unpipelined: `Trainer.train_next`, one micro-batch, the ids exchanged inside the step;
- `step_ms`, pipelined: `Trainer.train_pipelined` with `--micro_batches` M: the next batch's ids
  exchanged during this step, one micro-batch's embedding all-to-all during another's compute;
- `compute_ms`: the unpipelined step traced with every collective (all-to-alls, allreduces)
  replaced by the identity. The shapes stay those of the real step because every rank holds the
  same width of equally large tables (the configs below; row slicing would break it);
- `exchange_ms`: the step's collectives alone: the id all-to-all, the lookups, the embedding
  all-to-all and its gradient all-to-all, the dense gradients' allreduce and the loss's, nothing
  of the MLPs or the optimizer. The allreduce belongs here, not to the compute: it crosses the
  same host links as the all-to-alls, so max(compute, exchange) is the step's physical limit only
  when the exchange holds everything the links carry.
- `exchange_cpu_ms`: the CPU time (every thread of the rank, user and system) one exchange costs:
  on hosts that share one machine's cores, what moving the bytes takes from the compute.
- `exchange_beside_compute_ms`: the exchange timed while another thread of the rank runs the
  step's compute (the collective-free step above) without pause: what the pipelined step's hidden
  collectives take where the hosts' copying shares the cores with the compute.
The slowest rank's median is the row's value. Each rank also reports, from the traced graphs
(`recsys.training.step_graph.overlap_report`), which overlaps the graph allows. Rows (keys
link_mbit, pipelined, step_ms, compute_ms, exchange_ms, ...) replace those of the same hosts and
link rate in bench/results/multihost.json; a table is printed. The goal on rate-limited links:
pipelined step <= 1.2 x max(compute, exchange), with the unpipelined near compute + exchange.
Timings on a shared machine are no results: run it on a quiet cluster.

On the cluster of scripts/test_cluster.sh (`--cluster N`, as root: N hosts on this machine, one rank
each, the cpu-bench-like config below unless --quick) it brings the cluster up itself, measures once
on unlimited links, then limits every host's link (`slow`) to rates at which the comm model expects
the collectives' bytes to take about 0.5x, 1x and 2x the measured compute on the wire (or `--rates`),
one job per rate. Each row then also holds the comm model's prediction (recsys.sparse.comm_model):
the collectives the exchange timing covers on those links (`predicted_exchange_ms`: the unlimited
row's measured exchange, the lookups and the hosts' own copying, plus the collectives' bytes over
the rate), the step from it and the measured compute (`predicted_step_ms`: compute + exchange
unpipelined; pipelined, StepPrediction.pipelined_step_ms: what the step's compute cannot hide on
top of the overlapped rest, which takes exchange_beside_compute_ms / exchange_ms times as long as
alone), and `within_25pct`: both within 25% of the measurement.

Usage: python -m bench.multihost [--hosts H] [--np N] [--link_mbit X] [--transport gloo|mpi] [--quick]
       python -m bench.multihost --cluster N [--rates auto|MBIT,MBIT,...] [--transport ...] [--quick]
       python -m bench.multihost --worker '<json options>'   (one rank, under horovodrun)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "multihost.json")
RESULT_MARK = "MULTIHOST_RESULT "
WARMUP_STEPS = 3

# Equal tables (every rank the same width): the identity all-to-all keeps the real shapes.
FULL = {"cardinalities": [200_000] * 6, "dim": 64, "batch": 12288, "bottom": [512, 256, 64],
        "top": [1024, 512, 256, 1], "micro_batches": 4, "steps": 20, "batches": 4}
QUICK = {"cardinalities": [2_000] * 6, "dim": 16, "batch": 384, "bottom": [32, 16], "top": [32, 1],
         "micro_batches": 2, "steps": 3, "batches": 2}
# bench/train.py's cpu-bench (26 tables of 100,000 rows, dim 128, its MLPs) with 24 tables, so that
# 2, 3, 4, 6 or 8 hosts hold equally many.
CPU_BENCH = {"cardinalities": [100_000] * 24, "dim": 128, "batch": 6144, "bottom": [512, 256, 128],
             "top": [1024, 1024, 512, 256, 1], "micro_batches": 4, "steps": 10, "batches": 4}
CLUSTER_SCRIPT = os.path.join(REPO, "scripts", "test_cluster.sh")
CLUSTER_INTERFACE = "dlrm0"  # the cluster's network on every host
EXCHANGE_RATIOS = (0.5, 1.0, 2.0)  # exchange / compute the automatic rates aim at


# ---------------------------------------------------------------------------- worker side
@contextlib.contextmanager
def local_collectives() -> Iterator[None]:
    """While active, `distributed`'s all-to-all and allreduces send nothing: each rank keeps its own
    buffer (what traces in the meantime has no collective; shapes stay right only where every rank
    sends what it receives, as in this benchmark's configs)."""
    import tensorflow as tf

    from recsys.runtime import distributed

    real = distributed.alltoall, distributed.allreduce, distributed.grouped_allreduce

    def alltoall(tensor, splits=None, name=None):
        return tf.identity(tensor), tf.cast(splits, tf.int32)

    def allreduce(tensor, average=True, name=None):
        return tf.identity(tensor)

    def grouped_allreduce(tensors, average=True, fp16=False):
        return [tf.identity(t) for t in tensors]

    distributed.alltoall, distributed.allreduce, distributed.grouped_allreduce = alltoall, allreduce, grouped_allreduce
    try:
        yield
    finally:
        distributed.alltoall, distributed.allreduce, distributed.grouped_allreduce = real


def _trainer(options: dict, micro_batches: int, name: str):
    """The SGD trainer of the options' model with data-parallel input, and what this rank reads."""
    from recsys.runtime import distributed as dist
    from factory import ModelOptions, build_trainer
    from interaction import resolve_interaction_name
    from recsys.training.model_config import DlrmSettings, TrainingSettings
    from recsys.sparse.sharding import plan_sharding
    from bench.hybrid import NUM_NUMERICAL

    cardinalities = options["cardinalities"]
    plan = plan_sharding(cardinalities, (options["dim"],) * len(cardinalities), dist.size(), "basic")
    reads = plan.reads(dist.rank(), data_parallel_input=True)
    trainer = build_trainer(plan, dist.rank(), reads, ModelOptions(
        num_numerical_features=NUM_NUMERICAL,
        model=DlrmSettings(bottom_mlp_dims=options["bottom"], top_mlp_dims=options["top"],
                           interaction=resolve_interaction_name("auto")),
        training=TrainingSettings(learning_rate=0.01, warmup_steps=0, decay_start_step=10**9, decay_steps=1,
                                  micro_batches=micro_batches, pipeline_input=True)), name=name)
    return trainer, reads


def _batches(options: dict, reads):
    """An endless iterator over the options' random batches as this rank's loader would give them."""
    import tensorflow as tf

    from bench.hybrid import rank_batches

    batches = rank_batches(options, reads, options["batches"])
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return iter(dataset.repeat())


def median_ms(run: Callable[[], Any], steps: int) -> float:
    """The median of `steps` timed calls of `run` (each ends with a host read) after warm-up, in ms."""
    times = []
    for i in range(WARMUP_STEPS + steps):
        start = time.perf_counter()
        run()
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def median_beside_ms(run: Callable[[], Any], load: Callable[[], Any], steps: int) -> float:
    """`median_ms` of `run` while another thread calls `load` without pause (the load's last call
    finishes before this returns)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            load()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        return median_ms(run, steps)
    finally:
        stop.set()
        thread.join()


def worker(options: dict) -> Optional[dict]:
    """This rank's timings and overlap report; rank 0 returns every rank's, the others None."""
    import tensorflow as tf

    from recsys.data.batch import CATEGORICAL_KEY
    from recsys.runtime import distributed as dist
    from recsys.runtime.stop_signals import STOP_SIGNALS
    from recsys.training.step_graph import overlap_report
    from recsys.training.trainer import DENSE_GRADIENT_BUCKETS
    from recsys.sparse.comm_model import LOSS_VALUES
    from factory import communication_layout

    dist.init()
    steps, vote = options["steps"], tf.zeros([len(STOP_SIGNALS)])
    plain, reads = _trainer(options, 1, "plain")
    overlapped, _ = _trainer(options, options["micro_batches"], "overlapped")
    plain_batches, overlapped_batches = _batches(options, reads), _batches(options, reads)

    unpipelined_ms = median_ms(lambda: plain.train_next(plain_batches, vote)[0].numpy(), steps)
    carried = {"next": overlapped.exchange_next(overlapped_batches)}

    def pipelined_step() -> None:
        loss, _, _, carried["next"] = overlapped.train_pipelined(overlapped_batches, carried["next"], vote, True)
        loss.numpy()

    pipelined_ms = median_ms(pipelined_step, steps)
    with local_collectives():
        local_step = tf.function(plain._train_next)
        local_step(plain_batches, vote)[0].numpy()  # traced here, without all-to-all
    compute_ms = median_ms(lambda: local_step(plain_batches, vote)[0].numpy(), steps)

    @tf.function
    def exchanges(batches: tf.data.Iterator) -> tf.Tensor:
        (features, _), = plain.prepare(*next(batches))
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(plain.model.embedding(features[CATEGORICAL_KEY], exchanged=True))
        gradients = tape.gradient(total, plain.model.embedding_variables)
        reduced = dist.bucketed_allreduce([tf.zeros_like(v) for v in plain.model.dense_variables],
                                          DENSE_GRADIENT_BUCKETS)
        loss = dist.allreduce(tf.zeros([LOSS_VALUES]), name="train_loss")
        return tf.add_n([tf.reduce_sum(tf.convert_to_tensor(g.values if hasattr(g, "values") else g))
                         for g in [*gradients, *reduced, loss] if g is not None] + [total])

    exchange_ms = median_ms(lambda: exchanges(plain_batches).numpy(), steps)
    started = time.process_time()  # every thread of this rank; the kernel's copying shows as its system time
    for _ in range(steps):
        exchanges(plain_batches).numpy()
    exchange_cpu_ms = (time.process_time() - started) / steps * 1000
    # The same exchange while this rank's compute (the step without collectives) runs beside it
    load_batches = _batches(options, reads)
    exchange_beside_compute_ms = median_beside_ms(lambda: exchanges(plain_batches).numpy(),
                                                  lambda: local_step(load_batches, vote)[0].numpy(), steps)
    graphs = {"unpipelined": plain.train_next.get_concrete_function(plain_batches, vote).graph,
              "pipelined": overlapped.train_pipelined.get_concrete_function(
                  overlapped_batches, carried["next"], vote, True).graph}
    mine = {"rank": dist.rank(), "unpipelined_ms": unpipelined_ms, "pipelined_ms": pipelined_ms,
            "compute_ms": compute_ms, "exchange_ms": exchange_ms, "exchange_cpu_ms": exchange_cpu_ms,
            "exchange_beside_compute_ms": exchange_beside_compute_ms,
            "dense_weights": communication_layout(plain, options["batch"], True).dense_weights,
            "overlap": {name: overlap_report(graph) for name, graph in graphs.items()}}
    ranks = dist.allgather_object(mine)
    return ranks if dist.rank() == 0 else None


# ---------------------------------------------------------------------------- launcher side
def slots(hosts: str) -> int:
    """The processes a horovodrun host list holds ("a:2,b:1" -> 3; a host without a count: 1)."""
    return sum(int(entry.rsplit(":", 1)[1]) if ":" in entry else 1 for entry in hosts.split(",") if entry)


def run_job(hosts: str, np: int, transport: str, options: dict, interface: Optional[str] = None,
            threads: Optional[int] = None) -> List[dict]:
    """The worker on `np` ranks of `hosts` (over `interface` where given, with `threads` CPU threads
    each where given); every rank's result (rank 0 prints them)."""
    launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    mode = ["--gloo"] if transport == "gloo" else ["--mpi"]
    if interface:
        mode += ["--network-interfaces", interface]
        if transport == "mpi":
            mode.append(f"--mpi-args=-mca oob_tcp_if_include {interface}")
    command = [launcher if os.path.exists(launcher) else "horovodrun", "-np", str(np), "-H", hosts, *mode,
               sys.executable, "-m", "bench.multihost", "--worker", json.dumps(options)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               TF_CPP_MIN_LOG_LEVEL="2", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), TF_NUM_INTRAOP_THREADS=str(threads))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    for line in result.stdout.splitlines():
        if RESULT_MARK in line:
            return json.loads(line.split(RESULT_MARK, 1)[1])
    raise SystemExit(f"error: the benchmark job on {hosts} gave no result (exit {result.returncode}):\n"
                     f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def rows_of(ranks: List[dict], link_mbit: Optional[float], hosts: str, options: dict) -> List[dict]:
    """Two rows, unpipelined and pipelined, each with the slowest rank's medians."""
    def slowest(key: str) -> float:
        return max(r[key] for r in ranks)

    compute, exchange = slowest("compute_ms"), slowest("exchange_ms")
    rows = []
    for pipelined in (False, True):
        step = slowest("pipelined_ms" if pipelined else "unpipelined_ms")
        rows.append({"link_mbit": link_mbit, "pipelined": pipelined, "step_ms": step, "compute_ms": compute,
                     "exchange_ms": exchange, "exchange_cpu_ms": slowest("exchange_cpu_ms"),
                     "exchange_beside_compute_ms": slowest("exchange_beside_compute_ms"),
                     "step_over_max": step / max(compute, exchange),
                     "step_over_sum": step / (compute + exchange), "hosts": hosts, "np": len(ranks),
                     "micro_batches": options["micro_batches"] if pipelined else 1,
                     "overlap": ranks[0]["overlap"]["pipelined" if pipelined else "unpipelined"],
                     "per_rank_step_ms": [r["pipelined_ms" if pipelined else "unpipelined_ms"] for r in ranks],
                     "dense_weights": ranks[0]["dense_weights"], "config": options})
    return rows


def save(rows: List[dict], sweep: bool) -> List[dict]:
    """The results file's rows with `rows` in place of those of the same hosts, link rate and mode;
    a `sweep` (the cluster's rates, chosen anew each run) replaces every earlier row of its hosts."""
    old = []
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            old = json.load(f)["rows"]
    if sweep:
        replaced = {r["hosts"] for r in rows}
        merged = [r for r in old if r["hosts"] not in replaced] + rows
    else:
        keys = {(r["hosts"], r["link_mbit"], r["pipelined"]) for r in rows}
        merged = [r for r in old if (r["hosts"], r["link_mbit"], r["pipelined"]) not in keys] + rows
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"rows": merged}, f, indent=1)
    return merged


def wire_prediction(options: dict, dense_weights: int, np: int, ranks_per_host: int, link_mbit: float):
    """The comm model's prediction (recsys.sparse.comm_model.StepPrediction) of every collective of
    the step (what `exchange_ms` times) on links of `link_mbit` Mbit/s, without compute."""
    from recsys.sparse.comm_model import Network, StepLayout, predict_step
    from recsys.sparse.sharding import plan_sharding

    cardinalities = options["cardinalities"]
    plan = plan_sharding(cardinalities, (options["dim"],) * len(cardinalities), np, "basic")
    layout = StepLayout(options["batch"], dense_weights=dense_weights, data_parallel_input=True)
    return predict_step(plan, layout, Network(link_mbit / 1000, ranks_per_host))


def add_predictions(rows: List[dict], base_exchange_ms: float, np: int, ranks_per_host: int) -> None:
    """Each rate-limited row's predicted exchange and step and whether both are within 25% of the
    measurement (module docstring); `base_exchange_ms`: the exchange measured on unlimited links."""
    for row in rows:
        if row["link_mbit"] is None:
            continue
        wire = wire_prediction(row["config"], row["dense_weights"], np, ranks_per_host, row["link_mbit"])
        exchange = base_exchange_ms + wire.exchange_ms
        measured = replace(wire, exchange_ms=exchange, compute_ms=row["compute_ms"])
        if row["pipelined"]:
            beside_compute = max(1.0, row["exchange_beside_compute_ms"] / row["exchange_ms"])
            step = measured.pipelined_step_ms(row["micro_batches"], beside_compute)
        else:
            step = measured.step_ms
        row.update(predicted_exchange_ms=exchange, predicted_step_ms=step,
                   within_25pct=abs(exchange - row["exchange_ms"]) <= 0.25 * row["exchange_ms"]
                   and abs(step - row["step_ms"]) <= 0.25 * row["step_ms"])


def automatic_rates(options: dict, dense_weights: int, np: int, compute_ms: float) -> List[int]:
    """Link rates (Mbit/s) at which the model expects the step's collectives' bytes to take
    EXCHANGE_RATIOS x the compute on the wire (time ~ 1 / rate; the lookups and copies, small on a
    quiet machine, come on top)."""
    at_1000 = wire_prediction(options, dense_weights, np, 1, 1000.0).exchange_ms
    return [max(1, round(1000 * at_1000 / (ratio * compute_ms))) for ratio in EXCHANGE_RATIOS]


def cluster(*args: str) -> None:
    """A verb of scripts/test_cluster.sh; its error ends the benchmark."""
    result = subprocess.run([CLUSTER_SCRIPT, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stderr.strip() or f"error: scripts/test_cluster.sh {' '.join(args)} failed")


def on_cluster(nodes: int, rates: str, transport: str, options: dict) -> List[dict]:
    """Every row of the cluster runs (module docstring): unlimited, then one job per link rate. A
    cluster this brought up is taken down at the end; one already up is left up, unlimited."""
    was_up = subprocess.run([CLUSTER_SCRIPT, "status"], capture_output=True).returncode == 0
    cluster("up", str(nodes))
    hosts = ",".join(f"dlrm-node{k}:1" for k in range(1, nodes + 1))
    threads = max(1, (os.cpu_count() or 1) // nodes)  # the hosts share this machine's cores

    def measure(mbit: Optional[int]) -> List[dict]:
        for k in range(1, nodes + 1):
            cluster("slow", f"dlrm-node{k}", str(mbit or 0))
        ranks = run_job(hosts, nodes, transport, options, CLUSTER_INTERFACE, threads)
        return rows_of(ranks, mbit, hosts, options)

    try:
        rows = measure(None)
        base_exchange = rows[0]["exchange_ms"]
        chosen = automatic_rates(options, rows[0]["dense_weights"], nodes, rows[0]["compute_ms"]) if rates == "auto" \
            else [int(rate) for rate in rates.split(",")]
        for mbit in chosen:
            rows += measure(mbit)
    finally:
        for k in range(1, nodes + 1):
            subprocess.run([CLUSTER_SCRIPT, "slow", f"dlrm-node{k}", "0"], capture_output=True)
        if not was_up:
            subprocess.run([CLUSTER_SCRIPT, "down"], capture_output=True)
    add_predictions(rows, base_exchange, nodes, 1)
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        ranks = worker(json.loads(sys.argv[2]))
        if ranks is not None:
            print(RESULT_MARK + json.dumps(ranks), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="localhost:3", help="horovodrun's -H (default: localhost:3)")
    parser.add_argument("--np", type=int, default=None, help="ranks (default: the host list's slots)")
    parser.add_argument("--link_mbit", type=float, default=None, help="the links' rate, recorded in the rows")
    parser.add_argument("--transport", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--quick", action="store_true", help="a small model, a few steps (a smoke run)")
    parser.add_argument("--cluster", type=int, default=None, metavar="N",
                        help="on N hosts of scripts/test_cluster.sh (root), one rank each, unlimited and at --rates")
    parser.add_argument("--rates", default="auto",
                        help="with --cluster: link rates in Mbit/s (e.g. 200,400,800), or auto (default): those "
                             "where the exchange should take about 0.5x, 1x and 2x the compute")
    args = parser.parse_args()
    if args.rates != "auto" and not all(rate.isdigit() and int(rate) > 0 for rate in args.rates.split(",")):
        parser.error(f"--rates: expected auto or whole Mbit/s above 0 separated by commas, got {args.rates!r}")
    options = dict(QUICK if args.quick else CPU_BENCH if args.cluster else FULL)
    np = args.cluster or args.np or slots(args.hosts)
    if options["batch"] % (np * options["micro_batches"]):
        print(f"error: --np {np}: the batch {options['batch']} is not divisible by ranks x "
              f"{options['micro_batches']} micro-batches", file=sys.stderr)
        sys.exit(2)
    started = time.monotonic()
    if args.cluster:
        rows = on_cluster(args.cluster, args.rates, args.transport, options)
    else:
        rows = rows_of(run_job(args.hosts, np, args.transport, options), args.link_mbit, args.hosts, options)
    save(rows, sweep=bool(args.cluster))
    print(f"{'hosts':<24} {'link Mbit/s':>11} {'pipelined':>9} {'step ms':>9} {'compute ms':>10} "
          f"{'exchange ms':>11} {'exch. CPU':>9} {'beside':>7} {'step/max':>8} {'step/sum':>8} {'pred. exch':>10} {'pred. step':>10} "
          f"{'<=25%':>5}")
    for r in rows:
        link = "-" if r["link_mbit"] is None else f"{r['link_mbit']:g}"
        predicted = (f"{r['predicted_exchange_ms']:>10.1f} {r['predicted_step_ms']:>10.1f} "
                     f"{'yes' if r['within_25pct'] else 'no':>5}" if "within_25pct" in r else f"{'-':>10} {'-':>10} {'-':>5}")
        print(f"{r['hosts']:<24} {link:>11} {str(r['pipelined']):>9} {r['step_ms']:>9.1f} {r['compute_ms']:>10.1f} "
              f"{r['exchange_ms']:>11.1f} {r['exchange_cpu_ms']:>9.1f} {r['exchange_beside_compute_ms']:>7.1f} {r['step_over_max']:>8.2f} {r['step_over_sum']:>8.2f} {predicted}")
    print(f"overlaps the graphs allow (pipelined): {rows[1]['overlap']}; {time.monotonic() - started:.0f} s; "
          f"results: {RESULTS}")


if __name__ == "__main__":
    main()

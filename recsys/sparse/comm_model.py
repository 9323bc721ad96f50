"""The communication model: what one training step sends between ranks, and how long it takes.

Plain Python over a `ShardingPlan` and the batch layout of `recsys.data.batch`, the same ones the
hybrid embedding layer and the trainer use, so the bytes follow the code instead of a second
description of it. The collectives of one training step on W > 1 ranks, named as the code names
them in Horovod:

  forward   `ids`: data-parallel input only: rank s sends rank d its local batch's ids of the tables d
            holds a piece of, `hotness` int32 ids per sample (fixed-width ids; a ragged feature sends
            its row lengths and at most that many ids, plus the local batch, 4 bytes);
            `embeddings`: rank s sends rank d the pooled vectors of the columns s holds for d's local
            batch, in the exchange dtype (the compute dtype; bfloat16 moves as float32);
            `row_sliced_table_<t>_ids` / `_vectors`: a row-sliced table's ids go to the rank owning
            their row (4 bytes each), one partial sum per (sample, owner) comes back; these depend
            on the ids, and the model counts their expectation for ids spread uniformly over the rows;
  backward  `embeddings_grad`, `row_sliced_table_<t>_vectors_grad`: the reverse exchanges, the same
            bytes the other way (the id exchanges have no gradient);
  after     `dense_gradients`: the ring allreduce of the MLP (and cross network) gradients (the
            trainer sends it as a few buckets, the last layers' first: the same bytes), float16
            with --fp16_allreduce: 2 (W - 1) / W of the buffer out of every rank;
            `replicated_embedding_grad_<i>`: each replicated table's sparse gradient, gathered from
            every rank (its values and int32 indices: local batch x hotness rows; a ring allgather
            sends every block but one);
            `train_loss`: the loss and the stop votes, one float32 each, on a ring allreduce.
Nothing else crosses ranks in a step: model-parallel pieces and row blocks update locally, the
input pipelines read their own files. Evaluation, checkpoints and the start-up broadcast are not
per step and not counted.

Time: `Network` says what links carry this traffic: every host's link to the others (Gb/s, the
same for sending and receiving), the links between ranks of one host (NVLink, shared memory; none
given: not counted) and a latency per message. Ranks fill hosts in order (Horovod's and Slurm's
block placement). An all-to-all takes as long as its busiest host link or intra-host link; a ring
collective's ring crosses each host boundary once, so every host link carries what one rank sends.
`predict_step` adds a measured compute time: unpipelined, step = compute + exchange; fully
overlapped, step = max(compute, exchange); pipelined with M micro-batches, what the step's own compute
cannot hide (1/M of the in-step exchanges and the collectives after the backward pass) comes on top
of the overlapped rest (`StepPrediction.pipelined_step_ms`), which may take longer beside the compute
than alone where the hosts' cores also move the bytes (measured by bench.multihost; 1 with NICs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from recsys.data.batch import local_sizes
from recsys.runtime.stop_signals import STOP_SIGNALS
from recsys.sparse.sharding import ShardingPlan

ID_BYTES = 4  # ids travel as int32
LOSS_VALUES = 1 + len(STOP_SIGNALS)  # the loss and one stop vote per stop signal, float32 each
ALLTOALL, ALLREDUCE, ALLGATHER = "alltoall", "allreduce", "allgather"


@dataclass(frozen=True)
class StepLayout:
    """What besides the plan decides a step's traffic (factory.communication_layout reads it from
    the built trainer): the global batch, the input mode, the dtypes' sizes in bytes and the
    number of dense weights (the MLPs and the cross network)."""
    global_batch: int
    exchange_bytes: int = 4  # one value of the embedding exchange (the layer's output dtype)
    table_bytes: int = 4  # one value of a table (its gradient's dtype)
    dense_weights: int = 0
    dense_gradient_bytes: int = 4  # 2 with --fp16_allreduce
    data_parallel_input: bool = False


@dataclass(frozen=True)
class Collective:
    """One collective of a step. `sends[s][d]`: bytes rank s hands over for rank d (all-to-all,
    0 to itself); `buffer[r]`: bytes rank r contributes to a reduction or gather. `exact` is False
    where the bytes depend on the ids (row-sliced tables: their expectation)."""
    name: str
    kind: str
    phase: str
    sends: Tuple[Tuple[int, ...], ...] = ()
    buffer: Tuple[int, ...] = ()
    exact: bool = True

    @property
    def world_size(self) -> int:
        return len(self.sends) or len(self.buffer)

    def sent_by(self, rank: int) -> int:
        """Bytes `rank` puts on its links: an all-to-all's row; a ring allreduce 2 (W - 1) / W of
        the buffer; a ring allgather every block but the one it receives last (the next rank's)."""
        size = self.world_size
        if self.kind == ALLTOALL:
            return sum(self.sends[rank])
        if self.kind == ALLREDUCE:
            return 2 * (size - 1) * self.buffer[rank] // size
        return sum(self.buffer) - self.buffer[(rank + 1) % size]


def _alltoall(name: str, phase: str, size: int, count, exact: bool = True) -> Collective:
    """An all-to-all whose rank s sends `count(s, d)` bytes to rank d."""
    return Collective(name, ALLTOALL, phase, exact=exact, sends=tuple(
        tuple(0 if s == d else int(round(count(s, d))) for d in range(size)) for s in range(size)))


def _reverse(forward: Collective, name: str) -> Collective:
    """The backward pass of an all-to-all: what d received from s goes back from d to s."""
    return Collective(name, ALLTOALL, "backward", exact=forward.exact,
                      sends=tuple(tuple(column) for column in zip(*forward.sends)))


def expected_owner_groups(hotness: int, owned_fraction: float) -> float:
    """Expected (sample, owner) groups per sample for one owner holding `owned_fraction` of a
    table's rows, with `hotness` ids per sample drawn uniformly: 1 - (1 - f)^h (one-hot: f)."""
    return 1.0 - (1.0 - owned_fraction) ** hotness


def step_collectives(plan: ShardingPlan, layout: StepLayout) -> List[Collective]:
    """Every collective of one training step (module docstring), in the order the step runs them;
    none on one process."""
    size = plan.world_size
    if size == 1:
        return []
    rows = local_sizes(layout.global_batch, size)
    collectives = []
    if plan.pieces:
        if layout.data_parallel_input:  # ids per sample of the tables each rank holds
            held_ids = [sum(plan.hotness[t] for t in plan.model_parallel_tables_on(d)) for d in range(size)]
            collectives.append(_alltoall("ids", "forward", size, lambda s, d: rows[s] * held_ids[d] * ID_BYTES))
        widths = [plan.width_on(s) for s in range(size)]
        outputs = _alltoall("embeddings", "forward", size, lambda s, d: rows[d] * widths[s] * layout.exchange_bytes)
        collectives.append(outputs)
    backward = [_reverse(outputs, "embeddings_grad")] if plan.pieces else []
    for table in plan.row_sliced:  # the layer looks them up in feature order, after the exchange
        starts, hotness, width = plan.row_starts(table), plan.hotness[table], plan.dims[table]
        owned = [(starts[d + 1] - starts[d]) / plan.cardinalities[table] for d in range(size)]
        name = f"row_sliced_table_{table}"
        collectives.append(_alltoall(f"{name}_ids", "forward", size,
                                     lambda s, d: rows[s] * hotness * owned[d] * ID_BYTES, exact=False))
        vectors = _alltoall(f"{name}_vectors", "forward", size, lambda s, d: rows[d] * expected_owner_groups(
            hotness, owned[s]) * width * layout.exchange_bytes, exact=False)
        collectives.append(vectors)
        backward.append(_reverse(vectors, f"{name}_vectors_grad"))
    collectives.extend(reversed(backward))
    if layout.dense_weights:
        collectives.append(Collective("dense_gradients", ALLREDUCE, "after",
                                      buffer=(layout.dense_weights * layout.dense_gradient_bytes,) * size))
    for position, table in enumerate(plan.replicated):
        per_row = plan.dims[table] * layout.table_bytes + ID_BYTES
        collectives.append(Collective(f"replicated_embedding_grad_{position}", ALLGATHER, "after",
                                      buffer=tuple(r * plan.hotness[table] * per_row for r in rows)))
    collectives.append(Collective("train_loss", ALLREDUCE, "after", buffer=(LOSS_VALUES * 4,) * size))
    return collectives


@dataclass(frozen=True)
class Network:
    """The links a step's collectives use: `link_gbps` each host's link to the others (Gb/s, each
    way), `ranks_per_host` consecutive ranks on a host, `intra_host_gbps` each rank's link to the
    ranks of its host (None: not counted), `latency_us` per message."""
    link_gbps: float
    ranks_per_host: int = 1
    intra_host_gbps: Optional[float] = None
    latency_us: float = 0.0

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host


def _seconds(bytes_: float, gbps: Optional[float]) -> float:
    return 0.0 if gbps is None or not bytes_ else bytes_ * 8 / (gbps * 1e9)


def collective_ms(collective: Collective, network: Network) -> float:
    """Milliseconds of one collective on `network` (module docstring): the busiest link's bytes
    over its rate, plus the latency of every message a rank sends in turn."""
    size = collective.world_size
    hosts = (size + network.ranks_per_host - 1) // network.ranks_per_host
    if collective.kind == ALLTOALL:
        off_host, on_host = [0] * hosts, [0] * size
        for s in range(size):
            for d in range(size):
                if network.host(s) != network.host(d):
                    off_host[network.host(s)] += collective.sends[s][d]
                else:
                    on_host[s] += collective.sends[s][d]
        busiest = max(_seconds(max(off_host), network.link_gbps), _seconds(max(on_host), network.intra_host_gbps))
        messages = size - 1
    else:
        ring_edge = max(collective.sent_by(rank) for rank in range(size))
        busiest = max(_seconds(ring_edge if hosts > 1 else 0, network.link_gbps),
                      _seconds(ring_edge if network.ranks_per_host > 1 else 0, network.intra_host_gbps))
        messages = (2 if collective.kind == ALLREDUCE else 1) * (size - 1)
    return busiest * 1e3 + messages * network.latency_us / 1e3


@dataclass(frozen=True)
class StepPrediction:
    """A step's predicted times in milliseconds: each collective's, their sum (the exchange), the
    compute time given, and the step unpipelined (compute + exchange), fully overlapped
    (max(compute, exchange)) and as the pipelined trainer runs it (`pipelined_step_ms`).
    `in_step_ms`: the exchanges inside the forward and backward pass (the embeddings, the row-sliced
    tables' ids and vectors, their gradients); `after_ms`: the collectives after the backward pass
    (the dense allreduce, the replicated tables' gathers, the loss)."""
    collective_ms: Tuple[Tuple[str, float], ...]
    exchange_ms: float
    compute_ms: float
    in_step_ms: float = 0.0
    after_ms: float = 0.0

    @property
    def step_ms(self) -> float:
        return self.compute_ms + self.exchange_ms

    @property
    def overlapped_step_ms(self) -> float:
        return max(self.compute_ms, self.exchange_ms)

    def pipelined_step_ms(self, micro_batches: int, beside_compute: float = 1.0) -> float:
        """The step with the next batch's ids exchanged during this one and `micro_batches` M
        micro-batches. What no compute of the step can hide is exposed: the first micro-batch's
        forward exchange and the last one's backward exchange (1/M of the in-step exchanges) and
        the collectives after the backward pass (the next step's dense forward needs the weights
        they update). The rest runs beside the compute, taking `beside_compute` times as long as
        alone: 1 where moving bytes costs the hosts no core (a NIC's DMA); measured where hosts
        share cores with the copying (bench.multihost). step = exposed + max(compute, that rest),
        at least the fully overlapped step."""
        exposed = self.in_step_ms / micro_batches + self.after_ms
        return exposed + max(self.compute_ms, (self.exchange_ms - exposed) * beside_compute)


def predict_step(plan: ShardingPlan, layout: StepLayout, network: Network, compute_ms: float = 0.0) -> StepPrediction:
    """The step's exchange time on `network` and its step time with `compute_ms` of compute per
    step (measured: e.g. the step time of one rank's share of the batch on one process)."""
    collectives = step_collectives(plan, layout)
    times = tuple((c.name, collective_ms(c, network)) for c in collectives)
    in_step = sum(ms for c, (_, ms) in zip(collectives, times) if c.phase != "after" and c.name != "ids")
    after = sum(ms for c, (_, ms) in zip(collectives, times) if c.phase == "after")
    return StepPrediction(times, sum(ms for _, ms in times), compute_ms, in_step, after)


def predict_exchange(plan: ShardingPlan, global_batch: int, *, exchange_bytes: int, table_bytes: int,
                     dense_weights: int, link_gbps: float, compute_ms: float, fp16_allreduce: bool = False,
                     data_parallel_input: bool = False, ranks_per_host: int = 1,
                     intra_host_gbps: Optional[float] = None, latency_us: float = 0.0) -> Tuple[float, float]:
    """(predicted exchange ms, predicted unpipelined step ms) for a plan, a global batch, the
    dtypes' sizes in bytes, the dense weights, a link rate and a measured compute time: the entry
    for a benchmark comparing the model with measured steps."""
    layout = StepLayout(global_batch, exchange_bytes, table_bytes, dense_weights, 2 if fp16_allreduce else 4,
                        data_parallel_input)
    prediction = predict_step(plan, layout, Network(link_gbps, ranks_per_host, intra_host_gbps, latency_us),
                              compute_ms)
    return prediction.exchange_ms, prediction.step_ms


def describe(plan: ShardingPlan, layout: StepLayout, network: Optional[Network] = None,
             compute_ms: Optional[float] = None) -> str:
    """What --print_sharding_plan prints after the plan: every collective of a step with the bytes
    each rank sends, and with a network the predicted times."""
    collectives = step_collectives(plan, layout)
    lines = [f"communication per training step (global batch {layout.global_batch}, "
             f"{'data' if layout.data_parallel_input else 'model'}-parallel input, exchange "
             f"{layout.exchange_bytes}-byte values, {layout.dense_weights} dense weights):"]
    if not collectives:
        return lines[0] + " none on one process"
    times = dict(predict_step(plan, layout, network, compute_ms or 0.0).collective_ms) if network else {}
    for c in collectives:
        sent = ", ".join(str(c.sent_by(rank)) for rank in range(plan.world_size))
        note = "" if c.exact else ", expected for uniform ids"
        timing = f"; {times[c.name]:.3f} ms" if network else ""
        lines.append(f"  {c.name} ({c.kind}, {c.phase}{note}): bytes sent by rank 0.. {sent}{timing}")
    totals = ", ".join(str(sum(c.sent_by(rank) for c in collectives)) for rank in range(plan.world_size))
    lines.append(f"  total bytes sent per step by rank 0.. {totals}")
    if network:
        prediction = predict_step(plan, layout, network, compute_ms or 0.0)
        intra = (f", {network.intra_host_gbps:g} Gb/s within a host" if network.intra_host_gbps
                 else ", traffic within a host not counted" if network.ranks_per_host > 1 else "")
        lines.append(f"predicted at {network.link_gbps:g} Gb/s per host link, {network.ranks_per_host} rank(s) per "
                     f"host{intra}, {network.latency_us:g} us per message: exchange {prediction.exchange_ms:.3f} ms")
        if compute_ms is not None:
            lines.append(f"predicted step with {compute_ms:g} ms of compute: unpipelined (compute + exchange) "
                         f"{prediction.step_ms:.3f} ms, fully overlapped (max) {prediction.overlapped_step_ms:.3f} ms; "
                         f"{layout.global_batch / prediction.step_ms * 1e3:,.0f} to "
                         f"{layout.global_batch / max(prediction.overlapped_step_ms, 1e-9) * 1e3:,.0f} samples/s")
    return "\n".join(lines)

"""The communication layer: rank, size and collectives over Horovod, or a single process.

Under `horovodrun`, `mpirun` or `srun --mpi=pmix` every call goes through Horovod. Launched
plainly (`python main.py`), Horovod (or, where it is not installed, this module alone) sees one
process and every collective is the identity, so library code never branches on the world size.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Type, Union

import tensorflow as tf

# Environment variables that launchers set; any of them above 1 means "launched with peers".
_WORLD_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")

_hvd: Any = None
_initialised = False

TensorLike = Union[tf.Tensor, tf.Variable]


class DistributedError(RuntimeError):
    """The process was launched with peers but Horovod cannot serve them."""


def _launched_world_size() -> int:
    sizes = [int(os.environ[v]) for v in _WORLD_SIZE_VARIABLES if os.environ.get(v, "").isdigit()]
    return max(sizes, default=1)


def init() -> None:
    """Initialise Horovod when the process has peers (idempotent); otherwise stay single-process."""
    global _hvd, _initialised
    if _initialised:
        return
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        if _launched_world_size() > 1:
            raise DistributedError(f"launched with {_launched_world_size()} processes but Horovod cannot be "
                                   f"imported ({e}); run `make setup`") from e
        hvd = None
    if hvd is not None:
        hvd.init()
        _hvd = hvd
    _initialised = True


def _horovod() -> Any:
    """Horovod when it serves more than one process, else None (collectives become identities)."""
    init()
    if _hvd is not None and _hvd.size() > 1:
        return _hvd
    return None


def rank() -> int:
    init()
    return _hvd.rank() if _hvd is not None else 0


def size() -> int:
    init()
    return _hvd.size() if _hvd is not None else 1


def local_rank() -> int:
    init()
    return _hvd.local_rank() if _hvd is not None else 0


def local_size() -> int:
    init()
    return _hvd.local_size() if _hvd is not None else 1


def is_distributed() -> bool:
    return size() > 1


class CollectiveClock:
    """The in-flight intervals of the collectives traced while it is open (`timed_collectives`): a
    host timestamp once each one's inputs are ready and one once its outputs are. Within a step the
    time at least one of them is in flight is the time the step spends communicating, the wait for
    the slowest rank included; what the step computes meanwhile (the bottom MLP beside the embedding
    all-to-all) is not subtracted."""

    def __init__(self) -> None:
        self.intervals: List[Tuple[tf.Tensor, tf.Tensor]] = []

    def record(self, inputs: Any, run: Callable[[], Any]) -> Any:
        """`run()`'s outputs, with the interval from `inputs` ready to those outputs ready."""
        with tf.control_dependencies(_tensors_of(inputs)):
            start = tf.timestamp()
        outputs = run()
        with tf.control_dependencies(_tensors_of(outputs)):
            end = tf.timestamp()
        self.intervals.append((start, end))
        return outputs

    def add_outlasting(self, other: "CollectiveClock", after: Any) -> None:
        """The part of `other`'s intervals (collectives the step does not wait for, such as the next
        batch's id exchange) that lasts beyond the moment `after` is ready: a step waits for that."""
        if not other.intervals:
            return
        with tf.control_dependencies(_tensors_of(after)):
            done = tf.timestamp()
        self.intervals.extend((tf.maximum(start, done), end) for start, end in other.intervals)

    def in_flight_seconds(self) -> tf.Tensor:
        """The length of the union of the intervals (0.0 without any)."""
        if not self.intervals:
            return tf.constant(0.0, tf.float64)
        starts = tf.stack([start for start, _ in self.intervals])
        ends = tf.stack([end for _, end in self.intervals])
        order = tf.argsort(starts)
        starts, ends = tf.gather(starts, order), tf.gather(ends, order)
        covered_until, total = starts[0], tf.constant(0.0, tf.float64)
        for i in range(len(self.intervals)):  # a few collectives per step: unrolled
            total += tf.maximum(ends[i] - tf.maximum(starts[i], covered_until), 0.0)
            covered_until = tf.maximum(covered_until, ends[i])
        return total


_clocks: List[CollectiveClock] = []  # open clocks, innermost last (used while tracing)


def collectives_can_be_timed() -> bool:
    """False under TensorFlow's op determinism (`--deterministic`, TF_DETERMINISTIC_OPS), which
    refuses the timestamp op: collectives are then not timed."""
    from tensorflow.python.framework import config as tf_config  # is_op_determinism_enabled is not public

    return not (tf_config.is_op_determinism_enabled()
                or os.environ.get("TF_DETERMINISTIC_OPS", "").lower() in ("1", "true"))


@contextlib.contextmanager
def timed_collectives() -> Iterator[CollectiveClock]:
    """Record the in-flight interval of every collective traced inside (the innermost clock open
    gets it; nothing where `collectives_can_be_timed` is false); used by the trainer to report the
    share of a step spent communicating."""
    clock = CollectiveClock()
    timing = collectives_can_be_timed()
    if timing:
        _clocks.append(clock)
    try:
        yield clock
    finally:
        if timing:
            _clocks.remove(clock)


def _tensors_of(structure: Any) -> List[tf.Tensor]:
    """The tensors of a nest (IndexedSlices as their values and indices), for control dependencies."""
    flat = tf.nest.flatten(structure, expand_composites=True)
    return [t for t in flat if isinstance(t, tf.Tensor)]


def _timed(inputs: Any, run: Callable[[], Any]) -> Any:
    """`run()`, its interval recorded when a clock is open."""
    return _clocks[-1].record(inputs, run) if _clocks else run()


def allreduce(tensor: TensorLike, average: bool = True, name: Optional[str] = None) -> tf.Tensor:
    """Sum, or average, a tensor (or tf.IndexedSlices) over all ranks.

    Inside tf.function pass a `name` that is the same on every rank: Horovod otherwise names the
    collective after the tensor, and tensor names can differ between ranks whose graphs differ.
    Sparse gradients stay sparse: their rows and indices are gathered, never densified.
    """
    hvd = _horovod()
    if hvd is None:
        return tf.identity(tensor) if not isinstance(tensor, tf.IndexedSlices) else tensor
    if isinstance(tensor, tf.IndexedSlices):
        def gather() -> tf.IndexedSlices:
            values = hvd.allgather(tensor.values, name=f"{name}_values" if name else None)
            indices = hvd.allgather(tensor.indices, name=f"{name}_indices" if name else None)
            if average:
                values = values / tf.cast(hvd.size(), values.dtype)
            return tf.IndexedSlices(values, indices, tensor.dense_shape)
        return _timed(tensor, gather)
    return _timed(tensor, lambda: hvd.allreduce(tensor, op=hvd.Average if average else hvd.Sum, name=name))


def scale_gradient(gradient: Any, factor: float) -> Any:
    """`gradient` times `factor`, keeping a sparse gradient sparse (None stays None)."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * factor, gradient.indices, gradient.dense_shape)
    return gradient * factor


def average_gradients(gradients: Sequence[Any], name: str) -> List[Any]:
    """Average each gradient (dense or sparse) over the ranks, one collective each, named
    `<name>_<position>` so that every rank pairs the same ones; one process: returned as they are."""
    if size() == 1:
        return list(gradients)
    return [allreduce(gradient, name=f"{name}_{position}") for position, gradient in enumerate(gradients)]


def grouped_allreduce(tensors: Sequence[TensorLike], average: bool = True, fp16: bool = False) -> List[tf.Tensor]:
    """Allreduce a list of dense tensors in one fused collective; with `fp16` they travel as float16
    (Horovod's Compression.fp16: each rank's values rounded to float16, the result cast back)."""
    hvd = _horovod()
    if hvd is None:
        return [tf.identity(t) for t in tensors]
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    op = hvd.Average if average else hvd.Sum
    return _timed(list(tensors), lambda: list(hvd.grouped_allreduce(list(tensors), op=op, compression=compression)))


def gradient_buckets(sizes: Sequence[int], buckets: int) -> List[List[int]]:
    """The positions of tensors of `sizes` elements in at most `buckets` groups of contiguous
    positions with about equal elements, the last positions' group first: the order in which a
    backward pass completes the gradients of layers listed input first."""
    total, groups, current, done = sum(sizes), [], [], 0
    for position in reversed(range(len(sizes))):
        current.append(position)
        done += sizes[position]
        if done >= total * (len(groups) + 1) / buckets and len(groups) < buckets - 1:
            groups.append(sorted(current))
            current = []
    return groups + ([sorted(current)] if current else [])


def bucketed_allreduce(tensors: Sequence[TensorLike], buckets: int, fp16: bool = False) -> List[tf.Tensor]:
    """`grouped_allreduce` in `buckets` fused collectives (gradient_buckets), returned in the
    tensors' order: the bucket of the last layers' gradients, complete first in a backward pass,
    crosses the links while the earlier layers' gradients are still computed. The buckets follow
    from the shapes alone, so every rank and every run sums the same way."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    reduced: List[Any] = [None] * len(tensors)
    for group in gradient_buckets([t.shape.num_elements() for t in tensors], buckets):
        for position, tensor in zip(group, grouped_allreduce([tensors[p] for p in group], fp16=fp16)):
            reduced[position] = tensor
    return reduced


def alltoall(tensor: TensorLike, splits: Optional[TensorLike] = None,
             name: Optional[str] = None) -> Tuple[tf.Tensor, tf.Tensor]:
    """Send `splits[r]` rows (axis 0) to rank r; return the received rows and the received splits.

    With `splits=None` the rows are divided equally. Differentiable: the gradient is the reverse
    exchange, so it works inside `tf.GradientTape` and `tf.function`. With a `name`, the reverse
    exchange is named `<name>_grad`, and both names are used as given, without the graph's name
    scope: Horovod would otherwise name the reverse exchange after the gradient tensor and its
    scope, which differ between ranks whose graphs differ (ranks holding different tables), and
    ranks waiting on differently named collectives hang. bfloat16, which Horovod's ops do not
    take, travels as its 16 bits (bitcast to float16 and back: an all-to-all only moves bytes).
    """
    hvd = _horovod()
    if hvd is None:
        rows = tf.shape(tensor, out_type=tf.int32)[:1]
        return tf.identity(tensor), (tf.cast(splits, tf.int32) if splits is not None else rows)
    tensor = tf.convert_to_tensor(tensor)

    def send(values: tf.Tensor, counts: Optional[TensorLike], collective: Optional[str]) -> Tuple[tf.Tensor, tf.Tensor]:
        bits = values.dtype == tf.bfloat16
        received, received_counts = _timed([values, counts], lambda: hvd.alltoall(
            tf.bitcast(values, tf.float16) if bits else values, splits=counts, name=collective,
            ignore_name_scope=collective is not None))
        return (tf.bitcast(received, tf.bfloat16) if bits else received), received_counts

    if not tensor.dtype.is_floating:
        return send(tensor, splits, name)

    @tf.custom_gradient
    def exchange(values: tf.Tensor):
        received, received_splits = send(values, splits, name)

        def reverse(upstream: tf.Tensor, _splits_gradient=None) -> tf.Tensor:
            return send(upstream, received_splits, None if name is None else f"{name}_grad")[0]

        return (received, received_splits), reverse

    return exchange(tensor)


def allgather(tensor: TensorLike, name: Optional[str] = None) -> tf.Tensor:
    """Concatenate every rank's tensor along axis 0, in rank order (sizes may differ)."""
    hvd = _horovod()
    if hvd is None:
        return tf.identity(tensor)
    return hvd.allgather(tensor, name=name)


def broadcast(tensor: TensorLike, root_rank: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """Every rank receives root_rank's value."""
    hvd = _horovod()
    if hvd is None:
        return tf.identity(tensor)
    return hvd.broadcast(tensor, root_rank=root_rank, name=name)


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """Assign root_rank's values to the given variables on every rank (initial dense weights)."""
    hvd = _horovod()
    if hvd is not None and variables:
        hvd.broadcast_variables(list(variables), root_rank=root_rank)


def allgather_object(obj: Any) -> List[Any]:
    """Gather a picklable Python object from every rank, in rank order."""
    hvd = _horovod()
    if hvd is None:
        return [obj]
    return hvd.allgather_object(obj)


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """Return root_rank's picklable object on every rank."""
    hvd = _horovod()
    if hvd is None:
        return obj
    return hvd.broadcast_object(obj, root_rank=root_rank)


def rank0_verdict(rank: int, check: Callable[[], None], refusals: Tuple[Type[BaseException], ...]) -> Optional[str]:
    """Rank 0 runs `check`; the message of a refusal it raises (one of `refusals`), or None, on every
    rank. A collective: every rank calls it at the same point, so a refusal stops the whole job with
    one message instead of leaving the other ranks in a later collective."""
    message = None
    if rank == 0:
        try:
            check()
        except refusals as error:
            message = str(error)
    return broadcast_object(message, root_rank=0)


def barrier() -> None:
    """Block until every rank reaches this point."""
    hvd = _horovod()
    if hvd is not None:
        hvd.allreduce(tf.constant(0, tf.int32), op=hvd.Sum, name="barrier").numpy()

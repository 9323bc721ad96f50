"""Where a training step's time goes: TensorFlow's profiler over a few steps, its op events grouped.

`profile_breakdown(run_step, steps)` traces `steps` calls of `run_step` with `tf.profiler`, reads
the host plane of the trace (XSpace), and sums the wall time of every TensorFlow op event per
category of the step (input, embedding forward / backward / update, interaction, the MLPs forward and
backward, loss, dense optimizer, collectives, other), from the op's name scope and type (the
Keras scopes `bottom_mlp`, `top_mlp`, the `gradient_tape/` prefix of the backward pass). Ops run on
several inter-op threads at once, so the categories add up to more than the step's wall time when
the threads overlap: `thread_ms_per_step / step wall time` is the number of threads kept busy.
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
from collections import Counter
from typing import Callable, Dict, Iterable, Tuple

# First match wins: backward before forward (a gradient's name holds its forward op's), the
# interaction (whose gather's gradient sums segments) before the embedding.
CATEGORIES: Tuple[Tuple[str, "re.Pattern[str]"], ...] = tuple((name, re.compile(pattern)) for name, pattern in (
    ("collectives", r"Horovod|Alltoall|Allreduce"),
    ("input", r"Iterator|Prefetch"),
    ("interaction backward", r"^gradient_tape/\S*(DotBasedInteract|interaction|cross)"),
    ("interaction forward", r"DotBasedInteract|interaction|cross"),
    ("embedding update", r"EmbeddingSparse|ResourceScatter|ScatterNd|SparseApply|UnsortedSegment"),
    ("embedding backward", r"^gradient_tape/\S*(embedding|Gather)"),
    ("embedding forward", r"embedding|Gather"),
    ("bottom MLP backward", r"^gradient_tape/\S*bottom_mlp"),
    ("bottom MLP forward", r"bottom_mlp"),
    ("top MLP backward", r"^gradient_tape/\S*top_mlp"),
    ("top MLP forward", r"top_mlp"),
    ("loss", r"logistic_loss|sigmoid_cross_entropy"),
    ("dense optimizer", r"ResourceApply|Adam|Adagrad|GradientDescent"),
))
OTHER = "other"
# An op event of TensorFlow's executor: "<name scope>/<op name>:<op type>" (wrappers such as
# "EagerLocalExecute: __inference_..." or "ParallelFor" are not ops).
OP_EVENT = re.compile(r"^[\w./\-]+:[A-Za-z_]\w*$")


def categorize(op_event: str) -> str:
    """The step category of one op event name ("scope/op:Type")."""
    for name, pattern in CATEGORIES:
        if pattern.search(op_event):
            return name
    return OTHER


def summarize(op_events: Iterable[Tuple[str, float]], steps: int) -> Dict[str, float]:
    """{category: ms per step} from (op event name, duration ms) pairs of `steps` steps; every category
    is present (0 where no op fell in it)."""
    totals = Counter({name: 0.0 for name, _ in CATEGORIES} | {OTHER: 0.0})
    for name, duration_ms in op_events:
        totals[categorize(name)] += duration_ms
    return {name: total / steps for name, total in totals.items()}


def _op_events(xspace_path: str) -> Iterable[Tuple[str, float]]:
    """(name, duration ms) of every op event in the host plane of an XSpace file."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xspace_path, "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if OP_EVENT.match(name):
                    yield name, event.duration_ps / 1e9


def profile_breakdown(run_step: Callable[[], None], steps: int) -> Dict[str, float]:
    """{category: thread ms per step} over `steps` calls of `run_step` (each must end with a host
    read, so that the step's ops end inside the trace)."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(steps):
                run_step()
        finally:
            tf.profiler.experimental.stop()
        traces = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
        if not traces:
            raise RuntimeError(f"the profiler wrote no trace under {logdir}")
        return summarize(_op_events(traces[-1]), steps)

"""Where a training step's time goes: TensorFlow's profiler over a few steps, its op events grouped.

`profile_breakdown(run_step, steps)` traces `steps` calls of `run_step` with `tf.profiler`, reads
the host plane of the trace (XSpace) and splits the steps' wall time among the categories of the
step (input, embedding forward / backward / update, interaction, the MLPs forward and backward, loss,
dense optimizer, collectives, other), from each op's name scope and type (the Keras scopes
`bottom_mlp`, `top_mlp`, the `gradient_tape/` prefix of the backward pass). Ops run on several
inter-op threads at once, each slowed by the others it shares the cores with, so every instant is
split evenly among the ops running then: the categories add up to the time some op was running,
and IDLE is the rest of the steps' wall time (the host's own work between ops and steps).
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, Tuple

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
IDLE = "idle"
# An op event of TensorFlow's executor: "<name scope>/<op name>:<op type>" (wrappers such as
# "EagerLocalExecute: __inference_..." or "ParallelFor" are not ops).
OP_EVENT = re.compile(r"^[\w./\-]+:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class OpEvent:
    """One op's run: its event name ("scope/op:Type"), start and end in ms on the trace's clock."""
    name: str
    start_ms: float
    end_ms: float


def categorize(op_event: str) -> str:
    """The step category of one op event name ("scope/op:Type")."""
    for name, pattern in CATEGORIES:
        if pattern.search(op_event):
            return name
    return OTHER


def summarize(events: Iterable[OpEvent], steps: int, wall_ms: float) -> Dict[str, float]:
    """{category: ms per step} of `steps` steps that took `wall_ms` in all: each instant split evenly
    among the ops running then, IDLE the wall time no op ran; every category is present."""
    totals = Counter({name: 0.0 for name, _ in CATEGORIES} | {OTHER: 0.0})
    boundaries = []  # (time, +1 start / -1 end, category); ends sort before starts at the same time
    for event in events:
        category = categorize(event.name)
        boundaries += [(event.start_ms, 1, category), (event.end_ms, -1, category)]
    boundaries.sort(key=lambda boundary: (boundary[0], boundary[1]))
    running: Counter = Counter()
    busy, previous = 0.0, None
    for time_ms, change, category in boundaries:
        count = sum(running.values())
        if previous is not None and count and time_ms > previous:
            for name, active in running.items():
                totals[name] += (time_ms - previous) * active / count
            busy += time_ms - previous
        running[category] += change
        if not running[category]:
            del running[category]
        previous = time_ms
    totals[IDLE] = max(0.0, wall_ms - busy)
    return {name: total / steps for name, total in totals.items()}


def _op_events(xspace_path: str) -> Iterator[OpEvent]:
    """Every op event in the host plane of an XSpace file."""
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
                    start_ms = line.timestamp_ns / 1e6 + event.offset_ps / 1e9
                    yield OpEvent(name, start_ms, start_ms + event.duration_ps / 1e9)


def profile_breakdown(run_step: Callable[[], None], steps: int) -> Dict[str, float]:
    """{category: wall ms per step} over `steps` calls of `run_step` (each must end with a host read,
    so that the step's ops end inside the trace), IDLE included: the values add up to the step time."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            started = time.perf_counter()
            for _ in range(steps):
                run_step()
            wall_ms = (time.perf_counter() - started) * 1000
        finally:
            tf.profiler.experimental.stop()
        traces = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
        if not traces:
            raise RuntimeError(f"the profiler wrote no trace under {logdir}")
        return summarize(_op_events(traces[-1]), steps, wall_ms)

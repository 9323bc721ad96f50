"""What may run at the same time in a traced training step, read from its graph.

TensorFlow's executor runs every op whose inputs are ready, and Horovod's collectives are
asynchronous kernels served by Horovod's background thread, so inside one `tf.function` a
collective overlaps any computation that neither feeds it nor waits for it. What orders two ops is
a path of data or control edges between them (TensorFlow's automatic control dependencies, which
order the ops touching one variable in program order, included). `ordered` finds such a path;
`overlap_report` asks it of the pairs the trainer's overlap rests on (docs/architecture.md,
Overlap): the next batch's id all-to-all against this step's compute, the embedding all-to-all
against the bottom MLP, and the embedding-gradient all-to-all against the dense allreduce.
"""
from __future__ import annotations

from typing import Dict, List, Set

import tensorflow as tf


def upstream(op: tf.Operation) -> Set[tf.Operation]:
    """Every op `op` waits for: the ops its data and control inputs come from, transitively."""
    seen: Set[tf.Operation] = set()
    stack = [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def ordered(first: tf.Operation, second: tf.Operation) -> bool:
    """Whether one of the two ops must wait for the other (a path of edges between them)."""
    return first in upstream(second) or second in upstream(first)


def collectives(graph: tf.Graph, op_type: str) -> Dict[str, tf.Operation]:
    """The graph's Horovod collectives of `op_type` (e.g. "HorovodAlltoall"), by the last part of
    their node name (the collective's name: "ids", "embeddings_grad", ...)."""
    return {op.name.rsplit("/", 1)[-1]: op for op in graph.get_operations() if op.type == op_type}


def _matmuls(graph: tf.Graph, scope: str) -> List[tf.Operation]:
    """The forward MatMuls under `scope` (a layer's name), not those of the gradient tape."""
    return [op for op in graph.get_operations()
            if op.type == "MatMul" and f"/{scope}/" in f"/{op.name}" and "gradient_tape" not in op.name]


def overlap_report(step_graph: tf.Graph) -> Dict[str, bool]:
    """Which of the trainer's overlaps the graph of one step allows (True: no path orders the two).

    - `ids_vs_step`: the id all-to-alls ("ids" collectives) against every other collective and
      every forward MatMul of the step: free only where they are the next batch's (a pipelined
      step); absent where the step exchanges no ids;
    - `embeddings_vs_bottom_mlp`: each micro-batch's embedding all-to-all against the bottom MLP's
      forward MatMuls;
    - `embedding_grads_vs_dense_allreduce`: each embedding-gradient all-to-all against the dense
      gradients' grouped allreduce.
    """
    alltoalls = collectives(step_graph, "HorovodAlltoall")
    others = [op for op in step_graph.get_operations()
              if op.type.startswith("Horovod") and not op.name.rsplit("/", 1)[-1].startswith("ids")]
    bottom = _matmuls(step_graph, "bottom_mlp")
    compute = _matmuls(step_graph, "dlrm")
    report: Dict[str, bool] = {}
    next_ids = [op for name, op in alltoalls.items() if name.startswith("ids")]
    if next_ids:
        report["ids_vs_step"] = not any(ordered(ids, op) for ids in next_ids for op in others + compute)
    embeddings = [op for name, op in alltoalls.items() if name.startswith("embeddings") and "_grad" not in name]
    report["embeddings_vs_bottom_mlp"] = bool(embeddings and bottom) and not any(
        ordered(exchange, op) for exchange in embeddings for op in bottom)
    grads = [op for name, op in alltoalls.items() if name.startswith("embeddings") and name.endswith("_grad")]
    dense = list(collectives(step_graph, "HorovodGroupedAllreduce").values())
    report["embedding_grads_vs_dense_allreduce"] = bool(grads and dense) and not any(
        ordered(grad, op) for grad in grads for op in dense)
    return report

"""Runs on 2 ranks: one training step per input mode with Horovod's collectives recorded, compared
with what the communication model predicts for the same plan and stack.

Usage: python tests/comm_worker.py <output.json>
The tables cover every kind of traffic: model-parallel pieces (one multi-hot, one column-sliced),
replicated tables (one multi-hot) and a row-sliced one-hot table whose ids alternate between the
two row blocks, so the model's expectation (ids uniform over the rows) is exactly what is sent.
Model-parallel input runs with plain float32 dense gradients, data-parallel input with
--fp16_allreduce. Rank 0 writes every rank's differences (none when the model is right) and
the collectives it checked.
"""
import json
import sys

import numpy as np
import tensorflow as tf

from bench.hybrid import recording_collectives
from factory import ModelOptions, build_trainer, communication_layout
from model import dense_weight_count
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, local_slice
from recsys.runtime import distributed as dist
from recsys.sparse.comm_model import ALLTOALL, step_collectives
from recsys.sparse.sharding import plan_sharding
from recsys.training.model_config import DlrmSettings, TrainingSettings

CARDINALITIES = [50, 20, 7, 30, 3, 64, 200]
HOTNESS = [1, 3, 1, 1, 2, 1, 1]
DIM = 8
BATCH = 64
NUM_NUMERICAL = 5
THRESHOLDS = {"column_slice_threshold": 400, "data_parallel_threshold": 60, "row_slice_threshold": 1600}
ROW_SLICED = 6


def batch_for(reads, rank: int, world_size: int):
    """This rank's inputs of one global batch; the row-sliced table's ids alternate between its
    blocks, the others are random."""
    rng = np.random.default_rng(7)
    ids = [rng.integers(0, rows, (BATCH, hot) if hot > 1 else BATCH).astype(np.int32)
           for rows, hot in zip(CARDINALITIES, HOTNESS)]
    half = CARDINALITIES[ROW_SLICED] // 2
    ids[ROW_SLICED] = ((np.arange(BATCH) % 2) * half + np.arange(BATCH) // 2 % half).astype(np.int32)
    start, end = local_slice(BATCH, rank, world_size)
    id_start, id_end = reads.rows(BATCH, rank, world_size)
    features = {NUMERICAL_KEY: tf.constant(rng.random((BATCH, NUM_NUMERICAL), dtype=np.float32)[start:end]),
                CATEGORICAL_KEY: tuple(tf.constant(ids[t][id_start:id_end]) for t in reads.tables)}
    return features, tf.constant((rng.random((BATCH, 1)) < 0.5).astype(np.float32)[start:end])


def recorded_by_collective(sent: dict) -> dict:
    """The recorder's names joined the way the model counts them: a replicated table's gradient
    is one collective, its values' and its indices' gathers together."""
    joined = {}
    for name, counts in sent.items():
        base = name.rsplit("_", 1)[0] if name.endswith(("_values", "_indices")) else name
        joined[base] = [a + b for a, b in zip(joined.get(base, [0] * len(counts)), counts)]
    return joined


def main(output: str) -> None:
    dist.init()
    tf.keras.utils.set_random_seed(0)
    rank, world_size = dist.rank(), dist.size()
    plan = plan_sharding(CARDINALITIES, (DIM,) * len(CARDINALITIES), world_size, "basic", hotness=HOTNESS,
                         **THRESHOLDS)
    assert plan.row_sliced == [ROW_SLICED] and plan.replicated == [2, 4], plan.describe()
    differences, checked = [], []
    for data_parallel_input in (False, True):
        reads = plan.reads(rank, data_parallel_input)
        trainer = build_trainer(plan, rank, reads, ModelOptions(
            num_numerical_features=NUM_NUMERICAL, model=DlrmSettings(bottom_mlp_dims=[16, DIM], top_mlp_dims=[16, 1]),
            training=TrainingSettings(learning_rate=0.01, warmup_steps=0, decay_start_step=10**9, decay_steps=1,
                                      fp16_allreduce=data_parallel_input)),
            name=f"hybrid_{int(data_parallel_input)}")
        layout = communication_layout(trainer, BATCH, data_parallel_input)
        if dense_weight_count(trainer.model.config) != layout.dense_weights:
            differences.append(f"dense_weight_count {dense_weight_count(trainer.model.config)} != "
                               f"{layout.dense_weights} weights built")
        tf.config.run_functions_eagerly(True)
        try:
            with recording_collectives() as sent:
                trainer.train_step(*batch_for(reads, rank, world_size))[0].numpy()
        finally:
            tf.config.run_functions_eagerly(False)
        recorded = recorded_by_collective(sent)
        predicted = {c.name: list(c.sends[rank]) if c.kind == ALLTOALL else [c.buffer[rank]]
                     for c in step_collectives(plan, layout)}
        for name in sorted(set(recorded) | set(predicted)):
            if recorded.get(name) != predicted.get(name):
                differences.append(f"rank {rank}, data_parallel_input {data_parallel_input}, {name}: "
                                   f"sent {recorded.get(name)}, predicted {predicted.get(name)}")
        checked.extend(sorted(predicted))
    every_rank = dist.allgather_object({"differences": differences, "checked": checked})
    if rank == 0:
        with open(output, "w") as f:
            json.dump(every_rank, f)


if __name__ == "__main__":
    main(sys.argv[1])

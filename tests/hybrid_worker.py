"""Runs on 1 or N ranks: the same global batches through the model, for equivalence tests.

Usage: python tests/hybrid_worker.py '<json options>' <output.npz>
The stack comes from `factory.build_trainer`: with one process the plain embedding layer, with
several the hybrid-parallel layer planned from the options. Every rank starts from the same global weights
(drawn from a fixed numpy seed), so rank 0's output file can be compared across world sizes.
"""
import json
import sys

import numpy as np
import tensorflow as tf

import distributed as dist
from batch import CATEGORICAL_KEY, NUMERICAL_KEY, local_slice
from factory import ModelOptions, build_trainer
from sharding import plan_sharding

CARDINALITIES = [50, 20, 7, 30, 3, 64]
DIM = 8
NUM_NUMERICAL = 5


def global_batch(rng: np.random.Generator, size: int):
    numerical = rng.random((size, NUM_NUMERICAL), dtype=np.float32)
    categorical = [rng.integers(0, c, size).astype(np.int32) for c in CARDINALITIES]
    labels = (rng.random((size, 1)) < 0.4).astype(np.float32)
    return numerical, categorical, labels


def rank_inputs(batch, reads, rank, world_size):
    """What this rank's loader would give it for a global batch."""
    numerical, categorical, labels = batch
    start, end = local_slice(len(labels), rank, world_size)
    id_start, id_end = reads.rows(len(labels), rank, world_size)
    ids = tuple(tf.constant(categorical[t][id_start:id_end]) for t in reads.tables)
    features = {NUMERICAL_KEY: tf.constant(numerical[start:end]), CATEGORICAL_KEY: ids}
    return features, tf.constant(labels[start:end])


def main(options: dict, output: str) -> None:
    dist.init()
    tf.keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    rank, world_size = dist.rank(), dist.size()
    plan = plan_sharding(CARDINALITIES, DIM, world_size, options["strategy"],
                         options.get("column_slice_threshold"), options.get("data_parallel_threshold"),
                         row_slice_threshold=options.get("row_slice_threshold"))
    reads = plan.reads(rank, options["data_parallel_input"])
    trainer = build_trainer(plan, rank, reads, ModelOptions(
        num_numerical_features=NUM_NUMERICAL, bottom_mlp_dims=[16, DIM], top_mlp_dims=[16, 1],
        optimizer=options["optimizer"], learning_rate=0.05, warmup_steps=0, decay_start_step=10**9, decay_steps=1))
    model = trainer.model
    rng = np.random.default_rng(1234)
    for table, rows in zip(model.table_views(), CARDINALITIES):
        table.write_rows(0, rows, rng.uniform(-0.5, 0.5, (rows, DIM)).astype(np.float32))
    for _, variable in sorted(model.dense_weight_map().items()):
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))

    results = {}
    predict = tf.function(lambda features: model(features, training=False))
    for name, size in (("forward_full", 64), ("forward_partial", 37)):
        features, _ = rank_inputs(global_batch(rng, size), reads, rank, world_size)
        results[name] = dist.allgather(predict(features)).numpy()

    for _ in range(options["steps"]):
        features, labels = rank_inputs(global_batch(rng, 64), reads, rank, world_size)
        trainer.train_step(features, labels)
    for i, table in enumerate(model.table_views()):
        results[f"table_{i}"] = table.read_rows(0, table.rows)
    for name, variable in model.dense_weight_map().items():
        results[name] = variable.numpy()
    if rank == 0:
        np.savez(output, **results)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])

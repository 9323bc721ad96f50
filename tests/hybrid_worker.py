"""Runs on 1 or N ranks: the same global batches through the model, for equivalence tests.

Usage: python tests/hybrid_worker.py '<json options>' <output.npz>
The stack comes from `factory.build_trainer`: with one process the plain embedding layer, with
several the hybrid-parallel layer planned from the options. Every rank starts from the same global weights
(drawn from a fixed numpy seed), so rank 0's output file can be compared across world sizes.
With `"multihot": true` the features take every form of the batch contract (MULTIHOT_FORMS): `[b]`,
`[b, h]` and ragged ids (empty rows included), sum and mean pooling, with ids repeated within a
sample and across the ranks' samples (small tables).
"""
import json
import sys

import numpy as np
import tensorflow as tf

from recsys.runtime import distributed as dist
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, local_slice
from factory import ModelOptions, build_trainer
from recsys.training.model_config import DlrmSettings, TrainingSettings
from recsys.sparse.sharding import plan_sharding

CARDINALITIES = [50, 20, 7, 30, 3, 64]
DIM = 8
NUM_NUMERICAL = 5
# (form, hotness, pooling) of every table with "multihot": fixed [b, h], ragged (at most h ids,
# possibly none) or one-hot [b]
MULTIHOT_FORMS = [("fixed", 3, "sum"), ("ragged", 4, "mean"), ("fixed", 2, "mean"), ("one_hot", 1, "sum"),
                  ("ragged", 5, "sum"), ("ragged", 3, "mean")]


def global_batch(rng: np.random.Generator, size: int, multihot: bool = False):
    """Numericals, one id array per table (`[size]`, `[size, h]`, or a list of per-sample arrays
    for ragged ones) and labels."""
    numerical = rng.random((size, NUM_NUMERICAL), dtype=np.float32)
    forms = MULTIHOT_FORMS if multihot else [("one_hot", 1, "sum")] * len(CARDINALITIES)
    categorical = []
    for rows, (form, hotness, _) in zip(CARDINALITIES, forms):
        if form == "ragged":
            categorical.append([rng.integers(0, rows, rng.integers(0, hotness + 1)).astype(np.int32)
                                for _ in range(size)])
        else:
            categorical.append(rng.integers(0, rows, (size, hotness) if form == "fixed" else size).astype(np.int32))
    labels = (rng.random((size, 1)) < 0.4).astype(np.float32)
    return numerical, categorical, labels


def id_tensor(ids, start: int, end: int):
    """Rows [start, end) of one table's ids as the loader gives them (ragged for a list of rows)."""
    if isinstance(ids, list):
        rows = ids[start:end]
        return tf.RaggedTensor.from_row_lengths(np.concatenate([np.zeros(0, np.int32)] + rows),
                                                np.array([len(r) for r in rows], np.int64))
    return tf.constant(ids[start:end])


def rank_inputs(batch, reads, rank, world_size):
    """What this rank's loader would give it for a global batch."""
    numerical, categorical, labels = batch
    start, end = local_slice(len(labels), rank, world_size)
    id_start, id_end = reads.rows(len(labels), rank, world_size)
    ids = tuple(id_tensor(categorical[t], id_start, id_end) for t in reads.tables)
    features = {NUMERICAL_KEY: tf.constant(numerical[start:end]), CATEGORICAL_KEY: ids}
    return features, tf.constant(labels[start:end])


def main(options: dict, output: str) -> None:
    dist.init()
    tf.keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    rank, world_size = dist.rank(), dist.size()
    multihot = options.get("multihot", False)
    forms = MULTIHOT_FORMS if multihot else [("one_hot", 1, "sum")] * len(CARDINALITIES)
    plan = plan_sharding(CARDINALITIES, (DIM,) * len(CARDINALITIES), world_size, options["strategy"],
                         options.get("column_slice_threshold"), options.get("data_parallel_threshold"),
                         row_slice_threshold=options.get("row_slice_threshold"),
                         hotness=[h for _, h, _ in forms], poolings=[p for _, _, p in forms])
    reads = plan.reads(rank, options["data_parallel_input"])
    trainer = build_trainer(plan, rank, reads, ModelOptions(
        num_numerical_features=NUM_NUMERICAL, model=DlrmSettings(bottom_mlp_dims=[16, DIM], top_mlp_dims=[16, 1]),
        training=TrainingSettings(optimizer=options["optimizer"], learning_rate=0.05, warmup_steps=0,
                                  decay_start_step=10**9, decay_steps=1)))
    model = trainer.model
    rng = np.random.default_rng(1234)
    for table, rows in zip(model.table_views(), CARDINALITIES):
        table.write_rows(0, rows, rng.uniform(-0.5, 0.5, (rows, DIM)).astype(np.float32))
    for _, variable in sorted(model.dense_weight_map().items()):
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))

    results = {}
    predict = tf.function(lambda features: model(features, training=False))
    for name, size in (("forward_full", 64), ("forward_partial", 37)):
        features, _ = rank_inputs(global_batch(rng, size, multihot), reads, rank, world_size)
        results[name] = dist.allgather(predict(features)).numpy()

    for _ in range(options["steps"]):
        features, labels = rank_inputs(global_batch(rng, 64, multihot), reads, rank, world_size)
        trainer.train_step(features, labels)
    for i, table in enumerate(model.table_views()):
        results[f"table_{i}"] = table.read_rows(0, table.rows)
    for name, variable in model.dense_weight_map().items():
        results[name] = variable.numpy()
    if rank == 0:
        np.savez(output, **results)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])

"""Runs on 1 or N ranks: the same global batches through the model, for equivalence tests.

Usage: python tests/hybrid_worker.py '<json options>' <output.npz>
With one process the model uses the plain embedding layer; with several it uses the
hybrid-parallel layer planned from the options. Every rank starts from the same global weights
(drawn from a fixed numpy seed), so rank 0's output file can be compared across world sizes.
"""
import json
import sys

import numpy as np
import tensorflow as tf

import distributed as dist
from hybrid_embedding import HybridEmbedding, local_batch_bounds
from lr_scheduler import LearningRateScheduler
from batch import CATEGORICAL_KEY, NUMERICAL_KEY
from model import Dlrm, DlrmConfig
from optimizers import make_optimizers
from sharding import plan_sharding
from trainer import Trainer

CARDINALITIES = [50, 20, 7, 30, 3, 64]
DIM = 8
NUM_NUMERICAL = 5


def global_batch(rng: np.random.Generator, size: int):
    numerical = rng.random((size, NUM_NUMERICAL), dtype=np.float32)
    categorical = [rng.integers(0, c, size).astype(np.int32) for c in CARDINALITIES]
    labels = (rng.random((size, 1)) < 0.4).astype(np.float32)
    return numerical, categorical, labels


def rank_inputs(batch, plan, options, rank, world_size):
    """What this rank's loader would give it for a global batch."""
    numerical, categorical, labels = batch
    start, end = (int(b) for b in local_batch_bounds(len(labels), world_size).numpy()[rank:rank + 2])
    if plan is None or options["data_parallel_input"]:
        ids = tuple(tf.constant(c[start:end]) for c in categorical)
    else:
        ids = tuple(tf.constant(categorical[t]) for t in plan.input_tables(rank))
    features = {NUMERICAL_KEY: tf.constant(numerical[start:end]), CATEGORICAL_KEY: ids}
    return features, tf.constant(labels[start:end])


def main(options: dict, output: str) -> None:
    dist.init()
    tf.keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    rank, world_size = dist.rank(), dist.size()
    config = DlrmConfig(num_numerical_features=NUM_NUMERICAL, cardinalities=CARDINALITIES, embedding_dim=DIM,
                        bottom_mlp_dims=[16, DIM], top_mlp_dims=[16, 1], interaction="tensorflow")
    plan, layer = None, None
    if world_size > 1:
        plan = plan_sharding(CARDINALITIES, DIM, world_size, options["strategy"],
                             options.get("column_slice_threshold"), options.get("data_parallel_threshold"))
        layer = HybridEmbedding(plan, rank, data_parallel_input=options["data_parallel_input"])
    model = Dlrm(config, layer)
    model.build_weights()
    rng = np.random.default_rng(1234)
    for table, rows in zip(model.table_views(), CARDINALITIES):
        table.write_rows(0, rows, rng.uniform(-0.5, 0.5, (rows, DIM)).astype(np.float32))
    for _, variable in sorted(model.dense_weight_map().items()):
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(np.float32))

    results = {}
    predict = tf.function(lambda features: model(features, training=False))
    for name, size in (("forward_full", 64), ("forward_partial", 37)):
        features, _ = rank_inputs(global_batch(rng, size), plan, options, rank, world_size)
        results[name] = dist.allgather(predict(features)).numpy()

    dense_optimizer, embedding_optimizer = make_optimizers(options["optimizer"])
    trainer = Trainer(model, dense_optimizer, embedding_optimizer, LearningRateScheduler(0.05, 0, 10**9, 1))
    for _ in range(options["steps"]):
        features, labels = rank_inputs(global_batch(rng, 64), plan, options, rank, world_size)
        trainer.train_step(features, labels)
    for i, table in enumerate(model.table_views()):
        results[f"table_{i}"] = table.read_rows(0, table.rows)
    for name, variable in model.dense_weight_map().items():
        results[name] = variable.numpy()
    if rank == 0:
        np.savez(output, **results)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])

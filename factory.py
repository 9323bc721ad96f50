"""The one place the model stack is put together: sharding plan -> embedding layer -> DLRM ->
optimizers -> trainer.

`main.py`, the benchmarks and the multi-process test workers build through `build_trainer`, so
every run pairs the same embedding layer with the same plan and the same reads. The plan is made
first (`sharding.plan_sharding`) because the loader needs `plan.reads(rank, ...)` too; the same
`TableReads` object is handed to the loader and, here, to the embedding layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import tensorflow as tf

import distributed as dist
from batch import TableReads
from embedding import DualEmbeddingGroup, EmbeddingLayer
from hybrid_embedding import HybridEmbedding
from lr_scheduler import LearningRateScheduler
from model import Dlrm, DlrmConfig
from optimizers import make_optimizers
from sharding import ShardingPlan
from trainer import Trainer


@dataclass(frozen=True)
class ModelOptions:
    """What shapes the stack besides the plan (which fixes the tables and their width), in plain values.

    `interaction` is a concrete dot implementation (`interaction.resolve_interaction_name` resolves
    `auto` once, before this) or "cross" (the DCNv2 cross network). `loss_scale` None trains without
    loss scaling.
    """
    num_numerical_features: int
    bottom_mlp_dims: Sequence[int] = (512, 256, 128)
    top_mlp_dims: Sequence[int] = (1024, 1024, 512, 256, 1)
    interaction: str = "tensorflow"
    num_cross_layers: int = 3
    cross_layer_projection_dim: int = 512
    embedding_type: str = "fused"
    cpu_embedding_type: str = "multitable"
    embedding_trainable: bool = True
    embedding_zeros_initializer: bool = False
    table_dtype: str = "float32"
    compute_dtype: tf.DType = tf.float32
    seed: int = 0
    optimizer: str = "sgd"
    beta_1: float = 0.9
    beta_2: float = 0.999
    learning_rate: float = 24.0
    warmup_steps: int = 8000
    decay_start_step: int = 48000
    decay_steps: int = 24000
    loss_scale: Optional[float] = None
    fp16_allreduce: bool = False  # the dense gradients' allreduce sent as float16 (Horovod's compression)


def model_config(plan: ShardingPlan, rank: int, options: ModelOptions) -> DlrmConfig:
    """The DLRM's configuration; on one process the plan's host tables go to host memory. The
    tables' hotness and pooling come from the plan (`plan_sharding(..., hotness, poolings)`, the
    FeatureSpec's), the one place they are decided."""
    return DlrmConfig(
        num_numerical_features=options.num_numerical_features, cardinalities=list(plan.cardinalities),
        embedding_dim=plan.dims[0] if len(set(plan.dims)) == 1 else list(plan.dims),
        bottom_mlp_dims=list(options.bottom_mlp_dims), top_mlp_dims=list(options.top_mlp_dims),
        interaction=options.interaction, num_cross_layers=options.num_cross_layers,
        cross_layer_projection_dim=options.cross_layer_projection_dim,
        embedding_type=options.embedding_type, cpu_embedding_type=options.cpu_embedding_type,
        host_tables=plan.host_tables(rank) if plan.world_size == 1 else [],
        embedding_trainable=options.embedding_trainable,
        embedding_zeros_initializer=options.embedding_zeros_initializer, table_dtype=options.table_dtype,
        seed=options.seed, hotness=list(plan.hotness), poolings=list(plan.poolings))


def embedding_layer(config: DlrmConfig, plan: Optional[ShardingPlan] = None, rank: int = 0,
                    reads: Optional[TableReads] = None, compute_dtype: Optional[tf.DType] = None,
                    name: str = "hybrid_embedding") -> EmbeddingLayer:
    """The one choice of embedding layer for `config`'s tables: the plain tables (DualEmbeddingGroup,
    also the SavedModel's) without a plan or on one process, the hybrid-parallel layer (`name`) on
    several, each honouring the config's trainability, initialisation and table dtype. Vectors leave
    the layer in `compute_dtype` (default: the Keras policy's), except bfloat16 on several ranks,
    which Horovod's collectives do not all take: those move in float32 and the model casts them.
    The one-process layer also takes the config's tier layouts (`embedding_type`, `cpu_embedding_type`,
    `host_tables`); the hybrid layer's pieces are one variable per table slice by construction."""
    compute_dtype = compute_dtype or tf.as_dtype(tf.keras.mixed_precision.global_policy().compute_dtype)
    seed = None if config.embedding_zeros_initializer else config.seed
    if plan is None or plan.world_size == 1:
        return DualEmbeddingGroup(config.cardinalities, config.embedding_dim,
                                  device_embedding_type=config.embedding_type,
                                  cpu_embedding_type=config.cpu_embedding_type, host_tables=config.host_tables,
                                  table_dtype=tf.as_dtype(config.table_dtype), output_dtype=compute_dtype,
                                  trainable=config.embedding_trainable, poolings=config.feature_poolings, seed=seed)
    exchange_dtype = tf.float32 if compute_dtype == tf.bfloat16 else compute_dtype
    return HybridEmbedding(plan, rank, reads, table_dtype=tf.as_dtype(config.table_dtype), output_dtype=exchange_dtype,
                           trainable=config.embedding_trainable, seed=seed, name=name)


def single_process_model(config: DlrmConfig) -> Dlrm:
    """The DLRM of `config` with its tables in one process (the SavedModel's serving copy; tests),
    vectors in the Keras policy's compute dtype; variables are created on first use."""
    return Dlrm(config, embedding_layer(config))


def build_model(plan: ShardingPlan, rank: int, reads: TableReads, options: ModelOptions,
                name: str = "hybrid_embedding") -> Dlrm:
    """The DLRM with its variables created, its tables in `embedding_layer`'s choice for the plan.
    Every rank starts from the same data-parallel weights."""
    config = model_config(plan, rank, options)
    model = Dlrm(config, embedding_layer(config, plan, rank, reads, options.compute_dtype, name))
    model.build_weights()
    dist.broadcast_variables(model.data_parallel_variables, root_rank=0)
    return model


def build_trainer(plan: ShardingPlan, rank: int, reads: TableReads, options: ModelOptions,
                  name: str = "hybrid_embedding") -> Trainer:
    """The whole stack: the model of `build_model`, its optimizers, the learning-rate schedule and
    the trainer that owns them (`trainer.model`, `trainer.training_state`)."""
    model = build_model(plan, rank, reads, options, name)
    scheduler = LearningRateScheduler(options.learning_rate, options.warmup_steps, options.decay_start_step,
                                      options.decay_steps)
    return Trainer(model, *make_optimizers(options.optimizer, options.beta_1, options.beta_2), scheduler,
                   loss_scale=options.loss_scale, fp16_allreduce=options.fp16_allreduce)

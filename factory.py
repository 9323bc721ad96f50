"""The one place the model stack is put together: sharding plan -> embedding layer -> DLRM ->
optimizers -> trainer.

`main.py`, the benchmarks and the multi-process test workers build through `build_trainer`, so
every run pairs the same embedding layer with the same plan and the same reads. The plan is made
first (`sharding.plan_sharding`) because the loader needs `plan.reads(rank, ...)` too; the same
`TableReads` object is handed to the loader and, here, to the embedding layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import tensorflow as tf

from recsys.runtime import distributed as dist
from recsys.runtime.custom_ops import op_package
from recsys.data.batch import TableReads
from embedding import DualEmbeddingGroup
from recsys.sparse.tables import EmbeddingLayer
from recsys.sparse.hybrid_embedding import HybridEmbedding
from lr_scheduler import LearningRateScheduler
from model import Dlrm
from recsys.training.model_config import DlrmConfig, DlrmSettings, TrainingSettings
from recsys.training.optimizers import make_optimizers
from recsys.sparse.comm_model import StepLayout
from recsys.sparse.sharding import ShardingPlan
from recsys.training.trainer import Trainer


@dataclass(frozen=True)
class ModelOptions:
    """What shapes the stack besides the plan (which fixes the tables and their widths): the model's
    and the training's settings (model_config, each declared there once), the dataset's numerical
    width and the compute dtype the run decided.

    `model.interaction` is a concrete dot implementation (`interaction.resolve_interaction_name`
    resolves `auto` once, before this) or "cross" (the DCNv2 cross network).
    """
    num_numerical_features: int
    model: DlrmSettings = field(default_factory=DlrmSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    compute_dtype: tf.DType = tf.float32


def model_config(plan: ShardingPlan, rank: int, options: ModelOptions) -> DlrmConfig:
    """The DLRM's configuration: the settings with the plan's tables; on one process the plan's
    host tables go to host memory. The tables' hotness and pooling come from the plan
    (`plan_sharding(..., hotness, poolings)`, the FeatureSpec's), the one place they are decided;
    the MLPs' backward kernel from what this process can run (`mlp_backward_here`)."""
    return DlrmConfig.from_settings(
        options.model, num_numerical_features=options.num_numerical_features, cardinalities=list(plan.cardinalities),
        embedding_dim=tuple(plan.dims),
        host_tables=plan.host_tables(rank) if plan.world_size == 1 else [], hotness=list(plan.hotness),
        poolings=list(plan.poolings), mlp_backward=mlp_backward_here(options.compute_dtype))


def mlp_backward_here(compute_dtype: tf.DType) -> str:
    """The MLPs' backward pass for this process (DlrmConfig.mlp_backward). On a GPU, TensorFlow's.
    On the CPU, `model.ReluDense`'s (the input gradient by Einsum: the cpu-bench fp32 step 10 ms
    shorter, 332 against 342 ms, Zen 4), and in bfloat16 with the compiled one-pass ReLU + bias
    kernel where it is built. Measured on the cpu-bench step (batch 4096, Zen 4, one op at a time):
    in bfloat16 TensorFlow's ReluGrad and BiasAddGrad take 9-12 ms a step, the kernel 4; in float32
    both take about 6.7 ms, so float32 keeps TensorFlow's ops."""
    if tf.config.list_logical_devices("GPU"):
        return "tensorflow"
    if compute_dtype == tf.bfloat16 and op_package.relu_dropout_kernel_available():
        return "custom_cpu"
    return "cpu"


def embedding_layer(config: DlrmConfig, plan: Optional[ShardingPlan] = None, rank: int = 0,
                    reads: Optional[TableReads] = None, compute_dtype: Optional[tf.DType] = None,
                    name: str = "hybrid_embedding") -> EmbeddingLayer:
    """The one choice of embedding layer for `config`'s tables: the plain tables (DualEmbeddingGroup,
    also the SavedModel's) without a plan or on one process, the hybrid-parallel layer (`name`) on
    several, each honouring the config's trainability, initialisation and table dtype. Vectors leave
    the layer in `compute_dtype` (default: the Keras policy's), the dtype the all-to-alls send
    (bfloat16 as its 16 bits: `distributed.alltoall`).
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
    return HybridEmbedding(plan, rank, reads, table_dtype=tf.as_dtype(config.table_dtype), output_dtype=compute_dtype,
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
    training = options.training
    scheduler = LearningRateScheduler(training.learning_rate, training.warmup_steps, training.decay_start_step,
                                      training.decay_steps)
    return Trainer(model, *make_optimizers(training.optimizer, training.beta_1, training.beta_2), scheduler,
                   loss_scale=training.loss_scale, fp16_allreduce=training.fp16_allreduce,
                   micro_batches=training.micro_batches, pipeline_input=training.pipeline_input)


def communication_layout(trainer: Trainer, global_batch: int, data_parallel_input: bool) -> StepLayout:
    """What the communication model needs besides the plan, read from the built stack: the
    embedding layer's exchange dtype, the tables' dtype, the dense weights and the dtype their
    gradients' allreduce sends (float16 with --fp16_allreduce, Horovod's fp16 compression)."""
    model = trainer.model
    dense = model.dense_variables
    gradient_bytes = 2 if trainer.fp16_allreduce else max((v.dtype.size for v in dense), default=4)
    return StepLayout(global_batch=global_batch, exchange_bytes=tf.as_dtype(model.embedding.output_dtype).size,
                      table_bytes=tf.as_dtype(model.config.table_dtype).size,
                      dense_weights=sum(v.shape.num_elements() for v in dense),
                      dense_gradient_bytes=gradient_bytes, data_parallel_input=data_parallel_input)

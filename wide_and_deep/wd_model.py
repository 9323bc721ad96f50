"""The reference's Wide & Deep network (V1, §4), its optimizers and schedule (§5), and one training step.

wide logit = sum over the 13 categoricals of a 1-wide table row + Dense(1) over the 13 numerics;
deep logit = 5 x [Dense(1024, ReLU) -> Dropout(0.1)] -> Dense(1) over the 13 embeddings and the 13
numerics concatenated in alphabetical order of the feature names; probability = sigmoid(wide + deep).

Mathematically the reference's model; laid out for speed: the 13 wide tables are one [sum of buckets, 1]
variable and the deep tables are one variable per embedding width (128, 64, 16), each feature's rows at
its offset, so a batch costs four gathers and four sparse updates instead of 26. Each feature's rows are
initialised on their own (Glorot-normal deep, uniform +-0.05 wide, as Keras does for one table) from
(seed, feature), so the model depends on the seed only. Dropout masks are a function of (seed, step,
layer, rank), so a resumed run draws the same masks as an uninterrupted one.
Sparse gradients reach Keras's legacy (TF 2.4) FTRL and RMSprop, which update only the rows a batch
touched, as the reference's optimizers did.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

import distributed as dist
from wide_and_deep import features as F

WIDE_INIT_LIMIT = 0.05  # Keras Embedding's default uniform initialiser
TRUNCATION_STDDEV = 0.87962566103423978  # std of a unit normal truncated to [-2, 2] (Keras's correction)
DEEP_WIDTHS = tuple(sorted({dim for _, _, dim in F.CATEGORICAL_FEATURES}, reverse=True))


@dataclass(frozen=True)
class WideDeepConfig:
    """The model's shape and training hyper-parameters (the reference's flags)."""
    hidden_units: Tuple[int, ...] = (1024,) * 5
    dropout: float = 0.1
    linear_learning_rate: float = 0.02
    deep_learning_rate: float = 0.00012
    deep_warmup_epochs: float = 6.0
    num_epochs: int = 20
    seed: int = 0
    buckets: Dict[str, int] = field(default_factory=lambda: dict(F.BUCKETS))

    def describe(self) -> Dict[str, object]:
        """What a checkpoint must match to be restored into this model."""
        return {"model": "wide_and_deep", "hidden_units": list(self.hidden_units),
                "buckets": [self.buckets[n] for n in F.CATEGORICAL_NAMES],
                "embedding_dims": [F.EMBEDDING_DIMS[n] for n in F.CATEGORICAL_NAMES]}


def deep_learning_rate(step: int, steps_per_epoch: int, config: WideDeepConfig) -> float:
    """The reference's deep LR before counted step `step`: linear warmup over deep_warmup_epochs, then
    base/4 until halfway through the remaining epochs, then base/8 (§5; note the drop at warmup's end)."""
    base = config.deep_learning_rate
    warmup = int(config.deep_warmup_epochs * steps_per_epoch)
    if step < warmup:
        return base * max(step, 1) / warmup
    halfway = int((config.deep_warmup_epochs + (config.num_epochs - config.deep_warmup_epochs) / 2)
                  * steps_per_epoch)
    return base / 4 if step <= halfway else base / 8


def _offsets(names: Sequence[str], buckets: Dict[str, int]) -> np.ndarray:
    return np.cumsum([0] + [buckets[n] for n in names[:-1]]).astype(np.int64)


def _truncated_normal(rng: np.random.Generator, shape: Tuple[int, int], stddev: float) -> np.ndarray:
    """Normal values redrawn beyond two standard deviations (Keras's truncated normal), float32."""
    values = rng.standard_normal(shape, dtype=np.float32)
    outside = np.abs(values) > 2
    while outside.any():
        values[outside] = rng.standard_normal(int(outside.sum()), dtype=np.float32)
        outside = np.abs(values) > 2
    return values * np.float32(stddev)


def _stacked_init(names: Sequence[str], buckets: Dict[str, int], dim: int, seed: int, wide: bool) -> np.ndarray:
    """One table per feature, each from its own generator seeded by (seed, feature), stacked in `names`
    order: uniform +-0.05 (wide) or Glorot-normal (deep: truncated normal of variance 2 / (rows + dim),
    as Keras's GlorotNormal draws it)."""
    parts = []
    for name in names:
        rng = np.random.default_rng([seed, F.CATEGORICAL_NAMES.index(name), int(wide)])
        shape = (buckets[name], dim)
        if wide:
            parts.append(rng.uniform(-WIDE_INIT_LIMIT, WIDE_INIT_LIMIT, shape).astype(np.float32))
        else:
            parts.append(_truncated_normal(rng, shape, math.sqrt(2 / sum(shape)) / TRUNCATION_STDDEV))
    return np.concatenate(parts)


class WidePart(tf.keras.layers.Layer):
    """The linear model: one 1-wide table per categorical (summed) plus Dense(1) over the numerics."""

    def __init__(self, config: WideDeepConfig) -> None:
        super().__init__(name="wide")
        self.offsets = tf.constant(_offsets(F.CATEGORICAL_NAMES, config.buckets)[None, :], tf.int64)
        self.table = tf.Variable(_stacked_init(F.CATEGORICAL_NAMES, config.buckets, 1, config.seed, True),
                                 name="wide_table")
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(config.seed),
                                           name="wide_dense")

    def call(self, categorical: tf.Tensor, numeric: tf.Tensor) -> tf.Tensor:
        rows = tf.gather(self.table, categorical + self.offsets)  # [B, 13, 1]
        return tf.reduce_sum(rows, axis=[1, 2])[:, None] + tf.cast(self.dense(numeric), tf.float32)


class DeepEmbeddings(tf.keras.layers.Layer):
    """The 13 embeddings and the 13 numerics, concatenated in alphabetical order of the names (§4)."""

    def __init__(self, config: WideDeepConfig) -> None:
        super().__init__(name="deep_embeddings")
        self.groups = [[n for n in F.CATEGORICAL_NAMES if F.EMBEDDING_DIMS[n] == width] for width in DEEP_WIDTHS]
        self.tables = [tf.Variable(_stacked_init(names, config.buckets, width, config.seed, False),
                                   name=f"deep_table_{width}") for names, width in zip(self.groups, DEEP_WIDTHS)]
        self.columns = [tf.constant([F.CATEGORICAL_NAMES.index(n) for n in names], tf.int32) for names in self.groups]
        self.offsets = [tf.constant(_offsets(names, config.buckets)[None, :], tf.int64) for names in self.groups]

    def call(self, categorical: tf.Tensor, numeric: tf.Tensor) -> tf.Tensor:
        pieces = {}
        for names, table, columns, offsets in zip(self.groups, self.tables, self.columns, self.offsets):
            vectors = tf.gather(table, tf.gather(categorical, columns, axis=1) + offsets)  # [B, n, width]
            pieces.update({name: vectors[:, i] for i, name in enumerate(names)})
        pieces.update({name: numeric[:, i:i + 1] for i, name in enumerate(F.NUMERIC_FEATURES)})
        return tf.concat([tf.cast(pieces[name], self.compute_dtype) for name in F.deep_input_order()], axis=1)


class StepDropout(tf.keras.layers.Layer):
    """Dropout whose mask is drawn from a given stateless seed (the step's), not a hidden generator."""

    def __init__(self, rate: float, name: str) -> None:
        super().__init__(name=name)
        self.rate = rate

    def call(self, x: tf.Tensor, seed: Optional[tf.Tensor]) -> tf.Tensor:
        if seed is None or self.rate == 0:
            return x
        return tf.nn.experimental.stateless_dropout(x, rate=self.rate, seed=seed)


class WideAndDeep(tf.keras.Model):
    """Logit of the click probability: wide logit + deep logit (the sigmoid is applied by the caller)."""

    def __init__(self, config: WideDeepConfig) -> None:
        super().__init__(name="wide_and_deep")
        self.config = config
        self.wide = WidePart(config)
        self.embeddings = DeepEmbeddings(config)
        init = tf.keras.initializers.GlorotUniform
        self.hidden = [tf.keras.layers.Dense(units, activation="relu", kernel_initializer=init(config.seed + 10 + i),
                                             name=f"deep_dense_{i}") for i, units in enumerate(config.hidden_units)]
        self.dropouts = [StepDropout(config.dropout, f"deep_dropout_{i}") for i in range(len(config.hidden_units))]
        self.head = tf.keras.layers.Dense(1, kernel_initializer=init(config.seed + 9), name="deep_head")

    def call(self, categorical: tf.Tensor, numeric: tf.Tensor, dropout_seed: Optional[tf.Tensor] = None) -> tf.Tensor:
        x = self.embeddings(categorical, numeric)
        for i, (dense, dropout) in enumerate(zip(self.hidden, self.dropouts)):
            x = dropout(dense(x), None if dropout_seed is None else dropout_seed + [0, i])
        return self.wide(categorical, numeric) + tf.cast(self.head(x), tf.float32)

    def build_all(self) -> None:
        """Create every variable (one call on an empty batch)."""
        self(tf.zeros([0, len(F.CATEGORICAL_NAMES)], tf.int64), tf.zeros([0, len(F.NUMERIC_FEATURES)]))

    def wide_variables(self) -> List[tf.Variable]:
        return [self.wide.table, *self.wide.dense.trainable_variables]

    def deep_variables(self) -> List[tf.Variable]:
        return [*self.embeddings.tables, *(v for d in self.hidden for v in d.trainable_variables),
                *self.head.trainable_variables]

    def named_variables(self) -> Dict[str, tf.Variable]:
        """Every weight under a stable file-safe name (checkpoints)."""
        named = {"wide_table": self.wide.table, "wide_kernel": self.wide.dense.kernel,
                 "wide_bias": self.wide.dense.bias}
        named.update({f"deep_table_{w}": t for w, t in zip(DEEP_WIDTHS, self.embeddings.tables)})
        for i, dense in enumerate(self.hidden):
            named.update({f"deep_dense_{i}_kernel": dense.kernel, f"deep_dense_{i}_bias": dense.bias})
        named.update({"deep_head_kernel": self.head.kernel, "deep_head_bias": self.head.bias})
        return named


@dataclass
class Optimizers:
    """FTRL for the wide variables, RMSprop(rho 0.5) for the deep ones (§5); `deep_lr` is set per step."""
    wide: tf.keras.optimizers.legacy.Optimizer
    deep: tf.keras.optimizers.legacy.Optimizer
    deep_lr: tf.Variable


def build_optimizers(model: WideAndDeep, config: WideDeepConfig, loss_scaling: bool) -> Optimizers:
    """Both optimizers with their slots created (a restore needs them); `loss_scaling`: fp16 AMP's
    dynamic loss scaling, one scale per optimizer as the reference."""
    deep_lr = tf.Variable(config.deep_learning_rate, trainable=False, dtype=tf.float32, name="deep_lr")
    wide = tf.keras.optimizers.legacy.Ftrl(learning_rate=config.linear_learning_rate)
    deep = tf.keras.optimizers.legacy.RMSprop(learning_rate=lambda: deep_lr.read_value(), rho=0.5)
    if loss_scaling:
        wide = tf.keras.mixed_precision.LossScaleOptimizer(wide)
        deep = tf.keras.mixed_precision.LossScaleOptimizer(deep)
    wide._create_all_weights(model.wide_variables())
    deep._create_all_weights(model.deep_variables())
    return Optimizers(wide, deep, deep_lr)


def _inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def optimizer_slots(model: WideAndDeep, optimizers: Optimizers) -> Dict[str, Dict[str, tf.Variable]]:
    """Each named weight's optimizer slots (FTRL accumulator and linear, RMSprop rms)."""
    owners = {id(v): _inner(optimizers.wide) for v in model.wide_variables()}
    owners.update({id(v): _inner(optimizers.deep) for v in model.deep_variables()})
    return {name: {slot: owners[id(v)].get_slot(v, slot) for slot in owners[id(v)].get_slot_names()}
            for name, v in model.named_variables().items()}


def optimizer_counters(optimizers: Optimizers) -> Dict[str, tf.Variable]:
    """The optimizers' iteration counters (and loss scales under fp16 AMP)."""
    counters = {"wide_iterations": optimizers.wide.iterations, "deep_iterations": optimizers.deep.iterations}
    for name, optimizer in (("wide", optimizers.wide), ("deep", optimizers.deep)):
        if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
            counters[f"{name}_loss_scale"] = optimizer._loss_scale._current_loss_scale
            counters[f"{name}_good_steps"] = optimizer._loss_scale._counter
    return counters


def bce_from_logits(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Mean binary cross-entropy of sigmoid(logits) (the reference's BCE on the probability)."""
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits[:, 0]))


class TrainStep:
    """One update: forward, BCE, gradients averaged over the ranks, FTRL and RMSprop applied.

    The stop votes of stop_signals ride on the loss's allreduce so that every rank learns the same
    decision in the same step. Returns (mean loss over ranks, this rank's probabilities, votes).
    `jit_compile` (`--xla`): XLA compiles the forward and backward pass into one program; the
    allreduces and the sparse optimizer updates, which XLA has no kernels for, run around it.
    """

    def __init__(self, model: WideAndDeep, optimizers: Optimizers, seed: int, jit_compile: bool = False) -> None:
        self.model, self.optimizers, self.seed = model, optimizers, seed
        self.gradients = tf.function(self._gradients, jit_compile=jit_compile, reduce_retracing=True)
        self.step = tf.function(self._step, reduce_retracing=True)

    def _scaled(self, optimizer, loss):
        if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
            return optimizer.get_scaled_loss(loss)
        return loss

    def _unscaled(self, optimizer, gradients):
        if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
            return optimizer.get_unscaled_gradients(gradients)
        return gradients

    def _gradients(self, categorical: tf.Tensor, numeric: tf.Tensor, label: tf.Tensor, seed: tf.Tensor):
        """(loss, logits, wide gradients, deep gradients) of this rank's batch, unscaled."""
        model, opts = self.model, self.optimizers
        wide_vars, deep_vars = model.wide_variables(), model.deep_variables()
        with tf.GradientTape(persistent=True) as tape:
            logits = model(categorical, numeric, dropout_seed=seed)
            loss = bce_from_logits(label, logits)
            wide_loss, deep_loss = self._scaled(opts.wide, loss), self._scaled(opts.deep, loss)
        wide_grads = self._unscaled(opts.wide, tape.gradient(wide_loss, wide_vars))
        deep_grads = self._unscaled(opts.deep, tape.gradient(deep_loss, deep_vars))
        return loss, logits, wide_grads, deep_grads

    def _step(self, batch: Dict[str, tf.Tensor], step: tf.Tensor, votes: tf.Tensor):
        model, opts = self.model, self.optimizers
        seed = tf.stack([tf.constant(self.seed, tf.int64) * 1_000_003 + step, tf.cast(dist.rank(), tf.int64) * 97])
        loss, logits, wide_grads, deep_grads = self.gradients(batch["categorical"], batch["numeric"], batch["label"],
                                                              seed)
        wide_grads = dist.average_gradients(wide_grads, "wd_wide_grad")
        deep_grads = dist.average_gradients(deep_grads, "wd_deep_grad")
        opts.wide.apply_gradients(zip(wide_grads, model.wide_variables()))
        opts.deep.apply_gradients(zip(deep_grads, model.deep_variables()))
        reduced = dist.allreduce(tf.concat([loss[None], votes], 0), name="wd_loss_votes")
        return reduced[0], tf.sigmoid(logits[:, 0]), reduced[1:]


def predict_fn(model: WideAndDeep, jit_compile: bool = False):
    """A compiled evaluation forward pass: click probabilities of a batch (no dropout); `jit_compile`
    (`--xla`): one XLA program."""
    signature = [tf.TensorSpec([None, len(F.CATEGORICAL_NAMES)], tf.int64),
                 tf.TensorSpec([None, len(F.NUMERIC_FEATURES)], tf.float32)]

    @tf.function(input_signature=signature, jit_compile=jit_compile)
    def predict(categorical: tf.Tensor, numeric: tf.Tensor) -> tf.Tensor:
        return tf.sigmoid(model(categorical, numeric)[:, 0])
    return predict

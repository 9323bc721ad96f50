"""The reference's Wide & Deep network (V1, §4), its optimizers and schedule (§5), and one training step.

wide logit = sum over the 13 categoricals of a 1-wide table row + Dense(1) over the 13 numerics;
deep logit = 5 x [Dense(1024, ReLU) -> Dropout(0.1)] -> Dense(1) over the 13 embeddings and the 13
numerics concatenated in alphabetical order of the feature names; probability = sigmoid(wide + deep).

Mathematically the reference's model; laid out for speed: the 13 wide tables are one [sum of buckets, 1]
variable and the deep tables are one variable per embedding width (128, 64, 16), each feature's rows at
its offset, so a batch costs four gathers and four sparse updates instead of 26. Each feature's rows are
initialised on their own (Glorot-normal deep, uniform +-0.05 wide, as Keras does for one table) from
(seed, feature), so the model depends on the seed only. Each hidden layer's bias, ReLU and dropout are
one pass (the op package's `BiasReluDropout`, a CPU kernel; the same values from TensorFlow ops on a
GPU and under XLA), and its dropout mask is a hash of (seed, step, layer, the row's identity, the
batch key "row" of wd_data.row_ids): a resumed run draws the same masks as an uninterrupted one, and any
number of ranks the same as one.
The optimizers are Keras's legacy (TF 2.4) FTRL and RMSprop, the reference's, which update only the
rows a batch touched. Where the hidden layers use the CPU kernel and there is no fp16 loss scaling, the
four tables' sparse steps are the op package's fused multi-threaded `EmbeddingSparseFtrl` and
`EmbeddingSparseRmsprop`, the same arithmetic on the Keras optimizers' own slots (RMSprop's decay of
every rms row included); Keras still applies the dense weights and counts the iterations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.runtime import distributed as dist
from recsys.runtime.custom_ops import op_package
from recsys.runtime.tracing import traced
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
            # One Unpack (its gradient one Pack), not n slices whose gradients are n full-size tensors.
            pieces.update(zip(names, tf.unstack(vectors, axis=1)))
        pieces.update({name: numeric[:, i:i + 1] for i, name in enumerate(F.NUMERIC_FEATURES)})
        return tf.concat([tf.cast(pieces[name], self.compute_dtype) for name in F.deep_input_order()], axis=1)


class HiddenLayer(tf.keras.layers.Layer):
    """Dense(units, ReLU) followed by dropout (Keras's Dense and Dropout, same weights and initialiser),
    with the bias, the ReLU and the dropout fused into one pass; no dropout without a `key`."""

    def __init__(self, units: int, rate: float, seed: int, use_kernel: bool, name: str) -> None:
        super().__init__(name=name)
        self.units, self.rate, self.seed, self.use_kernel = units, rate, seed, use_kernel

    def build(self, input_shape: tf.TensorShape) -> None:
        self.kernel = self.add_weight("kernel", [int(input_shape[-1]), self.units],
                                      initializer=tf.keras.initializers.GlorotUniform(self.seed))
        self.bias = self.add_weight("bias", [self.units], initializer="zeros")

    def call(self, x: tf.Tensor, key: Optional[tf.Tensor], row_ids: Optional[tf.Tensor]) -> tf.Tensor:
        product = tf.matmul(x, tf.cast(self.kernel, x.dtype))
        if key is None:
            key, row_ids, rate = tf.zeros([2], tf.int64), tf.zeros([tf.shape(x)[0]], tf.int64), 0.0
        else:
            rate = self.rate
        return op_package.bias_relu_dropout(product, self.bias, key, row_ids, rate, self.use_kernel)


class WideAndDeep(tf.keras.Model):
    """Logit of the click probability: wide logit + deep logit (the sigmoid is applied by the caller)."""

    def __init__(self, config: WideDeepConfig, use_kernel: Optional[bool] = None) -> None:
        """`use_kernel`: the op package's CPU kernels, for the hidden layers and (see `build_optimizers`) the
        tables' optimizer steps (default: where the library is built and no GPU is visible)."""
        super().__init__(name="wide_and_deep")
        self.config = config
        self.wide = WidePart(config)
        self.embeddings = DeepEmbeddings(config)
        use_kernel = op_package.relu_dropout_kernel_available() if use_kernel is None else use_kernel
        self.use_kernel = use_kernel
        self.hidden = [HiddenLayer(units, config.dropout, config.seed + 10 + i, use_kernel, f"deep_dense_{i}")
                       for i, units in enumerate(config.hidden_units)]
        self.head = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(config.seed + 9),
                                          name="deep_head")

    def call(self, categorical: tf.Tensor, numeric: tf.Tensor, dropout_key: Optional[tf.Tensor] = None,
             row_ids: Optional[tf.Tensor] = None) -> tf.Tensor:
        """`dropout_key` (the step's int64 key) and `row_ids` (each row's identity, the batch key "row")
        turn dropout on; without them the deep part runs without dropout (evaluation)."""
        x = self.embeddings(categorical, numeric)
        for i, layer in enumerate(self.hidden):
            x = layer(x, None if dropout_key is None else tf.stack([dropout_key, tf.constant(i, tf.int64)]), row_ids)
        return self.wide(categorical, numeric) + tf.cast(self.head(x), tf.float32)

    def build_all(self) -> None:
        """Create every variable (one call on an empty batch)."""
        self(tf.zeros([0, len(F.CATEGORICAL_NAMES)], tf.int64), tf.zeros([0, len(F.NUMERIC_FEATURES)]))

    def tables(self) -> List[tf.Variable]:
        """The embedding tables (sparse gradients): the wide table, then the deep ones."""
        return [self.wide.table, *self.embeddings.tables]

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
    """FTRL for the wide variables, RMSprop(rho 0.5) for the deep ones (§5); `deep_lr` is set per step;
    `fused_tables`: the tables' steps are the op package's fused kernels (`apply_gradients`)."""
    wide: tf.keras.optimizers.legacy.Optimizer
    deep: tf.keras.optimizers.legacy.Optimizer
    deep_lr: tf.Variable
    fused_tables: bool


def build_optimizers(model: WideAndDeep, config: WideDeepConfig, loss_scaling: bool) -> Optimizers:
    """Both optimizers with their slots created (a restore needs them); `loss_scaling`: fp16 AMP's
    dynamic loss scaling, one scale per optimizer as the reference. The tables' steps are fused where
    the model uses the CPU kernels and nothing is loss-scaled (a skipped fp16 step is Keras's logic)."""
    deep_lr = tf.Variable(config.deep_learning_rate, trainable=False, dtype=tf.float32, name="deep_lr")
    wide = tf.keras.optimizers.legacy.Ftrl(learning_rate=config.linear_learning_rate)
    deep = tf.keras.optimizers.legacy.RMSprop(learning_rate=lambda: deep_lr.read_value(), rho=0.5)
    if loss_scaling:
        wide = tf.keras.mixed_precision.LossScaleOptimizer(wide)
        deep = tf.keras.mixed_precision.LossScaleOptimizer(deep)
    wide._create_all_weights(model.wide_variables())
    deep._create_all_weights(model.deep_variables())
    return Optimizers(wide, deep, deep_lr, model.use_kernel and not loss_scaling)


def _inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def fused_ftrl_step(optimizer: tf.keras.optimizers.legacy.Ftrl, tables: Sequence[tf.Variable],
                    gradients: Sequence[tf.IndexedSlices]) -> tf.Operation:
    """What `optimizer.apply_gradients` does to these tables (its hyper-parameters, learning rate and
    slots), as one fused multi-threaded CPU op; `optimizer`'s iterations are not counted."""
    if optimizer._l2_shrinkage_regularization_strength > 0:
        raise ValueError("fused_ftrl_step: FTRL with l2_shrinkage_regularization_strength > 0 is not fused")
    rate = optimizer._decayed_lr(tf.float32)

    def hyper(name: str) -> tf.Tensor:
        return optimizer._get_hyper(name, tf.float32)
    return op_package.sparse_ftrl_update(
        tables, [optimizer.get_slot(t, "accumulator") for t in tables], [optimizer.get_slot(t, "linear") for t in tables],
        [g.indices for g in gradients], [g.values for g in gradients], rate, hyper("l1_regularization_strength"),
        hyper("l2_regularization_strength") + hyper("beta") / (2.0 * rate), hyper("learning_rate_power"))


def fused_rmsprop_step(optimizer: tf.keras.optimizers.legacy.RMSprop, tables: Sequence[tf.Variable],
                       gradients: Sequence[tf.IndexedSlices]) -> tf.Operation:
    """What `optimizer.apply_gradients` does to these tables (every rms row decayed, the touched rows
    updated), as one fused multi-threaded CPU op; `optimizer`'s iterations are not counted."""
    if optimizer._momentum or optimizer.centered:
        raise ValueError("fused_rmsprop_step: RMSprop with momentum or centered is not fused")
    return op_package.sparse_rmsprop_update(
        tables, [optimizer.get_slot(t, "rms") for t in tables], [g.indices for g in gradients],
        [g.values for g in gradients], optimizer._decayed_lr(tf.float32), optimizer._get_hyper("rho", tf.float32),
        optimizer.epsilon)


def apply_gradients(model: WideAndDeep, optimizers: Optimizers, wide_grads: Sequence, deep_grads: Sequence) -> None:
    """One step of both optimizers on the gradients of `model.wide_variables()` and `deep_variables()`:
    all through Keras, or (`optimizers.fused_tables`) the tables through the fused kernels and the
    dense weights through Keras (which counts the iterations either way)."""
    pairs = {"wide": list(zip(wide_grads, model.wide_variables())), "deep": list(zip(deep_grads, model.deep_variables()))}
    if optimizers.fused_tables:
        tables = {id(t) for t in model.tables()}
        for name, fused_step in (("wide", fused_ftrl_step), ("deep", fused_rmsprop_step)):
            sparse = [(g, v) for g, v in pairs[name] if id(v) in tables]
            fused_step(getattr(optimizers, name), [v for _, v in sparse], [g for g, _ in sparse])
            pairs[name] = [(g, v) for g, v in pairs[name] if id(v) not in tables]
    optimizers.wide.apply_gradients(pairs["wide"])
    optimizers.deep.apply_gradients(pairs["deep"])


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


def bce_sum_from_logits(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Summed binary cross-entropy of sigmoid(logits) (the reference's BCE on the probability)."""
    return tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits[:, 0]))


class TrainStep:
    """One update: forward, BCE, gradients averaged over the ranks, FTRL and RMSprop applied (`apply_gradients`).

    The ranks' batches may differ in size (a step holding a split's short last record): each rank's
    loss is its summed BCE x W / the step's global rows (one scalar allreduce), so the averaged
    gradients are those of the global batch's mean, as on one process. The step is traced once, for
    any batch size (its input signature): a retrace for a new batch shape on one rank only would
    give that rank a different set of collectives. Grappler merges collectives of identical inputs
    and attributes (with static shapes the wide bias's and the deep head bias's gradients are the same
    tensor, so their two allreduces become one), but not in a graph traced for an unknown batch size;
    the retracing rank then submitted `wd_deep_grad_8`, which the other never did, and both hung.
    The stop votes of stop_signals ride on the loss's allreduce so that every rank learns the same
    decision in the same step. Returns (mean loss of the global batch, this rank's probabilities, votes).
    `jit_compile` (`--xla`): XLA compiles the forward and backward pass into one program (the model
    must then run its hidden layers in TensorFlow ops: `WideAndDeep(use_kernel=False)`); the
    allreduces and the optimizer updates, which XLA has no kernels for, run around it.
    """

    def __init__(self, model: WideAndDeep, optimizers: Optimizers, seed: int, jit_compile: bool = False) -> None:
        if jit_compile and model.use_kernel:
            raise ValueError("TrainStep(jit_compile=True) needs WideAndDeep(use_kernel=False): XLA cannot "
                             "compile the op package's kernels")
        self.model, self.optimizers, self.seed = model, optimizers, seed
        batch = {"categorical": tf.TensorSpec([None, len(F.CATEGORICAL_NAMES)], tf.int64),
                 "numeric": tf.TensorSpec([None, len(F.NUMERIC_FEATURES)], tf.float32),
                 "label": tf.TensorSpec([None], tf.float32), "display_id": tf.TensorSpec([None], tf.int64),
                 "row": tf.TensorSpec([None], tf.int64)}
        self.gradients = traced(self._gradients, jit_compile=jit_compile, reduce_retracing=True)
        self.step = traced(self._step, input_signature=[batch, tf.TensorSpec([], tf.int64),
                                                        tf.TensorSpec([None], tf.float32)])

    def _scaled(self, optimizer, loss):
        if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
            return optimizer.get_scaled_loss(loss)
        return loss

    def _unscaled(self, optimizer, gradients):
        if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
            return optimizer.get_unscaled_gradients(gradients)
        return gradients

    def _gradients(self, batch: Dict[str, tf.Tensor], key: tf.Tensor, loss_weight: tf.Tensor):
        """(weighted summed loss, logits, wide gradients, deep gradients) of this rank's batch, unscaled;
        dropout masks from the step's `key` and the rows' identities."""
        model, opts = self.model, self.optimizers
        wide_vars, deep_vars = model.wide_variables(), model.deep_variables()
        with tf.GradientTape(persistent=True) as tape:
            logits = model(batch["categorical"], batch["numeric"], dropout_key=key, row_ids=batch["row"])
            loss = bce_sum_from_logits(batch["label"], logits) * loss_weight
            wide_loss, deep_loss = self._scaled(opts.wide, loss), self._scaled(opts.deep, loss)
        wide_grads = self._unscaled(opts.wide, tape.gradient(wide_loss, wide_vars))
        deep_grads = self._unscaled(opts.deep, tape.gradient(deep_loss, deep_vars))
        return loss, logits, wide_grads, deep_grads

    def _step(self, batch: Dict[str, tf.Tensor], step: tf.Tensor, votes: tf.Tensor):
        rows = tf.cast(tf.shape(batch["label"])[0], tf.float32)
        global_rows = dist.allreduce(rows, average=False, name="wd_global_rows")
        key = tf.constant(self.seed, tf.int64) * 1_000_003 + step
        loss, logits, wide_grads, deep_grads = self.gradients(batch, key, dist.size() / global_rows)
        apply_gradients(self.model, self.optimizers, dist.average_gradients(wide_grads, "wd_wide_grad"),
                        dist.average_gradients(deep_grads, "wd_deep_grad"))
        reduced = dist.allreduce(tf.concat([loss[None], votes], 0), name="wd_loss_votes")
        return reduced[0], tf.sigmoid(logits[:, 0]), reduced[1:]


def predict_fn(model: WideAndDeep, jit_compile: bool = False):
    """A compiled evaluation forward pass: click probabilities of a batch (no dropout); `jit_compile`
    (`--xla`): one XLA program."""
    signature = [tf.TensorSpec([None, len(F.CATEGORICAL_NAMES)], tf.int64),
                 tf.TensorSpec([None, len(F.NUMERIC_FEATURES)], tf.float32)]

    @traced(input_signature=signature, jit_compile=jit_compile)
    def predict(categorical: tf.Tensor, numeric: tf.Tensor) -> tf.Tensor:
        return tf.sigmoid(model(categorical, numeric)[:, 0])
    return predict

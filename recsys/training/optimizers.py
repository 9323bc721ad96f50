"""SGD, Adam and lazy Adam, and Adagrad, with explicit slot variables.

Slots are plain variables with the shape of their parameter, so a checkpoint stores them in the
same (global) layout as the tables and a resumed run continues exactly. Lazy Adam (the role of
tensorflow_addons.LazyAdam, a retired package) updates only the rows an IndexedSlices gradient
touches: moments and parameters of untouched embedding rows stay as they are. A table's
IndexedSlices gradient lists every id looked up, repeats included (multi-hot samples, or one id
in several samples): SGD applies each (they add up), lazy Adam and Adagrad first sum a row's
gradients and update it once per step (`_merge_duplicates`; the fused op the same, per part).

Sparse gradients of float32 tables in host memory go to one fused op per step (the compiled
package's `EmbeddingSparseSgd` / `Adam` / `Adagrad`: all tables at once, over the intra-op
threads) instead of TensorFlow's single-threaded scatter per table; tables elsewhere (a GPU), or
without the compiled package, take the TensorFlow ops. Both give the same values to float rounding.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

import tensorflow as tf

from recsys.runtime.custom_ops import op_package

Gradient = Union[tf.Tensor, tf.IndexedSlices]


def _slot_name(variable: tf.Variable, slot: str) -> str:
    return variable.name.split(":")[0].replace("/", "_") + "_" + slot


def _slot_key(variable: tf.Variable) -> str:
    """The variable itself, not its name: two tables may both be named `fused_table` (one group per
    width, or per memory tier)."""
    return f"{variable.name}#{id(variable)}"


class Optimizer(tf.Module):
    """Applies gradients with a learning rate given per call (the schedule is owned elsewhere)."""

    slot_names: Tuple[str, ...] = ()
    slot_initial_value = 0.0

    def __init__(self, name: str, fused_sparse_updates: bool = True) -> None:
        super().__init__(name=name)
        self.slots: Dict[str, Dict[str, tf.Variable]] = {}
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_iterations")
        self.fused_sparse_updates = fused_sparse_updates and op_package.is_built()

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Create the slots of every variable (idempotent), on the variable's device, filled with
        `slot_initial_value` (the fill becomes the slot's buffer: no full-size temporary)."""
        for variable in variables:
            if _slot_key(variable) in self.slots:
                continue
            with tf.init_scope(), tf.device(variable.device):
                self.slots[_slot_key(variable)] = {
                    slot: tf.Variable(tf.fill(variable.shape, tf.constant(self.slot_initial_value, variable.dtype)),
                                      trainable=False, name=_slot_name(variable, slot))
                    for slot in self.slot_names}

    def slot_variables(self, variable: tf.Variable) -> Dict[str, tf.Variable]:
        return self.slots.get(_slot_key(variable), {})

    def apply(self, grads_and_vars: Sequence[Tuple[Gradient, tf.Variable]], learning_rate: tf.Tensor) -> None:
        self.iterations.assign_add(1)
        fused: List[Tuple[tf.IndexedSlices, tf.Variable]] = []
        for grad, variable in grads_and_vars:
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                if self._fuses(variable):
                    fused.append((grad, variable))
                else:
                    self._apply_sparse(grad, variable, learning_rate)
            else:
                self._apply_dense(grad, variable, learning_rate)
        if fused:
            self._apply_sparse_fused([grad for grad, _ in fused], [variable for _, variable in fused], learning_rate)

    def _fuses(self, variable: tf.Variable) -> bool:
        """Whether the fused op updates `variable`: a float32 table in host memory."""
        return (self.fused_sparse_updates and variable.dtype == tf.float32
                and tf.DeviceSpec.from_string(variable.device).device_type == "CPU")

    def _apply_dense(self, grad: tf.Tensor, variable: tf.Variable, learning_rate: tf.Tensor) -> None:
        raise NotImplementedError

    def _apply_sparse(self, grad: tf.IndexedSlices, variable: tf.Variable, learning_rate: tf.Tensor) -> None:
        raise NotImplementedError

    def _apply_sparse_fused(self, grads: List[tf.IndexedSlices], variables: List[tf.Variable],
                            learning_rate: tf.Tensor) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """Plain SGD (momentum 0), as the reference's default optimizer."""

    def __init__(self, name: str = "sgd", fused_sparse_updates: bool = True) -> None:
        super().__init__(name, fused_sparse_updates)

    def _apply_dense(self, grad, variable, learning_rate):
        # One in-place pass (var -= lr * grad) instead of a product tensor and a subtraction.
        tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=tf.cast(learning_rate, variable.dtype),
                                                delta=grad)

    def _apply_sparse(self, grad, variable, learning_rate):
        variable.scatter_sub(tf.IndexedSlices(tf.cast(learning_rate, variable.dtype) * grad.values,
                                              grad.indices, grad.dense_shape))

    def _apply_sparse_fused(self, grads, variables, learning_rate):
        op_package.sparse_sgd_update(variables, [g.indices for g in grads], _float32_values(grads), learning_rate)


class Adam(Optimizer):
    """Adam with bias correction; sparse gradients are applied lazily (touched rows only)."""

    slot_names = ("m", "v")

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                 name: str = "adam", fused_sparse_updates: bool = True) -> None:
        super().__init__(name, fused_sparse_updates)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def _corrected_rate(self, variable: tf.Variable, learning_rate: tf.Tensor) -> tf.Tensor:
        t = tf.cast(self.iterations, variable.dtype)
        return (tf.cast(learning_rate, variable.dtype) * tf.sqrt(1.0 - tf.pow(self.beta_2, t))
                / (1.0 - tf.pow(self.beta_1, t)))

    def _apply_dense(self, grad, variable, learning_rate):
        slots = self.slots[_slot_key(variable)]
        m = slots["m"].assign(self.beta_1 * slots["m"] + (1.0 - self.beta_1) * grad)
        v = slots["v"].assign(self.beta_2 * slots["v"] + (1.0 - self.beta_2) * tf.square(grad))
        variable.assign_sub(self._corrected_rate(variable, learning_rate) * m / (tf.sqrt(v) + self.epsilon))

    def _apply_sparse(self, grad, variable, learning_rate):
        slots = self.slots[_slot_key(variable)]
        values, indices = _merge_duplicates(grad)
        m_rows = self.beta_1 * tf.gather(slots["m"], indices) + (1.0 - self.beta_1) * values
        v_rows = self.beta_2 * tf.gather(slots["v"], indices) + (1.0 - self.beta_2) * tf.square(values)
        slots["m"].scatter_update(tf.IndexedSlices(m_rows, indices))
        slots["v"].scatter_update(tf.IndexedSlices(v_rows, indices))
        step = self._corrected_rate(variable, learning_rate) * m_rows / (tf.sqrt(v_rows) + self.epsilon)
        variable.scatter_sub(tf.IndexedSlices(step, indices))

    def _apply_sparse_fused(self, grads, variables, learning_rate):
        slots = [self.slots[_slot_key(variable)] for variable in variables]
        op_package.sparse_adam_update(variables, [s["m"] for s in slots], [s["v"] for s in slots],
                                      [g.indices for g in grads], _float32_values(grads),
                                      self._corrected_rate(variables[0], learning_rate),
                                      self.beta_1, self.beta_2, self.epsilon)


class Adagrad(Optimizer):
    """Adagrad as Keras defines it (accumulators start at 0.1, epsilon 1e-7): accumulator += g^2,
    w -= lr g / (sqrt(accumulator) + epsilon); sparse gradients update the touched rows only, each
    once with the sum of its gradients. The MLPerf DLRM-DCNv2 recipe's optimizer."""

    slot_names = ("accumulator",)

    def __init__(self, initial_accumulator_value: float = 0.1, epsilon: float = 1e-7, name: str = "adagrad",
                 fused_sparse_updates: bool = True) -> None:
        super().__init__(name, fused_sparse_updates)
        self.slot_initial_value = initial_accumulator_value
        self.epsilon = epsilon

    def _apply_dense(self, grad, variable, learning_rate):
        accumulator = self.slots[_slot_key(variable)]["accumulator"].assign_add(tf.square(grad))
        variable.assign_sub(tf.cast(learning_rate, variable.dtype) * grad / (tf.sqrt(accumulator) + self.epsilon))

    def _apply_sparse(self, grad, variable, learning_rate):
        accumulator = self.slots[_slot_key(variable)]["accumulator"]
        values, indices = _merge_duplicates(grad)
        rows = tf.gather(accumulator, indices) + tf.square(values)
        accumulator.scatter_update(tf.IndexedSlices(rows, indices))
        step = tf.cast(learning_rate, variable.dtype) * values / (tf.sqrt(rows) + self.epsilon)
        variable.scatter_sub(tf.IndexedSlices(step, indices))

    def _apply_sparse_fused(self, grads, variables, learning_rate):
        op_package.sparse_adagrad_update(variables, [self.slots[_slot_key(v)]["accumulator"] for v in variables],
                                         [g.indices for g in grads], _float32_values(grads), learning_rate,
                                         self.epsilon)


def _float32_values(grads: Sequence[tf.IndexedSlices]) -> List[tf.Tensor]:
    return [tf.cast(grad.values, tf.float32) for grad in grads]


def _merge_duplicates(grad: tf.IndexedSlices) -> Tuple[tf.Tensor, tf.Tensor]:
    """Sum the gradient rows of repeated indices so each touched row is updated once."""
    unique, positions = tf.unique(grad.indices)
    summed = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
    return summed, unique


EMBEDDING_OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adagrad": Adagrad}  # --optimizer -> what updates the tables


def embedding_slot_count(name: str) -> int:
    """Slot variables per table under --optimizer `name` (what the memory budget counts)."""
    return len(EMBEDDING_OPTIMIZERS[name].slot_names)


def make_optimizers(name: str, beta_1: float = 0.9, beta_2: float = 0.999) -> Tuple[Optimizer, Optimizer]:
    """(dense optimizer, embedding optimizer): one shared SGD, Adam + lazy Adam (V5 `--beta1`,
    `--beta2`), or Adagrad for both (an extension: the MLPerf DLRM-DCNv2 recipe's)."""
    if name == "sgd":
        shared = SGD()
        return shared, shared
    if name == "adam":
        return (Adam(beta_1, beta_2, name="adam_dense"), Adam(beta_1, beta_2, name="lazy_adam_embedding"))
    if name == "adagrad":
        return Adagrad(name="adagrad_dense"), Adagrad(name="adagrad_embedding")
    raise ValueError(f"--optimizer must be one of {sorted(EMBEDDING_OPTIMIZERS)}, got {name!r}")


"""DLRM dot interaction: the TF-ops implementation and the dispatch to the custom op.

Every implementation produces the same unified layout (ARCHITECTURE.md), so weights trained
with one transfer to the others. For an input ``[B, F, D]`` whose row 0 is the bottom-MLP
output, an output row is::

    [row 0 (D values),
     dot(x_i, x_j) for i > j in row-major order (1,0), (2,0), (2,1), (3,0), ...,
     zeros up to a multiple of 8]

Names accepted by :func:`make_interaction` (the model's ``--dot_interaction`` values):

* ``tensorflow``: batched matmul + gather in plain TF ops; runs everywhere, XLA included.
* ``dummy``: each vector averaged over D first (a cheap stand-in with the same output width).
* ``custom_cuda``: the compiled ``DotBasedInteract`` op on the GPU.
* ``custom_cpu``: the compiled ``DotBasedInteract`` op on the CPU.
* ``auto``: with a GPU, ``custom_cuda`` when the op holds code for the GPU's compute
  capability, else ``tensorflow`` (logging why); without one, ``custom_cpu`` when the op is
  built, else ``tensorflow``. :func:`resolve_interaction_name` tells which one it picked.
"""
from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np
import tensorflow as tf

INTERACTION_NAMES = ("tensorflow", "dummy", "custom_cuda", "custom_cpu", "auto")
OUTPUT_ALIGNMENT = 8
OP_PACKAGE_DIR = Path(__file__).resolve().parent / "tensorflow-dot-based-interact"
BUILD_HINT = "run `make setup` or `make -C tensorflow-dot-based-interact cpu`"

Interaction = Callable[[tf.Tensor], tf.Tensor]
logger = logging.getLogger(__name__)


class InteractionUnavailableError(RuntimeError):
    """The requested interaction cannot run here (op not built, or no GPU kernel/device)."""


def interaction_output_width(num_vectors: int, dim: int) -> int:
    """Width of an interaction output row: D + F(F-1)/2, rounded up to a multiple of 8."""
    if num_vectors < 1 or dim < 1:
        raise ValueError(f"need num_vectors >= 1 and dim >= 1, got {num_vectors} and {dim}")
    unpadded = dim + num_vectors * (num_vectors - 1) // 2
    return -(-unpadded // OUTPUT_ALIGNMENT) * OUTPUT_ALIGNMENT


def _lower_triangle_indices(num_vectors: int) -> np.ndarray:
    """Flat indices i*F + j of the strictly lower Gram entries (i > j), row-major."""
    rows, cols = np.tril_indices(num_vectors, k=-1)
    return (rows * num_vectors + cols).astype(np.int32)


def _static_shape(inputs: tf.Tensor) -> tuple[int, int]:
    """F and D of a [B, F, D] input; both must be known when the graph is built."""
    if inputs.shape.rank != 3:
        raise ValueError(f"interaction input must have rank 3 [batch, vectors, dim], got shape {inputs.shape}")
    num_vectors, dim = inputs.shape[1], inputs.shape[2]
    if num_vectors is None or dim is None:
        raise ValueError(f"interaction input needs static vectors and dim, got shape {inputs.shape}")
    return num_vectors, dim


def _assemble(bottom: tf.Tensor, vectors: tf.Tensor) -> tf.Tensor:
    """[bottom, strictly-lower Gram entries of `vectors`, zero padding] in the unified layout."""
    num_vectors, _ = _static_shape(vectors)
    gram = tf.matmul(vectors, vectors, transpose_b=True)
    flat_gram = tf.reshape(gram, [-1, num_vectors * num_vectors])
    pairs = tf.gather(flat_gram, _lower_triangle_indices(num_vectors), axis=1)
    dim = bottom.shape[1]
    padding = interaction_output_width(num_vectors, dim) - dim - pairs.shape[1]
    return tf.pad(tf.concat([bottom, pairs], axis=1), [[0, 0], [0, padding]])


def tensorflow_interaction(inputs: tf.Tensor) -> tf.Tensor:
    """Dot interaction of a [B, F, D] input in plain TF ops (the reference implementation)."""
    _static_shape(inputs)
    return _assemble(inputs[:, 0, :], inputs)


def dummy_interaction(inputs: tf.Tensor) -> tf.Tensor:
    """Cheap stand-in: vectors averaged over D before the dot products; same output width."""
    _static_shape(inputs)
    return _assemble(inputs[:, 0, :], tf.reduce_mean(inputs, axis=2, keepdims=True))


def _import_op_package() -> ModuleType:
    """The op's Python package: installed wheel first, else the in-repo source tree."""
    try:
        return importlib.import_module("tensorflow_dot_based_interact")
    except ImportError:
        sys.path.insert(0, str(OP_PACKAGE_DIR))
        return importlib.import_module("tensorflow_dot_based_interact")


def custom_op_available() -> bool:
    """True when the compiled op library is built and loads."""
    return _import_op_package().is_built()


def custom_op_has_gpu() -> bool:
    """True when the op has CUDA kernels and TensorFlow sees a GPU to run them on."""
    package = _import_op_package()
    return package.is_built() and package.has_gpu_kernels() and bool(tf.config.list_physical_devices("GPU"))


def _custom_op(device: str) -> Interaction:
    """The compiled op pinned to `device` ("CPU" or "GPU")."""
    package = _import_op_package()
    if not package.is_built():
        raise InteractionUnavailableError(f"the custom interaction op is not built: {BUILD_HINT}")
    if device == "GPU" and not custom_op_has_gpu():
        raise InteractionUnavailableError(
            "custom_cuda needs the op built with CUDA kernels (`make -C tensorflow-dot-based-interact gpu`) "
            "and a visible GPU; use custom_cpu or tensorflow instead")

    def interaction(inputs: tf.Tensor) -> tf.Tensor:
        _static_shape(inputs)
        with tf.device(f"/{device}:0"):
            return package.dot_based_interact(inputs)

    interaction.__name__ = f"custom_{device.lower()}_interaction"
    return interaction


def missing_gpu_code(gpu: tf.config.PhysicalDevice) -> str | None:
    """Why custom_cuda cannot run on `gpu`, or None when the op holds code for its compute capability."""
    package = _import_op_package()
    if not package.is_built():
        return f"the custom interaction op is not built ({BUILD_HINT})"
    if not package.has_gpu_kernels():
        return "the custom interaction op has no CUDA kernels (`make -C tensorflow-dot-based-interact gpu`)"
    capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
    if capability is None:
        return f"TensorFlow reports no compute capability for {gpu.name}"
    try:
        return package.missing_cuda_code(capability)
    except package.OpNotBuiltError as error:
        return str(error)


def resolve_interaction_name(name: str) -> str:
    """Turn `name` into a concrete implementation name; `auto` picks the fastest that can run here.

    On a GPU the CPU kernel is never picked: pinning the interaction to the CPU would copy every
    batch off the device and back, so the TF ops run on the GPU instead.
    """
    if name not in INTERACTION_NAMES:
        raise ValueError(f"unknown interaction {name!r}; choose one of {', '.join(INTERACTION_NAMES)}")
    if name != "auto":
        return name
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        reason = missing_gpu_code(gpus[0])
        if reason is None:
            return "custom_cuda"
        logger.warning("dot interaction: auto does not use custom_cuda: %s; using tensorflow", reason)
        return "tensorflow"
    if custom_op_available():
        return "custom_cpu"
    return "tensorflow"


def make_interaction(name: str) -> Interaction:
    """A callable mapping [B, F, D] to [B, interaction_output_width(F, D)] for `name`.

    Raises InteractionUnavailableError when a custom op is requested but cannot run here.
    """
    resolved = resolve_interaction_name(name)
    if name == "auto":
        logger.info("dot interaction: auto picked %s", resolved)
    if resolved == "tensorflow":
        return tensorflow_interaction
    if resolved == "dummy":
        return dummy_interaction
    return _custom_op("GPU" if resolved == "custom_cuda" else "CPU")

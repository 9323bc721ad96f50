"""DLRM dot interaction: the TF-ops implementation and the dispatch to the custom op.

Every implementation produces the same unified layout (docs/architecture.md), so weights trained
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
  built, else ``tensorflow``.

:func:`resolve_interaction_name` is the one place a name is resolved (``auto`` picked, a custom
name checked against :func:`unavailable_reason`); :func:`make_interaction` takes the result.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from recsys.runtime.custom_ops import op_package as _op

CUSTOM_NAMES = ("custom_cuda", "custom_cpu")
IMPLEMENTATIONS = ("tensorflow", "dummy") + CUSTOM_NAMES
INTERACTION_NAMES = IMPLEMENTATIONS + ("auto",)
OUTPUT_ALIGNMENT = 8
# The dtypes the compiled op has kernels for on each device; others run it in float32.
KERNEL_DTYPES = {"CPU": (tf.float32, tf.float16, tf.bfloat16), "GPU": (tf.float32, tf.float16)}

Interaction = Callable[[tf.Tensor], tf.Tensor]
# Maps vector blocks [B, k_i * D] (each sample's k_i vectors side by side, the bottom-MLP output
# first) to the interaction of all sum k_i vectors in block order.
BlockInteraction = Callable[[Sequence[tf.Tensor]], tf.Tensor]
logger = logging.getLogger(__name__)
BUILD_HINT = _op.BUILD_HINT


class InteractionUnavailableError(RuntimeError):
    """The requested interaction cannot run here (op not built, or no GPU kernel/device)."""


def aligned_width(width: int) -> int:
    """`width` rounded up to a multiple of OUTPUT_ALIGNMENT (what the top MLP is fed)."""
    return -(-width // OUTPUT_ALIGNMENT) * OUTPUT_ALIGNMENT


def interaction_output_width(num_vectors: int, dim: int) -> int:
    """Width of an interaction output row: D + F(F-1)/2, rounded up to a multiple of 8."""
    if num_vectors < 1 or dim < 1:
        raise ValueError(f"need num_vectors >= 1 and dim >= 1, got {num_vectors} and {dim}")
    return aligned_width(dim + num_vectors * (num_vectors - 1) // 2)


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


def custom_op_available() -> bool:
    """True when the compiled op library is built and loads."""
    return _op.is_built()


def visible_gpu() -> Optional[tf.config.PhysicalDevice]:
    """The first GPU TensorFlow sees (after `--cpu` or the rank's device choice), or None."""
    gpus = tf.config.list_physical_devices("GPU")
    return gpus[0] if gpus else None


def unavailable_reason(name: str, gpu: Optional[tf.config.PhysicalDevice]) -> Optional[str]:
    """Why the implementation `name` cannot run with `gpu` (None: no GPU), or None when it can.

    The one statement of what the custom implementations need: custom_cpu the built op;
    custom_cuda a GPU, the op built with CUDA kernels, and code for the GPU's compute capability.
    """
    if name not in CUSTOM_NAMES:
        return None
    if name == "custom_cuda" and gpu is None:
        return "no GPU is visible (with --cpu none is); use custom_cpu, tensorflow or auto"
    if not _op.is_built():
        return f"the custom interaction op is not built ({BUILD_HINT})"
    if name == "custom_cpu":
        return None
    if not _op.has_gpu_kernels():
        return f"the custom interaction op has no CUDA kernels ({_op.GPU_BUILD_HINT})"
    capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
    if capability is None:
        return f"TensorFlow reports no compute capability for {gpu.name}"
    try:
        return _op.missing_cuda_code(capability)
    except _op.OpNotBuiltError as error:
        return str(error)


def custom_op_has_gpu() -> bool:
    """True when custom_cuda can run here: a visible GPU and the op's CUDA code for it."""
    return unavailable_reason("custom_cuda", visible_gpu()) is None


def _check_available(name: str) -> None:
    reason = unavailable_reason(name, visible_gpu())
    if reason is not None:
        raise InteractionUnavailableError(f"--dot_interaction {name}: {reason}")


def resolve_interaction_name(name: str) -> str:
    """The implementation to run for `name`: `auto` picks the fastest that can run here, a custom
    name is checked (InteractionUnavailableError saying why it cannot run).

    On a GPU the CPU kernel is never picked: pinning the interaction to the CPU would copy every
    batch off the device and back, so the TF ops run on the GPU instead.
    """
    if name not in INTERACTION_NAMES:
        raise ValueError(f"unknown interaction {name!r}; choose one of {', '.join(INTERACTION_NAMES)}")
    if name != "auto":
        _check_available(name)
        return name
    gpu = visible_gpu()
    if gpu is not None:
        reason = unavailable_reason("custom_cuda", gpu)
        if reason is None:
            return "custom_cuda"
        logger.warning("dot interaction: auto does not use custom_cuda: %s; using tensorflow", reason)
        return "tensorflow"
    return "custom_cpu" if unavailable_reason("custom_cpu", None) is None else "tensorflow"


def make_interaction(name: str) -> Interaction:
    """A callable mapping [B, F, D] to [B, interaction_output_width(F, D)] for the concrete
    implementation `name` (what `resolve_interaction_name` returned; `auto` is resolved there).

    Raises InteractionUnavailableError when a custom op is requested but cannot run here.
    """
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown interaction {name!r}; choose one of {', '.join(IMPLEMENTATIONS)} "
                         f"(resolve 'auto' with resolve_interaction_name first)")
    if name == "tensorflow":
        return tensorflow_interaction
    if name == "dummy":
        return dummy_interaction
    _check_available(name)
    device = "GPU" if name == "custom_cuda" else "CPU"

    def interaction(inputs: tf.Tensor) -> tf.Tensor:
        _static_shape(inputs)
        with tf.device(f"/{device}:0"):
            if inputs.dtype in KERNEL_DTYPES[device]:
                return _op.dot_based_interact(inputs)
            return tf.cast(_op.dot_based_interact(tf.cast(inputs, tf.float32)), inputs.dtype)  # bfloat16 on a GPU

    interaction.__name__ = f"{name}_interaction"
    return interaction


class CrossNetwork(tf.keras.layers.Layer):
    """DCN-v2 cross layers (reference §13.2) over x0 = [bottom-MLP output, every embedding vector]:
    x_{l+1} = x0 * (W x_l + b) + x_l, with W = U V of rank `projection_dim` (0: a full-rank W),
    truncated-normal kernels and zero biases. The output is padded with zeros to a multiple of 8.

    Each kernel draws from its own seed derived from (`seed`, `seed_offset`, layer), as the MLPs do.
    """

    def __init__(self, num_layers: int, projection_dim: int, seed: int = 0, seed_offset: int = 0,
                 name: str = "cross_network") -> None:
        super().__init__(name=name)
        self.num_layers = num_layers
        self.projection_dim = projection_dim
        self.seeds = [(seed * 1_000_003 + seed_offset + i) * 2 for i in range(num_layers)]
        self.projections: list = []  # U of every layer (low rank only)
        self.expansions: list = []  # V (low rank) or W (full rank), with the bias b
        self.padding = 0

    def build(self, input_shape) -> None:
        width = int(input_shape[-1])
        for i, layer_seed in enumerate(self.seeds):
            if self.projection_dim:
                self.projections.append(tf.keras.layers.Dense(
                    self.projection_dim, use_bias=False, name=f"cross_{i}_u",
                    kernel_initializer=tf.keras.initializers.TruncatedNormal(seed=layer_seed)))
            self.expansions.append(tf.keras.layers.Dense(
                width, name=f"cross_{i}_{'v' if self.projection_dim else 'w'}", bias_initializer="zeros",
                kernel_initializer=tf.keras.initializers.TruncatedNormal(seed=layer_seed + 1)))
        self.padding = cross_output_width(width) - width
        super().build(input_shape)

    def call(self, x0: tf.Tensor) -> tf.Tensor:
        x = x0
        for i, expansion in enumerate(self.expansions):
            x = x0 * expansion(self.projections[i](x) if self.projections else x) + x
        return tf.pad(x, [[0, 0], [0, self.padding]]) if self.padding else x

    def weight_map(self) -> dict:
        """Stable names of the kernels and biases (checkpoint file names)."""
        names = {}
        for i, expansion in enumerate(self.expansions):
            if self.projections:
                names[f"cross_layer_{i}_u_kernel"] = self.projections[i].kernel
            names[f"cross_layer_{i}_{'v' if self.projections else 'w'}_kernel"] = expansion.kernel
            names[f"cross_layer_{i}_bias"] = expansion.bias
        return names


def cross_output_width(input_width: int) -> int:
    """Width of the cross network's output: its input width rounded up to a multiple of 8."""
    return aligned_width(input_width)


def stack_blocks(blocks: Sequence[tf.Tensor], dim: int) -> tf.Tensor:
    """The [B, F, dim] interaction input held by vector blocks [B, k_i * dim] (F = sum k_i)."""
    num_vectors = sum(int(block.shape[1]) for block in blocks) // dim
    return tf.reshape(tf.concat(list(blocks), axis=1), [-1, num_vectors, dim])


def make_block_interaction(name: str, dim: int) -> BlockInteraction:
    """`make_interaction(name)` over vector blocks of width a multiple of `dim` (what the model has:
    the bottom-MLP output and each table's vectors). custom_cpu reads the blocks where they are
    (`DotBasedInteractBlocks`): no [B, F, D] copy is built in the forward pass, and each block gets
    its own gradient without splitting one; the other implementations take the concatenation.
    """
    stacked_interaction = make_interaction(name)
    if name != "custom_cpu":
        return lambda blocks: stacked_interaction(stack_blocks(blocks, dim))

    def interaction(blocks: Sequence[tf.Tensor]) -> tf.Tensor:
        with tf.device("/CPU:0"):
            return _op.dot_based_interact_blocks(list(blocks), dim)

    interaction.__name__ = "custom_cpu_block_interaction"
    return interaction

"""Python wrapper of the compiled `DotBasedInteract` op, with its gradient registered.

The library `_dot_based_interact_ops.so` sits next to this file once `make` has run. It is
loaded on first use, so importing this module never fails; `is_built()` tells whether it can.
Beside it, `make` writes `_dot_based_interact_ops.json`, the CUDA architectures it compiled.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from types import ModuleType
from typing import Callable

import tensorflow as tf
from tensorflow.python.framework import kernels

LIBRARY_PATH = Path(__file__).resolve().parent / "_dot_based_interact_ops.so"
CUDA_RECORD_PATH = LIBRARY_PATH.with_suffix(".json")
BUILD_HINT = "run `make setup` or `make -C tensorflow-dot-based-interact cpu`"
GPU_BUILD_HINT = "`make -C tensorflow-dot-based-interact gpu`"
SUPPORTED_DTYPES = (tf.float32, tf.float16, tf.bfloat16)  # bfloat16: CPU kernel only


class OpNotBuiltError(RuntimeError):
    """The op library is missing (not built yet) or cannot be loaded."""


@functools.lru_cache(maxsize=None)
def load_op_library() -> ModuleType:
    """Load the op library once; raise OpNotBuiltError with the build command if absent."""
    if not LIBRARY_PATH.exists():
        raise OpNotBuiltError(f"{LIBRARY_PATH} does not exist: {BUILD_HINT}")
    try:
        return tf.load_op_library(str(LIBRARY_PATH))
    except tf.errors.NotFoundError as error:
        raise OpNotBuiltError(f"{LIBRARY_PATH} does not load ({error.message}): rebuild it, {BUILD_HINT}") from error


def is_built() -> bool:
    """True when the op library exists and loads into this TensorFlow."""
    try:
        load_op_library()
    except OpNotBuiltError:
        return False
    return True


def has_gpu_kernels() -> bool:
    """True when the loaded library registered CUDA kernels (the `make gpu` build)."""
    load_op_library()
    registered = kernels.get_registered_kernels_for_op("DotBasedInteract").kernel
    return any(kernel.device_type == "GPU" for kernel in registered)


def built_cuda_code() -> dict[str, list[int]]:
    """The CUDA code in the library, from the record `make` wrote next to it.

    {"cuda_sm": [75, 80, ...], "cuda_ptx": [90]}: architectures with a cubin, and with PTX.
    Raises OpNotBuiltError when the record is missing or unreadable.
    """
    try:
        record = json.loads(CUDA_RECORD_PATH.read_text())
        return {key: [int(arch) for arch in record[key]] for key in ("cuda_sm", "cuda_ptx")}
    except FileNotFoundError:
        raise OpNotBuiltError(f"{CUDA_RECORD_PATH} does not exist (library built before it was recorded): "
                              f"rebuild, {BUILD_HINT}") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise OpNotBuiltError(f"{CUDA_RECORD_PATH} is not a valid CUDA code record ({error}): rebuild, "
                              f"{BUILD_HINT}") from None


def missing_cuda_code(compute_capability: tuple[int, int], code: dict[str, list[int]] | None = None) -> str | None:
    """Why `code` (default: the library's record) cannot run on a GPU of `compute_capability`; None if it can.

    A cubin for sm_XY runs on devices X.Z with Z >= Y; PTX for compute_XY is compiled by the
    driver for any device of capability X.Y or newer.
    """
    code = built_cuda_code() if code is None else code
    major, minor = compute_capability
    device = major * 10 + minor
    if any(arch // 10 == major and arch <= device for arch in code["cuda_sm"]):
        return None
    if any(arch <= device for arch in code["cuda_ptx"]):
        return None
    built = ", ".join([f"sm_{arch}" for arch in code["cuda_sm"]]
                      + [f"compute_{arch} (PTX)" for arch in code["cuda_ptx"]])
    return (f"the op holds CUDA code for {built or 'no architecture'}, none of which runs on compute "
            f"capability {major}.{minor}")


def _check_dtype(inputs: tf.Tensor, bottom_mlp_output: tf.Tensor | None = None) -> None:
    """Clear errors for dtypes the op would otherwise reject with a generic type error."""
    if inputs.dtype not in SUPPORTED_DTYPES:
        raise tf.errors.InvalidArgumentError(
            None, None, f"DotBasedInteract supports float32, float16 and bfloat16 inputs, got {inputs.dtype.name}")
    if bottom_mlp_output is not None and bottom_mlp_output.dtype != inputs.dtype:
        raise tf.errors.InvalidArgumentError(
            None, None, "DotBasedInteract needs input and bottom_mlp_output of the same dtype, got "
                        f"{inputs.dtype.name} and {bottom_mlp_output.dtype.name}")


def dot_based_interact(inputs: tf.Tensor, bottom_mlp_output: tf.Tensor | None = None) -> tf.Tensor:
    """Dot interaction of `inputs` [B, F, D] (row 0 = bottom-MLP output) in the unified layout.

    Output [B, round_up(D + F(F-1)/2, 8)]: row 0 of `inputs`, the strictly-lower Gram entries
    in row-major order, zeros. As in the reference op, the forward pass copies row 0 of `inputs`
    and never reads `bottom_mlp_output`, whose gradient is the first D upstream columns.
    Without `bottom_mlp_output` (the usual case) that pass-through gradient goes to row 0 of
    `inputs`, exactly as in the TF-ops implementation, folded into the one gradient kernel.
    """
    inputs = tf.convert_to_tensor(inputs)
    if bottom_mlp_output is None:
        _check_dtype(inputs)
        return _interact_with_folded_bottom(inputs)
    bottom_mlp_output = tf.convert_to_tensor(bottom_mlp_output)
    _check_dtype(inputs, bottom_mlp_output)
    return load_op_library().dot_based_interact(input=inputs, bottom_mlp_output=bottom_mlp_output)


@tf.custom_gradient
def _interact_with_folded_bottom(inputs: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
    """The op with row 0 as its bottom-MLP output; one gradient kernel covers both uses of row 0."""
    library = load_op_library()
    # A wrong-rank input goes to the op as is: its shape check names the problem.
    bottom = tf.stop_gradient(inputs[:, 0, :] if inputs.shape.rank == 3 else inputs)
    output = library.dot_based_interact(input=inputs, bottom_mlp_output=bottom)

    def gradient(upstream_grad: tf.Tensor) -> tf.Tensor:
        with tf.device(output.device):  # where the forward ran (e.g. pinned to the CPU)
            grad, _ = library.dot_based_interact_grad(input=inputs, upstream_grad=upstream_grad,
                                                      fold_bottom_mlp_grad=True)
        return grad

    return output, gradient


@tf.RegisterGradient("DotBasedInteract")
def _dot_based_interact_grad(op: tf.Operation, upstream_grad: tf.Tensor) -> list[tf.Tensor]:
    """Gradients for (input, bottom_mlp_output) from the `DotBasedInteractGrad` op."""
    grad, bottom_mlp_grad = load_op_library().dot_based_interact_grad(input=op.inputs[0], upstream_grad=upstream_grad)
    return [grad, bottom_mlp_grad]


def dot_based_interact_blocks(blocks: list[tf.Tensor], dim: int) -> tf.Tensor:
    """The dot interaction of vectors held in several tensors, on the CPU, without concatenating them.

    `blocks[i]` is [B, k_i * dim]: each sample's k_i vectors side by side (block 0 starts with the
    bottom-MLP output). Equal to `dot_based_interact` on their concatenation reshaped to
    [B, sum k_i, dim], and so is the gradient, which comes back one tensor per block.
    """
    blocks = [tf.convert_to_tensor(block) for block in blocks]
    _check_dtype(blocks[0])
    if any(block.dtype != blocks[0].dtype for block in blocks):
        raise tf.errors.InvalidArgumentError(
            None, None, "DotBasedInteractBlocks needs every block in one dtype, got "
                        f"{', '.join(block.dtype.name for block in blocks)}")
    return load_op_library().dot_based_interact_blocks(blocks=blocks, dim=dim)


@tf.RegisterGradient("DotBasedInteractBlocks")
def _dot_based_interact_blocks_grad(op: tf.Operation, upstream_grad: tf.Tensor) -> list[tf.Tensor]:
    """One gradient per block from the `DotBasedInteractBlocksGrad` op."""
    return load_op_library().dot_based_interact_blocks_grad(blocks=list(op.inputs), upstream_grad=upstream_grad,
                                                             dim=op.get_attr("dim"))

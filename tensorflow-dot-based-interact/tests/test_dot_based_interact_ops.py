"""The package's own tests: the compiled op against a float64 NumPy reference (no repo code)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dot_based_interact as dbi
from harness.numpy_reference import interaction_reference, max_scaled_error, output_width

pytestmark = pytest.mark.skipif(not dbi.is_built(), reason="op library not built: run `make cpu`")


# Inputs are exact in their dtype and every kernel computes in fp32, so the error is one final
# rounding (unit roundoff: half 2^-11, bfloat16 2^-8 = 3.9e-3) plus fp32 summation (< 1e-5).
BFLOAT16 = tf.bfloat16.as_numpy_dtype


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-5), (np.float16, 2e-3), (BFLOAT16, 4e-3)],
                         ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(5, 27, 128), (3, 9, 64), (2, 6, 16), (3, 7, 13), (2, 40, 260), (4, 1, 8)])
@pytest.mark.parametrize("separate_bottom", [False, True], ids=["row0", "separate_bottom"])
def test_forward_and_gradients_match_numpy(shape: tuple[int, int, int], dtype: type, tolerance: float,
                                           separate_bottom: bool) -> None:
    rng = np.random.default_rng(0)
    values = rng.uniform(-1, 1, shape).astype(dtype)
    upstream = rng.uniform(-1, 1, (shape[0], output_width(shape[1], shape[2]))).astype(dtype)
    output, grad, bottom_grad = interaction_reference(values, upstream)
    inputs, bottom = tf.constant(values), tf.constant(values[:, 0, :])
    with tf.GradientTape() as tape:
        tape.watch([inputs, bottom])
        op_output = dbi.dot_based_interact(inputs, bottom if separate_bottom else None)
        loss = tf.reduce_sum(op_output * upstream)
    op_grad, op_bottom_grad = tape.gradient(loss, [inputs, bottom])
    if separate_bottom:
        grad[:, 0, :] -= bottom_grad  # the pass-through goes to the separate tensor instead
        np.testing.assert_array_equal(op_bottom_grad, upstream[:, :shape[2]])
    else:
        assert op_bottom_grad is None
    for actual, expected in ((op_output, output), (op_grad, grad)):
        assert actual.dtype == dtype
        assert max_scaled_error(actual.numpy(), expected) <= tolerance


def test_shape_inference_gives_static_width() -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, 27, 128], tf.float32)])
    def width_of(inputs: tf.Tensor) -> tf.Tensor:
        output = dbi.dot_based_interact(inputs)
        assert output.shape.as_list() == [None, 480]
        return tf.shape(output)[1]

    assert int(width_of(tf.zeros([2, 27, 128]))) == 480


def test_unsupported_dtype_is_rejected() -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match="float32, float16 and bfloat16"):
        dbi.dot_based_interact(tf.zeros([2, 3, 8], tf.float64))


# The record of a `make gpu` with nvcc 12 or 13: cubins from sm_75 (or sm_70) to sm_90, PTX of sm_90.
CUDA_13_BUILD = {"cuda_sm": [75, 80, 86, 89, 90], "cuda_ptx": [90]}


@pytest.mark.parametrize("capability, runs", [
    ((7, 0), False),  # V100: no sm_70 cubin from nvcc 13, and PTX 9.0 is newer than the device
    ((7, 5), True), ((8, 0), True), ((8, 6), True),
    ((8, 7), True),   # Orin: the sm_86 cubin runs on 8.7 (same major, older minor)
    ((9, 0), True),
    ((10, 0), True), ((12, 0), True),  # Blackwell: the driver compiles the compute_90 PTX
    ((6, 1), False),
])
def test_missing_cuda_code_follows_cubin_and_ptx_compatibility(capability: tuple[int, int], runs: bool) -> None:
    reason = dbi.missing_cuda_code(capability, CUDA_13_BUILD)
    if runs:
        assert reason is None
    else:
        assert f"{capability[0]}.{capability[1]}" in reason and "sm_75" in reason and "compute_90 (PTX)" in reason


def test_without_ptx_a_newer_major_is_missing() -> None:
    assert dbi.missing_cuda_code((8, 6), {"cuda_sm": [80], "cuda_ptx": []}) is None
    assert "9.0" in dbi.missing_cuda_code((9, 0), {"cuda_sm": [80], "cuda_ptx": []})


def test_the_build_records_its_cuda_code_next_to_the_library() -> None:
    code = dbi.built_cuda_code()
    if dbi.has_gpu_kernels():
        assert code["cuda_sm"] and code["cuda_ptx"] == [max(code["cuda_sm"])]
    else:
        assert code == {"cuda_sm": [], "cuda_ptx": []}
        assert "no architecture" in dbi.missing_cuda_code((9, 0))

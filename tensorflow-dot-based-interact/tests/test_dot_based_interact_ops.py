"""The package's own tests: the compiled op against a float64 NumPy reference (no repo code)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dot_based_interact as dbi

pytestmark = pytest.mark.skipif(not dbi.is_built(), reason="op library not built: run `make cpu`")


def reference(values: np.ndarray, upstream: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output, input gradient and bottom-MLP gradient of the unified layout, in float64."""
    values = values.astype(np.float64)
    upstream = upstream.astype(np.float64)
    batch, num_vectors, dim = values.shape
    rows, cols = np.tril_indices(num_vectors, k=-1)
    gram = np.einsum("bid,bjd->bij", values, values)
    output = np.zeros((batch, upstream.shape[1]))
    output[:, :dim] = values[:, 0, :]
    output[:, dim:dim + rows.size] = gram[:, rows, cols]
    pair_grads = np.zeros((batch, num_vectors, num_vectors))
    pair_grads[:, rows, cols] = upstream[:, dim:dim + rows.size]
    symmetric = pair_grads + pair_grads.transpose(0, 2, 1)
    return output, np.einsum("bij,bjd->bid", symmetric, values), upstream[:, :dim]


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float16, 2e-3)])
@pytest.mark.parametrize("shape", [(5, 27, 128), (3, 7, 13), (2, 40, 260), (4, 1, 8)])
def test_forward_and_gradients_match_numpy(shape: tuple[int, int, int], dtype: type, rtol: float) -> None:
    rng = np.random.default_rng(0)
    values = rng.uniform(-1, 1, shape).astype(dtype)
    width = -(-(shape[2] + shape[1] * (shape[1] - 1) // 2) // 8) * 8
    upstream = rng.uniform(-1, 1, (shape[0], width)).astype(dtype)
    inputs, bottom = tf.constant(values), tf.constant(values[:, 0, :])
    with tf.GradientTape() as tape:
        tape.watch([inputs, bottom])
        output = dbi.dot_based_interact(inputs, bottom)
        loss = tf.reduce_sum(output * upstream)
    grad, bottom_grad = tape.gradient(loss, [inputs, bottom])
    for actual, expected in zip((output, grad, bottom_grad), reference(values, upstream)):
        assert actual.dtype == dtype
        scale = float(np.sqrt(np.mean(np.square(expected)))) or 1.0
        np.testing.assert_allclose(actual.numpy().astype(np.float64), expected, rtol=rtol, atol=rtol * scale)


def test_shape_inference_gives_static_width() -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, 27, 128], tf.float32)])
    def width_of(inputs: tf.Tensor) -> tf.Tensor:
        output = dbi.dot_based_interact(inputs)
        assert output.shape.as_list() == [None, 480]
        return tf.shape(output)[1]

    assert int(width_of(tf.zeros([2, 27, 128]))) == 480


def test_unsupported_dtype_is_rejected() -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match="float32 and float16"):
        dbi.dot_based_interact(tf.zeros([2, 3, 8], tf.float64))

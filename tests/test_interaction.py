"""Dot interaction: the TF-ops layout against NumPy, and the compiled op against the TF ops.

The op tests use the real compiled CPU kernel; they skip (with the reason) when the op library
is not built, and fail instead under CI, where `make setup` builds it.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from recsys.runtime import custom_ops
import interaction
from multiproc import require

FP32_RTOL = 1e-5
# fp16: inputs are exact halves, so the op differs from an fp32 computation only by its final
# rounding (half epsilon 2^-10) plus fp32 summation order.
FP16_RTOL = 2e-3
# bf16: the same single rounding on exact inputs, bfloat16's unit roundoff 2^-8 = 3.9e-3, with a
# margin for the fp32 summation (< 1e-5).
BF16_RTOL = 4e-3


def random_inputs(shape: tuple[int, int, int], dtype: tf.DType = tf.float32, seed: int = 0) -> tf.Tensor:
    """Uniform [-1, 1) values of `shape`, exactly representable in `dtype`."""
    values = np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(dtype.as_numpy_dtype)
    return tf.constant(values)


def numpy_interaction(values: np.ndarray) -> np.ndarray:
    """The unified layout spelled out element by element."""
    batch, num_vectors, dim = values.shape
    width = interaction.interaction_output_width(num_vectors, dim)
    out = np.zeros((batch, width), dtype=np.float64)
    out[:, :dim] = values[:, 0, :]
    column = dim
    for i in range(1, num_vectors):
        for j in range(i):
            out[:, column] = np.einsum("bd,bd->b", values[:, i, :], values[:, j, :])
            column += 1
    return out


def numpy_interaction_gradient(values: np.ndarray, upstream: np.ndarray) -> np.ndarray:
    """Gradient of sum(interaction(values) * upstream) w.r.t. `values`, spelled out pair by pair."""
    batch, num_vectors, dim = values.shape
    grad = np.zeros((batch, num_vectors, dim), dtype=np.float64)
    grad[:, 0, :] = upstream[:, :dim]
    column = dim
    for i in range(1, num_vectors):
        for j in range(i):
            pair_grad = upstream[:, column, None]
            grad[:, i, :] += pair_grad * values[:, j, :]
            grad[:, j, :] += pair_grad * values[:, i, :]
            column += 1
    return grad


def assert_close(actual: tf.Tensor, expected: tf.Tensor, rtol: float) -> None:
    """Relative check; the absolute floor is rtol times the RMS of `expected` (sums may cancel)."""
    expected = np.asarray(expected, dtype=np.float64)
    scale = float(np.sqrt(np.mean(np.square(expected)))) or 1.0
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("num_vectors, dim, width", [(27, 128, 480), (1, 5, 8), (2, 8, 16), (4, 3, 16), (3, 2, 8)])
def test_output_width(num_vectors: int, dim: int, width: int) -> None:
    assert interaction.interaction_output_width(num_vectors, dim) == width


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 1, 3), (5, 9, 8)])
def test_tensorflow_layout_matches_numpy(shape: tuple[int, int, int]) -> None:
    inputs = random_inputs(shape)
    assert_close(interaction.tensorflow_interaction(inputs), numpy_interaction(inputs.numpy()), FP32_RTOL)


def test_tensorflow_interaction_in_tf_function_with_unknown_batch() -> None:
    compiled = tf.function(interaction.tensorflow_interaction,
                           input_signature=[tf.TensorSpec([None, 6, 4], tf.float32)])
    inputs = random_inputs((7, 6, 4))
    assert_close(compiled(inputs), numpy_interaction(inputs.numpy()), FP32_RTOL)


def test_tensorflow_interaction_float16() -> None:
    inputs = random_inputs((4, 5, 8), tf.float16)
    result = interaction.tensorflow_interaction(inputs)
    assert result.dtype == tf.float16
    assert_close(result, numpy_interaction(inputs.numpy().astype(np.float64)), FP16_RTOL)


def test_tensorflow_interaction_gradient() -> None:
    inputs = random_inputs((2, 4, 3), tf.float64)
    theoretical, numerical = tf.test.compute_gradient(interaction.tensorflow_interaction, [inputs])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-6)


def test_dummy_keeps_width_and_averages_vectors() -> None:
    inputs = random_inputs((3, 5, 8))
    result = interaction.dummy_interaction(inputs).numpy()
    means = inputs.numpy().mean(axis=2)
    assert result.shape == (3, interaction.interaction_output_width(5, 8))
    np.testing.assert_allclose(result[:, :8], inputs.numpy()[:, 0, :])
    np.testing.assert_allclose(result[:, 8 + 2], means[:, 2] * means[:, 1], rtol=1e-6)
    assert not result[:, 8 + 10:].any()


def test_tensorflow_rejects_rank_2() -> None:
    with pytest.raises(ValueError, match="rank 3"):
        interaction.tensorflow_interaction(tf.zeros([4, 5]))


def test_unknown_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown interaction 'fast'"):
        interaction.resolve_interaction_name("fast")
    with pytest.raises(ValueError, match="unknown interaction 'fast'"):
        interaction.make_interaction("fast")


def test_auto_is_resolved_once_then_built() -> None:
    resolved = interaction.resolve_interaction_name("auto")
    expected = "custom_cpu" if interaction.custom_op_available() else "tensorflow"
    if interaction.custom_op_has_gpu():
        expected = "custom_cuda"
    assert resolved == expected
    inputs = random_inputs((2, 3, 8))
    assert_close(interaction.make_interaction(resolved)(inputs), numpy_interaction(inputs.numpy()), FP32_RTOL)
    with pytest.raises(ValueError, match="resolve 'auto' with resolve_interaction_name first"):
        interaction.make_interaction("auto")


def test_custom_cuda_without_gpu_gives_clear_error() -> None:
    if interaction.visible_gpu() is not None:
        pytest.skip("a GPU is visible")
    for call in (interaction.resolve_interaction_name, interaction.make_interaction):
        with pytest.raises(interaction.InteractionUnavailableError,
                           match="--dot_interaction custom_cuda: no GPU is visible"):
            call("custom_cuda")


# ---- the compiled op -------------------------------------------------------------------------

@pytest.fixture
def op_built() -> None:
    """Skips (fails under CI, which builds the op) when the op library is not built."""
    require(interaction.custom_op_available(), f"custom interaction op not built: {interaction.BUILD_HINT}")


requires_op = pytest.mark.usefixtures("op_built")

OP_SHAPES = [
    (16, 32, 32), (17, 31, 37), (15, 31, 37),           # the reference's base sets
    (16, 31, 31), (16, 32, 33), (255, 32, 32),          # F 31-32 x D 31-33, B 16 and 255
    (16, 33, 31), (16, 33, 33),                         # F = 33
    (16, 31, 255), (16, 32, 256), (255, 32, 257),       # D 255-257
    (16, 33, 257),                                      # both out of tensor-core limits
    (2048, 27, 128),                                    # Criteo
    (3, 1, 5), (4, 2, 3),                               # tiny: no pairs / one pair
]


def forward_and_gradient(fn, inputs: tf.Tensor, upstream: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Output of `fn` and the gradient of sum(output * upstream) w.r.t. the inputs."""
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        output = fn(inputs)
        loss = tf.reduce_sum(output * upstream)
    return output, tape.gradient(loss, inputs)


@pytest.fixture(params=["custom_cpu", "custom_cuda"])
def custom_implementation(request: pytest.FixtureRequest, op_built: None) -> str:
    """Each compiled implementation; CUDA only where a GPU is present, with TF32 off (exact fp32)."""
    if request.param == "custom_cuda":
        if not interaction.custom_op_has_gpu():
            pytest.skip("no GPU, or the op was built without CUDA kernels")
        tf32_enabled = tf.config.experimental.tensor_float_32_execution_enabled()
        tf.config.experimental.enable_tensor_float_32_execution(False)
        request.addfinalizer(lambda: tf.config.experimental.enable_tensor_float_32_execution(tf32_enabled))
    return request.param


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", OP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_op_matches_tensorflow(shape: tuple[int, int, int], dtype: tf.DType, custom_implementation: str) -> None:
    inputs = random_inputs(shape, dtype, seed=1)
    width = interaction.interaction_output_width(shape[1], shape[2])
    upstream = random_inputs((shape[0], width, 1), dtype, seed=2)[:, :, 0]
    op = interaction.make_interaction(custom_implementation)
    op_output, op_grad = forward_and_gradient(op, inputs, upstream)
    # The reference runs in fp32 on the same (exact) values: fp16 error is then the op's alone.
    ref_output, ref_grad = forward_and_gradient(
        interaction.tensorflow_interaction, tf.cast(inputs, tf.float32), tf.cast(upstream, tf.float32))
    assert op_output.dtype == dtype and op_grad.dtype == dtype
    assert op_output.shape == (shape[0], width)
    rtol = FP32_RTOL if dtype == tf.float32 else FP16_RTOL
    assert_close(op_output, ref_output, rtol)
    assert_close(op_grad, ref_grad, rtol)
    assert not op_output.numpy()[:, shape[2] + shape[1] * (shape[1] - 1) // 2:].any()


@requires_op
@pytest.mark.parametrize("shape", OP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bf16_op_matches_float64_numpy(shape: tuple[int, int, int]) -> None:
    """The bf16 path (--amp on a CPU): bf16 in and out, within one bf16 rounding of float64."""
    inputs = random_inputs(shape, tf.bfloat16, seed=1)
    width = interaction.interaction_output_width(shape[1], shape[2])
    upstream = random_inputs((shape[0], width, 1), tf.bfloat16, seed=2)[:, :, 0]
    op_output, op_grad = forward_and_gradient(interaction.make_interaction("custom_cpu"), inputs, upstream)
    assert op_output.dtype == tf.bfloat16 and op_grad.dtype == tf.bfloat16
    values, upstream_values = inputs.numpy().astype(np.float64), upstream.numpy().astype(np.float64)
    assert_close(op_output, numpy_interaction(values), BF16_RTOL)
    assert_close(op_grad, numpy_interaction_gradient(values, upstream_values), BF16_RTOL)


@requires_op
def test_bf16_runs_the_bf16_kernels_without_casts() -> None:
    op = interaction.make_interaction("custom_cpu")

    @tf.function(input_signature=[tf.TensorSpec([4, 5, 8], tf.bfloat16)])
    def forward_backward(inputs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return forward_and_gradient(op, inputs, tf.ones([4, interaction.interaction_output_width(5, 8)], tf.bfloat16))

    operations = forward_backward.get_concrete_function().graph.get_operations()
    kernels = {operation.type: operation.get_attr("T") for operation in operations
               if operation.type.startswith("DotBasedInteract")}
    assert kernels == {"DotBasedInteract": tf.bfloat16, "DotBasedInteractGrad": tf.bfloat16}
    assert not [operation.name for operation in operations if operation.type == "Cast"]


@requires_op
@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 5, 3), (3, 2, 9)])
def test_op_compute_gradient(shape: tuple[int, int, int]) -> None:
    op = interaction.make_interaction("custom_cpu")
    theoretical, numerical = tf.test.compute_gradient(op, [random_inputs(shape, seed=3)], delta=1e-2)
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-3, atol=1e-3)


@requires_op
def test_op_second_input_gradient_is_pass_through() -> None:
    package = custom_ops.import_op_package()
    inputs = random_inputs((3, 4, 8))
    bottom = random_inputs((3, 8), seed=5)
    upstream = random_inputs((3, 16, 1), seed=6)[:, :, 0]
    with tf.GradientTape() as tape:
        tape.watch(bottom)
        loss = tf.reduce_sum(package.dot_based_interact(inputs, bottom) * upstream)
    np.testing.assert_array_equal(tape.gradient(loss, bottom), upstream[:, :8])


@requires_op
def test_op_in_tf_function_with_unknown_batch() -> None:
    op = interaction.make_interaction("custom_cpu")

    @tf.function(input_signature=[tf.TensorSpec([None, 5, 8], tf.float32)])
    def forward_backward(inputs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            output = op(inputs)
            loss = tf.reduce_sum(output)
        return output, tape.gradient(loss, inputs)

    inputs = random_inputs((6, 5, 8))
    output, grad = forward_backward(inputs)
    ref_output, ref_grad = forward_and_gradient(interaction.tensorflow_interaction, inputs, tf.ones_like(output))
    assert output.shape == (6, interaction.interaction_output_width(5, 8))
    assert_close(output, ref_output, FP32_RTOL)
    assert_close(grad, ref_grad, FP32_RTOL)


@requires_op
def test_op_is_deterministic() -> None:
    op = interaction.make_interaction("custom_cpu")
    inputs = random_inputs((64, 27, 128))
    np.testing.assert_array_equal(op(inputs), op(inputs))


@requires_op
@pytest.mark.parametrize("input_shape, message", [
    ([4, 8], "rank 3"),
    ([0, 3, 8], "empty batch"),
    ([4, 0, 8], "at least one vector"),
    ([4, 3, 0], "dim must be positive"),
])
def test_op_rejects_bad_input(input_shape: list[int], message: str) -> None:
    package = custom_ops.import_op_package()
    bottom = tf.zeros([input_shape[0], input_shape[-1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        package.dot_based_interact(tf.zeros(input_shape), bottom)


@requires_op
def test_op_rejects_mismatched_dtypes() -> None:
    package = custom_ops.import_op_package()
    with pytest.raises(tf.errors.InvalidArgumentError, match="same dtype"):
        package.dot_based_interact(tf.zeros([2, 3, 8]), tf.zeros([2, 8], tf.float16))


@requires_op
def test_op_rejects_mismatched_bottom_shape() -> None:
    package = custom_ops.import_op_package()
    with pytest.raises(tf.errors.InvalidArgumentError, match="bottom_mlp_output"):
        package.dot_based_interact(tf.zeros([2, 3, 8]), tf.zeros([2, 7]))


# ---- the blocks form: vectors held in several tensors (the model's bottom output and tables) ----

BLOCK_SPLITS = [[1] * 27, [1, 26], [27], [1, 3, 1, 22], [2, 1]]


def split_into_blocks(inputs: tf.Tensor, vectors_per_block: list[int]) -> list[tf.Tensor]:
    """[B, F, D] as blocks [B, k_i * D] of consecutive vectors."""
    batch, _, dim = inputs.shape
    return [tf.reshape(part, [batch, -1]) for part in tf.split(inputs, vectors_per_block, axis=1)]


@requires_op
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("vectors_per_block", BLOCK_SPLITS, ids=lambda k: f"{len(k)}blocks")
def test_blocks_op_equals_the_op_on_the_concatenation(vectors_per_block: list[int], dtype: tf.DType) -> None:
    """Bit for bit, forward and per-block gradients, in every kernel dtype."""
    package = custom_ops.import_op_package()
    num_vectors, dim = sum(vectors_per_block), 24
    inputs = random_inputs((33, num_vectors, dim), dtype, seed=7)
    upstream = random_inputs((33, interaction.interaction_output_width(num_vectors, dim), 1), dtype, seed=8)[:, :, 0]
    blocks = split_into_blocks(inputs, vectors_per_block)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(blocks)
        tape.watch(inputs)
        output = package.dot_based_interact_blocks(blocks, dim)
        reference = package.dot_based_interact(inputs)
        blocks_loss = tf.reduce_sum(tf.cast(output, tf.float32) * tf.cast(upstream, tf.float32))
        reference_loss = tf.reduce_sum(tf.cast(reference, tf.float32) * tf.cast(upstream, tf.float32))
    grads = tape.gradient(blocks_loss, blocks)
    reference_grads = split_into_blocks(tape.gradient(reference_loss, inputs), vectors_per_block)
    assert output.dtype == dtype and all(grad.dtype == dtype for grad in grads)
    np.testing.assert_array_equal(output.numpy(), reference.numpy())
    for grad, block, reference_grad in zip(grads, blocks, reference_grads):
        assert grad.shape == block.shape
        np.testing.assert_array_equal(grad.numpy(), reference_grad.numpy())


@requires_op
@pytest.mark.parametrize("vectors_per_block", [[1, 2, 3], [6]], ids=["3blocks", "1block"])
def test_blocks_gradient_reuses_dead_blocks_without_changing_results(vectors_per_block: list[int]) -> None:
    """In a tf.function the gradient kernel may write into the blocks' buffers (nothing reads them
    after it), a single block included: the results equal the stacked op's, and the inputs stay intact."""
    package = custom_ops.import_op_package()
    inputs = random_inputs((64, 6, 16), seed=9)

    @tf.function
    def blocks_gradient(values: tf.Tensor) -> list[tf.Tensor]:
        blocks = [block * 1.0 for block in split_into_blocks(values, vectors_per_block)]  # fresh buffers
        with tf.GradientTape() as tape:
            tape.watch(blocks)
            loss = tf.reduce_sum(package.dot_based_interact_blocks(blocks, 16))
        return tape.gradient(loss, blocks)

    before = inputs.numpy().copy()
    _, reference = forward_and_gradient(package.dot_based_interact, inputs,
                                        tf.ones([64, interaction.interaction_output_width(6, 16)]))
    for grad, expected in zip(blocks_gradient(inputs), split_into_blocks(reference, vectors_per_block)):
        np.testing.assert_array_equal(grad.numpy(), expected.numpy())
    np.testing.assert_array_equal(inputs.numpy(), before)


@requires_op
def test_blocks_op_with_unknown_batch_infers_the_width() -> None:
    package = custom_ops.import_op_package()
    forward = tf.function(lambda a, b: package.dot_based_interact_blocks([a, b], 8))
    concrete = forward.get_concrete_function(tf.TensorSpec([None, 8]), tf.TensorSpec([None, 24]))
    assert concrete.structured_outputs.shape.as_list() == [None, interaction.interaction_output_width(4, 8)]


@requires_op
@pytest.mark.parametrize("shapes, message", [
    ([[4, 8], [4, 12]], r"block 1 must be \[batch, k \* 8\] .* got shape \[4,12\]"),
    ([[4, 8], [3, 8]], r"block 1 must be .* the batch of block 0 \(4\), got shape \[3,8\]"),
    ([[0, 8], [0, 8]], "empty batch"),
])
def test_blocks_op_rejects_bad_blocks(shapes: list[list[int]], message: str) -> None:
    package = custom_ops.import_op_package()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        package.dot_based_interact_blocks([tf.zeros(shape) for shape in shapes], 8)


@requires_op
def test_blocks_op_rejects_mixed_dtypes() -> None:
    package = custom_ops.import_op_package()
    with pytest.raises(tf.errors.InvalidArgumentError, match="every block in one dtype.*float32, bfloat16"):
        package.dot_based_interact_blocks([tf.zeros([2, 8]), tf.zeros([2, 8], tf.bfloat16)], 8)


@pytest.mark.parametrize("name", ["tensorflow", "dummy", "custom_cpu"])
def test_block_interaction_equals_the_stacked_interaction(name: str) -> None:
    """What the model calls: every implementation over blocks equals it over the [B, F, D] stack."""
    if name == "custom_cpu":
        require(interaction.custom_op_available(), f"custom interaction op not built: {interaction.BUILD_HINT}")
    inputs = random_inputs((9, 5, 8), seed=10)
    blocks = split_into_blocks(inputs, [1, 1, 3])
    upstream = random_inputs((9, interaction.interaction_output_width(5, 8), 1), seed=11)[:, :, 0]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(blocks)
        tape.watch(inputs)
        output = interaction.make_block_interaction(name, 8)(blocks)
        reference = interaction.make_interaction(name)(inputs)
        loss, reference_loss = tf.reduce_sum(output * upstream), tf.reduce_sum(reference * upstream)
    assert_close(output, reference, FP32_RTOL)
    reference_grads = split_into_blocks(tape.gradient(reference_loss, inputs), [1, 1, 3])
    for grad, expected in zip(tape.gradient(loss, blocks), reference_grads):
        assert_close(grad, expected, FP32_RTOL)

"""DLRM dot-interaction op (`DotBasedInteract`) with CPU and CUDA kernels, its blocks form on the CPU
(`DotBasedInteractBlocks`, no concatenated input), and their gradients; the fused
sparse embedding updates (CPU; SGD, Adam, Adagrad, Keras legacy RMSprop, FTRL); the split-binary
batch read (CPU); a dense layer's bias, ReLU and dropout in one pass (CPU, with a TensorFlow-ops form
elsewhere)."""
from tensorflow_dot_based_interact.dot_based_interact_ops import (
    BUILD_HINT,
    GPU_BUILD_HINT,
    OpNotBuiltError,
    built_cuda_code,
    dot_based_interact,
    dot_based_interact_blocks,
    has_gpu_kernels,
    is_built,
    load_op_library,
    missing_cuda_code,
)
from tensorflow_dot_based_interact.embedding_update_ops import (sparse_adagrad_update, sparse_adam_update,
                                                                 sparse_ftrl_update, sparse_rmsprop_update,
                                                                 sparse_sgd_update)
from tensorflow_dot_based_interact.file_rows_ops import read_file_rows
from tensorflow_dot_based_interact.relu_dropout_ops import (bias_relu_dropout, bias_relu_grad,
                                                             relu_dropout_kernel_available)

__all__ = ["BUILD_HINT", "GPU_BUILD_HINT", "OpNotBuiltError", "bias_relu_dropout", "bias_relu_grad", "built_cuda_code", "dot_based_interact",
           "dot_based_interact_blocks", "has_gpu_kernels", "is_built", "load_op_library", "missing_cuda_code",
           "read_file_rows", "relu_dropout_kernel_available", "sparse_adagrad_update", "sparse_adam_update",
           "sparse_ftrl_update", "sparse_rmsprop_update", "sparse_sgd_update"]

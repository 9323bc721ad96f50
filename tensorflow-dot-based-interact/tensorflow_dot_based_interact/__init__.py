"""DLRM dot-interaction op (`DotBasedInteract`) with CPU and CUDA kernels, and its gradient."""
from tensorflow_dot_based_interact.dot_based_interact_ops import (
    BUILD_HINT,
    GPU_BUILD_HINT,
    OpNotBuiltError,
    built_cuda_code,
    dot_based_interact,
    has_gpu_kernels,
    is_built,
    load_op_library,
    missing_cuda_code,
)

__all__ = ["BUILD_HINT", "GPU_BUILD_HINT", "OpNotBuiltError", "built_cuda_code", "dot_based_interact", "has_gpu_kernels", "is_built",
           "load_op_library", "missing_cuda_code"]

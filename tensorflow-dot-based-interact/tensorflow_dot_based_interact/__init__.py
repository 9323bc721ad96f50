"""DLRM dot-interaction op (`DotBasedInteract`) with CPU and CUDA kernels, and its gradient."""
from tensorflow_dot_based_interact.dot_based_interact_ops import (
    OpNotBuiltError,
    dot_based_interact,
    has_gpu_kernels,
    is_built,
    load_op_library,
)

__all__ = ["OpNotBuiltError", "dot_based_interact", "has_gpu_kernels", "is_built", "load_op_library"]

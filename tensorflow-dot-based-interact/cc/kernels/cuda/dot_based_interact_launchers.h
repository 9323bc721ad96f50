// Plain C++ entry points of the CUDA kernels: no CUDA or TensorFlow headers needed to call them,
// so the TF glue (g++) and the standalone harness (nvcc) share one set of kernels.
#ifndef DOT_BASED_INTERACT_CUDA_LAUNCHERS_H_
#define DOT_BASED_INTERACT_CUDA_LAUNCHERS_H_

#include <cstdint>

#include "../interact_layout.h"
#include "kernel_layout.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*.

namespace dot_based_interact {
namespace cuda {

// 16 bits of an IEEE half (layout of both __half and Eigen::half).
struct Half {
  uint16_t bits;
};

// The kernel a launch used. Tensor cores (compute capability 8.0 and newer) take the shapes of
// FitsTensorCores with 16-byte aligned buffers: fp16 for half; for float TF32 when allowed, else
// 3xTF32 (each operand split into two TF32 parts, about fp32's accuracy). Other shapes and older
// GPUs run the general SIMT kernel, so every shape gets a correct result.
enum class KernelKind { kSimt, kTf32TensorCore, kSplitTf32TensorCore, kFp16TensorCore };

struct LaunchResult {
  KernelKind kernel;
  const char* error;  // nullptr on success, else the CUDA error string
};

const char* KernelName(KernelKind kernel);

// Forward of a whole batch on `stream`. `allow_tf32` only affects float inputs.
LaunchResult LaunchForward(const InteractShape& shape, const float* input, float* output, bool allow_tf32,
                           CUstream_st* stream);
LaunchResult LaunchForward(const InteractShape& shape, const Half* input, Half* output, bool allow_tf32,
                           CUstream_st* stream);

// Backward: grad [B, F, D] and bottom_mlp_grad [B, D]; with `fold_bottom_mlp_grad` the
// pass-through gradient is also added to grad row 0.
LaunchResult LaunchBackward(const InteractShape& shape, bool fold_bottom_mlp_grad, const float* input,
                            const float* upstream_grad, float* grad, float* bottom_mlp_grad, bool allow_tf32,
                            CUstream_st* stream);
LaunchResult LaunchBackward(const InteractShape& shape, bool fold_bottom_mlp_grad, const Half* input,
                            const Half* upstream_grad, Half* grad, Half* bottom_mlp_grad, bool allow_tf32,
                            CUstream_st* stream);

}  // namespace cuda
}  // namespace dot_based_interact

#endif  // DOT_BASED_INTERACT_CUDA_LAUNCHERS_H_

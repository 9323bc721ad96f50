// GPU OpKernels: TF glue (compiled by the host compiler with GOOGLE_CUDA=1) around the plain
// C++ launchers of cuda/dot_based_interact.cu. TF32 follows TensorFlow's global switch
// (tf.config.experimental.enable_tensor_float_32_execution).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <type_traits>

#include "cuda/dot_based_interact_launchers.h"
#include "dot_based_interact_kernels.h"
#include "tensorflow/core/platform/tensor_float_32_utils.h"

namespace dot_based_interact {
namespace {

// The launchers' element type for T: float, or the 16 bits of Eigen::half.
template <typename T>
using LauncherType = std::conditional_t<std::is_same_v<T, Eigen::half>, cuda::Half, float>;

template <typename T>
const LauncherType<T>* ForLauncher(const T* values) {
  return reinterpret_cast<const LauncherType<T>*>(values);
}

template <typename T>
LauncherType<T>* ForLauncher(T* values) {
  return reinterpret_cast<LauncherType<T>*>(values);
}

void Report(tensorflow::OpKernelContext* context, const cuda::LaunchResult& result) {
  if (result.error != nullptr) {
    context->SetStatus(tensorflow::errors::Internal("DotBasedInteract CUDA kernel ", cuda::KernelName(result.kernel),
                                                    " failed: ", result.error));
  }
}

}  // namespace

template <typename T>
struct DotBasedInteractFunctor<Eigen::GpuDevice, T> {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, const T* input,
                  T* output) const {
    Report(context, cuda::LaunchForward(shape, ForLauncher(input), ForLauncher(output),
                                        tensorflow::tensor_float_32_execution_enabled(),
                                        context->eigen_gpu_device().stream()));
  }
};

template <typename T>
struct DotBasedInteractGradFunctor<Eigen::GpuDevice, T> {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, bool fold_bottom_mlp_grad,
                  const T* input, const T* upstream_grad, T* grad, T* bottom_mlp_grad) const {
    Report(context, cuda::LaunchBackward(shape, fold_bottom_mlp_grad, ForLauncher(input), ForLauncher(upstream_grad),
                                         ForLauncher(grad), ForLauncher(bottom_mlp_grad),
                                         tensorflow::tensor_float_32_execution_enabled(),
                                         context->eigen_gpu_device().stream()));
  }
};

DBI_REGISTER_KERNELS(DEVICE_GPU, Eigen::GpuDevice, float);
DBI_REGISTER_KERNELS(DEVICE_GPU, Eigen::GpuDevice, Eigen::half);

}  // namespace dot_based_interact

#endif  // GOOGLE_CUDA

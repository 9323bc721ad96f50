// OpKernels of DotBasedInteract and DotBasedInteractGrad, shared by the CPU and GPU builds.
//
// The kernels validate their inputs, allocate outputs and hand raw pointers to a per-device
// functor: DotBasedInteractFunctor / DotBasedInteractGradFunctor, specialised in
// dot_based_interact_cpu.cc and dot_based_interact_gpu.cc.
#ifndef DOT_BASED_INTERACT_KERNELS_H_
#define DOT_BASED_INTERACT_KERNELS_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "interact_layout.h"

namespace dot_based_interact {

// Checks `input` is a non-empty [B, F, D] tensor and returns its InteractShape.
inline tensorflow::Status ShapeOfInput(const tensorflow::Tensor& input, InteractShape* shape) {
  if (input.dims() != 3) {
    return tensorflow::errors::InvalidArgument(
        "DotBasedInteract: input must have rank 3 [batch, vectors, dim], got shape ", input.shape().DebugString());
  }
  shape->batch = input.dim_size(0);
  shape->num_vectors = input.dim_size(1);
  shape->dim = input.dim_size(2);
  if (shape->batch == 0) {
    return tensorflow::errors::InvalidArgument("DotBasedInteract: empty batch (input shape ",
                                               input.shape().DebugString(), ")");
  }
  if (shape->num_vectors == 0) {
    return tensorflow::errors::InvalidArgument("DotBasedInteract: input needs at least one vector (the bottom-MLP "
                                               "output), got shape ", input.shape().DebugString());
  }
  if (shape->dim == 0) {
    return tensorflow::errors::InvalidArgument("DotBasedInteract: vector dim must be positive, got shape ",
                                               input.shape().DebugString());
  }
  shape->output_width = OutputWidth(shape->num_vectors, shape->dim);
  return tensorflow::OkStatus();
}

// Checks that a second operand is [B, expected_columns] for the input's batch.
inline tensorflow::Status CheckMatrix(const char* name, const tensorflow::Tensor& matrix, int64_t batch,
                                      int64_t expected_columns) {
  if (matrix.dims() != 2 || matrix.dim_size(0) != batch || matrix.dim_size(1) != expected_columns) {
    return tensorflow::errors::InvalidArgument("DotBasedInteract: ", name, " must have shape [", batch, ", ",
                                               expected_columns, "], got ", matrix.shape().DebugString());
  }
  return tensorflow::OkStatus();
}

// Forward: output rows = [input row 0, strictly-lower Gram entries row-major, zeros].
template <typename Device, typename T>
struct DotBasedInteractFunctor {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, const T* input,
                  T* output) const;
};

// Backward: grad = S x per sample (S the symmetric matrix of upstream interaction gradients,
// zero diagonal); bottom_mlp_grad = the first D upstream columns, also added to grad row 0
// when `fold_bottom_mlp_grad`.
template <typename Device, typename T>
struct DotBasedInteractGradFunctor {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, bool fold_bottom_mlp_grad,
                  const T* input, const T* upstream_grad, T* grad, T* bottom_mlp_grad) const;
};

template <typename Device, typename T>
class DotBasedInteractOp : public tensorflow::OpKernel {
 public:
  explicit DotBasedInteractOp(tensorflow::OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    InteractShape shape;
    OP_REQUIRES_OK(context, ShapeOfInput(input, &shape));
    OP_REQUIRES_OK(context, CheckMatrix("bottom_mlp_output", context->input(1), shape.batch, shape.dim));
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {shape.batch, shape.output_width}, &output));
    DotBasedInteractFunctor<Device, T>()(context, shape, input.flat<T>().data(), output->flat<T>().data());
  }
};

template <typename Device, typename T>
class DotBasedInteractGradOp : public tensorflow::OpKernel {
 public:
  explicit DotBasedInteractGradOp(tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("fold_bottom_mlp_grad", &fold_bottom_mlp_grad_));
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    const tensorflow::Tensor& upstream_grad = context->input(1);
    InteractShape shape;
    OP_REQUIRES_OK(context, ShapeOfInput(input, &shape));
    OP_REQUIRES_OK(context, CheckMatrix("upstream_grad", upstream_grad, shape.batch, shape.output_width));
    tensorflow::Tensor* grad = nullptr;
    tensorflow::Tensor* bottom_mlp_grad = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &grad));
    OP_REQUIRES_OK(context, context->allocate_output(1, {shape.batch, shape.dim}, &bottom_mlp_grad));
    DotBasedInteractGradFunctor<Device, T>()(context, shape, fold_bottom_mlp_grad_, input.flat<T>().data(),
                                             upstream_grad.flat<T>().data(), grad->flat<T>().data(),
                                             bottom_mlp_grad->flat<T>().data());
  }

 private:
  bool fold_bottom_mlp_grad_ = false;
};

// Registers both ops for element type T on one device (DEVICE_CPU + Eigen::ThreadPoolDevice, or
// DEVICE_GPU + Eigen::GpuDevice).
#define DBI_REGISTER_KERNELS(DEVICE_NAME, EIGEN_DEVICE, T)                                                  \
  REGISTER_KERNEL_BUILDER(Name("DotBasedInteract").Device(tensorflow::DEVICE_NAME).TypeConstraint<T>("T"), \
                          DotBasedInteractOp<EIGEN_DEVICE, T>);                                             \
  REGISTER_KERNEL_BUILDER(Name("DotBasedInteractGrad").Device(tensorflow::DEVICE_NAME).TypeConstraint<T>("T"), \
                          DotBasedInteractGradOp<EIGEN_DEVICE, T>)

}  // namespace dot_based_interact

#endif  // DOT_BASED_INTERACT_KERNELS_H_

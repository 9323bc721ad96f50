// CPU kernels of BiasReluDropout and BiasReluDropoutGrad (registered in cc/ops/relu_dropout_ops.cc).
//
// TensorFlow's own graph for bias + ReLU + dropout makes five passes over a [batch, units] tensor
// forward (bias add, relu, a random uniform, a compare, a select) and three backward, each a
// separate op; in bfloat16 each pass also widens and narrows every element. Here the forward is one
// pass that draws the mask from a hash of the element's coordinates (relu_dropout_mask.h), and the
// backward is one pass over (dy, y) that also sums the bias gradient, with float32 arithmetic inside
// and one rounding per stored element. Rows are spread over the intra-op threads.
#include <algorithm>
#include <cstring>
#include <vector>

#include "relu_dropout_mask.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace relu_dropout {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

// The elements as stored: float32, or bfloat16 as its 16 raw bits (the upper half of a float32).
template <typename T> struct Raw { using type = float; };
template <> struct Raw<tensorflow::bfloat16> { using type = uint16_t; };

template <typename T>
const typename Raw<T>::type* RawData(const Tensor& t) {
  return reinterpret_cast<const typename Raw<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename Raw<T>::type* RawData(Tensor* t) {
  return reinterpret_cast<typename Raw<T>::type*>(t->flat<T>().data());
}

// Element access in float32 for the two storage types; Store returns the value it stored. Written
// without branches, so that the compiler vectorizes the loops below.
inline float Load(const float* p, int64_t j) { return p[j]; }
inline float Store(float* p, int64_t j, float v) {
  p[j] = v;
  return v;
}

inline float Load(const uint16_t* p, int64_t j) {
  const uint32_t wide = static_cast<uint32_t>(p[j]) << 16;
  float v;
  std::memcpy(&v, &wide, sizeof(v));
  return v;
}

// Round to nearest even, as TensorFlow's float -> bfloat16 cast; NaN stays a quiet NaN.
inline float Store(uint16_t* p, int64_t j, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  const uint32_t stored = v != v ? 0x7FC00000u : rounded;
  p[j] = static_cast<uint16_t>(stored >> 16);
  float back;
  std::memcpy(&back, &stored, sizeof(back));
  return back;
}

// One row forward: y = relu(x + bias) * (kept ? scale : 0), NaN passing relu.
template <typename R>
inline __attribute__((always_inline)) void ForwardRowBody(const R* x, R* y, const float* bias, int64_t cols,
                                                          uint32_t row, uint32_t threshold, float scale) {
  for (int64_t j = 0; j < cols; ++j) {
    const float v = Load(x, j) + bias[j];
    const float kept_scale = Mix(row + static_cast<uint32_t>(j) * kColumnStride) >= threshold ? scale : 0.0f;
    const float scaled = v * kept_scale;
    Store(y, j, (v > 0.0f) | (v != v) ? scaled : 0.0f);
  }
}

// One row backward: dx = y > 0 ? dy * scale : 0, and the stored dx added to the column sums.
template <typename R>
inline __attribute__((always_inline)) void BackwardRowBody(const R* dy, const R* y, R* dx, float* sum, int64_t cols,
                                                           float scale) {
  for (int64_t j = 0; j < cols; ++j) {
    const float scaled = Load(dy, j) * scale;
    sum[j] += Store(dx, j, Load(y, j) > 0.0f ? scaled : 0.0f);
  }
}

// The row loops compiled for AVX-512 (BW: 16-bit lanes for bfloat16), AVX2 and the baseline, the
// widest one this CPU runs chosen once: the hash's 32-bit multiplies and unsigned compares are several
// times faster with AVX-512. (Chosen by hand: g++ 11, the NGC image's, has no target_clones for
// AVX-512BW.)
template <typename R>
using ForwardFn = void (*)(const R*, R*, const float*, int64_t, uint32_t, uint32_t, float);
template <typename R>
using BackwardFn = void (*)(const R*, const R*, R*, float*, int64_t, float);

#define ROW_LOOPS(SUFFIX, TARGET)                                                                          \
  template <typename R>                                                                                   \
  TARGET void ForwardRow##SUFFIX(const R* x, R* y, const float* bias, int64_t cols, uint32_t row,         \
                                 uint32_t threshold, float scale) {                                       \
    ForwardRowBody(x, y, bias, cols, row, threshold, scale);                                              \
  }                                                                                                       \
  template <typename R>                                                                                   \
  TARGET void BackwardRow##SUFFIX(const R* dy, const R* y, R* dx, float* sum, int64_t cols, float scale) { \
    BackwardRowBody(dy, y, dx, sum, cols, scale);                                                         \
  }
ROW_LOOPS(Avx512, __attribute__((target("avx512f,avx512bw"))))
ROW_LOOPS(Avx2, __attribute__((target("avx2"))))
ROW_LOOPS(Baseline, )
#undef ROW_LOOPS

template <typename R>
struct RowLoops {
  ForwardFn<R> forward;
  BackwardFn<R> backward;
};

template <typename R>
const RowLoops<R>& ChosenRowLoops() {
  static const RowLoops<R> chosen =
      __builtin_cpu_supports("avx512bw") ? RowLoops<R>{&ForwardRowAvx512<R>, &BackwardRowAvx512<R>}
      : __builtin_cpu_supports("avx2")   ? RowLoops<R>{&ForwardRowAvx2<R>, &BackwardRowAvx2<R>}
                                         : RowLoops<R>{&ForwardRowBaseline<R>, &BackwardRowBaseline<R>};
  return chosen;
}

float Scale(float rate) { return 1.0f / (1.0f - rate); }

tensorflow::Status CheckRate(float rate) {
  if (!(rate >= 0.0f && rate < 1.0f)) return errors::InvalidArgument("rate must be in [0, 1), got ", rate);
  return tensorflow::OkStatus();
}

// Both ops' `rate` attribute, read and checked once at construction.
class RateKernel : public OpKernel {
 public:
  explicit RateKernel(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("rate", &rate_));
    OP_REQUIRES_OK(context, CheckRate(rate_));
  }

 protected:
  float rate_ = 0.0f;
};

template <typename T>
class BiasReluDropoutOp : public RateKernel {
 public:
  using RateKernel::RateKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& bias = context->input(1);
    const Tensor& key = context->input(2);
    const Tensor& row_ids = context->input(3);
    OP_REQUIRES(context, x.dims() == 2, errors::InvalidArgument("x must be [rows, units], got ", x.shape().DebugString()));
    const int64_t rows = x.dim_size(0), cols = x.dim_size(1);
    OP_REQUIRES(context, bias.dims() == 1 && bias.dim_size(0) == cols,
                errors::InvalidArgument("bias must be [", cols, "], got ", bias.shape().DebugString()));
    OP_REQUIRES(context, key.dims() == 1 && key.dim_size(0) == 2,
                errors::InvalidArgument("key must be two int64 words, got ", key.shape().DebugString()));
    OP_REQUIRES(context, row_ids.dims() == 1 && row_ids.dim_size(0) == rows,
                errors::InvalidArgument("row_ids must be [", rows, "], got ", row_ids.shape().DebugString()));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));

    std::vector<float> bias_values(cols);
    const auto* bias_data = RawData<T>(bias);
    for (int64_t j = 0; j < cols; ++j) bias_values[j] = Load(bias_data, j);
    const uint32_t k0 = static_cast<uint32_t>(key.flat<int64_t>()(0));
    const uint32_t k1 = static_cast<uint32_t>(key.flat<int64_t>()(1));
    const uint32_t threshold = Threshold(rate_);
    const float scale = Scale(rate_);
    const auto* in = RawData<T>(x);
    auto* out = RawData<T>(y);
    const int64_t* ids = row_ids.flat<int64_t>().data();
    const float* b = bias_values.data();
    const auto forward = ChosenRowLoops<typename Raw<T>::type>().forward;

    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        forward(in + i * cols, out + i * cols, b, cols, RowHash(ids[i], k0) ^ k1, threshold, scale);
      }
    };
    const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(workers.num_threads, workers.workers, rows, 12 * cols, work);
  }
};

template <typename T>
class BiasReluDropoutGradOp : public RateKernel {
 public:
  using RateKernel::RateKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& y = context->input(1);
    OP_REQUIRES(context, dy.dims() == 2 && dy.shape() == y.shape(),
                errors::InvalidArgument("dy and y must be the same [rows, units], got ", dy.shape().DebugString(),
                                        " and ", y.shape().DebugString()));
    const int64_t rows = dy.dim_size(0), cols = dy.dim_size(1);
    Tensor* dx = nullptr;
    Tensor* dbias = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, dy.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({cols}), &dbias));
    const float scale = Scale(rate_);
    const auto* grad = RawData<T>(dy);
    const auto* out = RawData<T>(y);
    auto* result = RawData<T>(dx);

    // One float32 column-sum buffer per part; the parts own disjoint row ranges.
    const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(workers.num_threads, rows / 64));
    std::vector<float> sums(parts * cols, 0.0f);
    const auto backward = ChosenRowLoops<typename Raw<T>::type>().backward;
    auto work = [&](int64_t first_part, int64_t last_part) {
      for (int64_t part = first_part; part < last_part; ++part) {
        float* sum = sums.data() + part * cols;
        for (int64_t i = rows * part / parts; i < rows * (part + 1) / parts; ++i) {
          backward(grad + i * cols, out + i * cols, result + i * cols, sum, cols, scale);
        }
      }
    };
    workers.workers->ParallelFor(parts, rows * cols * 8, work);
    auto* bias_grad = RawData<T>(dbias);
    for (int64_t j = 0; j < cols; ++j) {
      float total = 0.0f;
      for (int64_t part = 0; part < parts; ++part) total += sums[part * cols + j];
      Store(bias_grad, j, total);
    }
  }

};

#define REGISTER_RELU_DROPOUT(T)                                                                     \
  REGISTER_KERNEL_BUILDER(Name("BiasReluDropout").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          BiasReluDropoutOp<T>);                                                     \
  REGISTER_KERNEL_BUILDER(Name("BiasReluDropoutGrad").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          BiasReluDropoutGradOp<T>);
REGISTER_RELU_DROPOUT(float)
REGISTER_RELU_DROPOUT(tensorflow::bfloat16)
#undef REGISTER_RELU_DROPOUT

}  // namespace
}  // namespace relu_dropout

// CPU kernels of DotBasedInteract / DotBasedInteractGrad (float and half).
//
// Work is split over the batch with TF's intra-op thread pool (Shard); one sample (F x D) fits
// in L1, so each sample is computed in fp32 with 8-float SIMD vectors (GCC vector extensions)
// and compiled for several x86-64 levels (target_clones), chosen at load time by the CPU.
// Half inputs are widened to fp32 per sample and results rounded once at the end.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dot_based_interact_kernels.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace dot_based_interact {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
#define DBI_MULTIVERSIONED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DBI_MULTIVERSIONED
#endif
// Helpers are forced inline so that each multiversioned clone gets them at its own ISA level.
#define DBI_INLINE inline __attribute__((always_inline))

constexpr int kLanes = 8;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

DBI_INLINE Vec Load(const float* source) {
  Vec value;
  std::memcpy(&value, source, sizeof(value));
  return value;
}

DBI_INLINE void Store(float* destination, Vec value) { std::memcpy(destination, &value, sizeof(value)); }

DBI_INLINE float HorizontalSum(Vec value) {
  float sum = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) sum += value[lane];
  return sum;
}

// Dot products of row `a` with the `kRows` consecutive rows starting at `b` (row stride `dim`).
template <int kRows>
DBI_INLINE void DotRows(const float* a, const float* b, int64_t dim, float* results) {
  Vec sums[kRows] = {};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    const Vec a_chunk = Load(a + d);
    for (int row = 0; row < kRows; ++row) sums[row] += a_chunk * Load(b + row * dim + d);
  }
  for (int row = 0; row < kRows; ++row) {
    float sum = HorizontalSum(sums[row]);
    for (int64_t tail = d; tail < dim; ++tail) sum += a[tail] * b[row * dim + tail];
    results[row] = sum;
  }
}

// pairs[PairColumn(0, i, j)] = dot(x_i, x_j) for all i > j, from one [F, D] fp32 sample.
DBI_MULTIVERSIONED
void SamplePairs(const float* sample, int64_t num_vectors, int64_t dim, float* pairs) {
  constexpr int kBlock = 4;
  for (int64_t i = 1; i < num_vectors; ++i) {
    const float* row_i = sample + i * dim;
    float* row_pairs = pairs + NumPairs(i);
    int64_t j = 0;
    for (; j + kBlock <= i; j += kBlock) DotRows<kBlock>(row_i, sample + j * dim, dim, row_pairs + j);
    for (; j < i; ++j) DotRows<1>(row_i, sample + j * dim, dim, row_pairs + j);
  }
}

// grad_i = sum over j != i of g_ij x_j for one [F, D] fp32 sample; `pair_grads` holds g_ij
// (i > j) in PairColumn order. Row i is complete once the loop has passed it.
DBI_MULTIVERSIONED
void SampleGrad(const float* sample, const float* pair_grads, int64_t num_vectors, int64_t dim, float* grad) {
  std::fill(grad, grad + dim, 0.0f);
  for (int64_t i = 1; i < num_vectors; ++i) {
    const float* row_i = sample + i * dim;
    const float* coefficients = pair_grads + NumPairs(i);
    float* grad_i = grad + i * dim;
    int64_t d = 0;
    for (; d + kLanes <= dim; d += kLanes) {
      const Vec x_i = Load(row_i + d);
      Vec sum = {};
      for (int64_t j = 0; j < i; ++j) {
        sum += coefficients[j] * Load(sample + j * dim + d);
        Store(grad + j * dim + d, Load(grad + j * dim + d) + coefficients[j] * x_i);
      }
      Store(grad_i + d, sum);
    }
    for (; d < dim; ++d) {
      float sum = 0.0f;
      for (int64_t j = 0; j < i; ++j) {
        sum += coefficients[j] * sample[j * dim + d];
        grad[j * dim + d] += coefficients[j] * row_i[d];
      }
      grad_i[d] = sum;
    }
  }
}

// fp32 view of `count` values: `values` itself for float, else widened into `scratch`.
template <typename T>
const float* AsFloat(const T* values, int64_t count, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return values;
  } else {
    std::transform(values, values + count, scratch, [](T value) { return static_cast<float>(value); });
    return scratch;
  }
}

template <typename T>
void StoreAs(const float* values, int64_t count, T* destination) {
  std::transform(values, values + count, destination, [](float value) { return static_cast<T>(value); });
}

// Runs `per_sample(begin, end)` over the batch on TF's intra-op thread pool.
template <typename Work>
void ShardBatch(tensorflow::OpKernelContext* context, const InteractShape& shape, Work per_sample) {
  const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
  const int64_t cost_per_sample = shape.num_vectors * shape.num_vectors * shape.dim;
  tensorflow::Shard(workers.num_threads, workers.workers, shape.batch, cost_per_sample, per_sample);
}

}  // namespace

template <typename T>
struct DotBasedInteractFunctor<Eigen::ThreadPoolDevice, T> {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, const T* input,
                  T* output) const {
    const int64_t sample_size = shape.num_vectors * shape.dim;
    const int64_t num_pairs = NumPairs(shape.num_vectors);
    ShardBatch(context, shape, [&](int64_t begin, int64_t end) {
      std::vector<float> widened(std::is_same_v<T, float> ? 0 : sample_size);
      std::vector<float> pairs(num_pairs);
      for (int64_t b = begin; b < end; ++b) {
        const T* sample = input + b * sample_size;
        T* row = output + b * shape.output_width;
        SamplePairs(AsFloat(sample, sample_size, widened.data()), shape.num_vectors, shape.dim, pairs.data());
        std::copy(sample, sample + shape.dim, row);
        StoreAs(pairs.data(), num_pairs, row + shape.dim);
        std::fill(row + shape.dim + num_pairs, row + shape.output_width, T(0.0f));
      }
    });
  }
};

template <typename T>
struct DotBasedInteractGradFunctor<Eigen::ThreadPoolDevice, T> {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, const T* input,
                  const T* upstream_grad, T* grad, T* bottom_mlp_grad) const {
    const int64_t sample_size = shape.num_vectors * shape.dim;
    const int64_t num_pairs = NumPairs(shape.num_vectors);
    ShardBatch(context, shape, [&](int64_t begin, int64_t end) {
      std::vector<float> widened(std::is_same_v<T, float> ? 0 : sample_size + num_pairs);
      std::vector<float> sample_grad(std::is_same_v<T, float> ? 0 : sample_size);
      for (int64_t b = begin; b < end; ++b) {
        const T* upstream_row = upstream_grad + b * shape.output_width;
        std::copy(upstream_row, upstream_row + shape.dim, bottom_mlp_grad + b * shape.dim);
        const float* sample = AsFloat(input + b * sample_size, sample_size, widened.data());
        const float* pair_grads = AsFloat(upstream_row + shape.dim, num_pairs, widened.data() + sample_size);
        if constexpr (std::is_same_v<T, float>) {
          SampleGrad(sample, pair_grads, shape.num_vectors, shape.dim, grad + b * sample_size);
        } else {
          SampleGrad(sample, pair_grads, shape.num_vectors, shape.dim, sample_grad.data());
          StoreAs(sample_grad.data(), sample_size, grad + b * sample_size);
        }
      }
    });
  }
};

#define DBI_REGISTER_CPU(T)                                                                            \
  REGISTER_KERNEL_BUILDER(Name("DotBasedInteract").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          DotBasedInteractOp<Eigen::ThreadPoolDevice, T>);                             \
  REGISTER_KERNEL_BUILDER(                                                                             \
      Name("DotBasedInteractGrad").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),              \
      DotBasedInteractGradOp<Eigen::ThreadPoolDevice, T>);

DBI_REGISTER_CPU(float);
DBI_REGISTER_CPU(Eigen::half);

#undef DBI_REGISTER_CPU

}  // namespace dot_based_interact

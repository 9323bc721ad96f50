// CUDA kernels of the dot interaction: a general SIMT kernel (fp32 math, any F and D) and
// WMMA tensor-core kernels (TF32 for float, fp16 with fp32 accumulation for half) for
// F <= 32 and D <= 128. One thread block handles one sample. Includes CUDA headers only.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <type_traits>

#include "dot_based_interact_launchers.h"

namespace dot_based_interact {
namespace cuda {
namespace {

using namespace nvcuda;

constexpr int kThreads = 128;  // 4 warps per block

__device__ __forceinline__ float ToFloat(float value) { return value; }
__device__ __forceinline__ float ToFloat(__half value) { return __half2float(value); }
template <typename T>
__device__ __forceinline__ T FromFloat(float value);
template <>
__device__ __forceinline__ float FromFloat<float>(float value) { return value; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float value) { return __float2half_rn(value); }

// Upstream gradient of dot(x_k, x_p), k != p, in a sample's upstream row.
template <typename T>
__device__ __forceinline__ float PairGrad(const T* upstream_row, int64_t dim, int64_t k, int64_t p) {
  return k > p ? ToFloat(upstream_row[PairColumn(dim, k, p)]) : ToFloat(upstream_row[PairColumn(dim, p, k)]);
}

// (i, j), i > j, of the p-th strictly-lower pair in row-major order. A float estimate of the
// row (no FP64 on the hot path) is corrected exactly by the two loops.
__device__ __forceinline__ void PairOfIndex(int64_t p, int64_t* i, int64_t* j) {
  int64_t row = static_cast<int64_t>((1.0f + sqrtf(1.0f + 8.0f * static_cast<float>(p))) * 0.5f);
  while (NumPairs(row) > p) --row;
  while (NumPairs(row + 1) <= p) ++row;
  *i = row;
  *j = p - NumPairs(row);
}

// ---- SIMT kernels: any shape, fp32 arithmetic, global loads (a sample stays in L1) ----------

// Writes one output row: row 0 of the sample, pair_value(i, j) for each pair, zero padding.
template <typename T, typename PairValue>
__device__ void WriteOutputRow(const InteractShape& shape, const T* row0, PairValue pair_value, T* row) {
  const int64_t pairs_end = shape.dim + NumPairs(shape.num_vectors);
  for (int64_t column = threadIdx.x; column < shape.output_width; column += blockDim.x) {
    if (column < shape.dim) {
      row[column] = row0[column];
    } else if (column < pairs_end) {
      int64_t i, j;
      PairOfIndex(column - shape.dim, &i, &j);
      row[column] = FromFloat<T>(pair_value(i, j));
    } else {
      row[column] = FromFloat<T>(0.0f);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ForwardSimtKernel(InteractShape shape, const T* __restrict__ input,
                                                              T* __restrict__ output) {
  const T* sample = input + blockIdx.x * shape.num_vectors * shape.dim;
  const auto dot = [&](int64_t i, int64_t j) {
    float sum = 0.0f;
    for (int64_t d = 0; d < shape.dim; ++d) sum += ToFloat(sample[i * shape.dim + d]) * ToFloat(sample[j * shape.dim + d]);
    return sum;
  };
  WriteOutputRow(shape, sample, dot, output + blockIdx.x * shape.output_width);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    BackwardSimtKernel(InteractShape shape, bool fold_bottom_mlp_grad, const T* __restrict__ input,
                       const T* __restrict__ upstream_grad, T* __restrict__ grad, T* __restrict__ bottom_mlp_grad) {
  const int64_t sample_size = shape.num_vectors * shape.dim;
  const T* sample = input + blockIdx.x * sample_size;
  const T* upstream_row = upstream_grad + blockIdx.x * shape.output_width;
  for (int64_t element = threadIdx.x; element < sample_size; element += blockDim.x) {
    const int64_t k = element / shape.dim;
    const int64_t d = element % shape.dim;
    float sum = (fold_bottom_mlp_grad && k == 0) ? ToFloat(upstream_row[d]) : 0.0f;
    for (int64_t p = 0; p < shape.num_vectors; ++p) {
      if (p != k) sum += PairGrad(upstream_row, shape.dim, k, p) * ToFloat(sample[p * shape.dim + d]);
    }
    grad[blockIdx.x * sample_size + element] = FromFloat<T>(sum);
  }
  for (int64_t d = threadIdx.x; d < shape.dim; d += blockDim.x) {
    bottom_mlp_grad[blockIdx.x * shape.dim + d] = upstream_row[d];
  }
}

// ---- tensor-core kernels: F <= 32, D <= 128 ---------------------------------------------------

// WMMA with TF32 operands exists from sm_80 (Ampere) on. For older targets (sm_70, sm_75) the
// tensor-core kernels are stubs that trap: ChooseKernel never launches them below compute 8.0.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16;                        // WMMA tiles are 16 x 16
constexpr int kTileRows = kTensorCoreMaxVectors;  // vectors padded to 2 tiles
constexpr int kGramStride = kTileRows + 4;       // fp32 rows; +4 keeps 32-byte tile alignment
constexpr int kResultStride = kTensorCoreMaxDim + 4;

// WMMA operand types per element type: fp16 (k = 16) or TF32 from fp32 storage (k = 8).
template <typename T>
struct Mma;

template <>
struct Mma<__half> {
  static constexpr int kK = 16;
  static constexpr int kSkew = 8;  // halves; rows stay 32-byte aligned, banks spread
  template <typename Use, typename Layout>
  using Operand = wmma::fragment<Use, kTile, kTile, kK, __half, Layout>;
  template <typename Fragment>
  __device__ static void Load(Fragment& fragment, const __half* source, unsigned stride) {
    wmma::load_matrix_sync(fragment, source, stride);
  }
};

template <>
struct Mma<float> {
  static constexpr int kK = 8;
  static constexpr int kSkew = 4;  // floats
  template <typename Use, typename Layout>
  using Operand = wmma::fragment<Use, kTile, kTile, kK, wmma::precision::tf32, Layout>;
  template <typename Fragment>
  __device__ static void Load(Fragment& fragment, const float* source, unsigned stride) {
    wmma::load_matrix_sync(fragment, source, stride);
    for (int t = 0; t < fragment.num_elements; ++t) fragment.x[t] = wmma::__float_to_tf32(fragment.x[t]);
  }
};

template <typename T>
constexpr int kSampleStride = kTensorCoreMaxDim + Mma<T>::kSkew;

// out (16 x 16 fp32, row-major) = A (16 x k_extent, row-major) * B (k_extent x 16); B is read
// col-major (B = X^T: consecutive k contiguous) or row-major (B = X), per BLayout.
template <typename T, typename BLayout>
__device__ void TileProduct(const T* a, unsigned a_stride, const T* b, unsigned b_stride, int k_extent, float* out,
                            unsigned out_stride) {
  typename Mma<T>::template Operand<wmma::matrix_a, wmma::row_major> a_fragment;
  typename Mma<T>::template Operand<wmma::matrix_b, BLayout> b_fragment;
  wmma::fragment<wmma::accumulator, kTile, kTile, Mma<T>::kK, float> sum;
  wmma::fill_fragment(sum, 0.0f);
  constexpr bool kBColMajor = std::is_same<BLayout, wmma::col_major>::value;
  for (int k = 0; k < k_extent; k += Mma<T>::kK) {
    Mma<T>::Load(a_fragment, a + k, a_stride);
    Mma<T>::Load(b_fragment, kBColMajor ? b + k : b + k * b_stride, b_stride);
    wmma::mma_sync(sum, a_fragment, b_fragment, sum);
  }
  wmma::store_matrix_sync(out, sum, out_stride, wmma::mem_row_major);
}

// Copies one [F, D] sample into a zero-padded [32, padded_dim] shared tile.
template <typename T>
__device__ void LoadSampleTile(const T* sample, const InteractShape& shape, int padded_dim, T* tile) {
  for (int element = threadIdx.x; element < kTileRows * padded_dim; element += blockDim.x) {
    const int row = element / padded_dim;
    const int column = element % padded_dim;
    const bool inside = row < shape.num_vectors && column < shape.dim;
    tile[row * kSampleStride<T> + column] = inside ? sample[row * shape.dim + column] : FromFloat<T>(0.0f);
  }
}

__host__ __device__ constexpr int PaddedDim(int64_t dim) { return static_cast<int>((dim + kTile - 1) / kTile * kTile); }

template <typename T>
__global__ void __launch_bounds__(kThreads) ForwardTensorCoreKernel(InteractShape shape, const T* __restrict__ input,
                                                                    T* __restrict__ output) {
  __shared__ __align__(32) T sample_tile[kTileRows * kSampleStride<T>];
  __shared__ __align__(32) float gram[kTileRows * kGramStride];
  const int padded_dim = PaddedDim(shape.dim);
  const T* sample = input + blockIdx.x * shape.num_vectors * shape.dim;
  LoadSampleTile(sample, shape, padded_dim, sample_tile);
  __syncthreads();
  // The lower Gram tiles (0,0), (1,0), (1,1); the upper tile (0,1) is never read.
  const int warp = threadIdx.x / 32;
  if (warp < 3) {
    const int tile_row = warp == 0 ? 0 : 1;
    const int tile_column = warp == 1 ? 0 : tile_row;
    TileProduct<T, wmma::col_major>(sample_tile + tile_row * kTile * kSampleStride<T>, kSampleStride<T>,
                                    sample_tile + tile_column * kTile * kSampleStride<T>, kSampleStride<T>,
                                    padded_dim, gram + tile_row * kTile * kGramStride + tile_column * kTile,
                                    kGramStride);
  }
  __syncthreads();
  const auto gram_entry = [&](int64_t i, int64_t j) { return gram[i * kGramStride + j]; };
  WriteOutputRow(shape, sample_tile, gram_entry, output + blockIdx.x * shape.output_width);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    BackwardTensorCoreKernel(InteractShape shape, bool fold_bottom_mlp_grad, const T* __restrict__ input,
                             const T* __restrict__ upstream_grad, T* __restrict__ grad,
                             T* __restrict__ bottom_mlp_grad) {
  constexpr int kCoefficientStride = kTileRows + Mma<T>::kSkew;
  __shared__ __align__(32) T sample_tile[kTileRows * kSampleStride<T>];
  __shared__ __align__(32) T coefficients[kTileRows * kCoefficientStride];  // symmetric S, zero diagonal
  __shared__ __align__(32) float result[kTileRows * kResultStride];
  const int padded_dim = PaddedDim(shape.dim);
  const int64_t sample_size = shape.num_vectors * shape.dim;
  const T* upstream_row = upstream_grad + blockIdx.x * shape.output_width;
  LoadSampleTile(input + blockIdx.x * sample_size, shape, padded_dim, sample_tile);
  for (int element = threadIdx.x; element < kTileRows * kTileRows; element += blockDim.x) {
    const int k = element / kTileRows;
    const int p = element % kTileRows;
    const bool inside = k < shape.num_vectors && p < shape.num_vectors && k != p;
    coefficients[k * kCoefficientStride + p] = inside ? FromFloat<T>(PairGrad(upstream_row, shape.dim, k, p))
                                                      : FromFloat<T>(0.0f);
  }
  __syncthreads();
  const int column_tiles = padded_dim / kTile;
  for (int tile = threadIdx.x / 32; tile < 2 * column_tiles; tile += kWarps) {
    const int tile_row = tile / column_tiles;
    const int tile_column = tile % column_tiles;
    TileProduct<T, wmma::row_major>(coefficients + tile_row * kTile * kCoefficientStride, kCoefficientStride,
                                    sample_tile + tile_column * kTile, kSampleStride<T>, kTileRows,
                                    result + tile_row * kTile * kResultStride + tile_column * kTile, kResultStride);
  }
  __syncthreads();
  for (int64_t element = threadIdx.x; element < sample_size; element += blockDim.x) {
    const int64_t k = element / shape.dim;
    const int64_t d = element % shape.dim;
    float sum = result[k * kResultStride + d];
    if (fold_bottom_mlp_grad && k == 0) sum += ToFloat(upstream_row[d]);
    grad[blockIdx.x * sample_size + element] = FromFloat<T>(sum);
  }
  for (int64_t d = threadIdx.x; d < shape.dim; d += blockDim.x) {
    bottom_mlp_grad[blockIdx.x * shape.dim + d] = upstream_row[d];
  }
}

#else

template <typename T>
__global__ void __launch_bounds__(kThreads) ForwardTensorCoreKernel(InteractShape, const T* __restrict__,
                                                                    T* __restrict__) {
  __trap();
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    BackwardTensorCoreKernel(InteractShape, bool, const T* __restrict__, const T* __restrict__, T* __restrict__,
                             T* __restrict__) {
  __trap();
}

#endif  // tensor-core kernels

// ---- dispatch ----------------------------------------------------------------------------------

bool FitsTensorCores(const InteractShape& shape) {
  return shape.num_vectors <= kTensorCoreMaxVectors && shape.dim <= kTensorCoreMaxDim;
}

int ComputeCapabilityMajor() {
  int device = 0;
  int major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}

template <typename T>
KernelKind ChooseKernel(const InteractShape& shape, bool allow_tf32) {
  // The tensor-core kernels hold code for sm_80 and newer only (see their #if).
  const bool tensor_cores = FitsTensorCores(shape) && ComputeCapabilityMajor() >= 8;
  if (std::is_same<T, __half>::value) return tensor_cores ? KernelKind::kFp16TensorCore : KernelKind::kSimt;
  return tensor_cores && allow_tf32 ? KernelKind::kTf32TensorCore : KernelKind::kSimt;
}

LaunchResult Finish(KernelKind kernel) {
  const cudaError_t status = cudaGetLastError();
  return {kernel, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

template <typename T>
LaunchResult Forward(const InteractShape& shape, const T* input, T* output, bool allow_tf32, cudaStream_t stream) {
  const KernelKind kernel = ChooseKernel<T>(shape, allow_tf32);
  const dim3 grid(static_cast<unsigned>(shape.batch));
  if (kernel == KernelKind::kSimt) {
    ForwardSimtKernel<T><<<grid, kThreads, 0, stream>>>(shape, input, output);
  } else {
    ForwardTensorCoreKernel<T><<<grid, kThreads, 0, stream>>>(shape, input, output);
  }
  return Finish(kernel);
}

template <typename T>
LaunchResult Backward(const InteractShape& shape, bool fold_bottom_mlp_grad, const T* input, const T* upstream_grad,
                      T* grad, T* bottom_mlp_grad, bool allow_tf32, cudaStream_t stream) {
  const KernelKind kernel = ChooseKernel<T>(shape, allow_tf32);
  const dim3 grid(static_cast<unsigned>(shape.batch));
  if (kernel == KernelKind::kSimt) {
    BackwardSimtKernel<T><<<grid, kThreads, 0, stream>>>(shape, fold_bottom_mlp_grad, input, upstream_grad, grad,
                                                         bottom_mlp_grad);
  } else {
    BackwardTensorCoreKernel<T><<<grid, kThreads, 0, stream>>>(shape, fold_bottom_mlp_grad, input, upstream_grad,
                                                               grad, bottom_mlp_grad);
  }
  return Finish(kernel);
}

const __half* AsCuda(const Half* values) { return reinterpret_cast<const __half*>(values); }
__half* AsCuda(Half* values) { return reinterpret_cast<__half*>(values); }

}  // namespace

const char* KernelName(KernelKind kernel) {
  switch (kernel) {
    case KernelKind::kSimt:
      return "simt_fp32";
    case KernelKind::kTf32TensorCore:
      return "tensor_core_tf32";
    case KernelKind::kFp16TensorCore:
      return "tensor_core_fp16";
  }
  return "unknown";
}

LaunchResult LaunchForward(const InteractShape& shape, const float* input, float* output, bool allow_tf32,
                           CUstream_st* stream) {
  return Forward(shape, input, output, allow_tf32, stream);
}

LaunchResult LaunchForward(const InteractShape& shape, const Half* input, Half* output, bool allow_tf32,
                           CUstream_st* stream) {
  return Forward(shape, AsCuda(input), AsCuda(output), allow_tf32, stream);
}

LaunchResult LaunchBackward(const InteractShape& shape, bool fold_bottom_mlp_grad, const float* input,
                            const float* upstream_grad, float* grad, float* bottom_mlp_grad, bool allow_tf32,
                            CUstream_st* stream) {
  return Backward(shape, fold_bottom_mlp_grad, input, upstream_grad, grad, bottom_mlp_grad, allow_tf32, stream);
}

LaunchResult LaunchBackward(const InteractShape& shape, bool fold_bottom_mlp_grad, const Half* input,
                            const Half* upstream_grad, Half* grad, Half* bottom_mlp_grad, bool allow_tf32,
                            CUstream_st* stream) {
  return Backward(shape, fold_bottom_mlp_grad, AsCuda(input), AsCuda(upstream_grad), AsCuda(grad),
                  AsCuda(bottom_mlp_grad), allow_tf32, stream);
}

}  // namespace cuda
}  // namespace dot_based_interact

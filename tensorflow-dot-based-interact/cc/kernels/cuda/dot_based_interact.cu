// CUDA kernels of the dot interaction, one warp per sample and kSamplesPerBlock samples per block
// (kernel_layout.h):
// * tensor-core kernels (WMMA with fp32 accumulation: fp16 for half; TF32 for float when TF32
//   is allowed, else 3xTF32) for the shapes of FitsTensorCores: the sample is staged in shared
//   memory 64 columns at a time with 16-byte loads, the output row is assembled in shared memory
//   and written with 16-byte stores;
// * a general SIMT kernel (fp32 arithmetic, any F and D) for every other shape and for GPUs
//   older than compute 8.0.
// No kernel finds a pair from its column: pairs are enumerated row by row, (i, j) for j < i, so
// column D + i(i-1)/2 + j is integer arithmetic. Includes CUDA headers only.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <type_traits>

#include "dot_based_interact_launchers.h"

namespace dot_based_interact {
namespace cuda {
namespace {

using namespace nvcuda;

constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ float ToFloat(float value) { return value; }
__device__ __forceinline__ float ToFloat(__half value) { return __half2float(value); }
template <typename T>
__device__ __forceinline__ T FromFloat(float value);
template <>
__device__ __forceinline__ float FromFloat<float>(float value) { return value; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float value) { return __float2half_rn(value); }

__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x) % kWarpSize; }
__device__ __forceinline__ int WarpInBlock() { return static_cast<int>(threadIdx.x) / kWarpSize; }
// The sample of this thread's warp.
__device__ __forceinline__ int64_t WarpSample() {
  return static_cast<int64_t>(blockIdx.x) * kSamplesPerBlock + WarpInBlock();
}

// ---- general SIMT kernels: any F and D, fp32 arithmetic ------------------------------------
// Lanes split the columns: lane l owns columns 4l..4l+3 of every 128-column step, so each load
// instruction of a warp reads consecutive memory. Rows are re-read through L1, where a sample
// stays while its warp works on it.

constexpr int kLaneColumns = 4;
constexpr int kStepColumns = kLaneColumns * kWarpSize;

// Four consecutive elements, loaded or stored as one 8- (half) or 16-byte (float) vector.
template <typename T>
struct alignas(kLaneColumns * sizeof(T)) Quad {
  T values[kLaneColumns];
};

// row[column .. column + 3] as fp32; `vector` when D is a multiple of 4 and the buffers are
// Quad-aligned, else guarded scalar loads (zero past `dim`).
template <typename T>
__device__ __forceinline__ void LoadFour(const T* row, int64_t column, int64_t dim, bool vector,
                                         float (&out)[kLaneColumns]) {
  if (vector) {
    const Quad<T> quad = *reinterpret_cast<const Quad<T>*>(row + column);
#pragma unroll
    for (int c = 0; c < kLaneColumns; ++c) out[c] = ToFloat(quad.values[c]);
  } else {
#pragma unroll
    for (int c = 0; c < kLaneColumns; ++c) out[c] = column + c < dim ? ToFloat(row[column + c]) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ void StoreFour(T* row, int64_t column, int64_t dim, bool vector,
                                          const float (&values)[kLaneColumns]) {
  if (vector) {
    Quad<T> quad;
#pragma unroll
    for (int c = 0; c < kLaneColumns; ++c) quad.values[c] = FromFloat<T>(values[c]);
    *reinterpret_cast<Quad<T>*>(row + column) = quad;
  } else {
#pragma unroll
    for (int c = 0; c < kLaneColumns; ++c) {
      if (column + c < dim) row[column + c] = FromFloat<T>(values[c]);
    }
  }
}

// Copies `dim` elements with the whole warp.
template <typename T>
__device__ void CopyRow(const T* source, T* target, int64_t dim, bool vector, int lane) {
  for (int64_t column = lane * kLaneColumns; column < dim; column += kStepColumns) {
    float values[kLaneColumns];
    LoadFour(source, column, dim, vector, values);
    StoreFour(target, column, dim, vector, values);
  }
}

// The sum over the warp, in every lane.
__device__ __forceinline__ float WarpSum(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullWarp, value, offset);
  return value;
}

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ForwardSimtKernel(InteractShape shape, bool vector, const T* __restrict__ input, T* __restrict__ output) {
  const int64_t sample = WarpSample();
  if (sample >= shape.batch) return;  // warp-uniform
  const int lane = Lane();
  const int64_t dim = shape.dim;
  const T* values = input + sample * shape.num_vectors * dim;
  T* row = output + sample * shape.output_width;
  CopyRow(values, row, dim, vector, lane);
  // Pair p's dot lands in lane p % 32 and each group of 32 is written with one coalesced store.
  T* pair_row = row + dim;
  const int64_t pair_columns = shape.output_width - dim;
  int filled = 0;
  float mine = 0.0f;
  int64_t group = 0;
  for (int64_t i = 1; i < shape.num_vectors; ++i) {
    const T* row_i = values + i * dim;
    for (int64_t j = 0; j < i; ++j) {
      const T* row_j = values + j * dim;
      float partial = 0.0f;
      for (int64_t column = lane * kLaneColumns; column < dim; column += kStepColumns) {
        float a[kLaneColumns], b[kLaneColumns];
        LoadFour(row_i, column, dim, vector, a);
        LoadFour(row_j, column, dim, vector, b);
#pragma unroll
        for (int c = 0; c < kLaneColumns; ++c) partial = fmaf(a[c], b[c], partial);
      }
      const float dot = WarpSum(partial);
      if (lane == filled) mine = dot;
      if (++filled == kWarpSize) {
        pair_row[group + lane] = FromFloat<T>(mine);
        group += kWarpSize;
        filled = 0;
      }
    }
  }
  // The last partial group, then the zero padding.
  for (; group < pair_columns; group += kWarpSize) {
    if (group + lane < pair_columns) pair_row[group + lane] = FromFloat<T>(lane < filled ? mine : 0.0f);
    filled = 0;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    BackwardSimtKernel(InteractShape shape, bool vector, bool fold_bottom_mlp_grad, const T* __restrict__ input,
                       const T* __restrict__ upstream_grad, T* __restrict__ grad, T* __restrict__ bottom_mlp_grad) {
  const int64_t sample = WarpSample();
  if (sample >= shape.batch) return;
  const int lane = Lane();
  const int64_t dim = shape.dim;
  const int64_t num_vectors = shape.num_vectors;
  const T* values = input + sample * num_vectors * dim;
  const T* upstream_row = upstream_grad + sample * shape.output_width;
  T* grad_rows = grad + sample * num_vectors * dim;
  CopyRow(upstream_row, bottom_mlp_grad + sample * dim, dim, vector, lane);
  for (int64_t k = 0; k < num_vectors; ++k) {
    for (int64_t column = lane * kLaneColumns; column < dim; column += kStepColumns) {
      float sum[kLaneColumns] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (fold_bottom_mlp_grad && k == 0) LoadFour(upstream_row, column, dim, vector, sum);
      for (int64_t p = 0; p < num_vectors; ++p) {
        if (p == k) continue;
        const float coefficient = ToFloat(upstream_row[k > p ? PairColumn(dim, k, p) : PairColumn(dim, p, k)]);
        float partner[kLaneColumns];
        LoadFour(values + p * dim, column, dim, vector, partner);
#pragma unroll
        for (int c = 0; c < kLaneColumns; ++c) sum[c] = fmaf(coefficient, partner[c], sum[c]);
      }
      StoreFour(grad_rows + k * dim, column, dim, vector, sum);
    }
  }
}

// ---- tensor-core kernels ----------------------------------------------------------------------

// WMMA with TF32 operands exists from sm_80 (Ampere) on. For older targets (sm_70, sm_75) the
// tensor-core kernels are stubs that trap: the dispatcher never launches them below compute 8.0.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

// How a kernel's operands reach the tensor cores, always with fp32 accumulation. Each k step
// is 32 bytes of operands, as TensorCoreLayout::k_step says.
// * Fp16Operands: half operands, WMMA 16x16x16.
// * Tf32Operands: float rounded to TF32 (10 mantissa bits), WMMA 16x16x8; float when TF32 is
//   allowed.
// * SplitTf32Operands ("3xTF32"): float split into a TF32 head and a TF32 tail (x - head) and
//   multiplied as tail*head + head*tail + head*head, which keeps about 21 of fp32's 24 mantissa
//   bits per product; float when TF32 is not allowed.
template <typename ElementType, typename Stored>
struct OperandTypes {
  using Element = ElementType;
  static constexpr int kK = 32 / sizeof(ElementType);
  using Sum = wmma::fragment<wmma::accumulator, kTile, kTile, kK, float>;
  template <typename Use, typename Layout>
  using Fragment = wmma::fragment<Use, kTile, kTile, kK, Stored, Layout>;
};

// One fragment per operand: fp16 as loaded, TF32 rounded after loading.
template <typename ElementType, typename Stored>
struct WholeOperands : OperandTypes<ElementType, Stored> {
  using Types = OperandTypes<ElementType, Stored>;
  template <typename Use, typename Layout>
  struct Operand {
    typename Types::template Fragment<Use, Layout> value;
  };
  template <typename Use, typename Layout>
  __device__ static void Load(Operand<Use, Layout>& operand, const ElementType* source, unsigned stride) {
    wmma::load_matrix_sync(operand.value, source, stride);
    if constexpr (std::is_same<Stored, wmma::precision::tf32>::value) {
#pragma unroll
      for (int t = 0; t < operand.value.num_elements; ++t) {
        operand.value.x[t] = wmma::__float_to_tf32(operand.value.x[t]);
      }
    }
  }
  template <typename LayoutA, typename LayoutB>
  __device__ static void Multiply(typename Types::Sum& sum, const Operand<wmma::matrix_a, LayoutA>& a,
                                  const Operand<wmma::matrix_b, LayoutB>& b) {
    wmma::mma_sync(sum, a.value, b.value, sum);
  }
};

using Fp16Operands = WholeOperands<__half, __half>;
using Tf32Operands = WholeOperands<float, wmma::precision::tf32>;

struct SplitTf32Operands : OperandTypes<float, wmma::precision::tf32> {
  template <typename Use, typename Layout>
  struct Operand {
    Fragment<Use, Layout> head, tail;
  };
  template <typename Use, typename Layout>
  __device__ static void Load(Operand<Use, Layout>& operand, const float* source, unsigned stride) {
    wmma::load_matrix_sync(operand.head, source, stride);
#pragma unroll
    for (int t = 0; t < operand.head.num_elements; ++t) {
      const float value = operand.head.x[t];
      operand.head.x[t] = wmma::__float_to_tf32(value);
      operand.tail.x[t] = wmma::__float_to_tf32(value - operand.head.x[t]);
    }
  }
  template <typename LayoutA, typename LayoutB>
  __device__ static void Multiply(Sum& sum, const Operand<wmma::matrix_a, LayoutA>& a,
                                  const Operand<wmma::matrix_b, LayoutB>& b) {
    wmma::mma_sync(sum, a.tail, b.head, sum);  // the small terms first
    wmma::mma_sync(sum, a.head, b.tail, sum);
    wmma::mma_sync(sum, a.head, b.head, sum);
  }
};

constexpr int kLoadBatch = 8;  // 16-byte loads in flight per lane

// This warp's `bytes` of the block's dynamic shared memory (one region per sample).
__device__ __forceinline__ unsigned char* WarpSharedRegion(int64_t bytes) {
  extern __shared__ __align__(128) unsigned char shared[];
  return shared + WarpInBlock() * bytes;
}

// Stages columns [first_column, first_column + width) of a sample's rows into `chunk` (width:
// up to 64 columns of the 16-padded D), zero past F rows and past D columns. With `row0_output`,
// row 0's values are also stored there (the forward's copy of the bottom-MLP output).
template <typename T>
__device__ void LoadChunk(const T* sample, const InteractShape& shape, const TensorCoreLayout& layout,
                          int first_column, T* chunk, T* row0_output, int lane) {
  constexpr int kPerVector = kVectorBytes / sizeof(T);
  const int num_vectors = static_cast<int>(shape.num_vectors);
  const int dim = static_cast<int>(shape.dim);
  const int width = min(kChunkColumns, layout.padded_dim - first_column);
  const int valid = min(width, dim - first_column);
  const int vectors_per_row = valid / kPerVector;
  const int total = num_vectors * vectors_per_row;
  for (int first = lane; first < total; first += kWarpSize * kLoadBatch) {
    uint4 loaded[kLoadBatch];
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int v = first + u * kWarpSize;
      if (v < total) {
        const int row = v / vectors_per_row;
        const int column = first_column + (v - row * vectors_per_row) * kPerVector;
        loaded[u] = __ldcs(reinterpret_cast<const uint4*>(sample + row * dim + column));
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int v = first + u * kWarpSize;
      if (v < total) {
        const int row = v / vectors_per_row;
        const int column = (v - row * vectors_per_row) * kPerVector;
        *reinterpret_cast<uint4*>(chunk + row * layout.chunk_stride + column) = loaded[u];
        if (row0_output != nullptr && row == 0) {
          __stcs(reinterpret_cast<uint4*>(row0_output + first_column + column), loaded[u]);
        }
      }
    }
  }
  const T zero = FromFloat<T>(0.0f);
  const int pad_columns = width - valid;
  for (int e = lane; e < num_vectors * pad_columns; e += kWarpSize) {
    chunk[(e / pad_columns) * layout.chunk_stride + valid + e % pad_columns] = zero;
  }
  for (int e = lane; e < (layout.rows - num_vectors) * width; e += kWarpSize) {
    chunk[(num_vectors + e / width) * layout.chunk_stride + e % width] = zero;
  }
}

// Writes the chunk's F rows, columns [first_column, min(first_column + 64, D)), to `sample`.
template <typename T>
__device__ void StoreChunk(const T* chunk, const InteractShape& shape, const TensorCoreLayout& layout,
                           int first_column, T* sample, int lane) {
  constexpr int kPerVector = kVectorBytes / sizeof(T);
  const int dim = static_cast<int>(shape.dim);
  const int valid = min(kChunkColumns, dim - first_column);
  const int vectors_per_row = valid / kPerVector;
  const int total = static_cast<int>(shape.num_vectors) * vectors_per_row;
  for (int v = lane; v < total; v += kWarpSize) {
    const int row = v / vectors_per_row;
    const int column = (v - row * vectors_per_row) * kPerVector;
    __stcs(reinterpret_cast<uint4*>(sample + row * dim + first_column + column),
           *reinterpret_cast<const uint4*>(chunk + row * layout.chunk_stride + column));
  }
}

// Forward: the lower Gram tiles (0,0), (1,0), (1,1) of the 16-padded rows accumulate over the
// chunks; then they go to shared memory, the pair values into the output stage, and the stage
// to the output row.
template <typename Operands, typename T = typename Operands::Element>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ForwardTensorCoreKernel(InteractShape shape, TensorCoreLayout layout, const T* __restrict__ input,
                            T* __restrict__ output) {
  const int64_t sample = WarpSample();
  if (sample >= shape.batch) return;
  unsigned char* region = WarpSharedRegion(layout.forward_bytes);
  const int lane = Lane();
  T* chunk = reinterpret_cast<T*>(region);
  const T* values = input + sample * shape.num_vectors * shape.dim;
  T* row = output + sample * shape.output_width;
  const bool two_tiles = layout.rows > kTile;  // warp-uniform, as WMMA needs

  typename Operands::Sum gram00, gram10, gram11;
  wmma::fill_fragment(gram00, 0.0f);
  wmma::fill_fragment(gram10, 0.0f);
  wmma::fill_fragment(gram11, 0.0f);
  for (int first_column = 0; first_column < layout.padded_dim; first_column += kChunkColumns) {
    LoadChunk(values, shape, layout, first_column, chunk, row, lane);
    __syncwarp();
    const int width = min(kChunkColumns, layout.padded_dim - first_column);
    for (int k = 0; k < width; k += Operands::kK) {
      typename Operands::template Operand<wmma::matrix_a, wmma::row_major> upper_a, lower_a;
      typename Operands::template Operand<wmma::matrix_b, wmma::col_major> upper_b, lower_b;
      Operands::Load(upper_a, chunk + k, layout.chunk_stride);
      Operands::Load(upper_b, chunk + k, layout.chunk_stride);
      Operands::Multiply(gram00, upper_a, upper_b);
      if (two_tiles) {
        const T* lower = chunk + kTile * layout.chunk_stride + k;
        Operands::Load(lower_a, lower, layout.chunk_stride);
        Operands::Load(lower_b, lower, layout.chunk_stride);
        Operands::Multiply(gram10, lower_a, upper_b);
        Operands::Multiply(gram11, lower_a, lower_b);
      }
    }
    __syncwarp();  // the next chunk, or the Gram tiles, overwrite this one
  }
  float* gram = reinterpret_cast<float*>(region);
  wmma::store_matrix_sync(gram, gram00, layout.gram_stride, wmma::mem_row_major);
  if (two_tiles) {
    wmma::store_matrix_sync(gram + kTile * layout.gram_stride, gram10, layout.gram_stride, wmma::mem_row_major);
    wmma::store_matrix_sync(gram + kTile * layout.gram_stride + kTile, gram11, layout.gram_stride,
                            wmma::mem_row_major);
  }
  __syncwarp();
  T* stage = reinterpret_cast<T*>(region + layout.forward_stage_offset);
  const int num_vectors = static_cast<int>(shape.num_vectors);
  for (int i = 1; i < num_vectors; ++i) {
    if (lane < i) stage[i * (i - 1) / 2 + lane] = FromFloat<T>(gram[i * layout.gram_stride + lane]);
  }
  const int stage_columns = static_cast<int>(shape.output_width - shape.dim);
  for (int p = static_cast<int>(NumPairs(num_vectors)) + lane; p < stage_columns; p += kWarpSize) {
    stage[p] = FromFloat<T>(0.0f);
  }
  __syncwarp();
  const int stage_vectors = stage_columns * static_cast<int>(sizeof(T)) / kVectorBytes;
  uint4* pair_row = reinterpret_cast<uint4*>(row + shape.dim);
  for (int v = lane; v < stage_vectors; v += kWarpSize) __stcs(pair_row + v, reinterpret_cast<const uint4*>(stage)[v]);
}

// Backward: grad = S X per sample with S the symmetric [rows, rows] matrix of upstream pair
// gradients (zero diagonal and padding), one 16-column tile of X at a time. A tile column's
// result replaces that column of the chunk (no other tile reads it): in place for fp32, through
// an fp32 scratch for fp16, where row 0 gets the pass-through before its single rounding.
template <typename Operands, typename T = typename Operands::Element>
__global__ void __launch_bounds__(kThreadsPerBlock)
    BackwardTensorCoreKernel(InteractShape shape, TensorCoreLayout layout, bool fold_bottom_mlp_grad,
                             const T* __restrict__ input, const T* __restrict__ upstream_grad, T* __restrict__ grad,
                             T* __restrict__ bottom_mlp_grad) {
  const int64_t sample = WarpSample();
  if (sample >= shape.batch) return;
  unsigned char* region = WarpSharedRegion(layout.backward_bytes);
  const int lane = Lane();
  T* chunk = reinterpret_cast<T*>(region);
  T* coefficients = reinterpret_cast<T*>(region + layout.coefficient_offset);
  T* upstream = reinterpret_cast<T*>(region + layout.upstream_offset);
  float* scratch = reinterpret_cast<float*>(region + layout.scratch_offset);
  const int num_vectors = static_cast<int>(shape.num_vectors);
  const int dim = static_cast<int>(shape.dim);
  const T* values = input + sample * num_vectors * dim;
  T* grad_rows = grad + sample * num_vectors * dim;

  // The upstream row into shared memory; its first D values are bottom_mlp_grad.
  const uint4* upstream_row = reinterpret_cast<const uint4*>(upstream_grad + sample * shape.output_width);
  uint4* bottom_row = reinterpret_cast<uint4*>(bottom_mlp_grad + sample * dim);
  const int upstream_vectors = static_cast<int>(shape.output_width) * static_cast<int>(sizeof(T)) / kVectorBytes;
  const int bottom_vectors = dim * static_cast<int>(sizeof(T)) / kVectorBytes;
#pragma unroll 4
  for (int v = lane; v < upstream_vectors; v += kWarpSize) {
    const uint4 loaded = __ldcs(upstream_row + v);
    reinterpret_cast<uint4*>(upstream)[v] = loaded;
    if (v < bottom_vectors) __stcs(bottom_row + v, loaded);
  }
  for (int e = lane; e < layout.rows * layout.coefficient_stride; e += kWarpSize) {
    coefficients[e] = FromFloat<T>(0.0f);
  }
  __syncwarp();
  for (int i = 1; i < num_vectors; ++i) {
    if (lane < i) {
      const T pair_grad = upstream[dim + i * (i - 1) / 2 + lane];
      coefficients[i * layout.coefficient_stride + lane] = pair_grad;
      coefficients[lane * layout.coefficient_stride + i] = pair_grad;
    }
  }
  __syncwarp();

  const bool two_tiles = layout.rows > kTile;
  for (int first_column = 0; first_column < layout.padded_dim; first_column += kChunkColumns) {
    LoadChunk(values, shape, layout, first_column, chunk, static_cast<T*>(nullptr), lane);
    __syncwarp();
    const int width = min(kChunkColumns, layout.padded_dim - first_column);
    const int valid = min(width, dim - first_column);
    for (int tile_column = 0; tile_column < width; tile_column += kTile) {
      typename Operands::Sum upper, lower;
      wmma::fill_fragment(upper, 0.0f);
      wmma::fill_fragment(lower, 0.0f);
      for (int k = 0; k < layout.rows; k += Operands::kK) {
        typename Operands::template Operand<wmma::matrix_a, wmma::row_major> a;
        typename Operands::template Operand<wmma::matrix_b, wmma::row_major> b;
        Operands::Load(b, chunk + k * layout.chunk_stride + tile_column, layout.chunk_stride);
        Operands::Load(a, coefficients + k, layout.coefficient_stride);
        Operands::Multiply(upper, a, b);
        if (two_tiles) {
          Operands::Load(a, coefficients + kTile * layout.coefficient_stride + k, layout.coefficient_stride);
          Operands::Multiply(lower, a, b);
        }
      }
      __syncwarp();  // every row of this tile column is read before it is overwritten
      float* result;
      int result_stride;
      if constexpr (std::is_same<T, float>::value) {
        result = chunk + tile_column;
        result_stride = layout.chunk_stride;
      } else {
        result = scratch;
        result_stride = kScratchStride;
      }
      wmma::store_matrix_sync(result, upper, result_stride, wmma::mem_row_major);
      if (two_tiles) wmma::store_matrix_sync(result + kTile * result_stride, lower, result_stride, wmma::mem_row_major);
      __syncwarp();
      if (fold_bottom_mlp_grad && lane < kTile && tile_column + lane < valid) {
        result[lane] += ToFloat(upstream[first_column + tile_column + lane]);
      }
      __syncwarp();
      if constexpr (!std::is_same<T, float>::value) {
        for (int e = lane; e < num_vectors * kTile; e += kWarpSize) {
          const int row = e / kTile;
          const int column = e % kTile;
          chunk[row * layout.chunk_stride + tile_column + column] = FromFloat<T>(scratch[row * kScratchStride + column]);
        }
        __syncwarp();
      }
    }
    StoreChunk(chunk, shape, layout, first_column, grad_rows, lane);
    __syncwarp();  // the next chunk overwrites this one
  }
}

#else

struct Fp16Operands {
  using Element = __half;
};
struct Tf32Operands {
  using Element = float;
};
struct SplitTf32Operands {
  using Element = float;
};

template <typename Operands, typename T = typename Operands::Element>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ForwardTensorCoreKernel(InteractShape, TensorCoreLayout, const T* __restrict__, T* __restrict__) {
  __trap();
}

template <typename Operands, typename T = typename Operands::Element>
__global__ void __launch_bounds__(kThreadsPerBlock)
    BackwardTensorCoreKernel(InteractShape, TensorCoreLayout, bool, const T* __restrict__, const T* __restrict__,
                             T* __restrict__, T* __restrict__) {
  __trap();
}

#endif  // tensor-core kernels

// ---- dispatch ----------------------------------------------------------------------------------

// What the launchers need of a device, read once per device (never per launch).
struct DeviceInfo {
  int major = 0;
  const char* error = nullptr;
};

constexpr int kMaxDevices = 64;

template <typename Operands>
cudaError_t AllowTensorCoreSharedMemory() {
  const int bytes =
      static_cast<int>(kSamplesPerBlock * MaxTensorCoreSampleBytes(sizeof(typename Operands::Element)));
  const cudaError_t forward =
      cudaFuncSetAttribute(ForwardTensorCoreKernel<Operands>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (forward != cudaSuccess) return forward;
  return cudaFuncSetAttribute(BackwardTensorCoreKernel<Operands>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Compute capability of `device` (current), and on 8.0+ the tensor-core kernels allowed the
// shared memory of kSamplesPerBlock samples of the largest tensor-core shape (over 48 KB for fp32).
DeviceInfo QueryDevice(int device) {
  DeviceInfo info;
  cudaError_t status = cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device);
  if (status == cudaSuccess && info.major >= 8) status = AllowTensorCoreSharedMemory<Fp16Operands>();
  if (status == cudaSuccess && info.major >= 8) status = AllowTensorCoreSharedMemory<Tf32Operands>();
  if (status == cudaSuccess && info.major >= 8) status = AllowTensorCoreSharedMemory<SplitTf32Operands>();
  if (status != cudaSuccess) info.error = cudaGetErrorString(status);
  return info;
}

DeviceInfo CurrentDevice() {
  static std::once_flag queried[kMaxDevices];
  static DeviceInfo devices[kMaxDevices];
  int device = 0;
  const cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return {0, cudaGetErrorString(status)};
  if (device < 0 || device >= kMaxDevices) return {0, "device ordinal beyond the launchers' table of 64 devices"};
  std::call_once(queried[device], [device] { devices[device] = QueryDevice(device); });
  return devices[device];
}

bool Aligned(std::initializer_list<const void*> pointers, uintptr_t bytes) {
  for (const void* pointer : pointers) {
    if (reinterpret_cast<uintptr_t>(pointer) % bytes != 0) return false;
  }
  return true;
}

// Tensor cores for shapes within FitsTensorCores on compute 8.0+ with 16-byte aligned buffers:
// fp16, TF32 for float when allowed, else 3xTF32; the SIMT kernel otherwise.
template <typename T>
KernelKind ChooseKernel(const InteractShape& shape, bool allow_tf32, int major,
                        std::initializer_list<const void*> buffers) {
  const bool tensor_cores = major >= 8 && FitsTensorCores(shape.num_vectors, shape.dim, sizeof(T)) &&
                            Aligned(buffers, kVectorBytes);
  if (!tensor_cores) return KernelKind::kSimt;
  if (std::is_same<T, __half>::value) return KernelKind::kFp16TensorCore;
  return allow_tf32 ? KernelKind::kTf32TensorCore : KernelKind::kSplitTf32TensorCore;
}

// Calls launch(Operands{}) with the operand policy of a tensor-core kernel kind.
template <typename T, typename Launch>
void WithOperands(KernelKind kernel, Launch launch) {
  if constexpr (std::is_same<T, __half>::value) {
    launch(Fp16Operands{});
  } else if (kernel == KernelKind::kTf32TensorCore) {
    launch(Tf32Operands{});
  } else {
    launch(SplitTf32Operands{});
  }
}

// The SIMT kernel's 4-element vectors: D a multiple of 4 and every buffer aligned to them.
template <typename T>
bool SimtVectors(const InteractShape& shape, std::initializer_list<const void*> buffers) {
  return shape.dim % kLaneColumns == 0 && Aligned(buffers, kLaneColumns * sizeof(T));
}

unsigned Blocks(const InteractShape& shape) {
  return static_cast<unsigned>((shape.batch + kSamplesPerBlock - 1) / kSamplesPerBlock);
}

LaunchResult Finish(KernelKind kernel) {
  const cudaError_t status = cudaGetLastError();
  return {kernel, status == cudaSuccess ? nullptr : cudaGetErrorString(status)};
}

template <typename T>
LaunchResult Forward(const InteractShape& shape, const T* input, T* output, bool allow_tf32, cudaStream_t stream) {
  const DeviceInfo device = CurrentDevice();
  if (device.error != nullptr) return {KernelKind::kSimt, device.error};
  const KernelKind kernel = ChooseKernel<T>(shape, allow_tf32, device.major, {input, output});
  if (kernel == KernelKind::kSimt) {
    ForwardSimtKernel<T><<<Blocks(shape), kThreadsPerBlock, 0, stream>>>(shape, SimtVectors<T>(shape, {input, output}),
                                                                         input, output);
  } else {
    const TensorCoreLayout layout = MakeTensorCoreLayout(shape.num_vectors, shape.dim, sizeof(T));
    WithOperands<T>(kernel, [&](auto operands) {
      using Operands = decltype(operands);
      ForwardTensorCoreKernel<Operands><<<Blocks(shape), kThreadsPerBlock, kSamplesPerBlock * layout.forward_bytes, stream>>>(
          shape, layout, input, output);
    });
  }
  return Finish(kernel);
}

template <typename T>
LaunchResult Backward(const InteractShape& shape, bool fold_bottom_mlp_grad, const T* input, const T* upstream_grad,
                      T* grad, T* bottom_mlp_grad, bool allow_tf32, cudaStream_t stream) {
  const DeviceInfo device = CurrentDevice();
  if (device.error != nullptr) return {KernelKind::kSimt, device.error};
  const std::initializer_list<const void*> buffers{input, upstream_grad, grad, bottom_mlp_grad};
  const KernelKind kernel = ChooseKernel<T>(shape, allow_tf32, device.major, buffers);
  if (kernel == KernelKind::kSimt) {
    BackwardSimtKernel<T><<<Blocks(shape), kThreadsPerBlock, 0, stream>>>(
        shape, SimtVectors<T>(shape, buffers), fold_bottom_mlp_grad, input, upstream_grad, grad, bottom_mlp_grad);
  } else {
    const TensorCoreLayout layout = MakeTensorCoreLayout(shape.num_vectors, shape.dim, sizeof(T));
    WithOperands<T>(kernel, [&](auto operands) {
      using Operands = decltype(operands);
      BackwardTensorCoreKernel<Operands><<<Blocks(shape), kThreadsPerBlock, kSamplesPerBlock * layout.backward_bytes, stream>>>(
          shape, layout, fold_bottom_mlp_grad, input, upstream_grad, grad, bottom_mlp_grad);
    });
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
    case KernelKind::kSplitTf32TensorCore:
      return "tensor_core_3xtf32";
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

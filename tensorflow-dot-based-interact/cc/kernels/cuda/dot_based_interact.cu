// CUDA kernels of the dot interaction (geometry and shared memory: kernel_layout.h):
// * tensor-core kernels (WMMA with fp32 accumulation: fp16 for half; TF32 for float when TF32
//   is allowed, else 3xTF32) for the shapes of FitsTensorCores, on a persistent grid: each warp
//   walks its samples chunk by chunk, and the next chunk's copies are in flight while it computes
//   this one (two shared-memory stages per warp): 16-byte cp.async copies from every lane, or on
//   sm_90, where a build chooses them (kernel_layout.h), one bulk copy per row (cp.async.bulk,
//   completing on the stage's mbarrier); the output leaves in 16-byte stores;
// * a general SIMT kernel (fp32 arithmetic, any F and D; one warp per sample, kSamplesPerBlock
//   per block) for every other shape and for GPUs older than compute 8.0.
// No kernel finds a pair from its column: pairs are enumerated row by row, (i, j) for j < i, so
// column D + i(i-1)/2 + j is integer arithmetic. Includes CUDA headers only.
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
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

// This warp's `bytes` of the block's dynamic shared memory (one region per warp).
__device__ __forceinline__ unsigned char* WarpSharedRegion(int64_t bytes) {
  extern __shared__ __align__(128) unsigned char shared[];
  return shared + WarpInBlock() * bytes;
}

// Zeroes `bytes` (a multiple of 16) of shared memory from `target` with 16-byte stores.
__device__ __forceinline__ void ZeroVectors(void* target, int64_t bytes, int lane) {
  const int vectors = static_cast<int>(bytes / kVectorBytes);
  for (int v = lane; v < vectors; v += kWarpSize) static_cast<uint4*>(target)[v] = make_uint4(0, 0, 0, 0);
}

// Bulk copies (sm_90+, where kernel_layout.h's DBI_*_BULK choose them): a stage's chunk arrives as
// one cp.async.bulk per row, each counted in bytes on the stage's mbarrier, which completes a phase
// once lane 0's arrival has announced the step's bytes and all of them have landed. Thin PTX
// wrappers (PTX ISA 8.0, so CUDA 12.0 and newer build them); for the CPU emulation,
// harness/emulation defines the same functions. Built for GPUs older than sm_90 they trap: those
// builds never call them (kBulkCopyTarget below).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kBulkCopyTarget = true;
#else
constexpr bool kBulkCopyTarget = false;  // older GPUs, and nvcc's host pass, which runs no kernel
#endif

#if defined(__CUDACC__)
// The statement on sm_90+; a trap elsewhere (never reached: see kBulkCopyTarget).
#if __CUDA_ARCH__ >= 900
#define DBI_ON_SM90(...) __VA_ARGS__
#else
#define DBI_ON_SM90(...) __trap()
#endif

[[maybe_unused]] __device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Sets up `barrier` for one arrival per phase.
__device__ __forceinline__ void MbarrierInit(uint64_t* barrier, uint32_t arrivals) {
  DBI_ON_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(barrier)), "r"(arrivals)
                           : "memory");
              asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
}

// Ends `barrier`'s life as an mbarrier (its bytes may then be used otherwise).
__device__ __forceinline__ void MbarrierInval(uint64_t* barrier) {
  DBI_ON_SM90(asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(SharedAddress(barrier)) : "memory"));
}

// Arrives on `barrier` and announces `bytes` of bulk copies that complete its current phase.
__device__ __forceinline__ void MbarrierArriveExpectBytes(uint64_t* barrier, uint32_t bytes) {
  DBI_ON_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(barrier)),
                           "r"(bytes)
                           : "memory"));
}

// Whether the phase of `barrier` with parity `parity` has completed (the calling thread then sees
// the bytes its bulk copies wrote); waits a while in hardware before saying no.
__device__ __forceinline__ bool MbarrierTryWaitParity(uint64_t* barrier, uint32_t parity) {
  uint32_t done = 0;
  DBI_ON_SM90(asm volatile("{\n .reg .pred complete;\n mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
                           " selp.u32 %0, 1, 0, complete;\n}\n"
                           : "=r"(done)
                           : "r"(SharedAddress(barrier)), "r"(parity)
                           : "memory"));
  return done != 0;
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to this block's
// shared memory, counted on `barrier`.
[[maybe_unused]] __device__ __forceinline__ void BulkCopyToShared(void* target, const void* source, uint32_t bytes,
                                                                  uint64_t* barrier) {
  DBI_ON_SM90(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                           ::"r"(SharedAddress(target)), "l"(source), "r"(bytes), "r"(SharedAddress(barrier))
                           : "memory"));
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from this block's shared
// memory to global memory, in this thread's current bulk group.
[[maybe_unused]] __device__ __forceinline__ void BulkCopyToGlobal(void* target, const void* source, uint32_t bytes) {
  DBI_ON_SM90(asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(target),
                           "r"(SharedAddress(source)), "r"(bytes)
                           : "memory"));
}

// Closes this thread's current bulk group.
__device__ __forceinline__ void BulkCommitGroup() { DBI_ON_SM90(asm volatile("cp.async.bulk.commit_group;" ::: "memory")); }

// Waits until this thread's bulk groups have read their shared memory (it may be written again).
__device__ __forceinline__ void BulkWaitGroupsRead() {
  DBI_ON_SM90(asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"));
}

// Waits until this thread's bulk groups are complete.
__device__ __forceinline__ void BulkWaitGroups() { DBI_ON_SM90(asm volatile("cp.async.bulk.wait_group 0;" ::: "memory")); }

// Orders this thread's ordinary shared-memory writes before later bulk copies into the same bytes.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  DBI_ON_SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));
}
#undef DBI_ON_SM90
#endif  // __CUDACC__

// A warp's kStages mbarriers, one per stage, and the parity of each one's next phase.
struct StageBarriers {
  uint64_t* barriers;
  uint32_t parities;  // bit s: the parity stage s's next wait expects
};

// Lane 0 sets up the stage barriers, once the ordinary zeroing of the warp's region is ordered
// before the bulk copies that follow it.
__device__ __forceinline__ StageBarriers InitStageBarriers(unsigned char* region, int64_t offset, int lane) {
  StageBarriers stages{reinterpret_cast<uint64_t*>(region + offset), 0u};
  FenceProxyAsyncShared();
  __syncwarp();
  if (lane == 0) {
    for (int stage = 0; stage < kStages; ++stage) MbarrierInit(stages.barriers + stage, 1);
  }
  __syncwarp();
  return stages;
}

// Lane 0 retires the stage barriers once the warp is done with its last step.
__device__ __forceinline__ void RetireStageBarriers(const StageBarriers& stages, int lane) {
  __syncwarp();
  if (lane == 0) {
    for (int stage = 0; stage < kStages; ++stage) MbarrierInval(stages.barriers + stage);
  }
}

// The bulk copies of one step into stage `stage`, all announced by lane 0 before any is issued.
__device__ __forceinline__ void AnnounceStepBytes(const StageBarriers& stages, int stage, uint32_t bytes, int lane) {
  if (lane == 0) MbarrierArriveExpectBytes(stages.barriers + stage, bytes);
  __syncwarp();
}

// Copies one row of a chunk per lane (F <= 32 rows): `row_bytes` from `sample` + row * dim to
// `chunk` + row * chunk_stride, counted on the stage's barrier.
template <typename T>
__device__ __forceinline__ void BulkCopyChunkRows(const T* sample, int num_vectors, int dim, uint32_t row_bytes,
                                                  T* chunk, int chunk_stride, uint64_t* barrier, int lane) {
  if (lane < num_vectors) BulkCopyToShared(chunk + lane * chunk_stride, sample + lane * dim, row_bytes, barrier);
}

// A step of a warp: the sample, which of its chunks, and the stage that holds it. Kept as
// counters and advanced one step at a time, so no step divides (a 64-bit division costs
// about a hundred instructions, as much as a chunk's copies).
struct StepPosition {
  int64_t sample;
  int chunk;
  int stage;
};

// The steps of this warp in the persistent grid: its samples are first, first + stride, ...
// (stride: the warps of the grid), each in `chunks` steps of one staged chunk.
struct WarpSteps {
  int64_t first;
  int64_t stride;
  int chunks;
  int64_t count;
  __device__ StepPosition Start() const { return {first, 0, 0}; }
  __device__ void Advance(StepPosition& position) const {
    if (++position.chunk == chunks) {
      position.chunk = 0;
      position.sample += stride;
    }
    position.stage = position.stage + 1 == kStages ? 0 : position.stage + 1;
  }
};

__device__ __forceinline__ WarpSteps StepsOfThisWarp(int64_t batch, int chunks) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTensorCoreWarpsPerBlock;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kTensorCoreWarpsPerBlock + WarpInBlock();
  const int64_t samples = first < batch ? (batch - first + stride - 1) / stride : 0;
  return {first, stride, chunks, samples * chunks};
}

// The 16-byte vectors of a [rows, per_row] block in row-major order as the lanes take them
// (vector lane, lane + 32, ...): one division per walk, none per vector.
struct LaneWalk {
  int row, column, row_step, column_step, per_row;
  __device__ LaneWalk(int vectors_per_row, int lane)
      : row(lane / vectors_per_row),
        column(lane % vectors_per_row),
        row_step(kWarpSize / vectors_per_row),
        column_step(kWarpSize % vectors_per_row),
        per_row(vectors_per_row) {}
  __device__ void Next() {
    row += row_step;
    column += column_step;
    if (column >= per_row) {
      column -= per_row;
      ++row;
    }
  }
};

// Calls copy(target_vector, source_vector) for the 16-byte vectors of `rows` rows of `per_row`
// vectors each as the lanes take them (vector lane, lane + 32, ...; rows `target_stride` and
// `source_stride` elements apart). Where per_row is a power of two up to 32 (every chunk of
// Criteo's shapes), a lane keeps its column and steps whole passes of rows: two pointer additions
// per vector, where LaneWalk's row and column arithmetic made a 16-byte copy cost about 20
// instructions (sm_90 SASS); other widths walk with LaneWalk.
template <typename Target, typename Source, typename Copy>
__device__ __forceinline__ void ForEachRowVector(Target* target, int target_stride, Source* source, int source_stride,
                                                 int rows, int per_row, int lane, Copy copy) {
  constexpr int kPerVector = kVectorBytes / sizeof(Target);
  static_assert(sizeof(Target) == sizeof(Source), "rows of one element type");
  if (per_row > 0 && per_row <= kWarpSize && (per_row & (per_row - 1)) == 0) {
    const int shift = __ffs(per_row) - 1;
    const int rows_per_pass = kWarpSize >> shift;
    int row = lane >> shift;
    const int column = (lane & (per_row - 1)) * kPerVector;
    target += row * target_stride + column;
    source += row * source_stride + column;
    const int target_step = rows_per_pass * target_stride;
    const int source_step = rows_per_pass * source_stride;
#pragma unroll 4
    for (; row < rows; row += rows_per_pass, target += target_step, source += source_step) copy(target, source);
  } else {
    for (LaneWalk walk(per_row, lane); walk.row < rows; walk.Next()) {
      const int column = walk.column * kPerVector;
      copy(target + walk.row * target_stride + column, source + walk.row * source_stride + column);
    }
  }
}

// The pairs (i, j), j < i, in output order p = i(i-1)/2 + j from pair `first` on, every `stride`-th,
// with no division or square root.
struct PairWalk {
  int p, i, j, stride;
  __device__ PairWalk(int first, int stride_) : p(first), i(1), j(first), stride(stride_) { Settle(); }
  __device__ void Next() {
    p += stride;
    j += stride;
    Settle();
  }
  __device__ void Settle() {
    while (j >= i) {
      j -= i;
      ++i;
    }
  }
};

// The pair after (i, j) in output order.
struct PairCursor {
  int i, j;
  __device__ void Next() {
    if (++j == i) {
      ++i;
      j = 0;
    }
  }
};

// A lane's share of a sample's pair columns as 16-byte vectors (vector lane, lane + 32, ...), each
// kPerVector consecutive pairs, and where each one's first pair lies (i << 8 | j, one register
// each): found once per kernel, since every sample has the same pairs.
template <typename T>
struct LanePairVectors {
  static constexpr int kPerVector = kVectorBytes / sizeof(T);
  static constexpr int kMaxPerLane =
      static_cast<int>((NumPairs(kTensorCoreMaxVectors) + kPerVector * kWarpSize - 1) / (kPerVector * kWarpSize));
  uint32_t first[kMaxPerLane];
  __device__ explicit LanePairVectors(int lane) {
    PairWalk walk(lane * kPerVector, kWarpSize * kPerVector);
#pragma unroll
    for (int vector = 0; vector < kMaxPerLane; ++vector, walk.Next()) first[vector] = walk.i << 8 | walk.j;
  }
  // The first pair of the lane's vector `vector` (a run-time index: picked by compares, so that
  // `first` stays in registers).
  __device__ PairCursor Start(int vector) const {
    uint32_t packed = first[0];
#pragma unroll
    for (int candidate = 1; candidate < kMaxPerLane; ++candidate) {
      if (vector == candidate) packed = first[candidate];
    }
    return {static_cast<int>(packed >> 8), static_cast<int>(packed & 0xffu)};
  }
};

// 16 bytes of T from fp32 values, each rounded once.
__device__ __forceinline__ uint4 PackVector(const float (&values)[kVectorBytes / sizeof(float)]) {
  uint4 packed;
  float* floats = reinterpret_cast<float*>(&packed);
#pragma unroll
  for (int e = 0; e < 4; ++e) floats[e] = values[e];
  return packed;
}
__device__ __forceinline__ uint4 PackVector(const float (&values)[kVectorBytes / sizeof(__half)]) {
  uint4 packed;
  __half2* halves = reinterpret_cast<__half2*>(&packed);
#pragma unroll
  for (int e = 0; e < 4; ++e) halves[e] = __floats2half2_rn(values[2 * e], values[2 * e + 1]);
  return packed;
}

// The columns of a sample a chunk holds: where they start, how many the MMAs read (whole tiles)
// and how many are data (the rest of the tiles are zero padding).
struct ChunkColumns {
  int first, width, valid;
};

__device__ __forceinline__ ChunkColumns ColumnsOfChunk(const TensorCoreLayout& layout, int dim, int chunk) {
  const int first = chunk * layout.chunk_columns;
  const int width = min(layout.chunk_columns, layout.padded_dim - first);
  return {first, width, min(width, dim - first)};
}

// Starts copying the chunk's data columns of a sample's F rows into `chunk` with cp.async (16
// bytes per copy; they land once the warp waits for their group). Padding is not touched: the
// kernels zero it once and keep the rows past F zero; the forward's padding columns stay zero
// too (where a stage may hold other chunks, ZeroPaddingColumns clears them with the last chunk),
// while the backward's may hold another chunk's columns, which only ever reach result columns
// that are never stored (column c of S X reads column c of X alone).
template <typename T>
__device__ __forceinline__ void IssueChunk(const T* sample, int num_vectors, int dim, const ChunkColumns& columns,
                                           T* chunk, int chunk_stride, int lane) {
  ForEachRowVector(chunk, chunk_stride, sample + columns.first, dim, num_vectors,
                   columns.valid * static_cast<int>(sizeof(T)) / kVectorBytes, lane,
                   [](T* target, const T* source) { __pipeline_memcpy_async(target, source, kVectorBytes); });
}

// Zeroes the chunk's padding columns (valid to width) of the F rows, which IssueChunk leaves as
// they were (16-byte stores: D and the chunk's first column are whole vectors).
template <typename T>
__device__ __forceinline__ void ZeroPaddingColumns(int num_vectors, const ChunkColumns& columns, T* chunk,
                                                   int chunk_stride, int lane) {
  constexpr int kPerVector = kVectorBytes / sizeof(T);
  for (LaneWalk walk((columns.width - columns.valid) / kPerVector, lane); walk.row < num_vectors; walk.Next()) {
    *reinterpret_cast<uint4*>(chunk + walk.row * chunk_stride + columns.valid + walk.column * kPerVector) =
        make_uint4(0, 0, 0, 0);
  }
}

// Starts copying `vectors` 16-byte vectors from `source` to `target` (cp.async).
[[maybe_unused]] __device__ __forceinline__ void IssueVectors(const void* source, void* target, int vectors, int lane) {
  for (int v = lane; v < vectors; v += kWarpSize) {
    __pipeline_memcpy_async(static_cast<uint4*>(target) + v, static_cast<const uint4*>(source) + v, kVectorBytes);
  }
}

// Copies `vectors` 16-byte vectors from shared memory to global memory (streaming stores).
__device__ __forceinline__ void StoreVectors(const void* source, void* target, int vectors, int lane) {
  for (int v = lane; v < vectors; v += kWarpSize) {
    __stcs(static_cast<uint4*>(target) + v, static_cast<const uint4*>(source)[v]);
  }
}

// Zeroes rows [from, to) of a chunk over its `width` columns (whole 16-byte vectors).
template <typename T>
__device__ __forceinline__ void ZeroRows(T* chunk, int from, int to, int width, int chunk_stride, int lane) {
  constexpr int kPerVector = kVectorBytes / sizeof(T);
  for (LaneWalk walk(width / kPerVector, lane); walk.row < to - from; walk.Next()) {
    *reinterpret_cast<uint4*>(chunk + (from + walk.row) * chunk_stride + walk.column * kPerVector) =
        make_uint4(0, 0, 0, 0);
  }
}

// Writes the chunk's data columns of the F rows to `sample`.
template <typename T>
__device__ __forceinline__ void StoreChunk(const T* chunk, int num_vectors, int dim, const ChunkColumns& columns,
                                           int chunk_stride, T* sample, int lane) {
  ForEachRowVector(sample + columns.first, dim, chunk, chunk_stride, num_vectors,
                   columns.valid * static_cast<int>(sizeof(T)) / kVectorBytes, lane, [](T* target, const T* source) {
                     __stcs(reinterpret_cast<uint4*>(target), *reinterpret_cast<const uint4*>(source));
                   });
}

// The pipeline of a warp: a step's copies are issued one step ahead, so step s + 1 arrives while
// step s is computed. `issue(position)` starts a step's copies, `compute(position)` runs it once
// they have landed; the stage computed is refilled only after the whole warp is done with it.
// With kBulk the copies complete on the stage's mbarrier (`stages`), else they are one cp.async
// group per step. kWaitThenIssue (bulk stores out of the stage just computed) issues step s + 1
// only once step s has arrived, which gives those stores that time to read their rows out before
// step s + 1 refills them; otherwise step s + 1 is issued first, keeping more bytes in flight.
template <bool kBulk, bool kWaitThenIssue = false, typename Issue, typename Compute>
__device__ __forceinline__ void RunPipeline(const WarpSteps& steps, StageBarriers stages, Issue issue,
                                            Compute compute) {
  StepPosition current = steps.Start();
  StepPosition next = current;
  issue(next);
  if constexpr (!kBulk) __pipeline_commit();
  for (int64_t step = 0; step < steps.count; ++step) {
    steps.Advance(next);
    if (!kWaitThenIssue && step + 1 < steps.count) issue(next);
    if constexpr (kBulk) {
      const uint32_t parity = stages.parities >> current.stage & 1u;
      while (!MbarrierTryWaitParity(stages.barriers + current.stage, parity)) {
      }
      stages.parities ^= 1u << current.stage;
      if (kWaitThenIssue && step + 1 < steps.count) issue(next);
    } else {
      __pipeline_commit();  // possibly empty: the wait below always leaves exactly the next step pending
      __pipeline_wait_prior(1);
    }
    __syncwarp();  // every lane's copies (and ordinary writes of the issue) of this step are visible to all
    compute(current);
    // This lane's ordinary writes to the stage come before the bulk copies of step + kStages.
    if constexpr (kBulk) FenceProxyAsyncShared();
    __syncwarp();  // the stage is free for the copies of step + kStages
    steps.Advance(current);
  }
}

// Forward: per sample, the lower Gram tiles (0,0), (1,0), (1,1) of the 16-padded rows accumulate
// over its chunks (row 0's columns go to the output on the way); after the last chunk they go to
// the chunk's stage, the pair values to the output stage after them, and that to the output row.
// Where those overwrite the stage's padding (layout.forward_rezero_*), it is zeroed again.
template <typename Operands, typename T = typename Operands::Element>
__global__ void __launch_bounds__(kTensorCoreThreadsPerBlock, ForwardBlocksPerSm(sizeof(T)))
    ForwardTensorCoreKernel(InteractShape shape, TensorCoreLayout layout, const T* __restrict__ input,
                            T* __restrict__ output) {
  const WarpSteps steps = StepsOfThisWarp(shape.batch, layout.chunks);
  if (steps.count == 0) return;  // warp-uniform
  unsigned char* region = WarpSharedRegion(layout.forward_bytes);
  const int lane = Lane();
  const int num_vectors = static_cast<int>(shape.num_vectors);
  const int dim = static_cast<int>(shape.dim);
  using Pairs = LanePairVectors<T>;
  const int pair_vectors = static_cast<int>(shape.output_width - shape.dim) / Pairs::kPerVector;
  const Pairs lane_pairs(lane);
  const bool two_tiles = layout.rows > kTile;  // warp-uniform, as WMMA needs
  const auto stage = [&](const StepPosition& position) {
    return reinterpret_cast<T*>(region + position.stage * layout.forward_stage_bytes);
  };
  constexpr bool kBulk = kBulkCopyTarget && ForwardBulkCopies(sizeof(T)) >= 1;
  ZeroVectors(region, layout.forward_bytes, lane);
  __syncwarp();
  StageBarriers stages{};
  if constexpr (kBulk) stages = InitStageBarriers(region, layout.forward_barrier_offset, lane);
  typename Operands::Sum gram00, gram10, gram11;
  RunPipeline<kBulk>(
      steps, stages,
      [&](const StepPosition& position) {
        const ChunkColumns columns = ColumnsOfChunk(layout, dim, position.chunk);
        const T* sample = input + position.sample * num_vectors * dim;
        if constexpr (kBulk) {
          const uint32_t row_bytes = columns.valid * sizeof(T);
          AnnounceStepBytes(stages, position.stage, num_vectors * row_bytes, lane);
          BulkCopyChunkRows(sample + columns.first, num_vectors, dim, row_bytes, stage(position), layout.chunk_stride,
                            stages.barriers + position.stage, lane);
        } else {
          IssueChunk(sample, num_vectors, dim, columns, stage(position), layout.chunk_stride, lane);
        }
        if (layout.forward_zero_last_chunk_padding && position.chunk + 1 == layout.chunks) {
          ZeroPaddingColumns(num_vectors, columns, stage(position), layout.chunk_stride, lane);
        }
      },
      [&](const StepPosition& position) {
        const ChunkColumns columns = ColumnsOfChunk(layout, dim, position.chunk);
        T* chunk = stage(position);
        T* row = output + position.sample * shape.output_width;
        if (position.chunk == 0) {
          wmma::fill_fragment(gram00, 0.0f);
          wmma::fill_fragment(gram10, 0.0f);
          wmma::fill_fragment(gram11, 0.0f);
        }
        StoreVectors(chunk, row + columns.first, columns.valid * static_cast<int>(sizeof(T)) / kVectorBytes, lane);
        for (int k = 0; k < columns.width; k += Operands::kK) {
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
        if (position.chunk + 1 < layout.chunks) return;
        __syncwarp();  // every lane has read the chunk before the Gram tiles overwrite it
        float* gram = reinterpret_cast<float*>(chunk);
        wmma::store_matrix_sync(gram, gram00, layout.gram_stride, wmma::mem_row_major);
        if (two_tiles) {
          wmma::store_matrix_sync(gram + kTile * layout.gram_stride, gram10, layout.gram_stride, wmma::mem_row_major);
          wmma::store_matrix_sync(gram + kTile * layout.gram_stride + kTile, gram11, layout.gram_stride,
                                  wmma::mem_row_major);
        }
        __syncwarp();
        // Each lane its vectors of pair values, straight from the Gram tiles to the output row; past
        // the last pair (i = F), the output's alignment padding: zero.
        uint4* pair_row = reinterpret_cast<uint4*>(row + dim);
#pragma unroll 1
        for (int vector = 0; vector < Pairs::kMaxPerLane; ++vector) {
          const int index = lane + vector * kWarpSize;
          if (index >= pair_vectors) break;
          PairCursor cursor = lane_pairs.Start(vector);
          float values[Pairs::kPerVector];
#pragma unroll
          for (int e = 0; e < Pairs::kPerVector; ++e, cursor.Next()) {
            values[e] = cursor.i < num_vectors ? gram[cursor.i * layout.gram_stride + cursor.j] : 0.0f;
          }
          __stcs(pair_row + index, PackVector(values));
        }
        if (layout.forward_rezero_to > layout.forward_rezero_from) {
          __syncwarp();  // every lane has read the Gram tiles before they are zeroed
          ZeroVectors(reinterpret_cast<unsigned char*>(chunk) + layout.forward_rezero_from,
                      layout.forward_rezero_to - layout.forward_rezero_from, lane);
        }
      });
  if constexpr (kBulk) RetireStageBarriers(stages, lane);
}

// fp16 backward where F fills the padded rows (16 or 32) and the pass-through is folded: one
// 16-column tile of a sample's gradient (the accumulator tiles of rows 0-15 and 16-31) through
// the fp32 scratch to `sample_grad`, row 0 plus the pass-through before its single rounding; two
// lanes per row, eight columns (16 bytes) each, columns past D left out.
template <typename Sum>
__device__ __forceinline__ void StoreHalfTileColumn(const Sum& upper, const Sum& lower, bool two_tiles, float* scratch,
                                                    const __half* pass_through, int num_vectors, int dim,
                                                    const ChunkColumns& columns, int tile_column, __half* sample_grad,
                                                    int lane) {
  constexpr int kHalvesPerVector = kVectorBytes / sizeof(__half);
  __syncwarp();  // every lane has read the previous tile column from the scratch
  wmma::store_matrix_sync(scratch, upper, kScratchStride, wmma::mem_row_major);
  if (two_tiles) wmma::store_matrix_sync(scratch + kTile * kScratchStride, lower, kScratchStride, wmma::mem_row_major);
  __syncwarp();
  const int half_tile = lane % 2 * kHalvesPerVector;
  const int column = columns.first + tile_column + half_tile;  // of the sample
  if (tile_column + half_tile >= columns.valid) return;
  for (int row = lane / 2; row < num_vectors; row += kWarpSize / 2) {
    const float4* source = reinterpret_cast<const float4*>(scratch + row * kScratchStride + half_tile);
    const float4 low = source[0];
    const float4 high = source[1];
    float values[kHalvesPerVector] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
    if (row == 0) {
#pragma unroll
      for (int c = 0; c < kHalvesPerVector; ++c) values[c] += __half2float(pass_through[column + c]);
    }
    uint4 packed;
    __half2* halves = reinterpret_cast<__half2*>(&packed);
#pragma unroll
    for (int c = 0; c < kHalvesPerVector / 2; ++c) halves[c] = __floats2half2_rn(values[2 * c], values[2 * c + 1]);
    __stcs(reinterpret_cast<uint4*>(sample_grad + row * dim + column), packed);
  }
}

// fp16 accumulator tiles from fp32 ones, each value rounded once. Element t of both fragment
// types is the same position of the tile (the element-wise use WMMA allows for fragments of one
// shape; the harness checks every position against NumPy).
template <typename Sum>
__device__ __forceinline__ wmma::fragment<wmma::accumulator, kTile, kTile, kTile, __half> RoundToHalf(const Sum& sum) {
  wmma::fragment<wmma::accumulator, kTile, kTile, kTile, __half> rounded;
  static_assert(decltype(rounded)::num_elements == Sum::num_elements, "fragments of one tile");
#pragma unroll
  for (int t = 0; t < rounded.num_elements; ++t) rounded.x[t] = __float2half_rn(sum.x[t]);
  return rounded;
}

// Backward: grad = S X per sample with S the symmetric [rows, rows] matrix of upstream pair
// gradients (zero diagonal and padding), built from the upstream row that arrives with the
// sample's first chunk, one 16-column tile of X at a time. A tile column's result replaces that
// column of the chunk (no other tile reads it; fp16 rounded once), and the chunk goes to `grad`.
// The pass-through joins row 0 before that rounding: fp16 with F below the padded rows carries
// it in padding row F of X, with S[0][F] = 1; fp32 adds it after the store; fp16 with F = 16 or
// 32 sends each tile through an fp32 scratch (StoreHalfTileColumn).
template <typename Operands, typename T = typename Operands::Element>
__global__ void __launch_bounds__(kTensorCoreThreadsPerBlock, BackwardBlocksPerSm(sizeof(T)))
    BackwardTensorCoreKernel(InteractShape shape, TensorCoreLayout layout, bool fold_bottom_mlp_grad,
                             const T* __restrict__ input, const T* __restrict__ upstream_grad, T* __restrict__ grad,
                             T* __restrict__ bottom_mlp_grad) {
  constexpr bool kHalf = !std::is_same<T, float>::value;
  const WarpSteps steps = StepsOfThisWarp(shape.batch, layout.chunks);
  if (steps.count == 0) return;  // warp-uniform
  unsigned char* region = WarpSharedRegion(layout.backward_bytes);
  const int lane = Lane();
  T* coefficients = reinterpret_cast<T*>(region + layout.coefficient_offset);
  T* pass_through = reinterpret_cast<T*>(region + layout.pass_through_offset);
  float* scratch = reinterpret_cast<float*>(region + layout.scratch_offset);
  const int num_vectors = static_cast<int>(shape.num_vectors);
  const int dim = static_cast<int>(shape.dim);
  const int upstream_vectors = static_cast<int>(shape.output_width) * static_cast<int>(sizeof(T)) / kVectorBytes;
  using Pairs = LanePairVectors<T>;
  const int pair_vectors = static_cast<int>(shape.output_width - shape.dim) / Pairs::kPerVector;
  const Pairs lane_pairs(lane);
  const int bottom_vectors = dim * static_cast<int>(sizeof(T)) / kVectorBytes;
  const bool two_tiles = layout.rows > kTile;
  const auto stage = [&](const StepPosition& position) {
    return region + position.stage * layout.backward_stage_bytes;
  };
  // Padding (rows past F, columns past D, S's diagonal and padding) stays zero from here on,
  // but for S[0][F] and row F of X when they carry the pass-through.
  constexpr bool kBulk = kBulkCopyTarget && BackwardBulkCopies(sizeof(T)) >= 1;
  constexpr bool kBulkStores = kBulkCopyTarget && BackwardBulkCopies(sizeof(T)) == 2;
  ZeroVectors(region, layout.backward_bytes, lane);
  const bool pass_through_row = kHalf && fold_bottom_mlp_grad && num_vectors < layout.rows;
  const bool in_place = !kHalf || !fold_bottom_mlp_grad || pass_through_row;
  __syncwarp();  // zeroed before S[0][F] is set
  if (pass_through_row && lane == 0) coefficients[num_vectors] = FromFloat<T>(1.0f);
  __syncwarp();
  StageBarriers stages{};
  if constexpr (kBulk) stages = InitStageBarriers(region, layout.backward_barrier_offset, lane);
  // S's tiles as A operands, per k step: loaded once per sample and kept in registers for all its
  // tile columns (loading them per tile column was half of the kernel's shared-memory traffic).
  constexpr int kMaxKSteps = kTensorCoreMaxVectors / Operands::kK;
  typename Operands::template Operand<wmma::matrix_a, wmma::row_major> s_upper[kMaxKSteps], s_lower[kMaxKSteps];
  RunPipeline<kBulk, kBulkStores>(
      steps, stages,
      [&](const StepPosition& position) {
        const ChunkColumns columns = ColumnsOfChunk(layout, dim, position.chunk);
        const T* sample = input + position.sample * num_vectors * dim;
        const T* upstream = upstream_grad + position.sample * shape.output_width;
        if constexpr (kBulkStores) BulkWaitGroupsRead();  // this lane's row of the stage is read out
        T* chunk = reinterpret_cast<T*>(stage(position));
        if constexpr (kBulk) {
          // Lanes 0 to F - 1 copy a row each, the last lane the upstream row with the first chunk.
          const uint32_t row_bytes = columns.valid * sizeof(T);
          const uint32_t upstream_bytes = position.chunk == 0 ? upstream_vectors * kVectorBytes : 0;
          uint64_t* barrier = stages.barriers + position.stage;
          AnnounceStepBytes(stages, position.stage, num_vectors * row_bytes + upstream_bytes, lane);
          BulkCopyChunkRows(sample + columns.first, num_vectors, dim, row_bytes, chunk, layout.chunk_stride, barrier,
                            lane);
          if (upstream_bytes != 0 && lane == kWarpSize - 1) {
            BulkCopyToShared(stage(position) + layout.backward_upstream_offset, upstream, upstream_bytes, barrier);
          }
        } else {
          IssueChunk(sample, num_vectors, dim, columns, chunk, layout.chunk_stride, lane);
          if (position.chunk == 0) {
            IssueVectors(upstream, stage(position) + layout.backward_upstream_offset, upstream_vectors, lane);
          }
        }
      },
      [&](const StepPosition& position) {
        const ChunkColumns columns = ColumnsOfChunk(layout, dim, position.chunk);
        T* chunk = reinterpret_cast<T*>(stage(position));
        T* sample_grad = grad + position.sample * num_vectors * dim;
        if (position.chunk == 0) {
          // S from the pair gradients; the first D values are bottom_mlp_grad and the pass-through.
          const T* upstream = reinterpret_cast<const T*>(stage(position) + layout.backward_upstream_offset);
          const uint4* pair_grads = reinterpret_cast<const uint4*>(upstream + dim);
#pragma unroll
          for (int vector = 0; vector < Pairs::kMaxPerLane; ++vector) {
            const int index = lane + vector * kWarpSize;
            if (index >= pair_vectors) break;
            const uint4 packed = pair_grads[index];
            const T* grads = reinterpret_cast<const T*>(&packed);
            PairCursor cursor = lane_pairs.Start(vector);
#pragma unroll
            for (int e = 0; e < Pairs::kPerVector; ++e, cursor.Next()) {
              if (cursor.i < num_vectors) {  // past the last pair, the row's alignment padding
                coefficients[cursor.i * layout.coefficient_stride + cursor.j] = grads[e];
                coefficients[cursor.j * layout.coefficient_stride + cursor.i] = grads[e];
              }
            }
          }
          StoreVectors(upstream, bottom_mlp_grad + position.sample * dim, bottom_vectors, lane);
          if (fold_bottom_mlp_grad) {
            for (int v = lane; v < bottom_vectors; v += kWarpSize) {
              reinterpret_cast<uint4*>(pass_through)[v] = reinterpret_cast<const uint4*>(upstream)[v];
            }
          }
          __syncwarp();
#pragma unroll
          for (int step = 0; step < kMaxKSteps; ++step) {
            const int k = step * Operands::kK;
            if (k >= layout.rows) continue;
            Operands::Load(s_upper[step], coefficients + k, layout.coefficient_stride);
            if (two_tiles) Operands::Load(s_lower[step], coefficients + kTile * layout.coefficient_stride + k, layout.coefficient_stride);
          }
        }
        if (pass_through_row) {
          const int vectors = columns.valid * static_cast<int>(sizeof(T)) / kVectorBytes;
          for (int v = lane; v < vectors; v += kWarpSize) {
            reinterpret_cast<uint4*>(chunk + num_vectors * layout.chunk_stride)[v] =
                reinterpret_cast<const uint4*>(pass_through + columns.first)[v];
          }
          __syncwarp();
        }
        for (int tile_column = 0; tile_column < columns.width; tile_column += kTile) {
          typename Operands::Sum upper, lower;
          wmma::fill_fragment(upper, 0.0f);
          wmma::fill_fragment(lower, 0.0f);
#pragma unroll
          for (int step = 0; step < kMaxKSteps; ++step) {
            const int k = step * Operands::kK;
            if (k >= layout.rows) continue;
            typename Operands::template Operand<wmma::matrix_b, wmma::row_major> b;
            Operands::Load(b, chunk + k * layout.chunk_stride + tile_column, layout.chunk_stride);
            Operands::Multiply(upper, s_upper[step], b);
            if (two_tiles) Operands::Multiply(lower, s_lower[step], b);
          }
          if (!in_place) {
            if constexpr (kHalf) {
              StoreHalfTileColumn(upper, lower, two_tiles, scratch, pass_through, num_vectors, dim, columns,
                                  tile_column, sample_grad, lane);
            }
            continue;
          }
          __syncwarp();  // every row of this tile column is read before it is overwritten
          T* result = chunk + tile_column;
          if constexpr (kHalf) {
            wmma::store_matrix_sync(result, RoundToHalf(upper), layout.chunk_stride, wmma::mem_row_major);
            if (two_tiles) {
              wmma::store_matrix_sync(result + kTile * layout.chunk_stride, RoundToHalf(lower), layout.chunk_stride,
                                      wmma::mem_row_major);
            }
            __syncwarp();
          } else {
            wmma::store_matrix_sync(result, upper, layout.chunk_stride, wmma::mem_row_major);
            if (two_tiles) {
              wmma::store_matrix_sync(result + kTile * layout.chunk_stride, lower, layout.chunk_stride,
                                      wmma::mem_row_major);
            }
            __syncwarp();
            if (fold_bottom_mlp_grad && lane < kTile && tile_column + lane < columns.valid) {
              result[lane] += pass_through[columns.first + tile_column + lane];
            }
          }
        }
        if (in_place) {
          // Rows past F came out as 0 * X, NaN where X holds one (row F: the pass-through's, done
          // with for this chunk): back to zero for the next sample. No later tile column read them.
          ZeroRows(chunk, num_vectors, layout.rows, columns.width, layout.chunk_stride, lane);
          if constexpr (kBulkStores) {
            FenceProxyAsyncShared();  // the results, written by every lane, before the bulk copies read them
            __syncwarp();
            if (lane < num_vectors) {
              BulkCopyToGlobal(sample_grad + lane * dim + columns.first, chunk + lane * layout.chunk_stride,
                               columns.valid * sizeof(T));
            }
            BulkCommitGroup();
          } else {
            __syncwarp();
            StoreChunk(chunk, num_vectors, dim, columns, layout.chunk_stride, sample_grad, lane);
          }
        }
      });
  if constexpr (kBulkStores) BulkWaitGroups();  // the last rows are out before the block's shared memory goes
  if constexpr (kBulk) RetireStageBarriers(stages, lane);
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
__global__ void __launch_bounds__(kTensorCoreThreadsPerBlock, ForwardBlocksPerSm(sizeof(T)))
    ForwardTensorCoreKernel(InteractShape, TensorCoreLayout, const T* __restrict__, T* __restrict__) {
  __trap();
}

template <typename Operands, typename T = typename Operands::Element>
__global__ void __launch_bounds__(kTensorCoreThreadsPerBlock, BackwardBlocksPerSm(sizeof(T)))
    BackwardTensorCoreKernel(InteractShape, TensorCoreLayout, bool, const T* __restrict__, const T* __restrict__,
                             T* __restrict__, T* __restrict__) {
  __trap();
}

#endif  // tensor-core kernels

// ---- dispatch ----------------------------------------------------------------------------------

// What the launchers need of a device, read once per device (never per launch): the compute
// capability, and what sizes the tensor-core kernels' persistent grid.
struct DeviceInfo {
  int major = 0;
  int multiprocessors = 0;
  int shared_bytes_per_sm = 0;
  int max_blocks_per_sm = 0;
  const char* error = nullptr;
};

constexpr int kMaxDevices = 64;

// Allows `kernel` the dynamic shared memory of a block of the largest tensor-core shape (above
// the default 48 KB) and asks for the largest shared-memory carveout of L1.
template <typename Kernel>
cudaError_t AllowSharedMemory(Kernel kernel, int element_bytes) {
  const int bytes = static_cast<int>(kTensorCoreWarpsPerBlock * MaxTensorCoreWarpBytes(element_bytes));
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status != cudaSuccess) return status;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

template <typename Operands>
cudaError_t AllowTensorCoreSharedMemory() {
  const int element_bytes = sizeof(typename Operands::Element);
  const cudaError_t forward = AllowSharedMemory(ForwardTensorCoreKernel<Operands>, element_bytes);
  if (forward != cudaSuccess) return forward;
  return AllowSharedMemory(BackwardTensorCoreKernel<Operands>, element_bytes);
}

// Compute capability of `device` (current), its SMs, shared memory and blocks per SM, and on
// 8.0+ the tensor-core kernels allowed their shared memory (AllowSharedMemory).
DeviceInfo QueryDevice(int device) {
  DeviceInfo info;
  cudaError_t status = cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&info.multiprocessors, cudaDevAttrMultiProcessorCount, device);
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&info.shared_bytes_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  }
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&info.max_blocks_per_sm, cudaDevAttrMaxBlocksPerMultiprocessor, device);
  }
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
  DeviceInfo failed;
  if (status != cudaSuccess) failed.error = cudaGetErrorString(status);
  if (status == cudaSuccess && (device < 0 || device >= kMaxDevices)) {
    failed.error = "device ordinal beyond the launchers' table of 64 devices";
  }
  if (failed.error != nullptr) return failed;
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

// SIMT kernels: one warp per sample.
unsigned Blocks(const InteractShape& shape) {
  return static_cast<unsigned>((shape.batch + kSamplesPerBlock - 1) / kSamplesPerBlock);
}

// Tensor-core kernels: the persistent grid, as many blocks of `warp_bytes` per warp as the device
// holds at once by shared memory (ResidentBlocks), by its own limit and by the registers the
// kernel is built for (`blocks_per_sm`, its __launch_bounds__), no more than the batch has
// samples for: one wave, no block waiting for another to finish.
unsigned TensorCoreBlocks(const InteractShape& shape, const DeviceInfo& device, int64_t warp_bytes,
                          int blocks_per_sm) {
  const int64_t resident = int64_t{device.multiprocessors} *
                           ResidentBlocks(kTensorCoreWarpsPerBlock * warp_bytes, device.shared_bytes_per_sm,
                                          Min(device.max_blocks_per_sm, blocks_per_sm));
  const int64_t needed = (shape.batch + kTensorCoreWarpsPerBlock - 1) / kTensorCoreWarpsPerBlock;
  return static_cast<unsigned>(Min(resident, needed));
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
    const TensorCoreLayout layout = ForwardLayout(shape.num_vectors, shape.dim, sizeof(T));
    WithOperands<T>(kernel, [&](auto operands) {
      using Operands = decltype(operands);
      ForwardTensorCoreKernel<Operands><<<TensorCoreBlocks(shape, device, layout.forward_bytes, ForwardBlocksPerSm(sizeof(T))), kTensorCoreThreadsPerBlock, kTensorCoreWarpsPerBlock * layout.forward_bytes, stream>>>(
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
    const TensorCoreLayout layout = BackwardLayout(shape.num_vectors, shape.dim, sizeof(T));
    WithOperands<T>(kernel, [&](auto operands) {
      using Operands = decltype(operands);
      BackwardTensorCoreKernel<Operands><<<TensorCoreBlocks(shape, device, layout.backward_bytes, BackwardBlocksPerSm(sizeof(T))), kTensorCoreThreadsPerBlock, kTensorCoreWarpsPerBlock * layout.backward_bytes, stream>>>(
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

// Launch geometry and per-sample shared-memory layout of the CUDA dot-interaction kernels, in
// plain constexpr C++: the kernels, the launchers and a host-only test (residency on A100/H100)
// all read the same numbers.
//
// Every kernel runs one warp per sample and kSamplesPerBlock warps per block. The tensor-core
// kernels stage a sample in shared memory kChunkColumns columns at a time (a [rows, 64] tile),
// so a sample's shared memory does not grow with D.
#ifndef DOT_BASED_INTERACT_CUDA_KERNEL_LAYOUT_H_
#define DOT_BASED_INTERACT_CUDA_KERNEL_LAYOUT_H_

#include <cstdint>

#include "../interact_layout.h"

namespace dot_based_interact {
namespace cuda {

constexpr int kWarpSize = 32;
constexpr int kSamplesPerBlock = 4;  // one warp per sample
constexpr int kThreadsPerBlock = kSamplesPerBlock * kWarpSize;
constexpr int kVectorBytes = 16;     // global loads and stores of the vectorised paths

// Tensor-core limits: vectors padded to at most 2 tiles of 16 rows, D to at most 128 columns.
constexpr int64_t kTensorCoreMaxVectors = 32;
constexpr int64_t kTensorCoreMaxDim = 128;
constexpr int kTile = 16;
constexpr int kChunkColumns = 64;  // sample columns staged per step
constexpr int kScratchStride = kTile + 4;  // fp32 tile-column scratch of the fp16 backward
constexpr int kRegionAlignment = 128;

constexpr int64_t RoundUp(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Shapes the tensor-core kernels take: F <= 32, D <= 128 and rows of whole 16-byte vectors
// (D a multiple of 8 in fp16, of 4 in fp32). Everything else runs the general SIMT kernel.
constexpr bool FitsTensorCores(int64_t num_vectors, int64_t dim, int element_bytes) {
  return num_vectors <= kTensorCoreMaxVectors && dim <= kTensorCoreMaxDim && dim * element_bytes % kVectorBytes == 0;
}

// Byte offsets and strides (in elements) of one warp's shared memory in the tensor-core kernels.
// Rows carry a 16-byte skew, which keeps every WMMA tile pointer 32-byte aligned and spreads
// consecutive rows over the banks.
struct TensorCoreLayout {
  int rows;               // F rounded up to 16
  int padded_dim;         // D rounded up to 16 (whole column tiles)
  int k_step;             // WMMA k: 16 for fp16, 8 for TF32 (32 bytes of operands)
  int chunk_stride;       // elements per row of the [rows, 64] sample chunk
  int gram_stride;        // fp32 per row of the forward's Gram tiles
  int coefficient_stride; // elements per row of the backward's symmetric [rows, rows] matrix
  // forward: chunk at 0; after the last chunk the Gram tiles at 0 and the output stage after them
  int64_t forward_stage_offset;
  int64_t forward_bytes;
  // backward: chunk, coefficients, the upstream row, and (2-byte types) an fp32 scratch tile column
  int64_t coefficient_offset;
  int64_t upstream_offset;
  int64_t scratch_offset;
  int64_t backward_bytes;
};

constexpr TensorCoreLayout MakeTensorCoreLayout(int64_t num_vectors, int64_t dim, int element_bytes) {
  const int skew = kVectorBytes / element_bytes;
  TensorCoreLayout layout{};
  layout.rows = static_cast<int>(RoundUp(num_vectors, kTile));
  layout.padded_dim = static_cast<int>(RoundUp(dim, kTile));
  layout.k_step = 32 / element_bytes;
  layout.chunk_stride = kChunkColumns + skew;
  layout.gram_stride = layout.rows + 4;
  layout.coefficient_stride = layout.rows + skew;
  const int64_t output_width = OutputWidth(num_vectors, dim);
  const int64_t chunk_bytes = RoundUp(int64_t{layout.rows} * layout.chunk_stride * element_bytes, kRegionAlignment);
  const int64_t gram_bytes = RoundUp(int64_t{layout.rows} * layout.gram_stride * 4, kRegionAlignment);
  const int64_t stage_bytes = RoundUp((output_width - dim) * element_bytes, kRegionAlignment);
  layout.forward_stage_offset = gram_bytes;
  layout.forward_bytes = chunk_bytes > gram_bytes + stage_bytes ? chunk_bytes : gram_bytes + stage_bytes;
  const int64_t coefficient_bytes =
      RoundUp(int64_t{layout.rows} * layout.coefficient_stride * element_bytes, kRegionAlignment);
  const int64_t upstream_bytes = RoundUp(output_width * element_bytes, kRegionAlignment);
  const int64_t scratch_bytes = element_bytes == 4 ? 0 : RoundUp(int64_t{layout.rows} * kScratchStride * 4, kRegionAlignment);
  layout.coefficient_offset = chunk_bytes;
  layout.upstream_offset = chunk_bytes + coefficient_bytes;
  layout.scratch_offset = layout.upstream_offset + upstream_bytes;
  layout.backward_bytes = layout.scratch_offset + scratch_bytes;
  return layout;
}

// The largest per-sample footprint within the tensor-core limits (F = 32, D = 128): what the
// launchers allow the kernels once per device, and what the residency test checks.
constexpr int64_t MaxTensorCoreSampleBytes(int element_bytes) {
  const TensorCoreLayout layout = MakeTensorCoreLayout(kTensorCoreMaxVectors, kTensorCoreMaxDim, element_bytes);
  return layout.backward_bytes > layout.forward_bytes ? layout.backward_bytes : layout.forward_bytes;
}

// Blocks of kSamplesPerBlock samples that fit in `shared_bytes_per_sm` (the runtime reserves
// 1 KB per block), times the samples per block; capped by `max_warps_per_sm`.
constexpr int64_t ResidentSamples(int64_t sample_bytes, int64_t shared_bytes_per_sm, int64_t max_warps_per_sm) {
  const int64_t blocks = shared_bytes_per_sm / (kSamplesPerBlock * sample_bytes + 1024);
  const int64_t samples = blocks * kSamplesPerBlock;
  return samples < max_warps_per_sm ? samples : max_warps_per_sm;
}

}  // namespace cuda
}  // namespace dot_based_interact

#endif  // DOT_BASED_INTERACT_CUDA_KERNEL_LAYOUT_H_

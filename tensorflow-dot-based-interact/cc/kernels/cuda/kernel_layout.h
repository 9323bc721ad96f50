// Launch geometry and per-warp shared-memory layout of the CUDA dot-interaction kernels, in
// plain constexpr C++: the kernels, the launchers and host-only tests (layout, residency on
// A100/H100, registers of the sm_90 build) all read the same numbers.
//
// The SIMT kernels run one warp per sample, kSamplesPerBlock warps per block. The tensor-core
// kernels run a persistent grid (as many blocks as the GPU holds at once, capped by the batch):
// each warp walks its samples (one every `warps in the grid`) in steps of one chunk of a
// sample's columns (64 columns of each row, but 32 in the fp32 backward), and while it computes
// one step, the next step's chunk is already on its way into the other of its kStages
// shared-memory stages, so every resident warp keeps a chunk in flight. A chunk arrives by
// 16-byte cp.async copies that every lane issues; on sm_90 a build may choose bulk copies instead
// (cp.async.bulk, one per row, each issued by one lane and counted on the stage's mbarrier), which
// the sweep measured slower (small per-row copies: 0.173 vs 0.139 ms fp16 forward on an H200). Small chunks
// keep many warps resident: with few warps per scheduler the kernels wait on their own latencies
// (an H200 profile of whole-sample chunks: 4-5 cycles per issued instruction at 8-12 warps per SM);
// halving them further costs more per-step work than the extra warps win back (the sweep below).
//
// The chunk sizes and the residency claims are tuning choices: each can be set at build time
// (make KERNEL_DEFINES="-DDBI_...=N"), which is how bench/interaction_cuda_sweep.py measures the
// alternatives side by side on a GPU; the defaults are the fastest candidates of its recorded H200
// run (bench/results/interaction_cuda_sweep.json, checked by tests/test_static.py).
#ifndef DOT_BASED_INTERACT_CUDA_KERNEL_LAYOUT_H_
#define DOT_BASED_INTERACT_CUDA_KERNEL_LAYOUT_H_

#include <cstdint>

#include "../interact_layout.h"

namespace dot_based_interact {
namespace cuda {

constexpr int kWarpSize = 32;
constexpr int kSamplesPerBlock = 4;  // SIMT kernels: one warp per sample
constexpr int kThreadsPerBlock = kSamplesPerBlock * kWarpSize;
constexpr int kVectorBytes = 16;     // global loads and stores of the vectorised paths

// Tensor-core limits: vectors padded to at most 2 tiles of 16 rows, D to at most 128 columns.
constexpr int64_t kTensorCoreMaxVectors = 32;
constexpr int64_t kTensorCoreMaxDim = 128;
constexpr int kTile = 16;
constexpr int kTensorCoreWarpsPerBlock = 2;
constexpr int kTensorCoreThreadsPerBlock = kTensorCoreWarpsPerBlock * kWarpSize;
constexpr int kStages = 2;             // chunks a warp holds: the one it computes, the one arriving

// Tuning choices per precision (FP16, FP32) and direction: the bytes of each row a step stages
// (whole 16-column tiles: a multiple of 32 in fp16, of 64 in fp32) and the blocks per SM claimed.
#ifndef DBI_FP16_FORWARD_ROW_BYTES
#define DBI_FP16_FORWARD_ROW_BYTES 128
#endif
#ifndef DBI_FP16_FORWARD_BLOCKS
#define DBI_FP16_FORWARD_BLOCKS 10
#endif
#ifndef DBI_FP16_BACKWARD_ROW_BYTES
#define DBI_FP16_BACKWARD_ROW_BYTES 128
#endif
#ifndef DBI_FP16_BACKWARD_BLOCKS
#define DBI_FP16_BACKWARD_BLOCKS 8
#endif
#ifndef DBI_FP32_FORWARD_ROW_BYTES
#define DBI_FP32_FORWARD_ROW_BYTES 256
#endif
#ifndef DBI_FP32_FORWARD_BLOCKS
#define DBI_FP32_FORWARD_BLOCKS 6
#endif
#ifndef DBI_FP32_BACKWARD_ROW_BYTES
#define DBI_FP32_BACKWARD_ROW_BYTES 128
#endif
#ifndef DBI_FP32_BACKWARD_BLOCKS
#define DBI_FP32_BACKWARD_BLOCKS 6
#endif
// How a precision's and direction's chunks move where the GPU has bulk copies (compute 9.0+): 0
// (the default, fastest on an H100 and an H200), by per-lane cp.async as on older GPUs; 1, in by
// bulk copies; 2 (backward), also the gradient rows out by bulk copies, each lane waiting for its
// row to be read out before refilling it.
#ifndef DBI_FP16_FORWARD_BULK
#define DBI_FP16_FORWARD_BULK 0
#endif
#ifndef DBI_FP16_BACKWARD_BULK
#define DBI_FP16_BACKWARD_BULK 0
#endif
#ifndef DBI_FP32_FORWARD_BULK
#define DBI_FP32_FORWARD_BULK 0
#endif
#ifndef DBI_FP32_BACKWARD_BULK
#define DBI_FP32_BACKWARD_BULK 0
#endif
static_assert(DBI_FP16_FORWARD_ROW_BYTES % 32 == 0 && DBI_FP16_BACKWARD_ROW_BYTES % 32 == 0 &&
                  DBI_FP32_FORWARD_ROW_BYTES % 64 == 0 && DBI_FP32_BACKWARD_ROW_BYTES % 64 == 0,
              "chunks of whole 16-column tiles");
constexpr int ForwardChunkRowBytes(int element_bytes) {
  return element_bytes == 2 ? DBI_FP16_FORWARD_ROW_BYTES : DBI_FP32_FORWARD_ROW_BYTES;
}
constexpr int BackwardChunkRowBytes(int element_bytes) {
  return element_bytes == 2 ? DBI_FP16_BACKWARD_ROW_BYTES : DBI_FP32_BACKWARD_ROW_BYTES;
}
static_assert(DBI_FP16_FORWARD_BULK >= 0 && DBI_FP16_FORWARD_BULK <= 1 && DBI_FP32_FORWARD_BULK >= 0 &&
                  DBI_FP32_FORWARD_BULK <= 1 && DBI_FP16_BACKWARD_BULK >= 0 && DBI_FP16_BACKWARD_BULK <= 2 &&
                  DBI_FP32_BACKWARD_BULK >= 0 && DBI_FP32_BACKWARD_BULK <= 2,
              "bulk copies: 0 or 1 forward, 0 to 2 backward");
constexpr int ForwardBulkCopies(int element_bytes) {
  return element_bytes == 2 ? DBI_FP16_FORWARD_BULK : DBI_FP32_FORWARD_BULK;
}
constexpr int BackwardBulkCopies(int element_bytes) {
  return element_bytes == 2 ? DBI_FP16_BACKWARD_BULK : DBI_FP32_BACKWARD_BULK;
}
constexpr int kScratchStride = kTile + 4;  // fp32 tile-column scratch of the fp16 backward
// Regions start on 32 bytes: what WMMA tile pointers need (bulk copies and 16-byte vectors need
// less); coarser alignment would cost the fp16 backward its 8th block per SM on an H100.
constexpr int kRegionAlignment = 32;
constexpr int kBarrierBytes = 8;  // an mbarrier per stage (the bulk copies' completion)
constexpr int kBlockReservedSharedBytes = 1024;  // the runtime's shared memory per block (8.0+)

// Residency each tensor-core kernel is designed for, in blocks of kTensorCoreWarpsPerBlock warps
// per SM, on an H100 or H200 (65,536 registers and 228 KB of shared memory per SM) at Criteo's
// shape (F = 27, D = 128): shared memory (the layouts below) allows at least that many, the
// kernels' __launch_bounds__ hold their registers to what that many blocks allow, and the
// launchers' persistent grid is that many blocks per SM. tests/test_static.py checks all three
// from the sm_90 build (cuobjdump).
constexpr int ForwardBlocksPerSm(int element_bytes) {
  return element_bytes == 2 ? DBI_FP16_FORWARD_BLOCKS : DBI_FP32_FORWARD_BLOCKS;
}
constexpr int BackwardBlocksPerSm(int element_bytes) {
  return element_bytes == 2 ? DBI_FP16_BACKWARD_BLOCKS : DBI_FP32_BACKWARD_BLOCKS;
}

constexpr int64_t RoundUp(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }
constexpr int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
constexpr int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }

// Shapes the tensor-core kernels take: F <= 32, D <= 128 and rows of whole 16-byte vectors
// (D a multiple of 8 in fp16, of 4 in fp32). Everything else runs the general SIMT kernel.
constexpr bool FitsTensorCores(int64_t num_vectors, int64_t dim, int element_bytes) {
  return num_vectors <= kTensorCoreMaxVectors && dim <= kTensorCoreMaxDim && dim * element_bytes % kVectorBytes == 0;
}

// Byte offsets and strides (in elements) of one warp's shared memory in the tensor-core kernels.
// Rows carry a 16-byte skew, which keeps every WMMA tile pointer 32-byte aligned and spreads
// consecutive rows over the banks. Stage s of a warp starts at s * (forward|backward)_stage_bytes.
struct TensorCoreLayout {
  int rows;               // F rounded up to 16
  int padded_dim;         // D rounded up to 16 (whole column tiles)
  int k_step;             // WMMA k: 16 for fp16, 8 for TF32 (32 bytes of operands)
  int chunk_columns;      // columns staged per step (a multiple of 16)
  int chunks;             // steps per sample
  int chunk_stride;       // elements per row of a staged [rows, chunk_columns] chunk
  int gram_stride;        // fp32 per row of the forward's Gram tiles
  int coefficient_stride; // elements per row of the backward's symmetric [rows, rows] matrix
  // forward stage: the chunk; after a sample's last chunk, the Gram tiles (from which the lanes
  // write the pair values to the output row)
  int64_t forward_stage_bytes;
  // bytes [from, to) of a stage (multiples of 16) that the Gram tiles overwrite
  // where the chunks keep zero padding (columns past D, rows past F), zeroed again after each
  // sample; from == to == 0 when they reach no padding
  int64_t forward_rezero_from;
  int64_t forward_rezero_to;
  // whether the last chunk's padding columns (past D) are zeroed each time it is staged: where
  // kStages is no multiple of the chunks, a stage holds different chunks of successive samples,
  // and a full chunk's data would stay in the last one's padding columns
  bool forward_zero_last_chunk_padding;
  int64_t forward_barrier_offset;  // kStages mbarriers, one per stage
  int64_t forward_bytes;  // per warp
  // backward stage: the chunk, then (filled with a sample's first chunk) its upstream row; per
  // warp after the stages: the coefficients, the upstream row's first D values (the
  // pass-through), and for 2-byte types with F = rows (16 or 32: no padding row to carry the
  // pass-through) an fp32 scratch tile column
  int64_t backward_upstream_offset;
  int64_t backward_stage_bytes;
  int64_t coefficient_offset;
  int64_t pass_through_offset;
  int64_t scratch_offset;
  int64_t backward_barrier_offset;  // kStages mbarriers, one per stage
  int64_t backward_bytes;  // per warp
};

// The layout of one direction: its chunks have at most `max_chunk_columns` columns.
constexpr TensorCoreLayout MakeTensorCoreLayout(int64_t num_vectors, int64_t dim, int element_bytes,
                                                int max_chunk_columns) {
  const int skew = kVectorBytes / element_bytes;
  TensorCoreLayout layout{};
  layout.rows = static_cast<int>(RoundUp(num_vectors, kTile));
  layout.padded_dim = static_cast<int>(RoundUp(dim, kTile));
  layout.k_step = 32 / element_bytes;
  layout.chunk_columns = static_cast<int>(Min(max_chunk_columns, layout.padded_dim));
  layout.chunks = (layout.padded_dim + layout.chunk_columns - 1) / layout.chunk_columns;
  layout.chunk_stride = layout.chunk_columns + skew;
  layout.gram_stride = layout.rows + 4;
  layout.coefficient_stride = layout.rows + skew;
  const int64_t output_width = OutputWidth(num_vectors, dim);
  const int64_t chunk_bytes = RoundUp(int64_t{layout.rows} * layout.chunk_stride * element_bytes, kRegionAlignment);
  const int64_t gram_bytes = RoundUp(int64_t{layout.rows} * layout.gram_stride * 4, kRegionAlignment);
  layout.forward_stage_bytes = Max(chunk_bytes, gram_bytes);
  const int64_t barrier_bytes = RoundUp(kStages * kBarrierBytes, kRegionAlignment);
  layout.forward_barrier_offset = kStages * layout.forward_stage_bytes;
  layout.forward_bytes = layout.forward_barrier_offset + barrier_bytes;
  const int64_t last_valid = dim - int64_t{layout.chunks - 1} * layout.chunk_columns;
  const bool padding_columns = layout.padded_dim != dim;
  layout.forward_zero_last_chunk_padding = padding_columns && kStages % layout.chunks != 0;
  const int64_t first_padding_byte = padding_columns ? last_valid * element_bytes
                                     : layout.rows != num_vectors ? num_vectors * layout.chunk_stride * element_bytes
                                                                  : chunk_bytes;
  const int64_t overwritten = int64_t{layout.rows} * layout.gram_stride * 4;
  if (overwritten > first_padding_byte) {
    layout.forward_rezero_from = first_padding_byte / kVectorBytes * kVectorBytes;
    layout.forward_rezero_to = RoundUp(overwritten, kVectorBytes);
  }
  layout.backward_upstream_offset = chunk_bytes;
  layout.backward_stage_bytes = chunk_bytes + RoundUp(output_width * element_bytes, kRegionAlignment);
  layout.coefficient_offset = kStages * layout.backward_stage_bytes;
  layout.pass_through_offset =
      layout.coefficient_offset + RoundUp(int64_t{layout.rows} * layout.coefficient_stride * element_bytes, kRegionAlignment);
  layout.scratch_offset = layout.pass_through_offset + RoundUp(dim * element_bytes, kRegionAlignment);
  const bool scratch = element_bytes == 2 && num_vectors == layout.rows;
  const int64_t scratch_bytes = scratch ? RoundUp(int64_t{layout.rows} * kScratchStride * 4, kRegionAlignment) : 0;
  layout.backward_barrier_offset = layout.scratch_offset + scratch_bytes;
  layout.backward_bytes = layout.backward_barrier_offset + barrier_bytes;
  return layout;
}

// The layouts the forward and the backward kernels run with (each reads its own direction's
// fields).
constexpr TensorCoreLayout ForwardLayout(int64_t num_vectors, int64_t dim, int element_bytes) {
  return MakeTensorCoreLayout(num_vectors, dim, element_bytes, ForwardChunkRowBytes(element_bytes) / element_bytes);
}
constexpr TensorCoreLayout BackwardLayout(int64_t num_vectors, int64_t dim, int element_bytes) {
  return MakeTensorCoreLayout(num_vectors, dim, element_bytes, BackwardChunkRowBytes(element_bytes) / element_bytes);
}

// The largest per-warp footprint within the tensor-core limits (F = 32, D = 128): what the
// launchers allow the kernels once per device (times the warps per block).
constexpr int64_t MaxTensorCoreWarpBytes(int element_bytes) {
  return Max(ForwardLayout(kTensorCoreMaxVectors, kTensorCoreMaxDim, element_bytes).forward_bytes,
             BackwardLayout(kTensorCoreMaxVectors, kTensorCoreMaxDim, element_bytes).backward_bytes);
}

// Blocks of `block_bytes` dynamic shared memory that fit in `shared_bytes_per_sm` beside the
// runtime's reserve per block, at least 1 (a GPU then runs them one after the other) and at most
// `max_blocks_per_sm`. The persistent grid is this many blocks per SM.
constexpr int64_t ResidentBlocks(int64_t block_bytes, int64_t shared_bytes_per_sm, int64_t max_blocks_per_sm) {
  return Max(1, Min(shared_bytes_per_sm / (block_bytes + kBlockReservedSharedBytes), max_blocks_per_sm));
}

}  // namespace cuda
}  // namespace dot_based_interact

#endif  // DOT_BASED_INTERACT_CUDA_KERNEL_LAYOUT_H_

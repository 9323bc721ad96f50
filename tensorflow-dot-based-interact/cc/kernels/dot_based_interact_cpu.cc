// CPU kernels of DotBasedInteract / DotBasedInteractGrad (float, half and bfloat16).
//
// Work is split over the batch with TF's intra-op thread pool (Shard); one sample (F x D) fits
// in L1, so each sample is computed in fp32 with 8-float SIMD vectors (GCC vector extensions)
// and compiled for several x86-64 levels (target_clones), chosen at load time by the CPU.
// Common vector widths (16, 32, 64, 128) get their own copy of each sample loop, with the width a
// constant: the loops over D unroll and keep their sums in registers (at D = 128 the forward
// pass computes 1.5x faster in L1 on Zen 4).
// Half and bfloat16 inputs are widened to fp32 per sample and results rounded once at the end.
// At the Criteo shape the op is bound by memory, not arithmetic, so two things keep the memory
// busy: the next sample's lines are requested into L2 a few at a time while the current sample
// computes (NextSampleLines; asking for all 216 at once into L1, as an earlier version did, made
// the forward pass 10% slower on Zen 4), and fp32 gradients are written with non-temporal stores,
// which do not first read the lines they overwrite (GradRows). Measured on Zen 4, 2 threads,
// batch 2048, in a standalone harness: forward 1005 -> about 720 ns a sample, backward 1960 ->
// about 1220. A sample held in several blocks is still copied into one contiguous scratch sample
// first: reading the rows where they lie (27 blocks, one per table) measured no faster, and the
// training step's backward pass slower, as rows of one sample in different blocks can share cache sets.
// (GCC >= 11 or Clang: vector extensions and target_clones on x86-64.)
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "dot_based_interact_kernels.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace dot_based_interact {
namespace {

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 12)
#define DBI_MULTIVERSIONED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__GNUC__)
// GCC 11 cannot dispatch on x86-64 levels, only on single ISA features: FMA (implies AVX).
#define DBI_MULTIVERSIONED __attribute__((target_clones("fma", "default")))
#else
#define DBI_MULTIVERSIONED
#endif
// Helpers are forced inline so that each multiversioned clone gets them at its own ISA level.
#define DBI_INLINE inline __attribute__((always_inline))
#define DBI_LAMBDA_INLINE __attribute__((always_inline))

constexpr int kLanes = 8;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

DBI_INLINE Vec Load(const float* source) {
  Vec value;
  std::memcpy(&value, source, sizeof(value));
  return value;
}

DBI_INLINE void Store(float* destination, Vec value) { std::memcpy(destination, &value, sizeof(value)); }

typedef int32_t VecIndex __attribute__((vector_size(kLanes * sizeof(int32_t))));

// x[first] + y[second], indices into the 16 lanes of (x, y): one level of a reduction tree.
DBI_INLINE Vec FoldPairs(Vec x, Vec y, VecIndex first, VecIndex second) {
  return __builtin_shuffle(x, y, first) + __builtin_shuffle(x, y, second);
}

DBI_INLINE float HorizontalSum(Vec value) {
  value = FoldPairs(value, value, VecIndex{0, 1, 2, 3, 0, 1, 2, 3}, VecIndex{4, 5, 6, 7, 4, 5, 6, 7});
  value = FoldPairs(value, value, VecIndex{0, 1, 0, 1, 0, 1, 0, 1}, VecIndex{2, 3, 2, 3, 2, 3, 2, 3});
  return value[0] + value[1];
}

// Lane sums of v[0..3] into sums[0..3], sharing the shuffles of one reduction tree.
DBI_INLINE void HorizontalSums4(const Vec* v, float* sums) {
  const VecIndex low_halves{0, 1, 2, 3, 8, 9, 10, 11};
  const VecIndex high_halves{4, 5, 6, 7, 12, 13, 14, 15};
  const Vec ab = FoldPairs(v[0], v[1], low_halves, high_halves);  // [a a a a b b b b]
  const Vec cd = FoldPairs(v[2], v[3], low_halves, high_halves);  // [c c c c d d d d]
  const Vec abcd = FoldPairs(ab, cd, VecIndex{0, 1, 8, 9, 4, 5, 12, 13}, VecIndex{2, 3, 10, 11, 6, 7, 14, 15});
  const Vec totals = FoldPairs(abcd, abcd, VecIndex{0, 2, 4, 6, 0, 2, 4, 6}, VecIndex{1, 3, 5, 7, 1, 3, 5, 7});
  sums[0] = totals[0];  // totals = [a c b d ...]
  sums[1] = totals[2];
  sums[2] = totals[1];
  sums[3] = totals[3];
}

// The next sample's memory (one range per input block, and in the backward pass the next
// upstream-gradient row), requested into L2 line by line in step with the current sample's work:
// the hardware prefetcher alone starts each sample's lines too late (with one block per table it
// cannot follow 27 streams), asking for all of them at once floods the miss queue, and bringing
// them into L1 evicts the sample being computed (on Zen 4, 27 blocks: about 1.2 against 1.5 us a
// sample).
class NextSampleLines {
 public:
  void Clear() {
    ranges_.clear();
    total_lines_ = issued_ = range_ = offset_ = 0;
  }

  void Add(const void* data, int64_t bytes) {
    if (bytes <= 0) return;
    ranges_.push_back({static_cast<const char*>(data), bytes});
    total_lines_ += (bytes + kLineBytes - 1) / kLineBytes;
  }

  // Requests the lines up to `done` / `total` of the next sample, in address order.
  DBI_INLINE void RequestUpTo(int64_t done, int64_t total) {
    const int64_t target = total_lines_ * done / total;
    for (; issued_ < target; ++issued_) {
      __builtin_prefetch(ranges_[range_].first + offset_, 0, 2);  // into L2 (T1)
      offset_ += kLineBytes;
      if (offset_ >= ranges_[range_].second) {
        ++range_;
        offset_ = 0;
      }
    }
  }

 private:
  static constexpr int64_t kLineBytes = 64;
  std::vector<std::pair<const char*, int64_t>> ranges_;
  int64_t total_lines_ = 0, issued_ = 0, range_ = 0, offset_ = 0;
};

// dot(a_r, b_c) for kA rows from `a` and kB rows from `b` (row stride `dim`), written into
// consecutive rows of the packed lower triangle: row r starts at out + r * first_row_length +
// NumPairs(r), as each triangle row is one longer than the one before. Each loaded chunk feeds
// several accumulators, so loads stay below the FMAs. Small
// blocks also split D over kSplit accumulator sets, so that at least 8 independent FMA chains
// hide the FMA latency.
template <int kA, int kB>
DBI_INLINE void DotBlock(const float* a, const float* b, int64_t dim, float* out, int64_t first_row_length) {
  constexpr int kSplit = kA * kB >= 8 ? 1 : 8 / (kA * kB);
  Vec split_sums[kSplit][kA][kB] = {};
  int64_t d = 0;
  for (; d + kSplit * kLanes <= dim; d += kSplit * kLanes) {
    for (int part = 0; part < kSplit; ++part) {
      Vec b_chunks[kB];
      for (int c = 0; c < kB; ++c) b_chunks[c] = Load(b + c * dim + d + part * kLanes);
      for (int r = 0; r < kA; ++r) {
        const Vec a_chunk = Load(a + r * dim + d + part * kLanes);
        for (int c = 0; c < kB; ++c) split_sums[part][r][c] += a_chunk * b_chunks[c];
      }
    }
  }
  for (; d + kLanes <= dim; d += kLanes) {
    for (int r = 0; r < kA; ++r) {
      for (int c = 0; c < kB; ++c) split_sums[0][r][c] += Load(a + r * dim + d) * Load(b + c * dim + d);
    }
  }
  Vec sums[kA][kB];
  for (int r = 0; r < kA; ++r) {
    for (int c = 0; c < kB; ++c) {
      sums[r][c] = split_sums[0][r][c];
      for (int part = 1; part < kSplit; ++part) sums[r][c] += split_sums[part][r][c];
    }
  }
  for (int r = 0; r < kA; ++r) {
    float totals[kB];
    if constexpr (kB == 4) {
      HorizontalSums4(sums[r], totals);
    } else {
      for (int c = 0; c < kB; ++c) totals[c] = HorizontalSum(sums[r][c]);
    }
    for (int c = 0; c < kB; ++c) {
      for (int64_t tail = dim - dim % kLanes; tail < dim; ++tail) totals[c] += a[r * dim + tail] * b[c * dim + tail];
      out[r * first_row_length + NumPairs(r) + c] = totals[c];
    }
  }
}

// Dots of rows i .. i+kA-1 with every row j < i, written at their PairColumn(0, ., j).
template <int kA>
DBI_INLINE void DotRowsWithEarlier(const float* sample, int64_t i, int64_t dim, float* pairs) {
  constexpr int kB = 4;
  const float* rows = sample + i * dim;
  float* out = pairs + NumPairs(i);
  int64_t j = 0;
  for (; j + kB <= i; j += kB) DotBlock<kA, kB>(rows, sample + j * dim, dim, out + j, i);
  for (; j < i; ++j) DotBlock<kA, 1>(rows, sample + j * dim, dim, out + j, i);
}

// pairs[PairColumn(0, i, j)] = dot(x_i, x_j) for all i > j, from one [F, D] fp32 sample.
// Rows go three at a time against all earlier rows; the three pairs inside a group follow.
DBI_INLINE void SamplePairsOfWidth(const float* sample, int64_t num_vectors, int64_t dim, float* pairs,
                                   NextSampleLines& next) {
  int64_t i = 1;
  for (; i + 3 <= num_vectors; i += 3) {
    DotRowsWithEarlier<3>(sample, i, dim, pairs);
    DotBlock<2, 1>(sample + (i + 1) * dim, sample + i * dim, dim, pairs + NumPairs(i + 1) + i, i + 1);
    DotBlock<1, 1>(sample + (i + 2) * dim, sample + (i + 1) * dim, dim, pairs + NumPairs(i + 2) + i + 1, 0);
    next.RequestUpTo(i + 3, num_vectors);
  }
  if (num_vectors - i == 2) {
    DotRowsWithEarlier<2>(sample, i, dim, pairs);
    DotBlock<1, 1>(sample + (i + 1) * dim, sample + i * dim, dim, pairs + NumPairs(i + 1) + i, 0);
  }
  if (num_vectors - i == 1) DotRowsWithEarlier<1>(sample, i, dim, pairs);
  next.RequestUpTo(num_vectors, num_vectors);
}

// Calls `per_width(width)` with the width a compile-time constant where it is a common one, so
// that the always-inline sample loops below it unroll for that width.
template <typename PerWidth>
DBI_INLINE void WithConstantWidth(int64_t dim, PerWidth per_width) {
  switch (dim) {
    case 16: return per_width(std::integral_constant<int64_t, 16>());
    case 32: return per_width(std::integral_constant<int64_t, 32>());
    case 64: return per_width(std::integral_constant<int64_t, 64>());
    case 128: return per_width(std::integral_constant<int64_t, 128>());
    default: return per_width(dim);
  }
}

DBI_MULTIVERSIONED
void SamplePairs(const float* sample, int64_t num_vectors, int64_t dim, float* pairs, NextSampleLines& next) {
  WithConstantWidth(dim, [&](auto width) DBI_LAMBDA_INLINE {
    SamplePairsOfWidth(sample, num_vectors, width, pairs, next);
  });
}

// Where a sample's gradient goes: row p to rows[p] (D floats each), plus `row0_addend` (the
// bottom MLP's pass-through gradient, or null) added to row 0. With `stream` the rows are written
// with non-temporal stores (fp32 output rows, 16-byte aligned): a plain store first reads the line
// it overwrites, half again the backward pass's traffic. Callers end with FinishStreaming.
struct GradRows {
  float* const* rows;
  const float* row0_addend;
  bool stream;
};

DBI_INLINE void StoreVec(float* destination, Vec value, bool stream) {
#if defined(__x86_64__)
  if (stream) {
    __m128 halves[2];
    std::memcpy(halves, &value, sizeof(value));
    _mm_stream_ps(destination, halves[0]);
    _mm_stream_ps(destination + 4, halves[1]);
    return;
  }
#endif
  Store(destination, value);
}

// out rows r < kRows = sum over p of coefficients[r * F + p] * x_p, for columns
// [d, d + kChunks * kLanes) of one [F, D] sample; out.rows[r] is output row r.
template <int kRows, int kChunks>
DBI_INLINE void CombineRows(const float* coefficients, const float* sample, int64_t num_vectors, int64_t dim,
                            int64_t d, const GradRows& out) {
  Vec sums[kRows][kChunks] = {};
  for (int64_t p = 0; p < num_vectors; ++p) {
    Vec chunks[kChunks];
    for (int c = 0; c < kChunks; ++c) chunks[c] = Load(sample + p * dim + d + c * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float coefficient = coefficients[r * num_vectors + p];
      for (int c = 0; c < kChunks; ++c) sums[r][c] += coefficient * chunks[c];
    }
  }
  if (out.row0_addend != nullptr) {
    for (int c = 0; c < kChunks; ++c) sums[0][c] += Load(out.row0_addend + d + c * kLanes);
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kChunks; ++c) StoreVec(out.rows[r] + d + c * kLanes, sums[r][c], out.stream);
  }
}

// CombineRows over all D columns of kRows output rows, the last (< kLanes) columns in scalar.
template <int kRows>
DBI_INLINE void CombineAllColumns(const float* coefficients, const float* sample, int64_t num_vectors,
                                  int64_t dim, const GradRows& out) {
  constexpr int kChunks = 4;
  int64_t d = 0;
  for (; d + kChunks * kLanes <= dim; d += kChunks * kLanes) {
    CombineRows<kRows, kChunks>(coefficients, sample, num_vectors, dim, d, out);
  }
  for (; d + kLanes <= dim; d += kLanes) CombineRows<kRows, 1>(coefficients, sample, num_vectors, dim, d, out);
  for (int r = 0; r < kRows; ++r) {
    for (int64_t tail = dim - dim % kLanes; tail < dim; ++tail) {
      float sum = 0.0f;
      for (int64_t p = 0; p < num_vectors; ++p) sum += coefficients[r * num_vectors + p] * sample[p * dim + tail];
      if (r == 0 && out.row0_addend != nullptr) sum += out.row0_addend[tail];
      out.rows[r][tail] = sum;
    }
  }
}

// grad = S x for one [F, D] fp32 sample, S the symmetric F x F matrix (zero diagonal) of the
// pair gradients g_ij (i > j, in PairColumn order), built in `coefficients`; written to `grad`.
DBI_INLINE void SampleGradOfWidth(const float* sample, const float* pair_grads, int64_t num_vectors, int64_t dim,
                                  float* coefficients, const GradRows& grad, NextSampleLines& next) {
  for (int64_t i = 0; i < num_vectors; ++i) {
    coefficients[i * num_vectors + i] = 0.0f;
    for (int64_t j = 0; j < i; ++j) {
      const float pair_grad = pair_grads[NumPairs(i) + j];
      coefficients[i * num_vectors + j] = pair_grad;
      coefficients[j * num_vectors + i] = pair_grad;
    }
  }
  constexpr int kRows = 3;
  int64_t k = 0;
  // Rows k.. of the gradient: the addend belongs to row 0 only.
  const auto rows_from = [&](int64_t first) DBI_LAMBDA_INLINE {
    return GradRows{grad.rows + first, first == 0 ? grad.row0_addend : nullptr, grad.stream};
  };
  for (; k + kRows <= num_vectors; k += kRows) {
    CombineAllColumns<kRows>(coefficients + k * num_vectors, sample, num_vectors, dim, rows_from(k));
    next.RequestUpTo(k + kRows, num_vectors);
  }
  const float* last_coefficients = coefficients + k * num_vectors;
  if (num_vectors - k == 2) CombineAllColumns<2>(last_coefficients, sample, num_vectors, dim, rows_from(k));
  if (num_vectors - k == 1) CombineAllColumns<1>(last_coefficients, sample, num_vectors, dim, rows_from(k));
  next.RequestUpTo(num_vectors, num_vectors);
}

DBI_MULTIVERSIONED
void SampleGrad(const float* sample, const float* pair_grads, int64_t num_vectors, int64_t dim, float* coefficients,
                const GradRows& grad, NextSampleLines& next) {
  WithConstantWidth(dim, [&](auto width) DBI_LAMBDA_INLINE {
    SampleGradOfWidth(sample, pair_grads, num_vectors, width, coefficients, grad, next);
  });
}

// Orders this thread's non-temporal stores before what follows (the op's completion).
void FinishStreaming() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// 16-bit <-> fp32 conversions, all rounding to nearest even.
//
// Half: where the compiler has _Float16 (GCC >= 12 and Clang on x86-64 define __FLT16_MAX__),
// the x86-64-v3+ clones vectorise them with F16C; elsewhere (GCC 11, the NGC 24.02 image's
// compiler) Eigen::half converts. Both types hold the same 16 bits, so values are moved with memcpy.
#if defined(__FLT16_MAX__)
using HalfBits = _Float16;
#else
using HalfBits = Eigen::half;
#endif
static_assert(sizeof(Eigen::half) == sizeof(HalfBits), "Eigen::half must be 16 bits");

DBI_MULTIVERSIONED
void Widen(const Eigen::half* values, int64_t count, float* widened) {
  for (int64_t k = 0; k < count; ++k) {
    HalfBits value;
    std::memcpy(static_cast<void*>(&value), values + k, sizeof(value));
    widened[k] = static_cast<float>(value);
  }
}

DBI_MULTIVERSIONED
void Narrow(const float* values, int64_t count, Eigen::half* narrowed) {
  for (int64_t k = 0; k < count; ++k) {
    const HalfBits value = static_cast<HalfBits>(values[k]);
    std::memcpy(static_cast<void*>(narrowed + k), &value, sizeof(value));
  }
}

// Bfloat16 is the upper half of an fp32, so both directions are integer operations on the bits,
// which every clone vectorises (no compiler-specific bf16 type needed, GCC 11 included).
static_assert(sizeof(Eigen::bfloat16) == sizeof(uint16_t), "Eigen::bfloat16 must be 16 bits");

DBI_MULTIVERSIONED
void Widen(const Eigen::bfloat16* values, int64_t count, float* widened) {
  for (int64_t k = 0; k < count; ++k) {
    uint16_t high;
    std::memcpy(&high, values + k, sizeof(high));
    const uint32_t bits = static_cast<uint32_t>(high) << 16;
    std::memcpy(widened + k, &bits, sizeof(bits));
  }
}

// Round to nearest even on the 16 dropped bits; a NaN stays a (quiet) NaN instead of rounding
// into the infinity next to it.
DBI_MULTIVERSIONED
void Narrow(const float* values, int64_t count, Eigen::bfloat16* narrowed) {
  for (int64_t k = 0; k < count; ++k) {
    uint32_t bits;
    std::memcpy(&bits, values + k, sizeof(bits));
    const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint16_t high = static_cast<uint16_t>(is_nan ? (bits >> 16) | 0x0040u : rounded);
    std::memcpy(static_cast<void*>(narrowed + k), &high, sizeof(high));
  }
}

// fp32 view of `count` values: `values` itself for float, else widened into `scratch`.
template <typename T>
const float* AsFloat(const T* values, int64_t count, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return values;
  } else {
    Widen(values, count, scratch);
    return scratch;
  }
}

// Runs `per_sample(begin, end)` over the batch on TF's intra-op thread pool.
template <typename Work>
void ShardBatch(tensorflow::OpKernelContext* context, const InteractShape& shape, Work per_sample) {
  const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
  const int64_t cost_per_sample = shape.num_vectors * shape.num_vectors * shape.dim;
  tensorflow::Shard(workers.num_threads, workers.workers, shape.batch, cost_per_sample, per_sample);
}

// Consecutive vectors of every sample held in one tensor: sample b's `vectors` x D values start
// at data + b * vectors * D. A stacked [B, F, D] input is one block; the blocks op takes one per
// input tensor (e.g. the bottom-MLP output and each table's vectors), so nothing is concatenated.
template <typename T>
struct VectorBlock {
  T* data;
  int64_t vectors;
};

template <typename T>
using InputBlocks = std::vector<VectorBlock<const T>>;

// The [F, D] fp32 sample b of `blocks`: the block itself when it is one fp32 block (unless
// `copy`), else its vectors copied (widened) into `scratch`, where one sample fits in L1.
template <typename T>
const float* GatherSample(const InputBlocks<T>& blocks, int64_t b, int64_t dim, float* scratch, bool copy = false) {
  if constexpr (std::is_same_v<T, float>) {
    if (blocks.size() == 1 && !copy) return blocks[0].data + b * blocks[0].vectors * dim;
  }
  float* out = scratch;
  for (const auto& block : blocks) {
    const int64_t count = block.vectors * dim;
    const T* source = block.data + b * count;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out, source, count * sizeof(float));
    } else {
      Widen(source, count, out);
    }
    out += count;
  }
  return scratch;
}

template <typename T>
bool NeedsSampleScratch(const InputBlocks<T>& blocks, bool copy = false) {
  return !std::is_same_v<T, float> || blocks.size() > 1 || copy;
}

// Sets `lines` to sample b's memory in every block, or to nothing when b is past the shard's end.
template <typename T>
void ListSample(const InputBlocks<T>& blocks, int64_t b, int64_t end, int64_t dim, NextSampleLines& lines) {
  lines.Clear();
  if (b >= end) return;
  for (const auto& block : blocks) {
    const int64_t count = block.vectors * dim;
    lines.Add(block.data + b * count, count * sizeof(T));
  }
}

static_assert(kOutputAlignment % kLanes == 0, "output rows must be whole vectors");

// `count` floats (a multiple of kLanes) from `source` to `destination`, with non-temporal stores when
// `stream` (destination 16-byte aligned). Callers end with FinishStreaming.
void CopyRow(const float* source, int64_t count, float* destination, bool stream) {
  for (int64_t k = 0; k < count; k += kLanes) StoreVec(destination + k, Load(source + k), stream);
}

// Forward over blocks whose vectors add up to shape.num_vectors; block 0 starts with the bottom-MLP
// output, copied as stored into the first D columns. fp32 output rows are assembled in L1 (the
// pairs written in place, the padding zero once) and streamed past the cache: a plain store of a
// row first reads the lines it overwrites, which took a tenth of the forward pass.
template <typename T>
void InteractBlocks(tensorflow::OpKernelContext* context, const InteractShape& shape, const InputBlocks<T>& blocks,
                    T* output) {
  const int64_t sample_size = shape.num_vectors * shape.dim;
  const int64_t num_pairs = NumPairs(shape.num_vectors);
  constexpr bool kFloat = std::is_same_v<T, float>;
  const bool stream = kFloat && reinterpret_cast<uintptr_t>(output) % 16 == 0;
  ShardBatch(context, shape, [&](int64_t begin, int64_t end) {
    std::vector<float> gathered(NeedsSampleScratch(blocks) ? sample_size : 0);
    std::vector<float> row_scratch(shape.output_width, 0.0f);  // [bottom | pairs | zeros]
    float* const pairs = row_scratch.data() + shape.dim;
    NextSampleLines next;
    for (int64_t b = begin; b < end; ++b) {
      const float* sample = GatherSample(blocks, b, shape.dim, gathered.data());
      const T* bottom = blocks[0].data + b * blocks[0].vectors * shape.dim;
      T* row = output + b * shape.output_width;
      ListSample(blocks, b + 1, end, shape.dim, next);
      SamplePairs(sample, shape.num_vectors, shape.dim, pairs, next);
      if constexpr (kFloat) {
        std::copy(bottom, bottom + shape.dim, row_scratch.data());
        CopyRow(row_scratch.data(), shape.output_width, row, stream);
      } else {
        std::copy(bottom, bottom + shape.dim, row);
        Narrow(pairs, num_pairs, row + shape.dim);
        std::fill(row + shape.dim + num_pairs, row + shape.output_width, T(0.0f));
      }
    }
    if (stream) FinishStreaming();
  });
}

// Backward over the same blocks: `grads` has one block per input block. bottom_mlp_grad (may be
// null) receives the first D upstream columns; with `fold_bottom_mlp_grad` they are also added to
// the gradient of vector 0. fp32 gradients are written straight to `grads`, streamed past the
// cache where every row is 16-byte aligned; 16-bit ones go through an fp32 scratch and are
// rounded. A gradient block may share its input block's buffer: the sample is then copied into
// scratch first, so that no row is overwritten before the last one is read.
template <typename T>
void InteractBlocksGrad(tensorflow::OpKernelContext* context, const InteractShape& shape, bool fold_bottom_mlp_grad,
                        const InputBlocks<T>& blocks, const T* upstream_grad, const std::vector<VectorBlock<T>>& grads,
                        T* bottom_mlp_grad) {
  const int64_t sample_size = shape.num_vectors * shape.dim;
  const int64_t num_pairs = NumPairs(shape.num_vectors);
  constexpr bool kFloat = std::is_same_v<T, float>;
  bool shares_input = false, aligned = shape.dim % 4 == 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    shares_input |= grads[i].data == blocks[i].data;
    aligned &= reinterpret_cast<uintptr_t>(grads[i].data) % 16 == 0;
  }
  ShardBatch(context, shape, [&](int64_t begin, int64_t end) {
    std::vector<float> gathered(NeedsSampleScratch(blocks, shares_input) ? sample_size : 0);
    std::vector<float> widened_upstream(kFloat ? 0 : shape.dim + num_pairs);
    std::vector<float> sample_grad(kFloat ? 0 : sample_size);
    std::vector<float*> grad_rows(shape.num_vectors);  // 16-bit: the scratch's rows, for every sample
    if constexpr (!kFloat) {
      for (int64_t p = 0; p < shape.num_vectors; ++p) grad_rows[p] = sample_grad.data() + p * shape.dim;
    }
    std::vector<float> coefficients(shape.num_vectors * shape.num_vectors);
    NextSampleLines next;
    for (int64_t b = begin; b < end; ++b) {
      const T* upstream_row = upstream_grad + b * shape.output_width;
      if (bottom_mlp_grad != nullptr) std::copy(upstream_row, upstream_row + shape.dim, bottom_mlp_grad + b * shape.dim);
      const float* sample = GatherSample(blocks, b, shape.dim, gathered.data(), shares_input);
      const float* upstream = AsFloat(upstream_row, shape.dim + num_pairs, widened_upstream.data());
      ListSample(blocks, b + 1, end, shape.dim, next);
      if (b + 1 < end) next.Add(upstream_row + shape.output_width, (shape.dim + num_pairs) * sizeof(T));
      if constexpr (kFloat) {  // fp32: sample b's rows in the gradient blocks
        int64_t p = 0;
        for (const auto& block : grads) {
          for (int64_t v = 0; v < block.vectors; ++v) grad_rows[p++] = block.data + (b * block.vectors + v) * shape.dim;
        }
      }
      const GradRows out{grad_rows.data(), fold_bottom_mlp_grad ? upstream : nullptr, kFloat && aligned};
      SampleGrad(sample, upstream + shape.dim, shape.num_vectors, shape.dim, coefficients.data(), out, next);
      if constexpr (!kFloat) {
        const float* from = sample_grad.data();
        for (const auto& block : grads) {
          const int64_t count = block.vectors * shape.dim;
          Narrow(from, count, block.data + b * count);
          from += count;
        }
      }
    }
    FinishStreaming();
  });
}

}  // namespace

template <typename T>
struct DotBasedInteractFunctor<Eigen::ThreadPoolDevice, T> {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, const T* input,
                  T* output) const {
    InteractBlocks<T>(context, shape, {{input, shape.num_vectors}}, output);
  }
};

template <typename T>
struct DotBasedInteractGradFunctor<Eigen::ThreadPoolDevice, T> {
  void operator()(tensorflow::OpKernelContext* context, const InteractShape& shape, bool fold_bottom_mlp_grad,
                  const T* input, const T* upstream_grad, T* grad, T* bottom_mlp_grad) const {
    InteractBlocksGrad<T>(context, shape, fold_bottom_mlp_grad, {{input, shape.num_vectors}}, upstream_grad,
                          {{grad, shape.num_vectors}}, bottom_mlp_grad);
  }
};

// The blocks' InteractShape and their VectorBlocks: every block [B, k * dim] with k >= 1, one batch.
template <typename T>
tensorflow::Status DescribeBlocks(const tensorflow::OpInputList& blocks, int64_t dim, InteractShape* shape,
                                  InputBlocks<T>* described) {
  shape->batch = blocks[0].dims() == 2 ? blocks[0].dim_size(0) : -1;
  shape->dim = dim;
  shape->num_vectors = 0;
  for (int i = 0; i < blocks.size(); ++i) {
    const tensorflow::Tensor& block = blocks[i];
    if (block.dims() != 2 || block.dim_size(0) != shape->batch || block.dim_size(1) == 0 ||
        block.dim_size(1) % dim != 0) {
      return tensorflow::errors::InvalidArgument(
          "DotBasedInteractBlocks: block ", i, " must be [batch, k * ", dim, "] with k >= 1 and the batch of block 0 (",
          shape->batch, "), got shape ", block.shape().DebugString());
    }
    described->push_back({block.flat<T>().data(), block.dim_size(1) / dim});
    shape->num_vectors += block.dim_size(1) / dim;
  }
  if (shape->batch == 0) return tensorflow::errors::InvalidArgument("DotBasedInteractBlocks: empty batch");
  shape->output_width = OutputWidth(shape->num_vectors, dim);
  return tensorflow::OkStatus();
}

// What both blocks kernels share: the `dim` attribute and reading and checking the `blocks` input
// list, before their own ComputeOnBlocks.
template <typename T>
class BlocksKernel : public tensorflow::OpKernel {
 public:
  explicit BlocksKernel(tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("dim", &dim_));
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    tensorflow::OpInputList blocks;
    OP_REQUIRES_OK(context, context->input_list("blocks", &blocks));
    InteractShape shape;
    InputBlocks<T> described;
    OP_REQUIRES_OK(context, DescribeBlocks(blocks, dim_, &shape, &described));
    ComputeOnBlocks(context, blocks, shape, described);
  }

 protected:
  virtual void ComputeOnBlocks(tensorflow::OpKernelContext* context, const tensorflow::OpInputList& blocks,
                               const InteractShape& shape, const InputBlocks<T>& described) = 0;

 private:
  int64_t dim_ = 0;
};

template <typename T>
class DotBasedInteractBlocksOp : public BlocksKernel<T> {
 public:
  using BlocksKernel<T>::BlocksKernel;

  void ComputeOnBlocks(tensorflow::OpKernelContext* context, const tensorflow::OpInputList& blocks,
                       const InteractShape& shape, const InputBlocks<T>& described) override {
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {shape.batch, shape.output_width}, &output));
    InteractBlocks<T>(context, shape, described, output->flat<T>().data());
  }
};

template <typename T>
class DotBasedInteractBlocksGradOp : public BlocksKernel<T> {
 public:
  using BlocksKernel<T>::BlocksKernel;

  void ComputeOnBlocks(tensorflow::OpKernelContext* context, const tensorflow::OpInputList& blocks,
                       const InteractShape& shape, const InputBlocks<T>& described) override {
    const tensorflow::Tensor& upstream_grad = context->input(blocks.size());
    OP_REQUIRES_OK(context, CheckMatrix("upstream_grad", upstream_grad, shape.batch, shape.output_width));
    // A gradient may take over its block's buffer when nothing else reads the block any more (the
    // usual case after the forward pass; InteractBlocksGrad reads each sample before overwriting
    // it): the backward pass then needs no new memory for them.
    std::vector<VectorBlock<T>> grad_blocks;
    for (int i = 0; i < blocks.size(); ++i) {
      tensorflow::Tensor* grad = nullptr;
      OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({i}, i, blocks[i].shape(), &grad));
      grad_blocks.push_back({grad->flat<T>().data(), described[i].vectors});
    }
    InteractBlocksGrad<T>(context, shape, true, described, upstream_grad.flat<T>().data(), grad_blocks, nullptr);
  }
};

#define DBI_REGISTER_BLOCK_KERNELS(T)                                                                           \
  REGISTER_KERNEL_BUILDER(Name("DotBasedInteractBlocks").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          DotBasedInteractBlocksOp<T>);                                                          \
  REGISTER_KERNEL_BUILDER(                                                                                       \
      Name("DotBasedInteractBlocksGrad").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),                  \
      DotBasedInteractBlocksGradOp<T>)

DBI_REGISTER_BLOCK_KERNELS(float);
DBI_REGISTER_BLOCK_KERNELS(Eigen::half);
DBI_REGISTER_BLOCK_KERNELS(Eigen::bfloat16);

DBI_REGISTER_KERNELS(DEVICE_CPU, Eigen::ThreadPoolDevice, float);
DBI_REGISTER_KERNELS(DEVICE_CPU, Eigen::ThreadPoolDevice, Eigen::half);
DBI_REGISTER_KERNELS(DEVICE_CPU, Eigen::ThreadPoolDevice, Eigen::bfloat16);

}  // namespace dot_based_interact

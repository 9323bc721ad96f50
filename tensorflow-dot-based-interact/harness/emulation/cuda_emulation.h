// A CPU emulation of the CUDA subset the dot-interaction kernels and the harness use, so that
// both run here, without a GPU, and check_harness.py checks their results against NumPy.
//
// Each warp's 32 lanes run as fibers (ucontext) on one thread; __syncwarp is a barrier among
// them and shuffles exchange through it, so the kernels' warp-synchronous code runs as written.
// WMMA fragments hold the whole tile in every lane (load, mma and fill are exact per lane; a
// store writes the elements e with (7e + 3) % 32 == lane, which no kernel's own indexing
// matches, so a read of a stored tile before __syncwarp sees stale data).
// Shared memory starts as 0xFF bytes (NaN), device buffers are heap blocks (AddressSanitizer
// catches out-of-bounds accesses), and WMMA pointers, strides, 16-byte vector accesses and
// dynamic shared memory above 48 KB without cudaFuncSetAttribute are checked.
// cp.async (cuda_pipeline.h's __pipeline_* calls) is deferred as on a GPU: a lane's copies land
// only when it waits for their group, so a stage read before its wait, or written while its
// copies are pending, gives wrong results; a lane that ends with copies never waited for fails.
// Bulk copies (the kernels' sm_90 path: MbarrierInit, MbarrierArriveExpectBytes, BulkCopyToShared,
// MbarrierTryWaitParity) are deferred the same way: they land when a lane's wait finds the
// barrier's phase complete (its arrival made and every announced byte issued); a copy of bytes
// not announced first, a barrier used before its init, a phase that never completes, and a block
// that ends with copies never waited for fail. Bulk copies out (BulkCopyToGlobal) land when their
// lane waits for their group, and a lane that ends without waiting fails. __CUDA_ARCH__ is 900 unless the build sets it
// (-D__CUDA_ARCH__=800 runs the cp.async path), and the emulated major follows it.
// The emulated GPU has one SM with 38 KB of shared memory, so the persistent grid of every
// tensor-core kernel at Criteo's shape is one block of two warps, and the first warp runs two of
// the harness's three emulated samples (a poisoned sample 0 must leave sample 2 alone).
// Not emulated: timing, races between warps (the kernels share nothing between warps), exact
// TF32 or tensor-core summation order. Test-only: never part of the op library.
#ifndef DOT_BASED_INTERACT_CUDA_EMULATION_H_
#define DOT_BASED_INTERACT_CUDA_EMULATION_H_

#include <ucontext.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 900
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

struct alignas(16) float4 {
  float x, y, z, w;
};

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

namespace emulation {

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what);
  std::abort();
}

constexpr int kLanes = 32;

// The lanes of the running warp: fibers, a barrier and the shuffle exchange.
// One deferred copy (cp.async, or a bulk copy out of shared memory), done when its lane waits for its group.
struct PendingCopy {
  void* target;
  const void* source;
  size_t bytes;
};

// One lane's deferred copies: committed groups, oldest first, and the group being gathered.
struct CopyGroups {
  std::vector<std::vector<PendingCopy>> committed;
  std::vector<PendingCopy> gathering;
  void Add(void* target, const void* source, size_t bytes) { gathering.push_back({target, source, bytes}); }
  void Commit() {
    committed.push_back(std::move(gathering));
    gathering.clear();
  }
  // Completes the committed groups but the `prior` most recent.
  void CompleteAllBut(size_t prior) {
    while (committed.size() > prior) {
      for (const PendingCopy& copy : committed.front()) std::memcpy(copy.target, copy.source, copy.bytes);
      committed.erase(committed.begin());
    }
  }
  bool Pending() const {
    for (const auto& group : committed) {
      if (!group.empty()) return true;
    }
    return !gathering.empty();
  }
};

struct Warp {
  ucontext_t scheduler;
  ucontext_t lanes[kLanes];
  std::vector<char> stacks[kLanes];
  bool finished[kLanes] = {};
  int current = 0;
  int arrived = 0;
  unsigned generation = 0;
  float exchange[kLanes] = {};
  std::function<void()> body;
  CopyGroups async_copies[kLanes];  // per lane: cp.async
  CopyGroups bulk_out[kLanes];      // per lane: bulk copies out of shared memory
};

// One mbarrier in shared memory: arrivals and bytes of the current phase, and its bulk copies,
// done when a wait finds the phase complete.
struct Mbarrier {
  unsigned arrivals = 0;
  unsigned pending_arrivals = 0;
  int64_t pending_bytes = 0;
  unsigned phase = 0;
  std::vector<PendingCopy> copies;
};

inline std::map<const void*, Mbarrier>& Mbarriers() {
  static std::map<const void*, Mbarrier> barriers;
  return barriers;
}

struct Position {
  uint3 thread{0, 0, 0};
  uint3 block{0, 0, 0};
  uint3 grid{1, 1, 1};
  Warp* warp = nullptr;
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
};

inline Position& Current() {
  static Position position;
  return position;
}

inline void Yield() {
  Warp& warp = *Current().warp;
  swapcontext(&warp.lanes[warp.current], &warp.scheduler);
}

inline void SyncWarp() {
  Warp& warp = *Current().warp;
  const unsigned generation = warp.generation;
  if (++warp.arrived == kLanes) {
    warp.arrived = 0;
    ++warp.generation;
    return;
  }
  while (warp.generation == generation) Yield();
}

inline void LaneEntry() {
  Warp& warp = *Current().warp;
  warp.body();
  if (warp.async_copies[warp.current].Pending()) Fail("a lane ended with cp.async copies it never waited for");
  if (warp.bulk_out[warp.current].Pending()) Fail("a lane ended with bulk copies to global memory it never waited for");
  warp.finished[warp.current] = true;
}

// Runs `body` in the 32 lanes of warp `warp_index` of block `block`, round robin.
inline void RunWarp(unsigned block, int warp_index, const std::function<void()>& body) {
  constexpr size_t kStackBytes = 256 * 1024;
  Warp warp;
  warp.body = body;
  Current().warp = &warp;
  for (int lane = 0; lane < kLanes; ++lane) {
    warp.stacks[lane].resize(kStackBytes);
    getcontext(&warp.lanes[lane]);
    warp.lanes[lane].uc_stack.ss_sp = warp.stacks[lane].data();
    warp.lanes[lane].uc_stack.ss_size = kStackBytes;
    warp.lanes[lane].uc_link = &warp.scheduler;
    makecontext(&warp.lanes[lane], LaneEntry, 0);
  }
  int running = kLanes;
  while (running > 0) {
    running = 0;
    for (int lane = 0; lane < kLanes; ++lane) {
      if (warp.finished[lane]) continue;
      warp.current = lane;
      Current().thread = {static_cast<unsigned>(warp_index * kLanes + lane), 0, 0};
      Current().block = {block, 0, 0};
      swapcontext(&warp.scheduler, &warp.lanes[lane]);
      if (warp.finished[lane] && warp.arrived > 0) Fail("a lane returned while its warp waits at __syncwarp");
      if (!warp.finished[lane]) ++running;
    }
  }
  Current().warp = nullptr;
}

// Dynamic shared memory each kernel may use: 48 KB unless cudaFuncSetAttribute raised it.
inline std::map<const void*, size_t>& SharedLimits() {
  static std::map<const void*, size_t> limits;
  return limits;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) becomes Launch(kernel, grid, block,
// shared_bytes, stream)(args...): every block, warp by warp (warps share nothing here).
template <typename... Params>
auto Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, void* /*stream*/) {
  return [=](auto&&... args) {
    const auto found = SharedLimits().find(reinterpret_cast<const void*>(kernel));
    const size_t limit = found == SharedLimits().end() ? 48 * 1024 : found->second;
    if (shared_bytes > limit) Fail("dynamic shared memory above the kernel's limit (cudaFuncSetAttribute)");
    if (block.x % kLanes != 0 || block.y != 1 || block.z != 1) Fail("blocks must be whole warps in x");
    std::tuple<std::decay_t<Params>...> bound(args...);
    std::vector<unsigned char> shared;
    Current().grid = {grid.x, 1, 1};
    for (unsigned b = 0; b < grid.x; ++b) {
      shared.assign(shared_bytes + 128, 0xFF);  // garbage that reads as NaN
      const uintptr_t base = reinterpret_cast<uintptr_t>(shared.data());
      Current().shared = shared.data() + ((128 - base % 128) % 128);
      Current().shared_bytes = shared_bytes;
      Mbarriers().clear();
      for (unsigned w = 0; w < block.x / kLanes; ++w) {
        RunWarp(b, static_cast<int>(w), [&] { std::apply(kernel, bound); });
      }
      for (const auto& barrier : Mbarriers()) {
        if (!barrier.second.copies.empty()) Fail("a block ended with bulk copies its warp never waited for");
      }
    }
  };
}

inline unsigned char* DynamicShared() { return Current().shared; }

inline void CheckAligned(const void* pointer, uintptr_t bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(pointer) % bytes != 0) Fail(what);
}

}  // namespace emulation

#define threadIdx (::emulation::Current().thread)
#define blockIdx (::emulation::Current().block)
#define gridDim (::emulation::Current().grid)

inline void __syncwarp(unsigned = 0xffffffffu) { emulation::SyncWarp(); }

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  emulation::Warp& warp = *emulation::Current().warp;
  const int lane = static_cast<int>(threadIdx.x) % emulation::kLanes;
  warp.exchange[lane] = value;
  emulation::SyncWarp();
  const float partner = warp.exchange[lane ^ lane_mask];
  emulation::SyncWarp();
  return partner;
}

inline uint4 __ldcs(const uint4* pointer) {
  emulation::CheckAligned(pointer, 16, "__ldcs of a misaligned uint4");
  return *pointer;
}

inline void __stcs(uint4* pointer, uint4 value) {
  emulation::CheckAligned(pointer, 16, "__stcs of a misaligned uint4");
  *pointer = value;
}

[[noreturn]] inline void __trap() { emulation::Fail("__trap"); }

// ---- cp.async (cuda_pipeline.h) ---------------------------------------------------------------

namespace emulation {
// The running lane's deferred copies of one kind (Warp::async_copies or Warp::bulk_out).
inline CopyGroups& LaneCopies(CopyGroups (Warp::*kind)[kLanes]) {
  Warp& warp = *Current().warp;
  return (warp.*kind)[warp.current];
}
}  // namespace emulation

inline void __pipeline_memcpy_async(void* target, const void* source, size_t bytes, size_t zero_fill = 0) {
  if (bytes != 4 && bytes != 8 && bytes != 16) emulation::Fail("cp.async of other than 4, 8 or 16 bytes");
  if (zero_fill != 0) emulation::Fail("cp.async zero fill is not emulated");
  emulation::CheckAligned(target, bytes, "cp.async target misaligned");
  emulation::CheckAligned(source, bytes, "cp.async source misaligned");
  emulation::LaneCopies(&emulation::Warp::async_copies).Add(target, source, bytes);
}

inline void __pipeline_commit() { emulation::LaneCopies(&emulation::Warp::async_copies).Commit(); }

// Completes this lane's committed groups but the `prior` most recent.
inline void __pipeline_wait_prior(size_t prior) {
  emulation::LaneCopies(&emulation::Warp::async_copies).CompleteAllBut(prior);
}

// ---- bulk copies and mbarriers (the kernels' sm_90 wrappers) ---------------------------------

namespace emulation {

inline void CheckShared(const void* pointer, size_t bytes, const char* what) {
  const unsigned char* byte = static_cast<const unsigned char*>(pointer);
  if (byte < Current().shared || byte + bytes > Current().shared + Current().shared_bytes) Fail(what);
}

inline Mbarrier& FindMbarrier(const uint64_t* barrier) {
  const auto found = Mbarriers().find(barrier);
  if (found == Mbarriers().end()) Fail("an mbarrier used before MbarrierInit");
  return found->second;
}

}  // namespace emulation

inline void MbarrierInit(uint64_t* barrier, uint32_t arrivals) {
  emulation::CheckAligned(barrier, 8, "mbarrier not 8-byte aligned");
  emulation::CheckShared(barrier, 8, "mbarrier outside the block's dynamic shared memory");
  emulation::Mbarrier& state = emulation::Mbarriers()[barrier];
  state = emulation::Mbarrier{};
  state.arrivals = state.pending_arrivals = arrivals;
}

inline void MbarrierInval(uint64_t* barrier) {
  if (!emulation::FindMbarrier(barrier).copies.empty()) emulation::Fail("an mbarrier retired with copies pending");
  emulation::Mbarriers().erase(barrier);
}

inline void MbarrierArriveExpectBytes(uint64_t* barrier, uint32_t bytes) {
  emulation::Mbarrier& state = emulation::FindMbarrier(barrier);
  if (state.pending_arrivals == 0) emulation::Fail("an mbarrier arrival beyond its count");
  --state.pending_arrivals;
  state.pending_bytes += bytes;
}

inline void BulkCopyToShared(void* target, const void* source, uint32_t bytes, uint64_t* barrier) {
  if (bytes == 0 || bytes % 16 != 0) emulation::Fail("bulk copy of no or not a multiple of 16 bytes");
  emulation::CheckAligned(target, 16, "bulk copy target misaligned");
  emulation::CheckAligned(source, 16, "bulk copy source misaligned");
  emulation::CheckShared(target, bytes, "bulk copy target outside the block's dynamic shared memory");
  emulation::Mbarrier& state = emulation::FindMbarrier(barrier);
  state.pending_bytes -= bytes;
  if (state.pending_bytes < 0) emulation::Fail("a bulk copy of bytes its barrier's phase was not told of");
  state.copies.push_back({target, source, bytes});
}

// Completes the phase when it can (the copies land then); whether the phase of `parity` is over.
inline bool MbarrierTryWaitParity(uint64_t* barrier, uint32_t parity) {
  static long fruitless = 0;
  emulation::Mbarrier& state = emulation::FindMbarrier(barrier);
  if (state.pending_arrivals == 0 && state.pending_bytes == 0 && (state.phase & 1u) == parity) {
    for (const emulation::PendingCopy& copy : state.copies) std::memcpy(copy.target, copy.source, copy.bytes);
    state.copies.clear();
    state.phase ^= 1u;
    state.pending_arrivals = state.arrivals;
  }
  if ((state.phase & 1u) != parity) {
    fruitless = 0;
    return true;
  }
  if (++fruitless > 1000000) emulation::Fail("an mbarrier phase never completes");
  emulation::Yield();  // the lanes that still have to arrive or copy run
  return false;
}

// Bulk copies out of shared memory land when their lane waits for their group (read or complete:
// the emulation does both at once), so shared memory written before that wait corrupts them.
inline void BulkCopyToGlobal(void* target, const void* source, uint32_t bytes) {
  if (bytes == 0 || bytes % 16 != 0) emulation::Fail("bulk copy of no or not a multiple of 16 bytes");
  emulation::CheckAligned(target, 16, "bulk copy target misaligned");
  emulation::CheckAligned(source, 16, "bulk copy source misaligned");
  emulation::CheckShared(source, bytes, "bulk copy source outside the block's dynamic shared memory");
  emulation::LaneCopies(&emulation::Warp::bulk_out).Add(target, source, bytes);
}

inline void BulkCommitGroup() { emulation::LaneCopies(&emulation::Warp::bulk_out).Commit(); }

inline void BulkWaitGroupsRead() { emulation::LaneCopies(&emulation::Warp::bulk_out).CompleteAllBut(0); }

inline void BulkWaitGroups() { BulkWaitGroupsRead(); }

inline void FenceProxyAsyncShared() {}

inline int min(int a, int b) { return a < b ? a : b; }
inline int __ffs(int value) { return __builtin_ffs(value); }

// ---- half -----------------------------------------------------------------------------------

struct __half {
  uint16_t bits;
};

inline float __half2float(__half value) {
  _Float16 half;
  std::memcpy(&half, &value.bits, sizeof(half));
  return static_cast<float>(half);
}

inline __half __float2half_rn(float value) {
  const _Float16 half = static_cast<_Float16>(value);  // round to nearest even
  __half result;
  std::memcpy(&result.bits, &half, sizeof(half));
  return result;
}

struct __half2 {
  __half x, y;
};

// Two values rounded to nearest even, the first in the low half (as CUDA packs them).
inline __half2 __floats2half2_rn(float low, float high) { return {__float2half_rn(low), __float2half_rn(high)}; }

// ---- WMMA -------------------------------------------------------------------------------------

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <typename T>
struct Storage {
  using type = T;
};
template <>
struct Storage<precision::tf32> {
  using type = float;
};

inline float AsFloat(float value) { return value; }
inline float AsFloat(__half value) { return __half2float(value); }

// The whole logical tile, row-major: matrix_a M x K, matrix_b K x N, accumulator M x N.
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int kRows = std::is_same<Use, matrix_b>::value ? K : M;
  static constexpr int kColumns = std::is_same<Use, matrix_a>::value ? K : N;
  static constexpr int num_elements = kRows * kColumns;
  typename Storage<T>::type x[num_elements];
};

inline void CheckTilePointer(const void* pointer, unsigned stride, size_t element_bytes) {
  emulation::CheckAligned(pointer, 32, "WMMA tile pointer not 32-byte aligned");
  if (stride * element_bytes % 16 != 0) emulation::Fail("WMMA stride not a multiple of 16 bytes");
}

template <typename Use, int M, int N, int K, typename T, typename Layout, typename Source>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& tile, const Source* source, unsigned stride) {
  using Fragment = fragment<Use, M, N, K, T, Layout>;
  CheckTilePointer(source, stride, sizeof(Source));
  for (int r = 0; r < Fragment::kRows; ++r) {
    for (int c = 0; c < Fragment::kColumns; ++c) {
      const Source value = std::is_same<Layout, col_major>::value ? source[c * stride + r] : source[r * stride + c];
      tile.x[r * Fragment::kColumns + c] = value;
    }
  }
}

template <int M, int N, int K>
void fill_fragment(fragment<accumulator, M, N, K, float>& tile, float value) {
  for (float& element : tile.x) element = value;
}

template <int M, int N, int K, typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float>& result, const fragment<matrix_a, M, N, K, T, LayoutA>& a,
              const fragment<matrix_b, M, N, K, T, LayoutB>& b, const fragment<accumulator, M, N, K, float>& c) {
  float sum[M * N];
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      float total = c.x[m * N + n];
      for (int k = 0; k < K; ++k) total += AsFloat(a.x[m * K + k]) * AsFloat(b.x[k * N + n]);
      sum[m * N + n] = total;
    }
  }
  std::memcpy(result.x, sum, sizeof(sum));
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* target, const fragment<accumulator, M, N, K, T>& tile, unsigned stride, layout_t layout) {
  if (layout != mem_row_major) emulation::Fail("only row-major stores are emulated");
  CheckTilePointer(target, stride, sizeof(T));
  const int lane = static_cast<int>(threadIdx.x) % emulation::kLanes;
  for (int e = 0; e < M * N; ++e) {
    if ((e * 7 + 3) % emulation::kLanes == lane) target[(e / N) * stride + e % N] = tile.x[e];
  }
}

// Rounds to the nearest value with 10 mantissa bits (ties away from zero), as cvt.rna.tf32 does.
inline float __float_to_tf32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace wmma
}  // namespace nvcuda

// ---- runtime API --------------------------------------------------------------------------------

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
struct CUstream_st;
using cudaStream_t = CUstream_st*;

inline const char* cudaGetErrorString(cudaError_t status) { return status == cudaSuccess ? "no error" : "error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

// The emulated compute capability: DBI_EMULATED_MAJOR (default: __CUDA_ARCH__'s, 9 for 900).
inline int EmulatedMajor() {
  const char* text = std::getenv("DBI_EMULATED_MAJOR");
  return text != nullptr ? std::atoi(text) : __CUDA_ARCH__ / 100;
}

enum cudaDeviceAttr {
  cudaDevAttrComputeCapabilityMajor,
  cudaDevAttrMemoryClockRate,
  cudaDevAttrGlobalMemoryBusWidth,
  cudaDevAttrMultiProcessorCount,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor,
  cudaDevAttrMaxBlocksPerMultiprocessor,
};
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  switch (attribute) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = EmulatedMajor();
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = 1;
      break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = 38 * 1024;
      break;
    case cudaDevAttrMaxBlocksPerMultiprocessor:
      *value = 32;
      break;
    default:
      *value = 0;
  }
  return cudaSuccess;
}

struct cudaDeviceProp {
  char name[256];
  int major;
  int minor;
  int multiProcessorCount;
};
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int) {
  std::snprintf(properties->name, sizeof(properties->name), "CPU emulation of compute %d.0", EmulatedMajor());
  properties->major = EmulatedMajor();
  properties->minor = 0;
  properties->multiProcessorCount = 1;
  return cudaSuccess;
}
inline cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* version) {
  *version = 0;
  return cudaSuccess;
}

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaFuncAttributePreferredSharedMemoryCarveout };
constexpr int cudaSharedmemCarveoutMaxShared = 100;
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel kernel, cudaFuncAttribute attribute, int value) {
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    emulation::SharedLimits()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t cudaMalloc(T** pointer, size_t bytes) {
  *pointer = static_cast<T*>(std::malloc(bytes == 0 ? 1 : bytes));  // malloc: 16-byte aligned
  return *pointer != nullptr ? cudaSuccess : 2;
}
inline cudaError_t cudaFree(void* pointer) {
  std::free(pointer);
  return cudaSuccess;
}
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
inline cudaError_t cudaMemcpy(void* target, const void* source, size_t bytes, cudaMemcpyKind) {
  std::memcpy(target, source, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* target, const void* source, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
  return cudaMemcpy(target, source, bytes, kind);
}
inline cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}

struct CUevent_st {
  std::chrono::steady_clock::time_point time;
};
using cudaEvent_t = CUevent_st*;
inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t = nullptr) {
  event->time = std::chrono::steady_clock::now();
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t stop) {
  *milliseconds = std::chrono::duration<float, std::milli>(stop->time - start->time).count();
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

#endif  // DOT_BASED_INTERACT_CUDA_EMULATION_H_

// Standalone CUDA harness of the dot-interaction kernels (no TensorFlow).
//
// 1. Correctness cases: forward and backward of every shape set in three modes (fp32 with TF32
//    off, fp32 with TF32 allowed, fp16), written as .npy files plus manifest.json into the output
//    directory; check_harness.py compares them with the NumPy reference.
// 2. Bandwidth cases (not with --quick): forward, backward and the two in a row at
//    (batch, 27, 128) per mode, timed with CUDA events after warm-up, as bytes read + written per
//    second against the device's peak (memory clock x bus width x 2, read from the device) and
//    against a device-to-device copy measured here.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "bandwidth.h"
#include "cuda/dot_based_interact_launchers.h"

namespace dbi = dot_based_interact;
namespace dbi_cuda = dot_based_interact::cuda;

namespace {

void Check(cudaError_t status, const char* what) {
  bandwidth::Check(status, (std::string("dbi_harness: ") + what).c_str());
}

void CheckLaunch(const dbi_cuda::LaunchResult& result) {
  if (result.error != nullptr) {
    std::fprintf(stderr, "dbi_harness: kernel %s failed: %s\n", dbi_cuda::KernelName(result.kernel), result.error);
    std::exit(1);
  }
}

// Host-side element types: fp32, or the bits of a half.
template <typename T>
T FromUniform(float value);
template <>
float FromUniform<float>(float value) { return value; }
template <>
dbi_cuda::Half FromUniform<dbi_cuda::Half>(float value) {
  const __half half = __float2half_rn(value);
  dbi_cuda::Half bits;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}

template <typename T>
const char* NpyType();
template <>
const char* NpyType<float>() { return "<f4"; }
template <>
const char* NpyType<dbi_cuda::Half>() { return "<f2"; }

// Deterministic uniform [-1, 1) values (xorshift), so runs are reproducible.
template <typename T>
std::vector<T> RandomValues(size_t count, uint64_t seed) {
  std::vector<T> values(count);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (T& value : values) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    value = FromUniform<T>(static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return values;
}

template <typename T>
void WriteNpy(const std::string& path, const std::vector<T>& values, const std::vector<int64_t>& shape) {
  std::ostringstream header;
  header << "{'descr': '" << NpyType<T>() << "', 'fortran_order': False, 'shape': (";
  for (int64_t extent : shape) header << extent << ", ";
  header << "), }";
  std::string text = header.str();
  const size_t preamble = 10;  // magic, version, header length
  text.append(64 - (preamble + text.size() + 1) % 64, ' ');
  text.push_back('\n');
  std::ofstream file(path, std::ios::binary);
  const uint16_t length = static_cast<uint16_t>(text.size());
  file.write("\x93NUMPY\x01\x00", 8);
  file.write(reinterpret_cast<const char*>(&length), sizeof(length));
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  file.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
  if (!file) {
    std::fprintf(stderr, "dbi_harness: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// A mode: the element type and whether fp32 may use TF32 tensor cores.
struct Mode {
  const char* name;
  bool half;
  bool allow_tf32;
};
constexpr Mode kModes[] = {{"fp32", false, false}, {"tf32", false, true}, {"fp16", true, true}};

// Device buffers of one forward + backward call. `offset` elements in front of every buffer
// (a misaligned call: the dispatcher must fall back to the SIMT kernel's scalar path).
template <typename T>
struct DeviceCall {
  dbi::InteractShape shape;
  int offset;
  std::vector<T*> allocations;
  T* input;
  T* output;
  T* upstream;
  T* grad;
  T* bottom_grad;

  DeviceCall(const dbi::InteractShape& call_shape, int element_offset) : shape(call_shape), offset(element_offset) {
    input = Allocate(InputCount());
    output = Allocate(OutputCount());
    upstream = Allocate(OutputCount());
    grad = Allocate(InputCount());
    bottom_grad = Allocate(BottomCount());
  }
  ~DeviceCall() {
    for (T* allocation : allocations) cudaFree(allocation);
  }
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;

  T* Allocate(size_t count) {
    T* allocation = nullptr;
    Check(cudaMalloc(&allocation, (count + offset) * sizeof(T)), "cudaMalloc");
    allocations.push_back(allocation);
    return allocation + offset;
  }
  size_t InputCount() const { return shape.batch * shape.num_vectors * shape.dim; }
  size_t OutputCount() const { return shape.batch * shape.output_width; }
  size_t BottomCount() const { return shape.batch * shape.dim; }

  dbi_cuda::LaunchResult Forward(const Mode& mode) {
    return dbi_cuda::LaunchForward(shape, input, output, mode.allow_tf32, nullptr);
  }
  dbi_cuda::LaunchResult Backward(const Mode& mode, bool fold) {
    return dbi_cuda::LaunchBackward(shape, fold, input, upstream, grad, bottom_grad, mode.allow_tf32, nullptr);
  }
};

template <typename T>
std::vector<T> Download(const T* device, size_t count) {
  std::vector<T> host(count);
  Check(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

dbi::InteractShape MakeShape(int64_t batch, int64_t num_vectors, int64_t dim) {
  return {batch, num_vectors, dim, dbi::OutputWidth(num_vectors, dim)};
}

std::string ShapeJson(const dbi::InteractShape& shape) {
  return bandwidth::ShapeJson(shape.batch, shape.num_vectors, shape.dim);
}

// Runs one correctness case, writes its .npy files and returns its manifest entry. `poisoned`: an
// infinity in sample 0's last vector, which must not reach any other sample's results (the
// kernels reuse a warp's shared memory for its next samples).
template <typename T>
std::string CorrectnessCase(const std::string& directory, const std::string& name, const dbi::InteractShape& shape,
                            const Mode& mode, bool fold, int offset, bool poisoned) {
  DeviceCall<T> call(shape, offset);
  std::vector<T> input = RandomValues<T>(call.InputCount(), 1);
  if (poisoned) input[(shape.num_vectors - 1) * shape.dim] = FromUniform<T>(std::numeric_limits<float>::infinity());
  const std::vector<T> upstream = RandomValues<T>(call.OutputCount(), 2);
  Check(cudaMemcpy(call.input, input.data(), input.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  Check(cudaMemcpy(call.upstream, upstream.data(), upstream.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  // Poison the outputs (0xFF bytes: NaN in both types): every element must be written.
  Check(cudaMemset(call.output, 0xFF, call.OutputCount() * sizeof(T)), "cudaMemset");
  Check(cudaMemset(call.grad, 0xFF, call.InputCount() * sizeof(T)), "cudaMemset");
  Check(cudaMemset(call.bottom_grad, 0xFF, call.BottomCount() * sizeof(T)), "cudaMemset");
  const dbi_cuda::LaunchResult forward = call.Forward(mode);
  CheckLaunch(forward);
  const dbi_cuda::LaunchResult backward = call.Backward(mode, fold);
  CheckLaunch(backward);
  Check(cudaDeviceSynchronize(), "kernel execution");
  const std::vector<int64_t> input_shape{shape.batch, shape.num_vectors, shape.dim};
  const std::vector<int64_t> output_shape{shape.batch, shape.output_width};
  WriteNpy(directory + "/" + name + "_input.npy", input, input_shape);
  WriteNpy(directory + "/" + name + "_upstream.npy", upstream, output_shape);
  WriteNpy(directory + "/" + name + "_output.npy", Download(call.output, call.OutputCount()), output_shape);
  WriteNpy(directory + "/" + name + "_grad.npy", Download(call.grad, call.InputCount()), input_shape);
  WriteNpy(directory + "/" + name + "_bottom_grad.npy", Download(call.bottom_grad, call.BottomCount()),
           {shape.batch, shape.dim});
  std::ostringstream json;
  json << "{\"name\": \"" << name << "\", \"shape\": " << ShapeJson(shape) << ", \"mode\": \"" << mode.name
       << "\", \"dtype\": \"" << (mode.half ? "float16" : "float32") << "\", \"fold\": " << (fold ? "true" : "false")
       << ", \"offset\": " << offset << ", \"poisoned\": " << (poisoned ? "true" : "false")
       << ", \"kernel_forward\": \"" << dbi_cuda::KernelName(forward.kernel)
       << "\", \"kernel_backward\": \"" << dbi_cuda::KernelName(backward.kernel) << "\"}";
  return json.str();
}

std::string CorrectnessCase(const std::string& directory, const dbi::InteractShape& shape, const Mode& mode, bool fold,
                            int offset, bool poisoned) {
  std::string name = std::to_string(shape.batch) + "x" + std::to_string(shape.num_vectors) + "x" +
                     std::to_string(shape.dim) + "_" + mode.name;
  if (!fold) name += "_nofold";
  if (offset != 0) name += "_offset" + std::to_string(offset);
  if (poisoned) name += "_poisoned";
  return mode.half ? CorrectnessCase<dbi_cuda::Half>(directory, name, shape, mode, fold, offset, poisoned)
                   : CorrectnessCase<float>(directory, name, shape, mode, fold, offset, poisoned);
}

// Times forward, backward and forward + backward of one large shape: three manifest entries.
template <typename T>
std::vector<std::string> BandwidthCase(const dbi::InteractShape& shape, const Mode& mode, int repeats,
                                       double peak_gbs) {
  DeviceCall<T> call(shape, 0);
  Check(cudaMemset(call.input, bandwidth::kFillByte, call.InputCount() * sizeof(T)), "cudaMemset");
  Check(cudaMemset(call.upstream, bandwidth::kFillByte, call.OutputCount() * sizeof(T)), "cudaMemset");
  const dbi_cuda::LaunchResult forward = call.Forward(mode);
  CheckLaunch(forward);
  CheckLaunch(call.Backward(mode, true));
  Check(cudaDeviceSynchronize(), "kernel execution");
  return bandwidth::TimeDirections(
      ShapeJson(shape), mode.name, dbi_cuda::KernelName(forward.kernel),
      bandwidth::CountsOf(shape.batch, shape.num_vectors, shape.dim, shape.output_width), sizeof(T),
      [&] { call.Forward(mode); }, [&] { call.Backward(mode, true); }, repeats, peak_gbs);
}

// Bytes read + written per second by a device-to-device copy of 1 GiB: the practical ceiling.
double CopyGbs(int repeats) {
  const size_t bytes = size_t{1} << 30;
  void* source = nullptr;
  void* target = nullptr;
  Check(cudaMalloc(&source, bytes), "cudaMalloc");
  Check(cudaMalloc(&target, bytes), "cudaMalloc");
  Check(cudaMemset(source, 0x3C, bytes), "cudaMemset");
  const double milliseconds =
      bandwidth::TimeMs([&] { Check(cudaMemcpyAsync(target, source, bytes, cudaMemcpyDeviceToDevice), "copy"); },
                        repeats);
  cudaFree(source);
  cudaFree(target);
  return 2.0 * bytes / (milliseconds * 1e-3) / 1e9;
}

struct Shape3 {
  int64_t batch, num_vectors, dim;
};

// The op tests' shape sets: the reference's base and extended sets (F 31-33 x D 31-33 at B 16
// and 255, D 255-257, F 39-41 with D 255-257), Criteo, tiny shapes, and the tensor-core edges
// (one row tile, padded column tiles, D a multiple of 4 but not 8, the largest shape, a batch
// that is not a multiple of the samples per block).
const Shape3 kCorrectnessShapes[] = {
    {16, 32, 32},  {17, 31, 37},  {15, 31, 37},                                     // reference base
    {16, 31, 31},  {16, 31, 32},  {16, 31, 33},  {16, 32, 31},  {16, 32, 33},      // F 31-32, D 31-33
    {255, 32, 32}, {255, 31, 33},                                                   // B 255
    {16, 33, 31},  {16, 33, 32},  {16, 33, 33},                                     // F 33
    {16, 31, 255}, {16, 32, 256}, {255, 32, 257},                                   // D 255-257
    {16, 39, 255}, {16, 40, 256}, {16, 41, 257},                                    // both out of limits
    {2048, 27, 128},                                                                // Criteo
    {3, 1, 5},     {4, 2, 3},     {4, 1, 8},                                        // tiny
    {16, 16, 128}, {16, 17, 64},  {16, 27, 120}, {16, 27, 36}, {16, 32, 128}, {5, 27, 128},
};

// Cases beyond "every shape, every mode, pass-through folded": the unfolded gradient, buffers
// one element off 16-byte alignment, and an infinity in sample 0 with enough samples that warps
// of the persistent grid run several (an H100 or H200 holds at most 2,640 of its warps).
struct ExtraCase {
  Shape3 shape;
  bool fold;
  int offset;
  bool poisoned;
};
const ExtraCase kExtraCases[] = {
    {{2048, 27, 128}, false, 0, false}, {{17, 31, 37}, false, 0, false}, {{16, 32, 128}, false, 0, false},
    {{64, 27, 128}, true, 1, false},    {{17, 31, 37}, true, 1, false},  {{6000, 27, 120}, true, 0, true},
};

void Usage(FILE* stream) {
  std::fprintf(stream,
               "usage: dbi_harness --output DIR [--repeats N] [--batch B] [--quick] [--max-batch M] [--timing-only]\n"
               "Runs the dot-interaction CUDA kernels: writes correctness cases (.npy) and\n"
               "DIR/manifest.json with bandwidth measurements at (B, 27, 128), B = 65536 by\n"
               "default; check_harness.py verifies them. --quick: correctness only, batches\n"
               "capped at 64 (for compute-sanitizer). --max-batch: cap at M instead.\n"
               "--timing-only: the bandwidth measurements alone (for a profiler).\n");
}

}  // namespace

int main(int argc, char** argv) {
  bandwidth::Options options;
  bool quick = false;
  bool timing_only = false;
  int64_t max_batch = 0;  // 0: no cap
  const int status = bandwidth::ParseOptions(argc, argv, &options, Usage, {{"--max-batch", &max_batch}},
                                             {{"--quick", &quick}, {"--timing-only", &timing_only}});
  if (status >= 0) return status;
  if (quick && timing_only) {
    Usage(stderr);
    return 2;
  }
  const std::string& directory = options.output;
  const int repeats = options.repeats;
  const int64_t batch = options.batch;
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties;
  Check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  int memory_clock_khz = 0;
  int bus_width_bits = 0;
  const double peak_gbs = bandwidth::PeakGbs(device, &memory_clock_khz, &bus_width_bits);
  int runtime_version = 0;
  int driver_version = 0;
  Check(cudaRuntimeGetVersion(&runtime_version), "cudaRuntimeGetVersion");
  Check(cudaDriverGetVersion(&driver_version), "cudaDriverGetVersion");

  if (quick && max_batch == 0) max_batch = 64;
  const auto case_batch = [&](int64_t wanted) { return max_batch > 0 ? std::min(wanted, max_batch) : wanted; };
  std::vector<std::string> cases;
  if (!timing_only) {
    for (const Shape3& s : kCorrectnessShapes) {
      const dbi::InteractShape shape = MakeShape(case_batch(s.batch), s.num_vectors, s.dim);
      for (const Mode& mode : kModes) cases.push_back(CorrectnessCase(directory, shape, mode, true, 0, false));
    }
    for (const ExtraCase& extra : kExtraCases) {
      const Shape3& s = extra.shape;
      const dbi::InteractShape shape = MakeShape(case_batch(s.batch), s.num_vectors, s.dim);
      for (const Mode& mode : kModes) {
        cases.push_back(CorrectnessCase(directory, shape, mode, extra.fold, extra.offset, extra.poisoned));
      }
    }
  }
  std::vector<std::string> timings;
  double copy_gbs = 0.0;
  if (!quick) {
    copy_gbs = CopyGbs(repeats);
    const dbi::InteractShape large = MakeShape(batch, bandwidth::kVectors, bandwidth::kDim);
    for (const Mode& mode : kModes) {
      const std::vector<std::string> entries = mode.half
                                                   ? BandwidthCase<dbi_cuda::Half>(large, mode, repeats, peak_gbs)
                                                   : BandwidthCase<float>(large, mode, repeats, peak_gbs);
      timings.insert(timings.end(), entries.begin(), entries.end());
    }
  }

  std::ofstream manifest(directory + "/manifest.json");
  manifest << "{\n  \"device\": \"" << properties.name << "\",\n  \"compute_capability\": [" << properties.major
           << ", " << properties.minor << "],\n  \"multiprocessors\": " << properties.multiProcessorCount
           << ",\n  \"memory_clock_khz\": " << memory_clock_khz << ",\n  \"bus_width_bits\": " << bus_width_bits
           << ",\n  \"peak_gb_per_s\": " << peak_gbs << ",\n  \"copy_gb_per_s\": " << copy_gbs
           << ",\n  \"cuda_runtime\": " << runtime_version << ",\n  \"cuda_driver\": " << driver_version
           << ",\n  \"repeats\": " << repeats << ",\n  \"cases\": [\n    ";
  for (size_t c = 0; c < cases.size(); ++c) manifest << (c ? ",\n    " : "") << cases[c];
  manifest << "\n  ],\n  \"bandwidth\": [\n    ";
  manifest << bandwidth::JoinEntries(timings);
  manifest << "\n  ]\n}\n";
  std::printf("dbi_harness: %zu correctness cases and %zu bandwidth entries on %s written to %s\n", cases.size(),
              timings.size(), properties.name, directory.c_str());
  return manifest ? 0 : 1;
}

// Standalone CUDA harness of the dot-interaction kernels (no TensorFlow).
//
// 1. Correctness cases: runs forward and backward on small shapes and writes inputs and results
//    as .npy files plus manifest.json into the output directory; check_harness.py compares them
//    with a NumPy reference.
// 2. Bandwidth cases: times forward and backward on a large batch (CUDA events, after warm-up)
//    and reports achieved bandwidth against the device's peak.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/dot_based_interact_launchers.h"

namespace dbi = dot_based_interact;
namespace dbi_cuda = dot_based_interact::cuda;

namespace {

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "dbi_harness: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

void CheckLaunch(const dbi_cuda::LaunchResult& result) {
  if (result.error != nullptr) {
    std::fprintf(stderr, "dbi_harness: kernel %s failed: %s\n", dbi_cuda::KernelName(result.kernel), result.error);
    std::exit(1);
  }
}

// Host-side element types: fp32, or the bits of a half.
dbi_cuda::Half ToHalf(float value) {
  const __half half = __float2half_rn(value);
  dbi_cuda::Half bits;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}

template <typename T>
T FromUniform(float value);
template <>
float FromUniform<float>(float value) { return value; }
template <>
dbi_cuda::Half FromUniform<dbi_cuda::Half>(float value) { return ToHalf(value); }

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

// Device buffers of one forward + backward call.
template <typename T>
struct DeviceCall {
  dbi::InteractShape shape;
  T* input = nullptr;
  T* output = nullptr;
  T* upstream = nullptr;
  T* grad = nullptr;
  T* bottom_grad = nullptr;

  explicit DeviceCall(const dbi::InteractShape& call_shape) : shape(call_shape) {
    Check(cudaMalloc(&input, InputCount() * sizeof(T)), "cudaMalloc");
    Check(cudaMalloc(&output, OutputCount() * sizeof(T)), "cudaMalloc");
    Check(cudaMalloc(&upstream, OutputCount() * sizeof(T)), "cudaMalloc");
    Check(cudaMalloc(&grad, InputCount() * sizeof(T)), "cudaMalloc");
    Check(cudaMalloc(&bottom_grad, shape.batch * shape.dim * sizeof(T)), "cudaMalloc");
  }
  ~DeviceCall() {
    for (T* buffer : {input, output, upstream, grad, bottom_grad}) cudaFree(buffer);
  }
  size_t InputCount() const { return shape.batch * shape.num_vectors * shape.dim; }
  size_t OutputCount() const { return shape.batch * shape.output_width; }

  dbi_cuda::LaunchResult Forward(bool allow_tf32) {
    return dbi_cuda::LaunchForward(shape, input, output, allow_tf32, nullptr);
  }
  dbi_cuda::LaunchResult Backward(bool allow_tf32) {
    return dbi_cuda::LaunchBackward(shape, true, input, upstream, grad, bottom_grad, allow_tf32, nullptr);
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
  std::ostringstream json;
  json << "[" << shape.batch << ", " << shape.num_vectors << ", " << shape.dim << "]";
  return json.str();
}

// Runs one correctness case, writes its .npy files and returns its manifest entry.
template <typename T>
std::string CorrectnessCase(const std::string& directory, const std::string& name, const dbi::InteractShape& shape,
                            bool allow_tf32) {
  DeviceCall<T> call(shape);
  const std::vector<T> input = RandomValues<T>(call.InputCount(), 1);
  const std::vector<T> upstream = RandomValues<T>(call.OutputCount(), 2);
  Check(cudaMemcpy(call.input, input.data(), input.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  Check(cudaMemcpy(call.upstream, upstream.data(), upstream.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  const dbi_cuda::LaunchResult forward = call.Forward(allow_tf32);
  CheckLaunch(forward);
  const dbi_cuda::LaunchResult backward = call.Backward(allow_tf32);
  CheckLaunch(backward);
  Check(cudaDeviceSynchronize(), "kernel execution");
  const std::vector<int64_t> input_shape{shape.batch, shape.num_vectors, shape.dim};
  const std::vector<int64_t> output_shape{shape.batch, shape.output_width};
  WriteNpy(directory + "/" + name + "_input.npy", input, input_shape);
  WriteNpy(directory + "/" + name + "_upstream.npy", upstream, output_shape);
  WriteNpy(directory + "/" + name + "_output.npy", Download(call.output, call.OutputCount()), output_shape);
  WriteNpy(directory + "/" + name + "_grad.npy", Download(call.grad, call.InputCount()), input_shape);
  WriteNpy(directory + "/" + name + "_bottom_grad.npy", Download(call.bottom_grad, shape.batch * shape.dim),
           {shape.batch, shape.dim});
  std::ostringstream json;
  json << "{\"name\": \"" << name << "\", \"shape\": " << ShapeJson(shape) << ", \"dtype\": \""
       << (sizeof(T) == 2 ? "float16" : "float32") << "\", \"kernel_forward\": \"" << dbi_cuda::KernelName(forward.kernel)
       << "\", \"kernel_backward\": \"" << dbi_cuda::KernelName(backward.kernel) << "\"}";
  return json.str();
}

// Milliseconds per call of `launch`, averaged over `repeats` after as many warm-up calls.
template <typename Launch>
float TimeMs(Launch launch, int repeats) {
  for (int r = 0; r < repeats; ++r) CheckLaunch(launch());
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  Check(cudaEventRecord(start), "cudaEventRecord");
  for (int r = 0; r < repeats; ++r) CheckLaunch(launch());
  Check(cudaEventRecord(stop), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "kernel execution");
  float milliseconds = 0.0f;
  Check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return milliseconds / static_cast<float>(repeats);
}

// Times forward and backward of one large shape; returns two manifest entries.
template <typename T>
std::string BandwidthCase(const dbi::InteractShape& shape, bool allow_tf32, int repeats, double peak_gbs) {
  DeviceCall<T> call(shape);
  Check(cudaMemset(call.input, 0, call.InputCount() * sizeof(T)), "cudaMemset");
  Check(cudaMemset(call.upstream, 0, call.OutputCount() * sizeof(T)), "cudaMemset");
  const double element = sizeof(T);
  const double forward_bytes = element * (call.InputCount() + call.OutputCount());
  const double backward_bytes = element * (2.0 * call.InputCount() + call.OutputCount() + shape.batch * shape.dim);
  const float forward_ms = TimeMs([&] { return call.Forward(allow_tf32); }, repeats);
  const float backward_ms = TimeMs([&] { return call.Backward(allow_tf32); }, repeats);
  const std::string kernel = dbi_cuda::KernelName(call.Forward(allow_tf32).kernel);
  std::ostringstream json;
  for (const auto& [direction, milliseconds, bytes] :
       {std::tuple<const char*, float, double>{"forward", forward_ms, forward_bytes},
        std::tuple<const char*, float, double>{"backward", backward_ms, backward_bytes}}) {
    const double gbs = bytes / (milliseconds * 1e-3) / 1e9;
    json << (json.tellp() > 0 ? ",\n    " : "") << "{\"shape\": " << ShapeJson(shape) << ", \"dtype\": \""
         << (sizeof(T) == 2 ? "float16" : "float32") << "\", \"kernel\": \"" << kernel << "\", \"direction\": \""
         << direction << "\", \"ms\": " << milliseconds << ", \"bytes\": " << bytes << ", \"gb_per_s\": " << gbs
         << ", \"fraction_of_peak\": " << gbs / peak_gbs << "}";
  }
  return json.str();
}

double PeakBandwidthGbs(int device) {
  int memory_clock_khz = 0;
  int bus_width_bits = 0;
  Check(cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, device), "memory clock");
  Check(cudaDeviceGetAttribute(&bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, device), "bus width");
  return 2.0 * memory_clock_khz * 1e3 * (bus_width_bits / 8.0) / 1e9;  // double data rate
}

void Usage(FILE* stream) {
  std::fprintf(stream,
               "usage: dbi_harness --output DIR [--repeats N] [--batch B]\n"
               "Runs the dot-interaction CUDA kernels: writes correctness cases (.npy) and\n"
               "DIR/manifest.json with bandwidth measurements; check_harness.py verifies them.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string directory;
  int repeats = 50;
  int64_t batch = 65536;
  for (int a = 1; a < argc; ++a) {
    const std::string argument = argv[a];
    if (argument == "--help" || argument == "-h") {
      Usage(stdout);
      return 0;
    }
    if (a + 1 >= argc) {
      Usage(stderr);
      return 2;
    }
    if (argument == "--output") {
      directory = argv[++a];
    } else if (argument == "--repeats") {
      repeats = std::max(1, std::atoi(argv[++a]));
    } else if (argument == "--batch") {
      batch = std::max<int64_t>(1, std::atoll(argv[++a]));
    } else {
      Usage(stderr);
      return 2;
    }
  }
  if (directory.empty()) {
    Usage(stderr);
    return 2;
  }
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties;
  Check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  const double peak_gbs = PeakBandwidthGbs(device);

  std::vector<std::string> cases;
  struct Shape3 {
    int64_t batch, num_vectors, dim;
  };
  const Shape3 correctness_shapes[] = {{16, 32, 32},  {17, 31, 37}, {15, 31, 37},  {16, 33, 33},
                                       {16, 32, 257}, {255, 32, 128}, {2048, 27, 128}, {4, 1, 8}};
  for (const Shape3& s : correctness_shapes) {
    const dbi::InteractShape shape = MakeShape(s.batch, s.num_vectors, s.dim);
    const std::string stem = std::to_string(s.batch) + "x" + std::to_string(s.num_vectors) + "x" + std::to_string(s.dim);
    cases.push_back(CorrectnessCase<float>(directory, stem + "_fp32", shape, false));
    cases.push_back(CorrectnessCase<float>(directory, stem + "_tf32", shape, true));
    cases.push_back(CorrectnessCase<dbi_cuda::Half>(directory, stem + "_fp16", shape, true));
  }
  const dbi::InteractShape large = MakeShape(batch, 27, 128);
  std::vector<std::string> bandwidth{BandwidthCase<float>(large, false, repeats, peak_gbs),
                                     BandwidthCase<float>(large, true, repeats, peak_gbs),
                                     BandwidthCase<dbi_cuda::Half>(large, true, repeats, peak_gbs)};

  std::ofstream manifest(directory + "/manifest.json");
  manifest << "{\n  \"device\": \"" << properties.name << "\",\n  \"compute_capability\": \"" << properties.major
           << "." << properties.minor << "\",\n  \"peak_gb_per_s\": " << peak_gbs << ",\n  \"repeats\": " << repeats
           << ",\n  \"cases\": [\n    ";
  for (size_t c = 0; c < cases.size(); ++c) manifest << (c ? ",\n    " : "") << cases[c];
  manifest << "\n  ],\n  \"bandwidth\": [\n    ";
  for (size_t b = 0; b < bandwidth.size(); ++b) manifest << (b ? ",\n    " : "") << bandwidth[b];
  manifest << "\n  ]\n}\n";
  std::printf("dbi_harness: %zu correctness cases and bandwidth on %s written to %s\n", cases.size(), properties.name,
              directory.c_str());
  return manifest ? 0 : 1;
}

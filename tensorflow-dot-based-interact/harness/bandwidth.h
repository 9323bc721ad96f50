// How the standalone harness and the reference peer time a dot interaction, so that both measure
// the same way: the shape, the bytes a call moves, the input values, the warm-up, the repeats and
// the JSON entry of one measurement. CUDA runtime only (no TensorFlow, no kernels of ours).
#ifndef DOT_BASED_INTERACT_HARNESS_BANDWIDTH_H_
#define DOT_BASED_INTERACT_HARNESS_BANDWIDTH_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace bandwidth {

// The timed shape is (batch, kVectors, kDim): Criteo's 26 tables + the bottom MLP, width 128.
constexpr int64_t kVectors = 27;
constexpr int64_t kDim = 128;
// Every input byte before timing: 1.06 in fp16, 0.0115 in fp32; finite and non-zero.
constexpr int kFillByte = 0x3C;

inline void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Elements of one call's buffers at (batch, F, D) with an output row of `width` elements.
struct Counts {
  int64_t input, output, bottom;
};
inline Counts CountsOf(int64_t batch, int64_t num_vectors, int64_t dim, int64_t width) {
  return {batch * num_vectors * dim, batch * width, batch * dim};
}
// Bytes read + written: forward reads the input and writes the output; backward reads the input
// and the upstream gradient and writes the input gradient and the bottom-MLP gradient.
inline double ForwardBytes(const Counts& counts, int element_bytes) {
  return static_cast<double>(element_bytes) * static_cast<double>(counts.input + counts.output);
}
inline double BackwardBytes(const Counts& counts, int element_bytes) {
  return static_cast<double>(element_bytes) * static_cast<double>(2 * counts.input + counts.output + counts.bottom);
}

// Milliseconds per call of `launch`, averaged over `repeats` after as many warm-up calls.
template <typename Launch>
double TimeMs(Launch launch, int repeats) {
  for (int r = 0; r < repeats; ++r) launch();
  Check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  Check(cudaEventRecord(start), "cudaEventRecord");
  for (int r = 0; r < repeats; ++r) launch();
  Check(cudaEventRecord(stop), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "kernel execution");
  float milliseconds = 0.0f;
  Check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return milliseconds / repeats;
}

inline std::string ShapeJson(int64_t batch, int64_t num_vectors, int64_t dim) {
  std::ostringstream json;
  json << "[" << batch << ", " << num_vectors << ", " << dim << "]";
  return json.str();
}

// One measurement as a JSON object; `mode` is fp32 (TF32 off), tf32 or fp16.
inline std::string Entry(const std::string& shape_json, const char* mode, const char* kernel, const char* direction,
                         double milliseconds, double bytes, double peak_gbs) {
  const double gbs = bytes / (milliseconds * 1e-3) / 1e9;
  std::ostringstream json;
  json << "{\"shape\": " << shape_json << ", \"mode\": \"" << mode << "\", \"dtype\": \""
       << (std::string(mode) == "fp16" ? "float16" : "float32") << "\", \"kernel\": \"" << kernel
       << "\", \"direction\": \"" << direction << "\", \"ms\": " << milliseconds << ", \"bytes\": " << bytes
       << ", \"gb_per_s\": " << gbs << ", \"fraction_of_peak\": " << (peak_gbs > 0 ? gbs / peak_gbs : 0.0) << "}";
  return json.str();
}

// Times forward, backward and the two in a row: three entries, in that order.
template <typename Forward, typename Backward>
std::vector<std::string> TimeDirections(const std::string& shape_json, const char* mode, const char* kernel,
                                        const Counts& counts, int element_bytes, Forward forward, Backward backward,
                                        int repeats, double peak_gbs) {
  const double forward_bytes = ForwardBytes(counts, element_bytes);
  const double backward_bytes = BackwardBytes(counts, element_bytes);
  const double forward_ms = TimeMs(forward, repeats);
  const double backward_ms = TimeMs(backward, repeats);
  const double both_ms = TimeMs([&] { forward(); backward(); }, repeats);
  Check(cudaGetLastError(), "timed launches");
  return {Entry(shape_json, mode, kernel, "forward", forward_ms, forward_bytes, peak_gbs),
          Entry(shape_json, mode, kernel, "backward", backward_ms, backward_bytes, peak_gbs),
          Entry(shape_json, mode, kernel, "forward+backward", both_ms, forward_bytes + backward_bytes, peak_gbs)};
}

// Peak DRAM bandwidth from the device's attributes (cudaDeviceProp::memoryClockRate is gone in
// CUDA 13; the attributes exist in CUDA 12 and 13). 0 when the device does not report them.
inline double PeakGbs(int device, int* memory_clock_khz, int* bus_width_bits) {
  Check(cudaDeviceGetAttribute(memory_clock_khz, cudaDevAttrMemoryClockRate, device), "memory clock");
  Check(cudaDeviceGetAttribute(bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, device), "bus width");
  return 2.0 * *memory_clock_khz * 1e3 * (*bus_width_bits / 8.0) / 1e9;  // double data rate
}

inline std::string JoinEntries(const std::vector<std::string>& entries) {
  std::string joined;
  for (size_t e = 0; e < entries.size(); ++e) joined += (e ? ",\n    " : "") + entries[e];
  return joined;
}

// The command line both programs share: --output PATH (required), --repeats N and --batch B (at
// least 1), plus a program's own integer options (`numbers`, at least 1) and flags.
struct Options {
  std::string output;
  int repeats = 50;
  int64_t batch = 65536;
};

// Fills `options`; returns -1 to go on, else the exit status (0 after --help, 2 after printing
// the usage for a bad command line).
inline int ParseOptions(int argc, char** argv, Options* options, void (*usage)(FILE*),
                        const std::map<std::string, int64_t*>& numbers = {},
                        const std::map<std::string, bool*>& flags = {}) {
  for (int a = 1; a < argc; ++a) {
    const std::string argument = argv[a];
    if (argument == "--help" || argument == "-h") {
      usage(stdout);
      return 0;
    }
    const auto flag = flags.find(argument);
    if (flag != flags.end()) {
      *flag->second = true;
      continue;
    }
    const auto number = numbers.find(argument);
    const bool known = argument == "--output" || argument == "--repeats" || argument == "--batch" ||
                       number != numbers.end();
    if (!known || a + 1 >= argc) {
      usage(stderr);
      return 2;
    }
    const char* value = argv[++a];
    if (argument == "--output") {
      options->output = value;
    } else if (argument == "--repeats") {
      options->repeats = std::max(1, std::atoi(value));
    } else if (argument == "--batch") {
      options->batch = std::max<int64_t>(1, std::atoll(value));
    } else {
      *number->second = std::max<int64_t>(1, std::atoll(value));
    }
  }
  if (options->output.empty()) {
    usage(stderr);
    return 2;
  }
  return -1;
}

}  // namespace bandwidth

#endif  // DOT_BASED_INTERACT_HARNESS_BANDWIDTH_H_

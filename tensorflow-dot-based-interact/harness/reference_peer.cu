// The reference's kernels as a peer in the harness's run: NVIDIA DeepLearningExamples' TF2 DLRM
// dot-interaction launchers (TensorFlow2/Recommendation/DLRM_and_DCNv2/tensorflow-dot-based-interact,
// the code this project reimplements), timed exactly as dbi_harness times ours (bandwidth.h):
// same shape, bytes, input values, warm-up and repeats, one mode per launcher family
// (fp16: FP16, tf32: TF32, fp32 with TF32 off: FP32).
//
// The reference is never part of this repository: `make reference-peer REFERENCE=DIR` compiles
// this file with the kernels folder of a DeepLearningExamples copy at DIR on the include path.
#include <sys/types.h>  // uint, which the reference's launchers use

#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bandwidth.h"
#include "launchers/dot_based_interact_fp16_launcher.cu"
#include "launchers/dot_based_interact_fp32_launcher.cu"
#include "launchers/dot_based_interact_tf32_launcher.cu"

namespace {

// Output row width of the reference's launchers: D + F(F-1)/2 rounded up to a multiple of 8.
int64_t ReferenceWidth(int64_t num_vectors, int64_t dim) {
  return (dim + num_vectors * (num_vectors - 1) / 2 + 7) / 8 * 8;
}

struct Buffers {
  std::vector<void*> allocations;
  void* Allocate(size_t bytes) {
    void* allocation = nullptr;
    bandwidth::Check(cudaMalloc(&allocation, bytes), "reference_peer: cudaMalloc");
    allocations.push_back(allocation);
    return allocation;
  }
  ~Buffers() {
    for (void* allocation : allocations) cudaFree(allocation);
  }
};

// One mode's forward, backward and both, as the reference's op calls them (bottom_mlp_output is
// the input's row 0 there; the launchers read the whole input).
template <typename Forward, typename Backward>
std::vector<std::string> TimeMode(const char* mode, const char* kernel, int element_bytes, uint batch, int repeats,
                                  double peak_gbs, Forward forward, Backward backward) {
  const int64_t width = ReferenceWidth(bandwidth::kVectors, bandwidth::kDim);
  const bandwidth::Counts counts = bandwidth::CountsOf(batch, bandwidth::kVectors, bandwidth::kDim, width);
  Buffers buffers;
  void* input = buffers.Allocate(counts.input * element_bytes);
  void* output = buffers.Allocate(counts.output * element_bytes);
  void* upstream = buffers.Allocate(counts.output * element_bytes);
  void* grad = buffers.Allocate(counts.input * element_bytes);
  void* bottom_grad = buffers.Allocate(counts.bottom * element_bytes);
  bandwidth::Check(cudaMemset(input, bandwidth::kFillByte, counts.input * element_bytes), "reference_peer: cudaMemset");
  bandwidth::Check(cudaMemset(upstream, bandwidth::kFillByte, counts.output * element_bytes),
                   "reference_peer: cudaMemset");
  const uint rows = static_cast<uint>(bandwidth::kVectors);
  const uint columns = static_cast<uint>(bandwidth::kDim);
  const auto run_forward = [&] { forward(input, input, output, batch, rows, columns, nullptr); };
  const auto run_backward = [&] { backward(input, upstream, grad, bottom_grad, batch, rows, columns, nullptr); };
  run_forward();
  run_backward();
  bandwidth::Check(cudaDeviceSynchronize(), "reference_peer: kernel execution");
  bandwidth::Check(cudaGetLastError(), "reference_peer: launch");
  return bandwidth::TimeDirections(bandwidth::ShapeJson(batch, bandwidth::kVectors, bandwidth::kDim), mode, kernel,
                                   counts, element_bytes, run_forward, run_backward, repeats, peak_gbs);
}

void Usage(FILE* stream) {
  std::fprintf(stream,
               "usage: reference_peer --output FILE [--repeats N] [--batch B]\n"
               "Times the reference's dot-interaction launchers (DeepLearningExamples) at (B, 27, 128)\n"
               "the way dbi_harness times this project's, and writes FILE (JSON).\n");
}

}  // namespace

int main(int argc, char** argv) {
  bandwidth::Options options;
  const int status = bandwidth::ParseOptions(argc, argv, &options, Usage);
  if (status >= 0) return status;
  int device = 0;
  bandwidth::Check(cudaGetDevice(&device), "reference_peer: cudaGetDevice");
  int memory_clock_khz = 0;
  int bus_width_bits = 0;
  const double peak_gbs = bandwidth::PeakGbs(device, &memory_clock_khz, &bus_width_bits);
  const uint samples = static_cast<uint>(options.batch);
  const int repeats = options.repeats;
  std::vector<std::string> entries;
  for (const auto& mode : {TimeMode("fp16", "reference_fp16", 2, samples, repeats, peak_gbs,
                                    dotBasedInteractFP16Fwd, dotBasedInteractFP16Bwd),
                           TimeMode("tf32", "reference_tf32", 4, samples, repeats, peak_gbs,
                                    dotBasedInteractTF32Fwd, dotBasedInteractTF32Bwd),
                           TimeMode("fp32", "reference_fp32", 4, samples, repeats, peak_gbs,
                                    dotBasedInteractFP32Fwd, dotBasedInteractFP32Bwd)}) {
    entries.insert(entries.end(), mode.begin(), mode.end());
  }
  std::ofstream file(options.output);
  file << "{\n  \"peer\": \"NVIDIA DeepLearningExamples TensorFlow2/Recommendation/DLRM_and_DCNv2 "
          "tensorflow-dot-based-interact launchers\",\n  \"bandwidth\": [\n    "
       << bandwidth::JoinEntries(entries) << "\n  ]\n}\n";
  std::printf("reference_peer: %zu bandwidth entries written to %s\n", entries.size(), options.output.c_str());
  return file ? 0 : 1;
}

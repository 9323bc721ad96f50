// CPU kernel of ReadFileRows (registered in cc/ops/file_rows_ops.cc).
//
// The Python reader paid for a batch three times: the read into its arena, a copy when
// tf.numpy_function adopted the arrays, and separate passes for the value checks and the
// float16 conversion. Here every read lands in its output tensor (or, when the type changes, in
// a small staging buffer) a chunk at a time, and the chunk is checked and converted while it is
// still in cache. Files are opened once, when the kernel is built.
#include <fcntl.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace file_rows {
namespace {

// Bytes read per system call: large enough that calls cost little, small enough that the chunk
// is still in L2 when it is checked and converted.
constexpr int64_t kChunkBytes = 256 << 10;
constexpr uint16_t kHalfMagnitude = 0x7FFF;
constexpr uint16_t kHalfInfinity = 0x7C00;  // magnitudes at or above it: Inf or NaN

enum class Check { kNone, kLabel, kFinite, kIds };

// A bad value found in a chunk: its index in the chunk and the value as reported.
struct Bad {
  int64_t index = -1;
  int64_t value = 0;
};

float HalfToFloatScalar(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1F;
  uint32_t mantissa = bits & 0x3FF;
  uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        --exponent;
      }
      out = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
  } else {  // finite (checked before conversion)
    out = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &out, sizeof(value));
  return value;
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void HalfToFloatF16c(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
  }
  for (; i < n; ++i) out[i] = HalfToFloatScalar(in[i]);
}
#endif

void HalfToFloat(const uint16_t* in, float* out, int64_t n) {
#if defined(__x86_64__)
  static const bool has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  if (has_f16c) {
    HalfToFloatF16c(in, out, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloatScalar(in[i]);
}

uint16_t FloatToBfloat16(float value) {  // round to nearest even (values are finite)
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// The first stored value outside [0, bound) read as unsigned, if any; `values` of width T.
template <typename T>
Bad FirstBadId(const T* values, int64_t n, uint64_t bound) {
  using Unsigned = std::make_unsigned_t<T>;
  const Unsigned* as_unsigned = reinterpret_cast<const Unsigned*>(values);
  Unsigned largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, as_unsigned[i]);
  if (static_cast<uint64_t>(largest) < bound) return {};
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint64_t>(as_unsigned[i]) >= bound) return {i, static_cast<int64_t>(values[i])};
  }
  return {};
}

Bad FirstBadLabel(const uint8_t* bytes, int64_t n) {
  uint8_t largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, bytes[i]);
  if (largest <= 1) return {};
  for (int64_t i = 0; i < n; ++i) {
    if (bytes[i] > 1) return {i, bytes[i]};
  }
  return {};
}

Bad FirstNonFinite(const uint16_t* bits, int64_t n) {
  uint16_t largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max<uint16_t>(largest, bits[i] & kHalfMagnitude);
  if (largest < kHalfInfinity) return {};
  for (int64_t i = 0; i < n; ++i) {
    if ((bits[i] & kHalfMagnitude) >= kHalfInfinity) return {i, bits[i]};
  }
  return {};
}

// One read of a call: where it comes from and how its values are checked and converted.
struct ReadSpec {
  std::string path;
  int fd = -1;
  int64_t width = 1;
  DataType stored;
  DataType out;
  Check check = Check::kNone;
  int64_t bound = 0;
  int64_t stored_size = 1;  // bytes per stored value
};

class ReadFileRowsOp : public OpKernel {
 public:
  explicit ReadFileRowsOp(OpKernelConstruction* context) : OpKernel(context) {
    std::vector<std::string> paths, checks;
    std::vector<int64_t> widths, bounds;
    std::vector<DataType> stored, out;
    OP_REQUIRES_OK(context, context->GetAttr("paths", &paths));
    OP_REQUIRES_OK(context, context->GetAttr("row_widths", &widths));
    OP_REQUIRES_OK(context, context->GetAttr("stored_types", &stored));
    OP_REQUIRES_OK(context, context->GetAttr("checks", &checks));
    OP_REQUIRES_OK(context, context->GetAttr("bounds", &bounds));
    OP_REQUIRES_OK(context, context->GetAttr("out_types", &out));
    OP_REQUIRES_OK(context, context->GetAttr("error_tag", &error_tag_));
    const size_t n = paths.size();
    OP_REQUIRES(context, widths.size() == n && stored.size() == n && checks.size() == n && bounds.size() == n &&
                             out.size() == n,
                errors::InvalidArgument("ReadFileRows: paths, row_widths, stored_types, checks, bounds and "
                                        "out_types must have one entry per read"));
    for (size_t i = 0; i < n; ++i) {
      ReadSpec read;
      read.path = paths[i];
      read.width = widths[i];
      read.stored = stored[i];
      read.out = out[i];
      read.bound = bounds[i];
      read.stored_size = tensorflow::DataTypeSize(stored[i]);
      OP_REQUIRES(context, read.width >= 1, errors::InvalidArgument("ReadFileRows: row width ", read.width));
      OP_REQUIRES_OK(context, ParseCheck(checks[i], &read));
      OP_REQUIRES_OK(context, CheckConversion(read));
      read.fd = ::open(read.path.c_str(), O_RDONLY | O_CLOEXEC);
      OP_REQUIRES(context, read.fd >= 0,
                  errors::NotFound(read.path, ": cannot open for reading: ", std::strerror(errno)));
      reads_.push_back(read);
    }
  }

  ~ReadFileRowsOp() override {
    for (const ReadSpec& read : reads_) ::close(read.fd);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& first_rows = context->input(0);
    const Tensor& num_rows = context->input(1);
    const int64_t n = static_cast<int64_t>(reads_.size());
    OP_REQUIRES(context, first_rows.NumElements() == n && num_rows.NumElements() == n,
                errors::InvalidArgument("ReadFileRows: first_rows and num_rows need ", n, " entries each"));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t first = first_rows.flat<int64_t>()(i);
      const int64_t rows = num_rows.flat<int64_t>()(i);
      OP_REQUIRES(context, first >= 0 && rows >= 0,
                  errors::InvalidArgument("ReadFileRows: read ", i, " has first row ", first, " and ", rows, " rows"));
      Tensor* output = nullptr;
      OP_REQUIRES_OK(context, context->allocate_output(i, TensorShape({rows, reads_[i].width}), &output));
      OP_REQUIRES_OK(context, Read(i, first, rows, output));
    }
  }

 private:
  static Status ParseCheck(const std::string& name, ReadSpec* read) {
    if (name == "none") {
      read->check = Check::kNone;
    } else if (name == "label") {
      read->check = Check::kLabel;
    } else if (name == "finite") {
      read->check = Check::kFinite;
    } else if (name == "ids") {
      read->check = Check::kIds;
    } else {
      return errors::InvalidArgument("ReadFileRows: unknown check '", name, "' for ", read->path);
    }
    return tensorflow::OkStatus();
  }

  // The conversions this kernel does: labels (bool, int8) to float; halves to float, half or
  // bfloat16; ids (int8/16/32) to int32.
  static Status CheckConversion(const ReadSpec& read) {
    const bool label = (read.stored == tensorflow::DT_BOOL || read.stored == tensorflow::DT_INT8) &&
                       read.out == tensorflow::DT_FLOAT && read.check != Check::kIds;
    const bool half = read.stored == tensorflow::DT_HALF &&
                      (read.out == tensorflow::DT_FLOAT || read.out == tensorflow::DT_HALF ||
                       read.out == tensorflow::DT_BFLOAT16);
    const bool ids = (read.stored == tensorflow::DT_INT8 || read.stored == tensorflow::DT_INT16 ||
                      read.stored == tensorflow::DT_INT32) &&
                     read.out == tensorflow::DT_INT32 && read.check != Check::kLabel;
    if (!(label || half || ids)) {
      return errors::InvalidArgument("ReadFileRows: cannot read ", tensorflow::DataTypeString(read.stored), " values of ",
                                     read.path, " as ", tensorflow::DataTypeString(read.out));
    }
    return tensorflow::OkStatus();
  }

  Status DataError(int64_t read, const char* what, int64_t sample, int64_t column, int64_t value) const {
    return errors::InvalidArgument(error_tag_, "] [", read, "] [", what, "] [", sample, "] [", column, "] [", value,
                                   "]");
  }

  // pread of exactly `bytes` at `offset` into `buffer`; eof is a DataError with the byte where the file ended.
  Status ReadBytes(int64_t read, char* buffer, int64_t bytes, int64_t offset, int64_t sample) const {
    int64_t done = 0;
    while (done < bytes) {
      const ssize_t got = ::pread(reads_[read].fd, buffer + done, bytes - done, offset + done);
      if (got < 0) {
        if (errno == EINTR) continue;
        return errors::Internal(reads_[read].path, ": read failed at byte ", offset + done, ": ", std::strerror(errno));
      }
      if (got == 0) return DataError(read, "eof", sample, 0, offset + done);
      done += got;
    }
    return tensorflow::OkStatus();
  }

  Status Read(int64_t index, int64_t first, int64_t rows, Tensor* output) const {
    const ReadSpec& read = reads_[index];
    const int64_t values = rows * read.width;
    const int64_t chunk_values = std::max<int64_t>(read.width, kChunkBytes / read.stored_size / read.width * read.width);
    const bool in_place = read.stored == read.out;
    thread_local std::vector<char> staging;
    if (!in_place && static_cast<int64_t>(staging.size()) < chunk_values * read.stored_size) {
      staging.resize(chunk_values * read.stored_size);
    }
    char* out_bytes = static_cast<char*>(output->data());
    const int64_t out_size = tensorflow::DataTypeSize(read.out);
    for (int64_t start = 0; start < values; start += chunk_values) {
      const int64_t count = std::min(chunk_values, values - start);
      char* chunk = in_place ? out_bytes + start * out_size : staging.data();
      const int64_t sample = first + start / read.width;
      TF_RETURN_IF_ERROR(ReadBytes(index, chunk, count * read.stored_size,
                                   (first * read.width + start) * read.stored_size, sample));
      const Bad bad = FindBad(read, chunk, count);
      if (bad.index >= 0) {
        const char* what = read.check == Check::kLabel ? "label" : read.check == Check::kFinite ? "finite" : "ids";
        return DataError(index, what, first + (start + bad.index) / read.width, (start + bad.index) % read.width,
                         bad.value);
      }
      if (!in_place) Convert(read, chunk, out_bytes + start * out_size, count);
    }
    return tensorflow::OkStatus();
  }

  static Bad FindBad(const ReadSpec& read, const char* chunk, int64_t count) {
    switch (read.check) {
      case Check::kLabel:
        return FirstBadLabel(reinterpret_cast<const uint8_t*>(chunk), count);
      case Check::kFinite:
        return FirstNonFinite(reinterpret_cast<const uint16_t*>(chunk), count);
      case Check::kIds:
        if (read.stored == tensorflow::DT_INT8) return FirstBadId(reinterpret_cast<const int8_t*>(chunk), count, read.bound);
        if (read.stored == tensorflow::DT_INT16) return FirstBadId(reinterpret_cast<const int16_t*>(chunk), count, read.bound);
        return FirstBadId(reinterpret_cast<const int32_t*>(chunk), count, read.bound);
      case Check::kNone:
        break;
    }
    return {};
  }

  static void Convert(const ReadSpec& read, const char* chunk, char* out, int64_t count) {
    if (read.stored == tensorflow::DT_HALF) {
      const uint16_t* halves = reinterpret_cast<const uint16_t*>(chunk);
      if (read.out == tensorflow::DT_FLOAT) {
        HalfToFloat(halves, reinterpret_cast<float*>(out), count);
      } else {  // bfloat16, through float a block at a time
        float block[512];
        uint16_t* bf16 = reinterpret_cast<uint16_t*>(out);
        for (int64_t start = 0; start < count; start += 512) {
          const int64_t n = std::min<int64_t>(512, count - start);
          HalfToFloat(halves + start, block, n);
          for (int64_t i = 0; i < n; ++i) bf16[start + i] = FloatToBfloat16(block[i]);
        }
      }
    } else if (read.out == tensorflow::DT_FLOAT) {  // labels: bytes 0/1
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(chunk);
      float* values = reinterpret_cast<float*>(out);
      for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(bytes[i] != 0);
    } else {  // narrower ids to int32
      int32_t* ids = reinterpret_cast<int32_t*>(out);
      if (read.stored == tensorflow::DT_INT8) {
        const int8_t* in = reinterpret_cast<const int8_t*>(chunk);
        for (int64_t i = 0; i < count; ++i) ids[i] = in[i];
      } else {
        const int16_t* in = reinterpret_cast<const int16_t*>(chunk);
        for (int64_t i = 0; i < count; ++i) ids[i] = in[i];
      }
    }
  }

  std::vector<ReadSpec> reads_;
  std::string error_tag_;
};

REGISTER_KERNEL_BUILDER(Name("ReadFileRows").Device(tensorflow::DEVICE_CPU), ReadFileRowsOp);

}  // namespace
}  // namespace file_rows
}  // namespace tensorflow

// The dropout mask of BiasReluDropout, one definition for the CPU kernel (and written the same way,
// in TensorFlow ops, by the Python fallback in relu_dropout_ops.py):
//   k0, k1   = the low 32 bits of key[0] and of key[1]
//   r        = mix(mix(low32(row) ^ k0) ^ high32(row))       once per row
//   h        = mix((r ^ k1) + column * 0x9E3779B9)          per element (32-bit wrap-around)
//   kept     = h >= threshold, threshold = the nearest integer to rate * 2^32 (saturated)
// mix is MurmurHash3's 32-bit finaliser. For a fixed row, distinct columns give distinct h (mix is a
// bijection), and every element is kept with probability 1 - threshold / 2^32.
#ifndef RELU_DROPOUT_MASK_H_
#define RELU_DROPOUT_MASK_H_

#include <cmath>
#include <cstdint>

namespace relu_dropout {

constexpr uint32_t kColumnStride = 0x9E3779B9u;

inline uint32_t Mix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

inline uint32_t RowHash(int64_t row, uint32_t k0) {
  const uint64_t bits = static_cast<uint64_t>(row);
  return Mix(Mix(static_cast<uint32_t>(bits) ^ k0) ^ static_cast<uint32_t>(bits >> 32));
}

// The drop threshold of `rate` in [0, 1): the nearest integer to rate * 2^32, at most 2^32 - 1.
inline uint32_t Threshold(float rate) {
  const double scaled = std::nearbyint(static_cast<double>(rate) * 4294967296.0);
  return scaled >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(scaled);
}

}  // namespace relu_dropout

#endif  // RELU_DROPOUT_MASK_H_

// The unified interaction layout, in plain C++ (shared by the TF glue and the CUDA sources).
//
// Output row of a [F, D] sample: [row 0 (D values), dot(x_i, x_j) for i > j in row-major order
// (1,0), (2,0), (2,1), (3,0), ..., zeros up to a multiple of 8].
#ifndef DOT_BASED_INTERACT_LAYOUT_H_
#define DOT_BASED_INTERACT_LAYOUT_H_

#include <cstdint>

namespace dot_based_interact {

constexpr int64_t kOutputAlignment = 8;

// Sizes of one call: input [batch, num_vectors, dim] -> output [batch, output_width].
struct InteractShape {
  int64_t batch;
  int64_t num_vectors;
  int64_t dim;
  int64_t output_width;
};

// Number of strictly-lower Gram entries of F vectors.
constexpr int64_t NumPairs(int64_t num_vectors) { return num_vectors * (num_vectors - 1) / 2; }

// D + F(F-1)/2 rounded up to a multiple of 8.
constexpr int64_t OutputWidth(int64_t num_vectors, int64_t dim) {
  return (dim + NumPairs(num_vectors) + kOutputAlignment - 1) / kOutputAlignment * kOutputAlignment;
}

// Column of dot(x_i, x_j), i > j, in an output row.
constexpr int64_t PairColumn(int64_t dim, int64_t i, int64_t j) { return dim + NumPairs(i) + j; }

}  // namespace dot_based_interact

#endif  // DOT_BASED_INTERACT_LAYOUT_H_

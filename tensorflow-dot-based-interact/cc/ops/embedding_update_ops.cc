// Registration of the fused sparse embedding updates: one op applies an optimizer step to the
// touched rows of every table of a rank (SGD, lazy Adam, Adagrad, Keras legacy RMSprop, FTRL), with the work spread over the CPU's
// intra-op threads. Tables and slots are float32 resource variables of shape [rows, dim];
// indices are int64 rows of each table; gradients are [len(indices), dim].
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/common_shape_fns.h"

REGISTER_OP("EmbeddingSparseSgd")
    .Input("tables: N * resource")
    .Input("indices: N * int64")
    .Input("gradients: N * float")
    .Input("learning_rate: float")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
table[indices[j]] -= learning_rate * gradients[j] for every table, in index order (repeated rows
take every one of their gradients, as ResourceScatterSub does).
)doc");

REGISTER_OP("EmbeddingSparseAdam")
    .Input("tables: N * resource")
    .Input("first_moments: N * resource")
    .Input("second_moments: N * resource")
    .Input("indices: N * int64")
    .Input("gradients: N * float")
    .Input("step_size: float")
    .Input("beta_1: float")
    .Input("beta_2: float")
    .Input("epsilon: float")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Lazy Adam on the touched rows: per distinct row r with g the sum of its gradients (in index order),
m = beta_1 m + (1 - beta_1) g, v = beta_2 v + (1 - beta_2) g^2,
table[r] -= step_size * m / (sqrt(v) + epsilon); step_size carries the bias correction.
)doc");

REGISTER_OP("EmbeddingSparseAdagrad")
    .Input("tables: N * resource")
    .Input("accumulators: N * resource")
    .Input("indices: N * int64")
    .Input("gradients: N * float")
    .Input("learning_rate: float")
    .Input("epsilon: float")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Adagrad on the touched rows: per distinct row r with g the sum of its gradients (in index order),
accumulator += g^2, table[r] -= learning_rate * g / (sqrt(accumulator) + epsilon).
)doc");

REGISTER_OP("EmbeddingSparseRmsprop")
    .Input("tables: N * resource")
    .Input("rms: N * resource")
    .Input("indices: N * int64")
    .Input("gradients: N * float")
    .Input("learning_rate: float")
    .Input("rho: float")
    .Input("epsilon: float")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Keras legacy RMSprop (no momentum, not centered) on sparse gradients: first every row of every rms
slot decays, rms = rho * rms (touched or not, as Keras's sparse apply does); then per distinct
touched row r with g the sum of its gradients (in index order), rms[r] += g^2 * (1 - rho),
table[r] -= learning_rate * g / (sqrt(rms[r]) + epsilon).
)doc");

REGISTER_OP("EmbeddingSparseFtrl")
    .Input("tables: N * resource")
    .Input("accumulators: N * resource")
    .Input("linears: N * resource")
    .Input("indices: N * int64")
    .Input("gradients: N * float")
    .Input("learning_rate: float")
    .Input("l1: float")
    .Input("l2: float")
    .Input("learning_rate_power: float")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
FTRL-proximal (TensorFlow's ApplyFtrl) on the touched rows: per distinct row r with g the sum of its
gradients (in index order), p = -learning_rate_power, new = accumulator + g^2,
linear += g - (new^p - accumulator^p) / learning_rate * table[r],
table[r] = (clip(linear, -l1, l1) - linear) / (new^p / learning_rate + 2 l2), accumulator = new.
)doc");

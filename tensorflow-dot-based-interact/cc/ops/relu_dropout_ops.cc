// Registration of the fused bias + ReLU + dropout of a dense layer's output (Wide & Deep's deep
// part, CPU kernels in cc/kernels/relu_dropout_cpu.cc). The dropout mask is a hash of
// (key, row id, column), so it needs no state, no stored mask, and is the same whichever rank holds
// a row; relu_dropout_mask.h defines it.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("BiasReluDropout")
    .Input("x: T")
    .Input("bias: T")
    .Input("key: int64")
    .Input("row_ids: int64")
    .Output("y: T")
    .Attr("rate: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, bias, key, rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bias));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &key));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &rows));
      c->set_output(0, x);
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
y[i, j] = keep(key, row_ids[i], j) ? relu(x[i, j] + bias[j]) / (1 - rate) : 0, where keep drops an
element with probability `rate` (relu_dropout_mask.h); key is two int64 words, row_ids one per row.
)doc");

REGISTER_OP("BiasReluDropoutGrad")
    .Input("dy: T")
    .Input("y: T")
    .Output("dx: T")
    .Output("dbias: T")
    .Attr("rate: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &dy));
      c->set_output(0, dy);
      c->set_output(1, c->Vector(c->Dim(dy, 1)));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
The gradient of BiasReluDropout from its output alone: an element passed iff y > 0 (a kept, positive
pre-activation), so dx = y > 0 ? dy / (1 - rate) : 0 and dbias = the column sums of dx (float32
accumulation).
)doc");

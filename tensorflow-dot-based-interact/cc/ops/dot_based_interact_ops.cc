// Registration of DotBasedInteract and DotBasedInteractGrad (signatures as in NVIDIA's op).
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "../kernels/interact_layout.h"

namespace dot_based_interact {
namespace {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Output width D + F(F-1)/2 rounded up to 8, unknown while F or D is unknown.
tensorflow::Status OutputWidthDim(InferenceContext* context, ShapeHandle input, DimensionHandle* width) {
  const DimensionHandle vectors = context->Dim(input, 1);
  const DimensionHandle dim = context->Dim(input, 2);
  if (!context->ValueKnown(vectors) || !context->ValueKnown(dim)) {
    *width = context->UnknownDim();
    return tensorflow::OkStatus();
  }
  *width = context->MakeDim(OutputWidth(context->Value(vectors), context->Value(dim)));
  return tensorflow::OkStatus();
}

// Checks input [B, F, D] and a second operand [B, ?]; returns both and the merged batch dim.
tensorflow::Status InputsAndBatch(InferenceContext* context, ShapeHandle* input, ShapeHandle* second,
                                  DimensionHandle* batch) {
  TF_RETURN_IF_ERROR(context->WithRank(context->input(0), 3, input));
  TF_RETURN_IF_ERROR(context->WithRank(context->input(1), 2, second));
  return context->Merge(context->Dim(*input, 0), context->Dim(*second, 0), batch);
}

tensorflow::Status ForwardShape(InferenceContext* context) {
  ShapeHandle input, bottom;
  DimensionHandle batch, dim, width;
  TF_RETURN_IF_ERROR(InputsAndBatch(context, &input, &bottom, &batch));
  TF_RETURN_IF_ERROR(context->Merge(context->Dim(input, 2), context->Dim(bottom, 1), &dim));
  TF_RETURN_IF_ERROR(OutputWidthDim(context, input, &width));
  context->set_output(0, context->Matrix(batch, width));
  return tensorflow::OkStatus();
}

tensorflow::Status GradShape(InferenceContext* context) {
  ShapeHandle input, upstream;
  DimensionHandle batch, width;
  TF_RETURN_IF_ERROR(InputsAndBatch(context, &input, &upstream, &batch));
  TF_RETURN_IF_ERROR(OutputWidthDim(context, input, &width));
  TF_RETURN_IF_ERROR(context->Merge(context->Dim(upstream, 1), width, &width));
  context->set_output(0, input);
  context->set_output(1, context->Matrix(batch, context->Dim(input, 2)));
  return tensorflow::OkStatus();
}

// Blocks [B, k_i * dim] -> output [B, OutputWidth(sum k_i, dim)]; the widths must be known.
tensorflow::Status BlocksShape(InferenceContext* context) {
  int64_t dim = 0;
  TF_RETURN_IF_ERROR(context->GetAttr("dim", &dim));
  std::vector<ShapeHandle> blocks;
  TF_RETURN_IF_ERROR(context->input("blocks", &blocks));
  DimensionHandle batch = context->UnknownDim();
  int64_t num_vectors = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    ShapeHandle block;
    TF_RETURN_IF_ERROR(context->WithRank(blocks[i], 2, &block));
    TF_RETURN_IF_ERROR(context->Merge(batch, context->Dim(block, 0), &batch));
    const DimensionHandle width = context->Dim(block, 1);
    if (!context->ValueKnown(width)) {
      return tensorflow::errors::InvalidArgument("DotBasedInteractBlocks: the width of block ", i, " must be known");
    }
    if (context->Value(width) == 0 || context->Value(width) % dim != 0) {
      return tensorflow::errors::InvalidArgument("DotBasedInteractBlocks: block ", i, " has width ",
                                                 context->Value(width), ", not a positive multiple of dim ", dim);
    }
    num_vectors += context->Value(width) / dim;
  }
  context->set_output(0, context->Matrix(batch, OutputWidth(num_vectors, dim)));
  return tensorflow::OkStatus();
}

// The gradient of each block has the block's shape.
tensorflow::Status BlocksGradShape(InferenceContext* context) {
  std::vector<ShapeHandle> blocks;
  TF_RETURN_IF_ERROR(context->input("blocks", &blocks));
  return context->set_output("grads", blocks);
}

}  // namespace

REGISTER_OP("DotBasedInteract")
    .Attr("T: {float, half, bfloat16}")
    .Input("input: T")
    .Input("bottom_mlp_output: T")
    .Output("output: T")
    .SetShapeFn(ForwardShape)
    .Doc(R"doc(
DLRM dot interaction. input [B, F, D] (row 0 = bottom-MLP output); output [B, W] with
W = D + F(F-1)/2 rounded up to 8: [input row 0, strictly-lower Gram entries row-major, zeros].
bottom_mlp_output [B, D] is not read; it receives the pass-through gradient.
)doc");

REGISTER_OP("DotBasedInteractGrad")
    .Attr("T: {float, half, bfloat16}")
    .Attr("fold_bottom_mlp_grad: bool = false")
    .Input("input: T")
    .Input("upstream_grad: T")
    .Output("grad: T")
    .Output("bottom_mlp_grad: T")
    .SetShapeFn(GradShape)
    .Doc(R"doc(
Gradient of DotBasedInteract: grad [B, F, D] w.r.t. input (interaction terms only) and
bottom_mlp_grad [B, D] = the first D columns of upstream_grad. With fold_bottom_mlp_grad,
bottom_mlp_grad is also added to grad row 0 (for callers whose bottom-MLP output is input row 0:
one pass instead of a separate slice gradient and sum).
)doc");

REGISTER_OP("DotBasedInteractBlocks")
    .Attr("T: {float, half, bfloat16}")
    .Attr("N: int >= 1")
    .Attr("dim: int >= 1")
    .Input("blocks: N * T")
    .Output("output: T")
    .SetShapeFn(BlocksShape)
    .Doc(R"doc(
DotBasedInteract over vectors held in several tensors (CPU): blocks[i] is [B, k_i * dim], sample
b's k_i vectors side by side; the F = sum k_i vectors in block order are the interaction input,
block 0 starting with the bottom-MLP output. Equal to DotBasedInteract on the [B, F, dim]
concatenation, without building it.
)doc");

REGISTER_OP("DotBasedInteractBlocksGrad")
    .Attr("T: {float, half, bfloat16}")
    .Attr("N: int >= 1")
    .Attr("dim: int >= 1")
    .Input("blocks: N * T")
    .Input("upstream_grad: T")
    .Output("grads: N * T")
    .SetShapeFn(BlocksGradShape)
    .Doc(R"doc(
Gradient of DotBasedInteractBlocks: grads[i] has the shape of blocks[i]; the pass-through gradient
of the bottom-MLP output (the first dim upstream columns) is added to vector 0's.
)doc");

}  // namespace dot_based_interact

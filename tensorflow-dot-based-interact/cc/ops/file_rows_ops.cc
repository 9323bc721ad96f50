// Registration of ReadFileRows: the split-binary reader's batch read as one op. Each of N reads
// takes rows [first_rows[i], first_rows[i] + num_rows[i]) of a file of fixed-width rows, checks
// every value and converts it to its output type, so a batch crosses into TensorFlow without a
// Python call or an extra copy.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

REGISTER_OP("ReadFileRows")
    .Input("first_rows: int64")
    .Input("num_rows: int64")
    .Output("values: out_types")
    .Attr("paths: list(string) >= 1")
    .Attr("row_widths: list(int) >= 1")
    .Attr("stored_types: list({bool, int8, int16, int32, half}) >= 1")
    .Attr("checks: list(string) >= 1")
    .Attr("bounds: list(int) >= 1")
    .Attr("out_types: list({float, half, bfloat16, int32}) >= 1")
    .Attr("error_tag: string")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<int64_t> widths;
      TF_RETURN_IF_ERROR(c->GetAttr("row_widths", &widths));
      for (int i = 0; i < c->num_outputs(); ++i) {
        c->set_output(i, c->Matrix(c->UnknownDim(), i < static_cast<int>(widths.size()) ? widths[i] : -1));
      }
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Read i: rows [first_rows[i], first_rows[i] + num_rows[i]) of paths[i], whose rows are
row_widths[i] values of stored_types[i], as a [num_rows[i], row_widths[i]] tensor of out_types[i].
checks[i] says what every value must be: "label" (a byte 0 or 1), "finite" (a finite half),
"ids" (an id in [0, bounds[i]), read as unsigned) or "none". A bad value, or a file that ends
before the rows do, fails with InvalidArgument "<error_tag>] [<read>] [<what>] [<sample>]
[<column>] [<value>]" (what: label, finite, ids or eof; value: the stored value, a half's bits,
or for eof the byte offset where the file ended), for the caller to word.
)doc");

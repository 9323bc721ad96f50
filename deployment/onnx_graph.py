"""The whole network as one ONNX graph, built from numpy weights with `onnx.helper` (no TensorFlow).

Both graphs take the serving inputs of `saved_model.py` and serving.json: `numerical_features` float32
`[B, n_num]` and `categorical_features` int32 `[B, sum of hotness]` (feature i owns `hotness[i]`
consecutive columns; a multi-hot feature's unused columns hold PAD_ID), and give `probabilities`
float32 `[B, 1]`.

DLRM / DCNv2 (model.py): bottom MLP (ReLU on every layer) -> each table's vector (a Gather; multi-hot:
the Gather of every column, PAD_ID columns masked out, summed, or averaged over the real ids with an
empty row pooling to zeros, as `recsys.sparse.tables.pooled_lookup`) -> the dot interaction
(interaction.py's layout: the bottom output, then dot(x_i, x_j) for i > j in row-major order) or the
cross network (x_{l+1} = x0 * (W x_l + b) + x_l, W = U V at low rank) -> top MLP (linear last) ->
sigmoid. The interaction's and the cross network's zero padding to a multiple of 8 is left out
together with the top MLP's kernel rows it would meet, which add nothing. The bottom MLP's first
kernel has rows for the numericals padded to a multiple of 8 the same way.

Wide & Deep (wide_and_deep/wd_model.py): wide logit = sum of each categorical's 1-wide row + the
numericals' linear layer; deep logit = the hidden ReLU layers and the head over the embeddings and
the numericals concatenated in `deep_order`; probability = sigmoid(wide + deep).

A table is float32 rows or `quantize.QuantizedTable` (8-bit rows): the graph gathers the bytes, their
scale and their bias by the same ids and computes bytes * scale + bias from the gathered rows only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deployment.quantize import QuantizedTable

NUMERICAL = "numerical_features"
CATEGORICAL = "categorical_features"
PROBABILITIES = "probabilities"
PAD_ID = -1  # a multi-hot feature's unused column: no id
OPSET = 17
IR_VERSION = 8  # the oldest IR of opset 17: older ONNX Runtimes (a Triton image's) load the model too
POOLINGS = ("sum", "mean")

Table = Union[np.ndarray, QuantizedTable]


@dataclass(frozen=True)
class Dense:
    """A dense layer: y = x @ kernel + bias, kernel `[in, out]` (Keras's layout)."""
    kernel: np.ndarray
    bias: np.ndarray


@dataclass(frozen=True)
class CrossLayer:
    """A DCNv2 cross layer: `projection` U `[W, r]` at low rank (None: full rank), `kernel` V `[r, W]`
    (or W `[W, W]`) and its `bias` `[W]`."""
    projection: Optional[np.ndarray]
    kernel: np.ndarray
    bias: np.ndarray


@dataclass(frozen=True)
class DlrmWeights:
    """What the DLRM / DCNv2 graph is made of, in feature order; `cross` None: the dot interaction."""
    num_numerical: int
    tables: Sequence[Table]
    hotness: Sequence[int]
    poolings: Sequence[str]
    bottom: Sequence[Dense]
    top: Sequence[Dense]
    cross: Optional[Sequence[CrossLayer]] = None


@dataclass(frozen=True)
class WideDeepWeights:
    """What the Wide & Deep graph is made of: per categorical (in column order) its 1-wide wide table and
    its deep table; `deep_order` the deep part's inputs in concatenation order, each ("categorical", i)
    or ("numerical", i)."""
    num_numerical: int
    wide_tables: Sequence[np.ndarray]
    wide: Dense
    deep_tables: Sequence[Table]
    deep_order: Sequence[Tuple[str, int]]
    hidden: Sequence[Dense]
    head: Dense


class _Builder:
    """Nodes and initializers of one graph, each output named uniquely."""

    def __init__(self) -> None:
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self.count = 0

    def _name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str = "const") -> str:
        name = self._name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, order="C"), name))
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(values, np.int64), "ints")

    def op(self, op_type: str, inputs: Sequence[str], **attributes) -> str:
        output = self._name(op_type.lower())
        # named: ONNX Runtime's fusions name their nodes after the fused ones, and unnamed ones collide
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attributes))
        return output

    def dense_stack(self, x: str, width: int, layers: Sequence[Dense], relu_last: bool, hint: str) -> str:
        """`layers` over `x` of `width` columns; a first kernel with more rows (zero padding of its
        input) keeps the first `width`."""
        for i, layer in enumerate(layers):
            kernel = layer.kernel[:width] if i == 0 else layer.kernel
            x = self.op("Add", [self.op("MatMul", [x, self.const(kernel.astype(np.float32), f"{hint}_{i}_kernel")]),
                                self.const(layer.bias.astype(np.float32), f"{hint}_{i}_bias")])
            if i < len(layers) - 1 or relu_last:
                x = self.op("Relu", [x])
        return x

    def rows(self, table: Table, ids: str, hint: str) -> str:
        """The float32 rows of `table` at `ids` (any shape S): `[*S, dim]`."""
        if isinstance(table, QuantizedTable):
            values = self.op("Cast", [self.op("Gather", [self.const(table.values, f"{hint}_int8"), ids])],
                             to=TensorProto.FLOAT)
            scale = self.op("Gather", [self.const(table.scale, f"{hint}_scale"), ids])
            bias = self.op("Gather", [self.const(table.bias, f"{hint}_bias"), ids])
            return self.op("Add", [self.op("Mul", [values, scale]), bias])
        return self.op("Gather", [self.const(np.asarray(table, np.float32), hint), ids])

    def pooled(self, categorical: str, column: int, hotness: int, pooling: str, table: Table, hint: str) -> str:
        """One vector per sample `[B, dim]` of the feature in columns [column, column + hotness)."""
        if hotness == 1:
            return self.rows(table, self.op("Gather", [categorical, self.const(np.asarray(column, np.int64))],
                                            axis=1), hint)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        ids = self.op("Slice", [categorical, self.ints([column]), self.ints([column + hotness]), self.ints([1])])
        real = self.op("Not", [self.op("Equal", [ids, self.const(np.asarray(PAD_ID, np.int32))])])
        safe = self.op("Where", [real, ids, self.const(np.asarray(0, np.int32))])
        weights = self.op("Cast", [real], to=TensorProto.FLOAT)  # [B, h]
        masked = self.op("Mul", [self.rows(table, safe, hint), self.op("Unsqueeze", [weights, self.ints([2])])])
        summed = self.op("ReduceSum", [masked, self.ints([1])], keepdims=0)
        if pooling == "sum":
            return summed
        count = self.op("ReduceSum", [weights, self.ints([1])], keepdims=1)
        return self.op("Div", [summed, self.op("Max", [count, self.const(np.asarray(1.0, np.float32))])])

    def model(self, output: str, num_numerical: int, categorical_columns: int, name: str) -> onnx.ModelProto:
        inputs = [helper.make_tensor_value_info(NUMERICAL, TensorProto.FLOAT, ["batch", num_numerical]),
                  helper.make_tensor_value_info(CATEGORICAL, TensorProto.INT32, ["batch", categorical_columns])]
        self.nodes.append(helper.make_node("Sigmoid", [output], [PROBABILITIES], name=PROBABILITIES))
        outputs = [helper.make_tensor_value_info(PROBABILITIES, TensorProto.FLOAT, ["batch", 1])]
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dlrm-tf2")
        model.ir_version = IR_VERSION
        return model


def _dot_interaction(builder: _Builder, bottom: str, vectors: Sequence[str], dim: int) -> Tuple[str, int]:
    """interaction.py's layout without its zero padding, and its width."""
    count = len(vectors) + 1
    stacked = builder.op("Reshape", [builder.op("Concat", [bottom, *vectors], axis=1), builder.ints([-1, count, dim])])
    gram = builder.op("MatMul", [stacked, builder.op("Transpose", [stacked], perm=[0, 2, 1])])
    flat = builder.op("Reshape", [gram, builder.ints([-1, count * count])])
    rows, columns = np.tril_indices(count, k=-1)
    pairs = builder.op("Gather", [flat, builder.const((rows * count + columns).astype(np.int64), "pairs")], axis=1)
    return builder.op("Concat", [bottom, pairs], axis=1), dim + len(rows)


def _cross_network(builder: _Builder, x0: str, layers: Sequence[CrossLayer]) -> str:
    x = x0
    for i, layer in enumerate(layers):
        inner = x if layer.projection is None else builder.op(
            "MatMul", [x, builder.const(layer.projection.astype(np.float32), f"cross_{i}_u")])
        expanded = builder.op("Add", [builder.op("MatMul", [inner, builder.const(layer.kernel.astype(np.float32),
                                                                                 f"cross_{i}_kernel")]),
                                      builder.const(layer.bias.astype(np.float32), f"cross_{i}_bias")])
        x = builder.op("Add", [builder.op("Mul", [x0, expanded]), x])
    return x


def dlrm_graph(weights: DlrmWeights) -> onnx.ModelProto:
    """The DLRM (dot interaction) or DCNv2 (cross network) network of `weights` as an ONNX model."""
    if not len(weights.tables) == len(weights.hotness) == len(weights.poolings):
        raise ValueError(f"{len(weights.tables)} tables, {len(weights.hotness)} hotness values and "
                         f"{len(weights.poolings)} poolings: one of each per feature")
    builder = _Builder()
    bottom = builder.dense_stack(NUMERICAL, weights.num_numerical, weights.bottom, relu_last=True, hint="bottom")
    columns = np.cumsum([0, *weights.hotness])
    vectors = [builder.pooled(CATEGORICAL, int(columns[i]), hotness, pooling, table, f"table_{i}")
               for i, (table, hotness, pooling) in enumerate(zip(weights.tables, weights.hotness, weights.poolings))]
    dims = [_table_dim(table) for table in weights.tables]
    bottom_width = int(weights.bottom[-1].kernel.shape[1])
    if weights.cross is None:
        interaction, width = _dot_interaction(builder, bottom, vectors, bottom_width)
    else:
        interaction = _cross_network(builder, builder.op("Concat", [bottom, *vectors], axis=1), weights.cross)
        width = bottom_width + sum(dims)
    logit = builder.dense_stack(interaction, width, weights.top, relu_last=False, hint="top")
    return builder.model(logit, weights.num_numerical, int(columns[-1]), "dcnv2" if weights.cross else "dlrm")


def wide_and_deep_graph(weights: WideDeepWeights) -> onnx.ModelProto:
    """The Wide & Deep network of `weights` as an ONNX model (every categorical one-hot)."""
    builder = _Builder()
    count = len(weights.wide_tables)
    ids = [builder.op("Gather", [CATEGORICAL, builder.const(np.asarray(i, np.int64))], axis=1) for i in range(count)]
    wide_rows = builder.op("Concat", [builder.rows(table, ids[i], f"wide_{i}")
                                      for i, table in enumerate(weights.wide_tables)], axis=1)  # [B, count]
    linear = builder.op("Add", [builder.op("MatMul", [NUMERICAL, builder.const(weights.wide.kernel.astype(np.float32),
                                                                               "wide_kernel")]),
                                builder.const(weights.wide.bias.astype(np.float32), "wide_bias")])
    wide = builder.op("Add", [builder.op("ReduceSum", [wide_rows, builder.ints([1])], keepdims=1), linear])
    pieces = []
    for kind, index in weights.deep_order:
        if kind == "categorical":
            pieces.append(builder.rows(weights.deep_tables[index], ids[index], f"deep_{index}"))
        else:
            pieces.append(builder.op("Slice", [NUMERICAL, builder.ints([index]), builder.ints([index + 1]),
                                               builder.ints([1])]))
    deep_input = builder.op("Concat", pieces, axis=1)
    width = sum(_table_dim(weights.deep_tables[i]) if kind == "categorical" else 1 for kind, i in weights.deep_order)
    deep = builder.dense_stack(deep_input, width, [*weights.hidden, weights.head], relu_last=False, hint="deep")
    return builder.model(builder.op("Add", [wide, deep]), weights.num_numerical, count, "wide_and_deep")


def _table_dim(table: Table) -> int:
    return int((table.values if isinstance(table, QuantizedTable) else table).shape[1])


def table_bytes(tables: Sequence[Table]) -> int:
    """What `tables` cost in the model (8-bit rows with their scales and biases, or float32 rows)."""
    return sum(t.nbytes if isinstance(t, QuantizedTable) else int(np.prod(t.shape)) * 4 for t in tables)

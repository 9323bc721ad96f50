"""The DLRM network (reference §2.2-2.7, §13.2): bottom MLP, embeddings, dot interaction or the
DCNv2 cross network, top MLP.

Inputs are the dict the input pipelines produce: `numerical_features` `[B, n_num]` and
`categorical_features`, a tuple of int32 id tensors in feature order, each `[B]`, `[B, h]` or
ragged (batch.py); the embedding layer pools each multi-hot feature to one vector per sample. The output is the
logit `[B, 1]` in float32. Tables may differ in width with the cross network; the dot interaction
needs one width, equal to the bottom MLP's output.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

import interaction
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from recsys.runtime.custom_ops import op_package
from recsys.sparse.tables import EmbeddingLayer, TableView, VariableSelector, micro_batch_rows
from recsys.training.model_config import DlrmConfig




def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _input_gradient(dz: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
    """dz @ kernel^T, the gradient of a dense layer's input, as TensorFlow's Einsum, which lays the
    kernel out for a plain product. TensorFlow's MatMul gradient multiplies by the kernel through
    oneDNN's transposed-operand path, which in float32 runs 1.2-1.35x slower where a layer narrows
    1024 or more outputs to 512 or fewer inputs, as the top MLP's first layer does (480 x 1024 at
    batch 4096: 26.0 against 20.1 ms, Zen 4) and no faster elsewhere. A Transpose op before the
    MatMul would not do: Grappler folds it back into the MatMul's transpose flag."""
    return tf.einsum("bo,io->bi", dz, kernel)


def _relu_dense(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, compiled_relu_grad: bool) -> tf.Tensor:
    """relu(x @ kernel + bias) with its own gradient: the pre-activation and bias gradients from the
    output by the compiled kernel in one pass (op_package.bias_relu_grad) or by TensorFlow's ReluGrad
    and BiasAddGrad, and the input gradient by `_input_gradient`."""

    @tf.custom_gradient
    def forward(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor):
        y = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, kernel), bias))
        scope = tf.get_current_name_scope()

        def gradient(dy: tf.Tensor):
            # named as TensorFlow names a gradient of the tape (bench.step_profile reads the scopes)
            with tf.name_scope(f"gradient_tape/{scope}/" if scope else "gradient_tape/"):
                if compiled_relu_grad:
                    dz, dbias = op_package.bias_relu_grad(dy, y)
                else:
                    dz = tf.raw_ops.ReluGrad(gradients=dy, features=y)
                    dbias = tf.raw_ops.BiasAddGrad(out_backprop=dz)
                return _input_gradient(dz, kernel), tf.matmul(x, dz, transpose_a=True), dbias

        return y, gradient

    return forward(x, kernel, bias)


class ReluDense(tf.keras.layers.Dense):
    """Keras's Dense with ReLU (the same weights, names and forward pass: MatMul, BiasAdd and Relu,
    which oneDNN runs as one op) with the CPU's backward pass (DlrmConfig.mlp_backward): the input
    gradient by `_input_gradient`, and with `compiled_relu_grad` the pre-activation gradient and the
    bias gradient in one pass of the compiled CPU kernel over the output gradient and the output,
    where TensorFlow runs ReluGrad and then BiasAddGrad (whose column sum runs far below memory speed
    in bfloat16). For 2-D inputs, as the MLPs have."""

    def __init__(self, *args: Any, compiled_relu_grad: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compiled_relu_grad = compiled_relu_grad

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        dtype = self.compute_dtype
        return _relu_dense(tf.cast(inputs, dtype), tf.cast(self.kernel, dtype), tf.cast(self.bias, dtype),
                           self.compiled_relu_grad)


class Mlp(tf.keras.layers.Layer):
    """Dense stack with the reference's initialisers; ReLU on every layer unless the last is linear.

    Each kernel and bias is drawn from its own seed derived from (`seed`, `seed_offset`, layer), so
    the initial weights do not depend on what else was initialised before (e.g. how many tables
    this rank holds). `backward` (DlrmConfig.mlp_backward): "tensorflow" keeps Keras's Dense and
    TensorFlow's gradients; "cpu" and "custom_cpu" make the ReLU layers `ReluDense`, "custom_cpu"
    with the compiled ReLU + bias gradient.
    """

    def __init__(self, widths: Sequence[int], linear_last: bool, name: str, seed: int = 0,
                 seed_offset: int = 0, backward: str = "tensorflow") -> None:
        super().__init__(name=name)
        self.dense_layers = []
        for i, width in enumerate(widths):
            linear = i == len(widths) - 1 and linear_last
            layer_seed = (seed * 1_000_003 + seed_offset + i) * 2
            layer_args = dict(
                kernel_initializer=tf.keras.initializers.GlorotNormal(seed=layer_seed),
                bias_initializer=tf.keras.initializers.RandomNormal(stddev=math.sqrt(1.0 / width),
                                                                    seed=layer_seed + 1),
                name=f"dense_{i}")
            if linear or backward == "tensorflow":
                layer = tf.keras.layers.Dense(width, activation=None if linear else "relu", **layer_args)
            else:
                layer = ReluDense(width, activation="relu", compiled_relu_grad=backward == "custom_cpu",
                                  **layer_args)
            self.dense_layers.append(layer)

    def call(self, x: tf.Tensor) -> tf.Tensor:
        for layer in self.dense_layers:
            x = layer(x)
        return x


def cross_input_width(config: DlrmConfig) -> int:
    """The cross network's input: the bottom MLP's output and every table's vector side by side."""
    return config.bottom_mlp_dims[-1] + sum(config.dims)


def top_mlp_input_width(config: DlrmConfig) -> int:
    """The top MLP's input width: the cross network's output, or the dot interaction's."""
    if config.cross:
        return interaction.cross_output_width(cross_input_width(config))
    return interaction.interaction_output_width(len(config.cardinalities) + 1, config.bottom_mlp_dims[-1])


def _mlp_weights(input_width: int, widths: Sequence[int]) -> int:
    """Kernels and biases of a dense stack on `input_width` inputs."""
    inputs = [input_width, *widths[:-1]]
    return sum(i * o + o for i, o in zip(inputs, widths))


def dense_weight_count(config: DlrmConfig) -> int:
    """The MLPs' and the cross network's weights (what the dense gradients' allreduce carries), from
    the widths `Dlrm.build_weights` gives them; plain arithmetic, for configurations too large to build."""
    count = _mlp_weights(_round_up(config.num_numerical_features, 8), config.bottom_mlp_dims)
    if config.cross:
        width, rank = cross_input_width(config), config.cross_layer_projection_dim
        per_layer = width * rank + rank * width + width if rank else width * width + width
        count += config.num_cross_layers * per_layer
    return count + _mlp_weights(top_mlp_input_width(config), config.top_mlp_dims)


class Dlrm(tf.keras.Model):
    """Bottom MLP -> [bottom output, embeddings] -> dot interaction or cross network -> top MLP -> logit."""

    def __init__(self, config: DlrmConfig, embedding_layer: EmbeddingLayer) -> None:
        """`embedding_layer` holds the tables of `config` (`factory.embedding_layer` makes the one for
        the world size)."""
        super().__init__(name="dlrm")
        config.validate()
        if not isinstance(embedding_layer, EmbeddingLayer):
            raise TypeError(f"{type(embedding_layer).__name__} is not an EmbeddingLayer (recsys.sparse.tables)")
        self.config = config
        self.padded_numerical = _round_up(config.num_numerical_features, 8)
        self.bottom_mlp = Mlp(config.bottom_mlp_dims, linear_last=False, name="bottom_mlp", seed=config.seed,
                              backward=config.mlp_backward)
        self.embedding = embedding_layer
        self.cross_network = (interaction.CrossNetwork(config.num_cross_layers, config.cross_layer_projection_dim,
                                                       seed=config.seed, seed_offset=len(config.bottom_mlp_dims)
                                                       + len(config.top_mlp_dims))
                              if config.cross else None)
        self.interact = (None if config.cross else
                         interaction.make_block_interaction(config.interaction, config.bottom_mlp_dims[-1]))
        self.top_mlp = Mlp(config.top_mlp_dims, linear_last=True, name="top_mlp", seed=config.seed,
                           seed_offset=len(config.bottom_mlp_dims), backward=config.mlp_backward)

    def call(self, inputs: Dict[str, Any], training: bool = False, ids_exchanged: bool = False,
             tag: str = "") -> tf.Tensor:
        """The logits of a batch; with `ids_exchanged` its categorical part is what `exchange_ids`
        made of the ids (a step that exchanged them ahead), and `tag` names its collectives apart
        (a micro-batch's)."""
        numerical = tf.cast(inputs[NUMERICAL_KEY], self.compute_dtype)
        padding = self.padded_numerical - self.config.num_numerical_features
        if padding:
            numerical = tf.pad(numerical, [[0, 0], [0, padding]])
        bottom = self.bottom_mlp(numerical)
        # [bottom, vector blocks...]: joined once for the cross network, read in place by the dot interaction.
        ids = inputs[CATEGORICAL_KEY] if ids_exchanged else tuple(inputs[CATEGORICAL_KEY])
        blocks = [bottom] + [tf.cast(block, bottom.dtype)
                             for block in self.embedding(ids, as_blocks=True, exchanged=ids_exchanged, tag=tag)]
        if self.cross_network is not None:
            features = tf.concat(blocks, axis=1)  # [B, bottom width + sum of table widths]
            return tf.cast(self.top_mlp(self.cross_network(features)), tf.float32)
        with tf.name_scope("interaction"):  # its ops named apart (bench.step_profile's breakdown)
            interacted = self.interact(blocks)
        return tf.cast(self.top_mlp(interacted), tf.float32)

    def micro_batches(self, features: Dict[str, Any], labels: tf.Tensor,
                      parts: int) -> List[Tuple[Dict[str, Any], tf.Tensor]]:
        """The batch as `parts` micro-batches (features, labels): micro-batch i holds rows
        [rank_start(i, L, parts), rank_start(i + 1, L, parts)) of the local batch of L rows, its
        ids in the form the embedding layer reads (`EmbeddingLayer.micro_batch_ids`)."""
        if parts == 1:
            return [(features, labels)]
        ids = self.embedding.micro_batch_ids(tuple(features[CATEGORICAL_KEY]), parts)
        return [({**{key: micro_batch_rows(value, part, parts) for key, value in features.items()
                     if key != CATEGORICAL_KEY}, CATEGORICAL_KEY: ids[part]},
                 micro_batch_rows(labels, part, parts)) for part in range(parts)]

    def exchange_ids(self, features: Dict[str, Any], tag: str = "") -> Dict[str, Any]:
        """`features` with its ids as the embedding layer's `exchange_ids` makes them (for
        `call(..., ids_exchanged=True)`): the part of a batch that needs no weight."""
        return {**features, CATEGORICAL_KEY: self.embedding.exchange_ids(tuple(features[CATEGORICAL_KEY]), tag)}

    def build_weights(self) -> None:
        """Create every variable without a forward pass (which would need every rank's input)."""
        self.bottom_mlp(tf.zeros([1, self.padded_numerical]))
        self.embedding.build(None)
        if self.cross_network is not None:
            self.cross_network(tf.zeros([1, cross_input_width(self.config)]))
        self.top_mlp(tf.zeros([1, top_mlp_input_width(self.config)]))
        self.built = True

    @property
    def embedding_variables(self) -> List[tf.Variable]:
        return list(self.embedding.trainable_variables)

    @property
    def dense_variables(self) -> List[tf.Variable]:
        cross = self.cross_network.trainable_variables if self.cross_network is not None else []
        return self.bottom_mlp.trainable_variables + cross + self.top_mlp.trainable_variables

    @property
    def data_parallel_variables(self) -> List[tf.Variable]:
        """Variables every rank holds whole (MLPs, replicated tables): broadcast from rank 0 at start."""
        local = {id(v) for v in self.embedding.model_parallel_variables}
        return [v for v in self.variables if id(v) not in local]

    def table_views(self, selector: Optional[VariableSelector] = None) -> List[TableView]:
        """Every table (or an optimizer slot of it) in global layout, in feature order."""
        return self.embedding.table_views(selector)

    def dense_weight_map(self) -> Dict[str, tf.Variable]:
        """Stable, implementation-independent names for the MLP and cross weights (checkpoint file names)."""
        names = {}
        for mlp in (self.bottom_mlp, self.top_mlp):
            for i, layer in enumerate(mlp.dense_layers):
                names[f"{mlp.name}_layer_{i}_kernel"] = layer.kernel
                names[f"{mlp.name}_layer_{i}_bias"] = layer.bias
        if self.cross_network is not None:
            names |= self.cross_network.weight_map()
        return names

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
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import tensorflow as tf

import embedding
import interaction
from batch import CATEGORICAL_KEY, NUMERICAL_KEY
from sharding import describe_dims, table_dims


@dataclass
class DlrmConfig:
    """Everything that fixes the shapes of the weights (stored in checkpoint manifests)."""
    num_numerical_features: int
    cardinalities: List[int]
    embedding_dim: Union[int, List[int]] = 128  # one width for every table, or one per table
    bottom_mlp_dims: List[int] = field(default_factory=lambda: [512, 256, 128])
    top_mlp_dims: List[int] = field(default_factory=lambda: [1024, 1024, 512, 256, 1])
    interaction: str = "tensorflow"  # a dot implementation (interaction.IMPLEMENTATIONS) or "cross"
    num_cross_layers: int = 3
    cross_layer_projection_dim: int = 512  # 0: full-rank cross kernels
    embedding_type: str = "fused"
    cpu_embedding_type: str = "multitable"
    host_tables: List[int] = field(default_factory=list)  # offloaded to host memory (the plan decides)
    embedding_trainable: bool = True
    embedding_zeros_initializer: bool = False
    table_dtype: str = "float32"
    seed: int = 0
    hotness: List[int] = field(default_factory=list)  # ids per sample of every feature (empty: all one-hot)
    poolings: List[str] = field(default_factory=list)  # 'sum' or 'mean' per feature (empty: all 'sum')

    @property
    def dims(self) -> List[int]:
        """The width of every table."""
        return table_dims(self.embedding_dim, len(self.cardinalities))

    @property
    def feature_hotness(self) -> List[int]:
        """Ids per sample of every feature (1: one-hot)."""
        return list(self.hotness) or [1] * len(self.cardinalities)

    @property
    def feature_poolings(self) -> List[str]:
        """The pooling of every feature."""
        return list(self.poolings) or ["sum"] * len(self.cardinalities)

    @property
    def cross(self) -> bool:
        return self.interaction == CROSS

    def validate(self) -> None:
        """Shape rules of the reference, each as one clear message naming the flag."""
        if self.num_numerical_features < 1:
            raise ValueError("the model needs at least one numerical feature for the bottom MLP "
                             f"(the dataset has {self.num_numerical_features})")
        if not self.cardinalities:
            raise ValueError("the model needs at least one categorical feature")
        if not self.bottom_mlp_dims:
            raise ValueError("--bottom_mlp_dims needs at least one layer")
        dims = self.dims
        if not self.cross and (len(set(dims)) != 1 or self.bottom_mlp_dims[-1] != dims[0]):
            raise ValueError(f"the dot interaction needs every table of one width equal to the last "
                             f"--bottom_mlp_dims entry ({self.bottom_mlp_dims[-1]}), got --embedding_dim "
                             f"{describe_dims(dims)}; use --interaction cross for mixed widths")
        if not self.top_mlp_dims or self.top_mlp_dims[-1] != 1:
            raise ValueError(f"the last --top_mlp_dims entry must be 1 (one logit), got {self.top_mlp_dims}")
        if any(d < 1 for d in self.bottom_mlp_dims + self.top_mlp_dims + dims):
            raise ValueError("layer widths and --embedding_dim must be positive")
        if self.cross and (self.num_cross_layers < 1 or self.cross_layer_projection_dim < 0):
            raise ValueError(f"the cross network needs --num_cross_layers >= 1 and --cross_layer_projection_dim "
                             f">= 0, got {self.num_cross_layers} and {self.cross_layer_projection_dim}")

    def shape_fields(self) -> Dict[str, Any]:
        """The fields two checkpoints must agree on to hold the same weights."""
        fields = asdict(self)
        for free in ("interaction", "num_cross_layers", "cross_layer_projection_dim", "embedding_type",
                     "cpu_embedding_type", "host_tables", "embedding_trainable", "embedding_zeros_initializer",
                     "table_dtype", "seed", "hotness", "poolings"):
            fields.pop(free)
        if self.cross:  # a dot model's fields stay as they were before the cross network existed
            fields |= {"interaction": CROSS, "num_cross_layers": self.num_cross_layers,
                       "cross_layer_projection_dim": self.cross_layer_projection_dim}
        return fields


CROSS = "cross"


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


class Mlp(tf.keras.layers.Layer):
    """Dense stack with the reference's initialisers; ReLU on every layer unless the last is linear.

    Each kernel and bias is drawn from its own seed derived from (`seed`, `seed_offset`, layer), so
    the initial weights do not depend on what else was initialised before (e.g. how many tables
    this rank holds).
    """

    def __init__(self, widths: Sequence[int], linear_last: bool, name: str, seed: int = 0,
                 seed_offset: int = 0) -> None:
        super().__init__(name=name)
        self.dense_layers = []
        for i, width in enumerate(widths):
            last = i == len(widths) - 1
            layer_seed = (seed * 1_000_003 + seed_offset + i) * 2
            self.dense_layers.append(tf.keras.layers.Dense(
                width, activation=None if (last and linear_last) else "relu",
                kernel_initializer=tf.keras.initializers.GlorotNormal(seed=layer_seed),
                bias_initializer=tf.keras.initializers.RandomNormal(stddev=math.sqrt(1.0 / width),
                                                                    seed=layer_seed + 1),
                name=f"dense_{i}"))

    def call(self, x: tf.Tensor) -> tf.Tensor:
        for layer in self.dense_layers:
            x = layer(x)
        return x


class Dlrm(tf.keras.Model):
    """Bottom MLP -> [bottom output, embeddings] -> dot interaction or cross network -> top MLP -> logit."""

    def __init__(self, config: DlrmConfig, embedding_layer: embedding.EmbeddingLayer) -> None:
        """`embedding_layer` holds the tables of `config` (`factory.embedding_layer` makes the one for
        the world size)."""
        super().__init__(name="dlrm")
        config.validate()
        if not isinstance(embedding_layer, embedding.EmbeddingLayer):
            raise TypeError(f"{type(embedding_layer).__name__} is not an embedding.EmbeddingLayer")
        self.config = config
        self.padded_numerical = _round_up(config.num_numerical_features, 8)
        self.bottom_mlp = Mlp(config.bottom_mlp_dims, linear_last=False, name="bottom_mlp", seed=config.seed)
        self.embedding = embedding_layer
        self.cross_network = (interaction.CrossNetwork(config.num_cross_layers, config.cross_layer_projection_dim,
                                                       seed=config.seed, seed_offset=len(config.bottom_mlp_dims)
                                                       + len(config.top_mlp_dims))
                              if config.cross else None)
        # The tables change only in the optimizer's update, after the gradient: the CPU interaction
        # may gather their vectors again for the backward pass instead of holding them in between.
        self.interact = (None if config.cross else
                         interaction.make_block_interaction(config.interaction, config.bottom_mlp_dims[-1],
                                                           regather_for_gradient=True))
        self.top_mlp = Mlp(config.top_mlp_dims, linear_last=True, name="top_mlp", seed=config.seed,
                           seed_offset=len(config.bottom_mlp_dims))

    def call(self, inputs: Dict[str, Any], training: bool = False) -> tf.Tensor:
        numerical = tf.cast(inputs[NUMERICAL_KEY], self.compute_dtype)
        padding = self.padded_numerical - self.config.num_numerical_features
        if padding:
            numerical = tf.pad(numerical, [[0, 0], [0, padding]])
        bottom = self.bottom_mlp(numerical)
        # [bottom, vector blocks...]: joined once for the cross network, read in place by the dot interaction.
        blocks = [bottom] + [tf.cast(block, bottom.dtype)
                             for block in self.embedding(tuple(inputs[CATEGORICAL_KEY]), as_blocks=True)]
        if self.cross_network is not None:
            features = tf.concat(blocks, axis=1)  # [B, bottom width + sum of table widths]
            return tf.cast(self.top_mlp(self.cross_network(features)), tf.float32)
        return tf.cast(self.top_mlp(self.interact(blocks)), tf.float32)

    def build_weights(self) -> None:
        """Create every variable without a forward pass (which would need every rank's input)."""
        self.bottom_mlp(tf.zeros([1, self.padded_numerical]))
        self.embedding.build(None)
        features = self.config.bottom_mlp_dims[-1] + sum(self.config.dims)
        if self.cross_network is not None:
            self.cross_network(tf.zeros([1, features]))
            top_width = interaction.cross_output_width(features)
        else:
            top_width = interaction.interaction_output_width(len(self.config.cardinalities) + 1,
                                                             self.config.bottom_mlp_dims[-1])
        self.top_mlp(tf.zeros([1, top_width]))
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

    def table_views(self, selector: Optional[embedding.VariableSelector] = None) -> List[embedding.TableView]:
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

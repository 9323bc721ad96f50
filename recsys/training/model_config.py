"""The DLRM's configuration, each setting declared once with its default (docs/architecture.md,
Configuration).

- `DlrmSettings`: what a user chooses about the network (the MLPs, the interaction, the embedding
  layouts, initialisation); main.py's flags take their defaults from it and fill it by the flag
  named in each field's metadata (`flag_name`).
- `TrainingSettings`: the optimizers and the learning-rate schedule, the same way.
- `DlrmConfig`: the settings plus what the dataset and the sharding plan decide (the tables, their
  widths, hotness and pooling, the host-memory tier); the model is built from it, and its
  `shape_fields` (the fields marked `SHAPE`, and the cross network's when it is used) go into every
  checkpoint manifest.
- `table_widths`: --embedding_dim as one width per table, and the one check of every rule on it.
Plain Python, no TensorFlow: main.py reads the defaults before TensorFlow loads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from recsys.sparse.sharding import check_table_widths, describe_dims

CROSS = "cross"
SHAPE = "shape"  # metadata key: the field fixes the weights' shapes
CROSS_SHAPE = "cross"  # ... only when the model uses the cross network
FLAG = "flag"  # metadata key: main.py's flag for the field, when it is not the field's name
MLP_BACKWARDS = ("tensorflow", "cpu", "custom_cpu")  # DlrmConfig.mlp_backward


@dataclass(kw_only=True)
class DlrmSettings:
    """The network as the user sets it (reference V3/V4 defaults; dlrm.py and dcnv2.py set V5's)."""
    bottom_mlp_dims: List[int] = field(default_factory=lambda: [512, 256, 128], metadata={SHAPE: True})
    top_mlp_dims: List[int] = field(default_factory=lambda: [1024, 1024, 512, 256, 1], metadata={SHAPE: True})
    interaction: str = field(default="tensorflow", metadata={SHAPE: CROSS_SHAPE})  # a dot implementation or "cross"
    num_cross_layers: int = field(default=3, metadata={SHAPE: CROSS_SHAPE})
    cross_layer_projection_dim: int = field(default=512, metadata={SHAPE: CROSS_SHAPE})  # 0: full-rank kernels
    embedding_type: str = field(default="fused", metadata={FLAG: "gpu_embedding_type"})
    cpu_embedding_type: str = "multitable"
    embedding_trainable: bool = True
    embedding_zeros_initializer: bool = False
    table_dtype: str = "float32"
    seed: int = 0


@dataclass(kw_only=True)
class TrainingSettings:
    """The optimizers and the schedule (reference V3/V4 defaults). `loss_scale` None: no loss scaling."""
    optimizer: str = "sgd"
    beta_1: float = field(default=0.9, metadata={FLAG: "beta1"})
    beta_2: float = field(default=0.999, metadata={FLAG: "beta2"})
    learning_rate: float = 24.0
    warmup_steps: int = 8000
    decay_start_step: int = 48000
    decay_steps: int = 24000
    loss_scale: Optional[float] = None
    fp16_allreduce: bool = False  # the dense gradients' allreduce sent as float16 (Horovod's compression)
    # Overlap of the exchanges with compute (trainer.Trainer): the next batch's id all-to-all during
    # this step (where the layer exchanges ids: data-parallel input on several ranks), and each
    # step's local batch as this many micro-batches in one graph. Same weights either way.
    pipeline_input: bool = True
    micro_batches: int = 1


def table_widths(embedding_dim: Union[int, Sequence[int]], num_tables: int, *, cross: bool,
                 bottom_mlp_width: int) -> Tuple[int, ...]:
    """Every table's width, one integer per table in feature order, from --embedding_dim's value
    (one integer for every table, or one per table). The one place every rule on the widths is
    checked, each error naming --embedding_dim: one positive width per table, and, with the dot
    interaction, one width for all equal to the bottom MLP's last layer (`bottom_mlp_width`), whose
    output is dotted with the embedding vectors. main.py resolves the widths with it as soon as the
    feature spec gives the number of tables, before any plan or pipeline; the planner, DlrmConfig
    and the embedding layers take the tuple."""
    widths = (embedding_dim,) * num_tables if isinstance(embedding_dim, int) else tuple(embedding_dim)
    check_table_widths(widths, num_tables)
    if not cross and set(widths) != {bottom_mlp_width}:
        raise ValueError(f"the dot interaction needs every table of one width equal to the last "
                         f"--bottom_mlp_dims entry ({bottom_mlp_width}), got --embedding_dim "
                         f"{describe_dims(widths)}; use --interaction cross for mixed widths")
    return widths


def flag_name(setting: Any) -> str:
    """The main.py flag that sets a dataclass field."""
    return setting.metadata.get(FLAG, setting.name)


def setting_default(settings_class: type, name: str) -> Any:
    """A setting's declared default (main.py's flag default)."""
    return getattr(settings_class(), name)


@dataclass(kw_only=True)
class DlrmConfig(DlrmSettings):
    """The settings plus what the dataset and the plan decide; everything the model is built from."""
    num_numerical_features: int = field(metadata={SHAPE: True})
    cardinalities: List[int] = field(metadata={SHAPE: True})
    embedding_dim: Tuple[int, ...] = field(metadata={SHAPE: True})  # one width per table (`table_widths`)
    host_tables: List[int] = field(default_factory=list)  # offloaded to host memory (the plan decides)
    hotness: List[int] = field(default_factory=list)  # ids per sample of every feature (empty: all one-hot)
    poolings: List[str] = field(default_factory=list)  # 'sum' or 'mean' per feature (empty: all 'sum')
    # The MLPs' backward pass: TensorFlow's gradients of Keras's Dense ("tensorflow"), or the CPU's
    # (model.ReluDense): "cpu", TensorFlow's ReLU and bias gradient ops, "custom_cpu", one pass of the
    # compiled kernel. factory.model_config picks it for the process. Same weights' shapes.
    mlp_backward: str = "tensorflow"

    @property
    def dims(self) -> List[int]:
        """The width of every table, as a list."""
        return list(self.embedding_dim)

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
        if self.mlp_backward not in MLP_BACKWARDS:
            raise ValueError(f"unknown MLP backward {self.mlp_backward!r}; one of {', '.join(MLP_BACKWARDS)}")
        table_widths(self.embedding_dim, len(self.cardinalities), cross=self.cross,
                     bottom_mlp_width=self.bottom_mlp_dims[-1])
        if not self.top_mlp_dims or self.top_mlp_dims[-1] != 1:
            raise ValueError(f"the last --top_mlp_dims entry must be 1 (one logit), got {self.top_mlp_dims}")
        if any(d < 1 for d in self.bottom_mlp_dims + self.top_mlp_dims):
            raise ValueError("layer widths must be positive")
        if self.cross and (self.num_cross_layers < 1 or self.cross_layer_projection_dim < 0):
            raise ValueError(f"the cross network needs --num_cross_layers >= 1 and --cross_layer_projection_dim "
                             f">= 0, got {self.num_cross_layers} and {self.cross_layer_projection_dim}")

    def shape_fields(self) -> Dict[str, Any]:
        """The fields two checkpoints must agree on to hold the same weights: those marked SHAPE, and
        the cross network's when it is used (a dot model's fields stay as they were before it existed).
        `embedding_dim` keeps the manifests' JSON form: one integer when every table has that width
        (as before per-table widths existed), else the list."""
        values = asdict(self)
        widths = self.embedding_dim
        values["embedding_dim"] = widths[0] if len(set(widths)) == 1 else list(widths)
        return {f.name: values[f.name] for f in fields(self)
                if f.metadata.get(SHAPE) is True or (self.cross and f.metadata.get(SHAPE) == CROSS_SHAPE)}

    @classmethod
    def from_settings(cls, settings: DlrmSettings, **decided: Any) -> "DlrmConfig":
        """`settings` with what the dataset and the plan decided (`num_numerical_features`,
        `cardinalities`, `embedding_dim`, ...)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(DlrmSettings)}, **decided)

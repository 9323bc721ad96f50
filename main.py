"""DLRM for TensorFlow 2: train, eval, inference and deploy (reference §1).

Flags keep the reference's names, types and defaults (V3 set plus V4 additions). They are
defined before TensorFlow is imported so that `--xla` can set TF_XLA_FLAGS first. Launch with
`python main.py ...` (one process) or `horovodrun -np N python main.py ...`. Once applied and
validated, the flags are read once into a `JobConfig` (`config_from_flags`), which is all the job sees.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

from absl import app, flags

import utils

from recsys.data import data_formats  # plain Python: the formats' names without importing them (or TensorFlow)
from recsys.data.feature_spec import MLPERF_HOTNESS, MLPERF_ROW_CAP  # plain Python, as sharding
from recsys.training.model_config import (  # plain Python: the settings' defaults
    DlrmSettings, TrainingSettings, flag_name, table_widths)
from recsys.runtime.cpu_affinity import MODES as AFFINITY_MODES  # plain Python
from recsys.sparse.sharding import STRATEGIES  # plain Python: importing it loads no TensorFlow

if TYPE_CHECKING:  # TensorFlow loads only once the flags are parsed (--xla sets TF_XLA_FLAGS first)
    from recsys.training.checkpoint import TrainingState
    from dataloader import InputPipelines
    from recsys.runtime.precision import Precision
    from saved_model import ServedFeatures
    from recsys.training.trainer import Evaluator, Trainer
    from recsys.runtime.logger import DllLogger

FLAGS = flags.FLAGS
MODEL, TRAINING = DlrmSettings(), TrainingSettings()  # the declared defaults the flags start from

# V5 --interaction -> this project's interaction (a --dot_interaction value, or the cross network).
V5_INTERACTIONS = {"dot_custom_cuda": "custom_cuda", "dot_tensorflow": "tensorflow", "cross": "cross"}
# Flags kept so that launch scripts of other versions still run: (default, version, what they mean here).
ACCEPTED_FLAGS = {
    "concat_embedding": (False, "V5", "one process already keeps its tables concatenated per width "
                                      "(--gpu_embedding_type fused); the flag changes nothing"),
    "use_mde_embeddings": (True, "V5", "the hybrid-parallel layer plays distributed-embeddings' role on "
                                       "every world size; the flag changes nothing"),
    "use_merlin_de_embeddings": (False, "V4", "the hybrid-parallel layer plays distributed-embeddings' role; "
                                              "the flag changes nothing"),
    "columnwise_split": (False, "V3", "column slicing is decided by --column_slice_threshold (V4); the flag "
                                      "changes nothing"),
    "data_parallel_bottom_mlp": (False, "V3", "the bottom MLP is always data parallel (V4); the flag changes "
                                              "nothing"),
    "dummy_model": (False, "V3", "not provided (the reference's path crashed); the real model runs"),
    "compress": (False, "SOK", "SOK deduplicates the ids before its lookup (tf.unique); the lookups here give the "
                               "same vectors without it; the flag changes nothing (--fp16_allreduce compresses the "
                               "dense gradients' allreduce)"),
    "use_splited_dataset": (False, "SOK", "--dataset_type sok_split recognises category_<i>.bin files by itself; "
                                          "the flag changes nothing"),
}

flags.DEFINE_enum("mode", "train", ["inference", "eval", "train", "deploy"], "Select task to be performed")
flags.DEFINE_float("learning_rate", TRAINING.learning_rate, "Learning rate (peak after warmup) of every optimizer")
flags.DEFINE_integer("batch_size", 64 * 1024, "Global training batch size (split evenly across ranks)")
flags.DEFINE_integer("valid_batch_size", 64 * 1024, "Global batch size for evaluation and inference")
flags.DEFINE_bool("run_eagerly", False, "Disable all tf.function graph compilation")
flags.DEFINE_list("top_mlp_dims", [str(d) for d in MODEL.top_mlp_dims], "Top MLP layer widths")
flags.DEFINE_list("bottom_mlp_dims", [str(d) for d in MODEL.bottom_mlp_dims],
                  "Bottom MLP layer widths (with the dot interaction the last equals --embedding_dim)")
flags.DEFINE_enum("optimizer", TRAINING.optimizer, ["sgd", "adam", "adagrad"],
                  "sgd for everything, Adam for the MLPs with lazy Adam for the embeddings, or Adagrad for "
                  "both (an extension: the MLPerf DLRM-DCNv2 recipe's optimizer)")
flags.DEFINE_string("save_checkpoint_path", None,
                    "Directory to save checkpoints to (step_<N> subdirectories; the newest K are kept)")
flags.DEFINE_string("restore_checkpoint_path", None,
                    "Checkpoint directory, or a root of step_<N> directories (the newest is used)")
flags.DEFINE_bool("auto_resume", False,
                  "Resume from the newest checkpoint under --save_checkpoint_path when it holds any (a requeued or "
                  "restarted job continues by itself); start as given (fresh, or --restore_checkpoint_path) otherwise")
flags.DEFINE_integer("checkpoint_every_n_steps", 0, "Also save every N training steps (0: only at the end)")
flags.DEFINE_integer("keep_checkpoints", 3, "Number of newest checkpoints kept under --save_checkpoint_path")
flags.DEFINE_string("saved_model_output_path", None, "Export a SavedModel here (after training or in deploy mode)")
flags.DEFINE_bool("save_input_signature", False,
                  "Kept for compatibility: the SavedModel always carries the serving input signature")
flags.DEFINE_string("saved_model_input_path", None, "Load a SavedModel for eval or inference instead of building")
flags.DEFINE_bool("cpu", False, "Run on the CPU: every table and layer placed on /CPU:0")
flags.DEFINE_enum("gpu_embedding_type", MODEL.embedding_type, ["multitable", "fused"],
                  "Implementation of the tables that fit the device memory budget (one process; on several "
                  "ranks each rank's table slices are one variable each)")
flags.DEFINE_enum("cpu_embedding_type", MODEL.cpu_embedding_type, ["multitable", "fused"],
                  "Implementation of the tables offloaded to CPU memory (one process; on several ranks each "
                  "rank's table slices are one variable each)")
flags.DEFINE_bool("amp", False, "Mixed precision with float32 weights: float16 compute with static loss scaling "
                                "on a GPU, bfloat16 compute on a CPU with bf16 units (float32 on other CPUs)")
flags.DEFINE_bool("fp16", False, "Pure float16 policy, for inference and export only")
flags.DEFINE_bool("xla", False, "Enable XLA auto-clustering (TF_XLA_FLAGS=--tf_xla_auto_jit=fusible)")
flags.DEFINE_integer("loss_scale", 1024, "Static loss scale used with --amp")
flags.DEFINE_integer("auc_thresholds", None,
                     "Use the reference's approximate AUC with this many thresholds (default: exact AUC)")
flags.DEFINE_integer("epochs", 1, "Number of passes over the training data")
flags.DEFINE_integer("max_steps", -1, "Stop after this many training steps in total (-1: all epochs); "
                                      "inference: number of batches (1000 when -1)")
flags.DEFINE_bool("embedding_trainable", MODEL.embedding_trainable, "If False, the embedding tables are frozen")
flags.DEFINE_enum("dot_interaction", "auto", ["custom_cuda", "custom_cpu", "tensorflow", "dummy", "auto"],
                  "Interaction implementation; auto picks the fastest available and says which")
flags.DEFINE_string("embedding_dim", "128", "Width of the embedding vectors: one integer for every table, or (V5) "
                                           "a comma list with one per table, or the path of a JSON list of them")
flags.DEFINE_integer("evals_per_epoch", 1, "Evaluations per epoch (spread evenly over its steps)")
flags.DEFINE_float("print_freq", 1000, "Steps between progress lines (and the 2x warm-up of the timer)")
flags.DEFINE_integer("warmup_steps", TRAINING.warmup_steps, "Linear learning-rate warmup length")
flags.DEFINE_integer("decay_start_step", TRAINING.decay_start_step, "Step at which polynomial decay starts")
flags.DEFINE_integer("decay_steps", TRAINING.decay_steps, "Polynomial decay length (the rate is 0 afterwards)")
flags.DEFINE_integer("profiler_start_step", None, "Start the TF profiler at this step, for 100 steps")
flags.DEFINE_integer("profiled_rank", 1, "Rank that runs the profiler")
flags.DEFINE_integer("inter_op_parallelism", None, "TF inter-op thread count (default: on a CPU run, as measured for "
                     "this CPU kind and the ranks on the host; the `threads:` start-up line says which)")
flags.DEFINE_integer("intra_op_parallelism", None, "TF intra-op thread count (default: on a CPU run, as measured for "
                     "this CPU kind and the ranks on the host; the `threads:` start-up line says which)")
flags.DEFINE_enum("affinity", "auto", ["auto", *AFFINITY_MODES],
                  "Which CPUs each rank runs on, by its local rank (recsys/runtime/cpu_affinity.py; every rank "
                  "prints its CPUs). auto: several ranks on a host each get their own share of its cores, unless "
                  "a launcher bound them; one rank keeps its CPUs")
flags.DEFINE_integer("tf_gpu_memory_limit_gb", None,
                     "Memory budget (GiB) per rank for device-resident embedding state (tables, optimizer "
                     "slots, update transients); what does not fit is kept in host memory. Default: the "
                     "GPU's memory less a reserve (10%, at least 4 GiB). With --cpu every table is in host memory")
flags.DEFINE_string("log_path", "dlrm_tf_log.json", "Path of the dllogger JSON log")
flags.DEFINE_string("tensorboard_dir", None,
                    "Training writes TensorBoard scalars here (rank 0, at each progress line and evaluation): "
                    "loss, learning rate, throughput, step time, AUC, validation loss. Off by default")
flags.DEFINE_string("dataset_path", None, "Dataset directory (holds the feature spec)")
flags.DEFINE_string("feature_spec", "feature_spec.yaml", "Feature spec file name inside --dataset_path")
flags.DEFINE_bool("allow_external_data_paths", False,
                  "Let the feature spec name data files outside --dataset_path (absolute or ../ paths); "
                  "refused by default, so a stray path cannot read another dataset's files")
flags.DEFINE_enum("dataset_type", "tf_raw", list(data_formats.names("training")),
                  "Split-binary files, in-memory synthetic data, (V5) split-TFRecords files, HugeCTR raw "
                  "files (train_data.bin, test_data.bin), the SOK DLRM benchmark's split layout, or TorchRec's "
                  "day_<i>_{labels,dense,sparse}.npy files (MLPerf's day_<i>_sparse_multi_hot.npz ids too)")
flags.DEFINE_list("hugectr_cardinalities", None,
                  "(hugectr_raw) The cardinality of each categorical feature (HugeCTR's slot_size_array); "
                  "needed unless --dataset_path holds a metadata.json (SOK's keys), which it must then match")
flags.DEFINE_bool("hugectr_dense_log", True,
                  "(hugectr_raw) The dense values still need the log transform; a metadata.json's dense_log "
                  "wins (given, the flag must match it)")
flags.DEFINE_list("num_embeddings_per_feature", None,
                  "(torchrec_npy) TorchRec's flag: each table's size; ids are taken modulo it as TorchRec does. "
                  "Needed unless --dataset_path holds a feature spec (its cardinalities; ids then checked "
                  "against them), which it must then match")
flags.DEFINE_bool("synthetic_dataset_use_feature_spec", False,
                  "Synthetic data shaped by --dataset_path/--feature_spec")
flags.DEFINE_integer("synthetic_dataset_train_batches", 64008, "Synthetic train length in batches")
flags.DEFINE_integer("synthetic_dataset_valid_batches", 1350, "Synthetic eval length in batches")
flags.DEFINE_list("synthetic_dataset_cardinalities", 26 * ["1000"], "Synthetic table sizes")
flags.DEFINE_list("synthetic_dataset_hotness", ["1"],
                  "Synthetic ids per sample (V5): one value for every table, or one per table; a table above "
                  "1 gets V5's power-law ids, [batch, hotness] per feature")
flags.DEFINE_integer("synthetic_dataset_num_numerical_features", 13, "Synthetic numerical feature count")
flags.DEFINE_enum("dist_strategy", "memory_balanced", list(STRATEGIES),
                  "Table placement of the model-parallel embeddings (the sharding planner's strategies)")
flags.DEFINE_integer("column_slice_threshold", 10 * 1000 * 1000 * 1000,
                     "Tables with more elements are column-sliced across ranks (model-parallel embeddings)")
flags.DEFINE_integer("row_slice_threshold", None,
                     "Tables (not replicated) with at least this many elements are cut by rows over all ranks, "
                     "each rank holding a contiguous block; ids are routed to the owning rank (V5; none: off)")
flags.DEFINE_integer("data_parallel_threshold", None,
                     "Tables with at most this many elements are replicated on every rank (data parallel)")
flags.DEFINE_bool("data_parallel_input", False,
                  "Every rank reads its local batch of all features and ids are exchanged; by default each "
                  "rank reads the global batch of only the tables it holds")
flags.DEFINE_bool("print_sharding_plan", False, "Print which rank holds which table or slice, its memory per "
                  "rank, and the bytes every collective of a training step sends from each rank (docs/scaling.md)")
flags.DEFINE_float("plan_link_gbps", None, "With --print_sharding_plan: each host's network link in Gb/s; "
                   "prints the predicted exchange time of a step (docs/scaling.md)")
flags.DEFINE_float("plan_intra_host_gbps", None, "With --plan_link_gbps: each rank's link to the ranks of its own "
                   "host in Gb/s (NVLink, shared memory); not given: traffic within a host is not counted")
flags.DEFINE_float("plan_latency_us", 0.0, "With --plan_link_gbps: microseconds per message of a collective")
flags.DEFINE_float("plan_compute_ms", None, "With --plan_link_gbps: a step's measured compute time in ms; prints "
                   "the predicted step, unpipelined (compute + exchange) and fully overlapped (the larger)")
flags.DEFINE_bool("shuffle_batch_order", False, "Shuffle the order of training batches (seeded)")
flags.DEFINE_integer("seed", 12345, "Seed of weight initialisation, synthetic data and batch shuffling")
flags.DEFINE_bool("deterministic", False, "Enable TF op determinism (bitwise reproducible runs)")
flags.DEFINE_bool("validate_data", False, "Check every categorical id against its cardinality before training")
# V5 (DLRM_and_DCNv2) flags; dlrm.py and dcnv2.py set their V5 defaults.
flags.DEFINE_enum("interaction", None, list(V5_INTERACTIONS),
                  "(V5) dot_custom_cuda, dot_tensorflow or cross (DCNv2); overrides --dot_interaction")
flags.DEFINE_integer("num_cross_layers", MODEL.num_cross_layers, "(V5) Cross layers of the DCNv2 cross network")
flags.DEFINE_integer("cross_layer_projection_dim", MODEL.cross_layer_projection_dim, "(V5) Rank of the cross kernels W = U V (0: full rank)")
flags.DEFINE_float("beta1", TRAINING.beta_1, "(V5) Adam beta_1, for the MLPs and the embeddings")
flags.DEFINE_float("beta2", TRAINING.beta_2, "(V5) Adam beta_2, for the MLPs and the embeddings")
flags.DEFINE_bool("embedding_zeros_initializer", MODEL.embedding_zeros_initializer, "(V5) Start every embedding table at zero")
flags.DEFINE_integer("cpu_offloading_threshold_gb", None,
                     "(V5) Per-rank device budget for embedding state in GB (10^9 bytes, V5's unit), the rest in "
                     "host memory; the budget --tf_gpu_memory_limit_gb gives in GiB (give one of the two). V5's "
                     "default, 75, is not kept: the default budget is measured from the GPU (docs/dlrm.md)")
flags.DEFINE_bool("tfdata_debug", False, "(V5) Run tf.data in debug mode (eager, in order)")
flags.DEFINE_enum("preset", None, ["mlperf_dcnv2"],
                  "A documented recipe's flag values, under any flag given explicitly: mlperf_dcnv2 is MLPerf "
                  "Training's DLRM-DCNv2 (docs/v5.md); the dataset must have its 26 multi-hot features")
for _name, (_default, _version, _meaning) in ACCEPTED_FLAGS.items():
    flags.DEFINE_bool(_name, _default, f"({_version}) accepted: {_meaning}")
# The SOK DLRM benchmark's main.py flags, aliases of this project's (apply_sok_aliases).
flags.DEFINE_string("data_dir", None, "(SOK) The SOK benchmark's dataset folder: --dataset_type sok_split "
                                      "--dataset_path DIR")
flags.DEFINE_integer("global_batch_size", None, "(SOK) --batch_size (global); also --valid_batch_size unless given")
flags.DEFINE_bool("custom_interact", False, "(SOK) A custom dot interaction: --dot_interaction custom_cuda on a GPU, "
                                            "custom_cpu otherwise")
flags.DEFINE_bool("eval_in_last", False, "(SOK) Evaluate once, after the last training step (--evals_per_epoch 0 "
                                         "and an evaluation at the end)")
flags.DEFINE_integer("early_stop", -1, "(SOK) Stop after N training steps in all (--max_steps N); <= 0: off")
flags.DEFINE_float("target_auc", None, "Stop training after the evaluation that reaches this AUC (SOK and MLPerf: "
                                       "0.8025), saving the checkpoint and export as at the end")
flags.DEFINE_bool("pipeline_input", TRAINING.pipeline_input,
                  "With --data_parallel_input on several ranks: exchange the next batch's ids while this step "
                  "computes (the same weights; --nopipeline_input exchanges them inside each step)")
flags.DEFINE_integer("micro_batches", TRAINING.micro_batches,
                     "Run each step's batch as N micro-batches in one step, so that one's embedding exchange "
                     "overlaps another's compute (the same weights to float rounding; --batch_size must be "
                     "divisible by ranks x N)")
flags.DEFINE_bool("fp16_allreduce", TRAINING.fp16_allreduce, "Send the dense gradients' allreduce as float16 (Horovod's "
                                           "Compression.fp16): half the bytes, rounded gradients; several processes")


class UsageError(ValueError):
    """A flag value or combination is invalid; the message names the flag."""


# Each preset's flag values (a flag given on the command line keeps its value).
PRESETS: Dict[str, Dict[str, Any]] = {
    "mlperf_dcnv2": {"embedding_dim": "128", "interaction": "cross", "num_cross_layers": 3,
                     "cross_layer_projection_dim": 512, "bottom_mlp_dims": ["512", "256", "128"],
                     "top_mlp_dims": ["1024", "1024", "512", "256", "1"], "optimizer": "adagrad",
                     "learning_rate": 0.005, "warmup_steps": 0, "decay_start_step": 2**31 - 1,
                     "batch_size": 65536, "synthetic_dataset_hotness": [str(h) for h in MLPERF_HOTNESS]},
}


def apply_preset(opts: Any) -> None:
    """Set the chosen --preset's values on every flag not given on the command line (`opts` is FLAGS)."""
    for name, value in PRESETS.get(opts.preset, {}).items():
        if not opts[name].present:
            opts[name].value = value


def sok_alias_targets(opts: Any, gpu_visible: bool) -> Dict[str, Dict[str, Any]]:
    """{each SOK benchmark flag given: {this project's flag: value}} (docs/from_hugectr_sok.md)."""
    targets: Dict[str, Dict[str, Any]] = {}
    if opts["data_dir"].present:
        targets["data_dir"] = {"dataset_type": "sok_split", "dataset_path": opts.data_dir}
    if opts["global_batch_size"].present:  # SOK evaluates with the training batch too
        targets["global_batch_size"] = {"batch_size": opts.global_batch_size} | (
            {} if opts["valid_batch_size"].present else {"valid_batch_size": opts.global_batch_size})
    if opts.custom_interact:
        targets["custom_interact"] = {"dot_interaction": "custom_cuda" if gpu_visible else "custom_cpu"}
    if opts.eval_in_last:
        targets["eval_in_last"] = {"evals_per_epoch": 0}
    if opts.early_stop > 0:
        targets["early_stop"] = {"max_steps": opts.early_stop}
    return targets


def apply_sok_aliases(opts: Any, gpu_visible: bool) -> List[str]:
    """Set the flags the SOK benchmark's flags stand for (`opts` is FLAGS); return one start-up line
    per alias given. A target given on the command line with another value is a UsageError; values
    are range-checked first, so an alias's bad value is reported as its own."""
    _check_values(opts)
    lines = []
    for alias, targets in sok_alias_targets(opts, gpu_visible).items():
        given = f"--{alias}" + ("" if isinstance(opts[alias].value, bool) else f" {opts[alias].value}")
        for name, value in targets.items():
            if opts[name].present and opts[name].value != value:
                raise UsageError(f"{given} (SOK) means --{name} {value}, but --{name} {opts[name].value} is given "
                                 f"too; give one of them")
            opts[name].value = value
        lines.append(f"{given} (SOK): " + " ".join(f"--{name} {value}" for name, value in targets.items()))
    if opts.custom_interact and opts.interaction is not None:  # V5's --interaction would override the dot choice
        if opts["interaction"].present or opts.interaction == "cross":
            raise UsageError(f"--custom_interact (SOK) picks a custom dot interaction; --interaction "
                             f"{opts.interaction} chooses another: give one of them")
        opts.interaction = None  # dlrm.py's default dot_custom_cuda: --dot_interaction decides
    return lines


def check_preset_dataset(preset: Optional[str], hotness: List[int], cardinalities: List[int],
                         names: List[str]) -> None:
    """The dataset a preset trains on must be the recipe's: for mlperf_dcnv2, its 26 features with
    MLPerf's hotness and tables of at most 40M rows (dataloading's MLPerf script makes such a one)."""
    if preset != "mlperf_dcnv2":
        return
    if len(hotness) != len(MLPERF_HOTNESS):
        raise UsageError(f"--preset {preset} needs {len(MLPERF_HOTNESS)} categorical features; the "
                         f"dataset has {len(hotness)}")
    for name, have, want, rows in zip(names, hotness, MLPERF_HOTNESS, cardinalities):
        if have != want:
            raise UsageError(f"--preset {preset} needs MLPerf's hotness {','.join(map(str, MLPERF_HOTNESS))}; "
                             f"the dataset's feature {name} has hotness {have}, the recipe {want}")
        if rows > MLPERF_ROW_CAP:
            raise UsageError(f"--preset {preset} caps tables at {MLPERF_ROW_CAP} rows; the dataset's "
                             f"feature {name} has {rows} (build the dataset with the cap)")


INFERENCE_WARMUP_BATCHES = 10


def _at_least(low: float) -> Callable[[Any], bool]:
    return lambda value: value >= low


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


# Every numeric flag: (name, check of its value, what the value must be), checked in this order.
NUMERIC_FLAGS: Tuple[Tuple[str, Callable[[Any], bool], str], ...] = (
    ("learning_rate", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    ("batch_size", _at_least(1), ">= 1"),
    ("valid_batch_size", _at_least(1), ">= 1"),
    ("checkpoint_every_n_steps", _at_least(0), ">= 0 (0: save only at the end)"),
    ("keep_checkpoints", _at_least(1), ">= 1"),
    ("loss_scale", _at_least(1), ">= 1"),
    ("auc_thresholds", _optional(_at_least(2)), ">= 2"),
    ("epochs", _at_least(1), ">= 1"),
    ("max_steps", _at_least(-1), "-1 (no limit) or >= 0"),
    ("evals_per_epoch", _at_least(0), ">= 0"),
    ("print_freq", lambda v: math.isfinite(v) and v == int(v) and v >= 1, "a whole number of steps >= 1"),
    ("warmup_steps", _at_least(0), ">= 0"),
    ("decay_start_step", _at_least(0), ">= 0"),
    ("decay_steps", _at_least(0), ">= 0"),
    ("profiler_start_step", _optional(_at_least(0)), ">= 0"),
    ("profiled_rank", _at_least(0), ">= 0"),
    ("inter_op_parallelism", _optional(_at_least(0)), ">= 0 (0: TensorFlow's default)"),
    ("intra_op_parallelism", _optional(_at_least(0)), ">= 0 (0: TensorFlow's default)"),
    ("tf_gpu_memory_limit_gb", _optional(_at_least(0)), ">= 0"),
    ("synthetic_dataset_train_batches", _at_least(1), ">= 1"),
    ("synthetic_dataset_valid_batches", _at_least(1), ">= 1"),
    ("synthetic_dataset_num_numerical_features", _at_least(1), ">= 1 (the bottom MLP needs an input)"),
    ("column_slice_threshold", _at_least(1), ">= 1 (elements)"),
    ("data_parallel_threshold", _optional(_at_least(0)), ">= 0 (elements)"),
    ("row_slice_threshold", _optional(_at_least(1)), ">= 1 (elements)"),
    ("seed", lambda v: 0 <= v < 2 ** 32, "in [0, 2**32)"),
    ("num_cross_layers", _at_least(1), ">= 1"),
    ("cross_layer_projection_dim", _at_least(0), ">= 0 (0: full rank)"),
    ("beta1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("cpu_offloading_threshold_gb", _optional(_at_least(0)), ">= 0"),
    ("global_batch_size", _optional(_at_least(1)), ">= 1"),
    ("early_stop", _at_least(-1), ">= -1 (<= 0: off)"),
    ("target_auc", _optional(lambda v: 0 < v <= 1), "in (0, 1]"),
    ("plan_link_gbps", _optional(lambda v: math.isfinite(v) and v > 0), "a finite number > 0"),
    ("plan_intra_host_gbps", _optional(lambda v: math.isfinite(v) and v > 0), "a finite number > 0"),
    ("plan_latency_us", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    ("plan_compute_ms", _optional(lambda v: math.isfinite(v) and v >= 0), "a finite number >= 0"),
    ("micro_batches", _at_least(1), ">= 1"),
)
LIST_FLAGS = ("top_mlp_dims", "bottom_mlp_dims", "synthetic_dataset_cardinalities", "synthetic_dataset_hotness",
              "hugectr_cardinalities", "num_embeddings_per_feature")


def embedding_dims(value: str) -> Union[int, List[int]]:
    """--embedding_dim read: one integer for every table, or one per table from a comma list or a
    JSON file holding a list (V5). Only its syntax is checked here: `model_config.table_widths`
    turns it into every table's width and checks the widths' rules."""
    text = value.strip()
    if text.endswith(".json") or os.path.isfile(text):
        try:
            with open(text) as f:
                numbers = json.load(f)
        except (OSError, ValueError) as error:
            raise UsageError(f"--embedding_dim {text}: cannot read a JSON list of widths ({error})") from None
        if not isinstance(numbers, list) or not all(isinstance(n, int) for n in numbers):
            raise UsageError(f"--embedding_dim {text}: the file must hold a JSON list of integers")
    else:
        try:
            numbers = [int(v) for v in text.split(",")]
        except ValueError:
            raise UsageError(f"--embedding_dim must be an integer, a comma list of integers or a JSON file, "
                             f"got {value}") from None
    return numbers[0] if len(numbers) == 1 else numbers


def _check_values(opts: Any) -> None:
    """Each numeric flag in range, each list flag a list of positive integers; errors name the flag."""
    for name, check, wording in NUMERIC_FLAGS:
        value = getattr(opts, name)
        if not check(value):
            raise UsageError(f"--{name} must be {wording}, got {value}")
    for name in LIST_FLAGS:
        values = getattr(opts, name)
        if values is None:  # an optional list not given
            continue
        try:
            numbers = [int(v) for v in values]
        except ValueError:
            raise UsageError(f"--{name} must be a comma-separated list of integers, got {','.join(values)}") from None
        if not numbers or min(numbers) < 1:
            raise UsageError(f"--{name} needs positive integers, got {numbers}")


def validate_flags(opts: Any, world_size: int) -> None:
    """Flag ranges, the reference's incompatible combinations (§1.1) and this implementation's limits.

    `opts` is FLAGS or any object with the flags as attributes, so tests can check values in-process.
    """
    _check_values(opts)
    if opts.restore_checkpoint_path and opts.saved_model_input_path:
        raise UsageError("--restore_checkpoint_path and --saved_model_input_path cannot be used together")
    if opts.saved_model_input_path and opts.mode in ("train", "deploy"):
        raise UsageError(f"--saved_model_input_path serves eval and inference only, not --mode {opts.mode}")
    if opts.cpu_offloading_threshold_gb is not None and opts.tf_gpu_memory_limit_gb is not None:
        raise UsageError("--cpu_offloading_threshold_gb (V5) and --tf_gpu_memory_limit_gb set the same "
                         "embedding budget; give one of them")
    if opts.amp and opts.fp16:
        raise UsageError("--amp and --fp16 are mutually exclusive")
    if opts.fp16 and opts.mode == "train":
        raise UsageError("--fp16 is for inference and export only; train with --amp instead")
    if opts.mode == "deploy" and not opts.saved_model_output_path:
        raise UsageError("--mode deploy needs --saved_model_output_path")
    if opts.mode != "train" and not (opts.restore_checkpoint_path or opts.saved_model_input_path):
        raise UsageError(f"--mode {opts.mode} needs trained weights: give --restore_checkpoint_path"
                         + (" or --saved_model_input_path" if opts.mode != "deploy" else "")
                         + " (random initial weights are never evaluated or exported)")
    for name, modes in (("save_checkpoint_path", ("train",)), ("tensorboard_dir", ("train",)),
                        ("saved_model_output_path", ("train", "deploy"))):
        if getattr(opts, name) and opts.mode not in modes:
            raise UsageError(f"--{name} is written by --mode {' or '.join(modes)} only, not --mode {opts.mode}")
    if opts.mode == "train" and opts.max_steps == 0 and not opts.save_checkpoint_path:
        raise UsageError("--max_steps 0 trains nothing; give --max_steps -1 (all epochs) or > 0, or add "
                         "--save_checkpoint_path to save the initial weights")
    if opts.dataset_type != "synthetic" and not opts.dataset_path and not opts.saved_model_input_path:
        raise UsageError(f"--dataset_path is required with --dataset_type {opts.dataset_type}")
    if opts.synthetic_dataset_use_feature_spec and not opts.dataset_path:
        raise UsageError("--synthetic_dataset_use_feature_spec needs --dataset_path")
    if opts.checkpoint_every_n_steps and not opts.save_checkpoint_path:
        raise UsageError("--checkpoint_every_n_steps needs --save_checkpoint_path")
    if opts.auto_resume and not (opts.mode == "train" and opts.save_checkpoint_path):
        raise UsageError("--auto_resume resumes training from --save_checkpoint_path: it needs --mode train and "
                         "--save_checkpoint_path")
    if opts.profiler_start_step is not None and opts.profiled_rank >= world_size:
        raise UsageError(f"--profiled_rank {opts.profiled_rank} does not exist in a {world_size}-process run, "
                         f"so --profiler_start_step would profile nothing; use --profiled_rank 0")
    if opts.target_auc is not None and not (opts.mode == "train" and (opts.evals_per_epoch or opts.eval_in_last)):
        raise UsageError("--target_auc stops training at an evaluation: it needs --mode train and evaluations "
                         "(--evals_per_epoch >= 1, or --eval_in_last)")
    for name, needs in (("plan_link_gbps", "print_sharding_plan"), ("plan_intra_host_gbps", "plan_link_gbps"),
                        ("plan_latency_us", "plan_link_gbps"), ("plan_compute_ms", "plan_link_gbps")):
        if getattr(opts, name) and not getattr(opts, needs):
            raise UsageError(f"--{name} needs --{needs}")
    if opts.mode == "train" and opts.micro_batches > 1 and opts.batch_size % (world_size * opts.micro_batches):
        raise UsageError(f"--micro_batches {opts.micro_batches} on {world_size} rank(s) needs --batch_size "
                         f"divisible by {world_size * opts.micro_batches} (every rank's micro-batches of one "
                         f"size), got {opts.batch_size}")
    if world_size > 1 and (opts.mode == "deploy" or opts.saved_model_output_path):
        raise UsageError("SavedModel export (--mode deploy, --saved_model_output_path) runs on a single process; "
                         "export the checkpoint with `python main.py --mode deploy --restore_checkpoint_path ...`")


# The run's configuration: the flags read once (config_from_flags), right after they are applied and
# validated; every function after that takes these values, never FLAGS (tests/test_flags.py checks).
@dataclass(frozen=True)
class RunConfig:
    """What runs and how it reports: the mode, its length, evaluations, progress and logs."""
    mode: str
    epochs: int
    max_steps: int  # -1: all epochs (inference: 1000 batches)
    evals_per_epoch: int
    eval_in_last: bool  # (SOK) one evaluation after the last step
    target_auc: Optional[float]
    auc_thresholds: Optional[int]  # None: exact AUC
    print_freq: int
    log_path: str
    log_path_given: bool  # False: the default file in the working folder, which takes runs in turn
    tensorboard_dir: Optional[str]
    profiler_start_step: Optional[int]
    profiled_rank: int
    seed: int
    deterministic: bool
    run_eagerly: bool
    tfdata_debug: bool


@dataclass(frozen=True)
class DataConfig:
    """The dataset, how it is read and the synthetic data's shape; batch sizes are global."""
    dataset_type: str
    dataset_path: Optional[str]
    feature_spec: str  # the spec's file name inside dataset_path
    allow_external_data_paths: bool
    batch_size: int
    valid_batch_size: int
    shuffle_batch_order: bool
    validate_data: bool
    hugectr_cardinalities: Optional[Tuple[int, ...]]
    hugectr_dense_log: Optional[bool]  # None unless given: a metadata.json's value decides
    num_embeddings_per_feature: Optional[Tuple[int, ...]]
    synthetic_use_feature_spec: bool
    synthetic_train_batches: int
    synthetic_valid_batches: int
    synthetic_cardinalities: Tuple[int, ...]
    synthetic_hotness: Tuple[int, ...]  # one value per synthetic table
    synthetic_num_numerical_features: int


@dataclass(frozen=True)
class CheckpointConfig:
    """Where weights come from and go to: checkpoints and SavedModels."""
    save_checkpoint_path: Optional[str]
    restore_checkpoint_path: Optional[str]
    auto_resume: bool
    checkpoint_every_n_steps: int
    keep_checkpoints: int
    saved_model_output_path: Optional[str]
    saved_model_input_path: Optional[str]


@dataclass(frozen=True)
class DeviceConfig:
    """Precision and device placement (the run shell sets the thread counts)."""
    cpu: bool
    amp: bool
    fp16: bool
    loss_scale: int  # the static loss scale of --amp on a GPU
    embedding_budget_bytes: Optional[int]  # per rank; None: measured from the GPU (memory_budget)


@dataclass(frozen=True)
class ShardingConfig:
    """How the embedding tables are spread over the ranks (the sharding planner's inputs)."""
    dist_strategy: str
    column_slice_threshold: int
    row_slice_threshold: Optional[int]
    data_parallel_threshold: Optional[int]
    data_parallel_input: bool
    print_sharding_plan: bool
    plan_link_gbps: Optional[float]  # the communication model's network and compute (docs/scaling.md)
    plan_intra_host_gbps: Optional[float]
    plan_latency_us: float
    plan_compute_ms: Optional[float]


@dataclass(frozen=True)
class NetworkConfig:
    """The model and its optimizers as the user set them (model_config's settings), with what the
    job still decides: `settings.interaction` is the interaction asked for (chosen_interaction
    resolves it), `training.loss_scale` is set by model_options once the precision is known, and
    `embedding_dim` is --embedding_dim's text (embedding_dims and table_widths read it in prepare_job)."""
    settings: DlrmSettings
    training: TrainingSettings
    embedding_dim: str
    dot_falls_back: bool  # dlrm.py's default dot_custom_cuda, not given: the fastest dot when no GPU is visible
    preset: Optional[str]


@dataclass(frozen=True)
class JobConfig:
    """Everything a run reads from its flags, grouped; built once by config_from_flags."""
    run: RunConfig
    data: DataConfig
    checkpoints: CheckpointConfig
    devices: DeviceConfig
    sharding: ShardingConfig
    network: NetworkConfig
    parameters: Dict[str, Any]  # every flag's value: the log's first record (log_parameters)
    accepted_flags_given: Tuple[str, ...]  # ACCEPTED_FLAGS given on the command line
    layout_flags_given: Tuple[Tuple[str, str], ...]  # (table layout flag, value) given on the command line


def _optional_ints(values: Optional[List[str]]) -> Optional[Tuple[int, ...]]:
    return tuple(_ints(values)) if values else None


def embedding_budget_bytes(gib: Optional[int], gb: Optional[int]) -> Optional[int]:
    """The per-rank device budget for embedding state in bytes, from --tf_gpu_memory_limit_gb (GiB, V3)
    or --cpu_offloading_threshold_gb (GB, V5's unit); validate_flags allows at most one. None: neither."""
    return gib << 30 if gib is not None else gb * 10**9 if gb is not None else None


def config_from_flags(opts: Any) -> JobConfig:
    """The run's configuration from the parsed flags (`opts` is FLAGS), read once, after
    apply_preset, the SOK aliases and validate_flags; list flags become integers."""
    requested = opts.dot_interaction if opts.interaction is None else V5_INTERACTIONS[opts.interaction]
    own_flags = opts.get_flags_for_module(sys.modules[__name__])
    return JobConfig(
        run=RunConfig(
            mode=opts.mode, epochs=opts.epochs, max_steps=opts.max_steps, evals_per_epoch=opts.evals_per_epoch,
            eval_in_last=opts.eval_in_last, target_auc=opts.target_auc, auc_thresholds=opts.auc_thresholds,
            print_freq=int(opts.print_freq), log_path=opts.log_path, log_path_given=opts["log_path"].present,
            tensorboard_dir=opts.tensorboard_dir,
            profiler_start_step=opts.profiler_start_step, profiled_rank=opts.profiled_rank, seed=opts.seed,
            deterministic=opts.deterministic, run_eagerly=opts.run_eagerly, tfdata_debug=opts.tfdata_debug),
        data=DataConfig(
            dataset_type=opts.dataset_type, dataset_path=opts.dataset_path, feature_spec=opts.feature_spec,
            allow_external_data_paths=opts.allow_external_data_paths, batch_size=opts.batch_size,
            valid_batch_size=opts.valid_batch_size, shuffle_batch_order=opts.shuffle_batch_order,
            validate_data=opts.validate_data, hugectr_cardinalities=_optional_ints(opts.hugectr_cardinalities),
            hugectr_dense_log=opts.hugectr_dense_log if opts["hugectr_dense_log"].present else None,
            num_embeddings_per_feature=_optional_ints(opts.num_embeddings_per_feature),
            synthetic_use_feature_spec=opts.synthetic_dataset_use_feature_spec,
            synthetic_train_batches=opts.synthetic_dataset_train_batches,
            synthetic_valid_batches=opts.synthetic_dataset_valid_batches,
            synthetic_cardinalities=tuple(_ints(opts.synthetic_dataset_cardinalities)),
            synthetic_hotness=tuple(synthetic_hotness(opts.synthetic_dataset_hotness,
                                                      len(opts.synthetic_dataset_cardinalities))),
            synthetic_num_numerical_features=opts.synthetic_dataset_num_numerical_features),
        checkpoints=CheckpointConfig(
            save_checkpoint_path=opts.save_checkpoint_path, restore_checkpoint_path=opts.restore_checkpoint_path,
            auto_resume=opts.auto_resume, checkpoint_every_n_steps=opts.checkpoint_every_n_steps,
            keep_checkpoints=opts.keep_checkpoints, saved_model_output_path=opts.saved_model_output_path,
            saved_model_input_path=opts.saved_model_input_path),
        devices=DeviceConfig(
            cpu=opts.cpu, amp=opts.amp, fp16=opts.fp16, loss_scale=opts.loss_scale,
            embedding_budget_bytes=embedding_budget_bytes(opts.tf_gpu_memory_limit_gb,
                                                          opts.cpu_offloading_threshold_gb)),
        sharding=ShardingConfig(
            dist_strategy=opts.dist_strategy, column_slice_threshold=opts.column_slice_threshold,
            row_slice_threshold=opts.row_slice_threshold, data_parallel_threshold=opts.data_parallel_threshold,
            data_parallel_input=opts.data_parallel_input, print_sharding_plan=opts.print_sharding_plan,
            plan_link_gbps=opts.plan_link_gbps, plan_intra_host_gbps=opts.plan_intra_host_gbps,
            plan_latency_us=opts.plan_latency_us, plan_compute_ms=opts.plan_compute_ms),
        network=NetworkConfig(
            settings=settings_from_flags(opts, DlrmSettings, interaction=requested,
                                         table_dtype="float16" if opts.fp16 else "float32"),
            training=settings_from_flags(opts, TrainingSettings, loss_scale=None),
            embedding_dim=opts.embedding_dim,
            dot_falls_back=opts.interaction == "dot_custom_cuda" and not opts["interaction"].present,
            preset=opts.preset),
        parameters={flag.name: flag.value for flag in own_flags},
        accepted_flags_given=tuple(name for name in ACCEPTED_FLAGS if opts[name].present),
        layout_flags_given=tuple((name, opts[name].value) for name in ("gpu_embedding_type", "cpu_embedding_type")
                                 if opts[name].present))


def settings_from_flags(opts: Any, settings_class: type, **decided: Any) -> Any:
    """A model_config settings dataclass filled from the flag (of `opts`, FLAGS) named by each field
    (list flags as integers); `decided` gives the fields the run decides itself."""
    values = {}
    for setting in dataclasses.fields(settings_class):
        if setting.name not in decided:
            value = opts[flag_name(setting)].value
            values[setting.name] = _ints(value) if isinstance(value, list) else value
    return settings_class(**values, **decided)


def check_output_paths(config: JobConfig) -> None:
    """Every output can be written and none touches an input; raises OutputPathError naming the flag.

    Runs before any work: a bad log, checkpoint or export path costs one error line, not a run.
    The export may replace only an empty folder or an earlier export (saved_model.check_export_target).
    """
    from recsys.training import checkpoint
    from recsys.runtime.safe_io import check_output_dir, refuse_overlap
    from saved_model import check_export_target
    from recsys.runtime.logger import check_log_file

    data, saved = config.data, config.checkpoints
    log_path, tensorboard_dir = config.run.log_path, config.run.tensorboard_dir
    spec_path = os.path.join(data.dataset_path, data.feature_spec) if data.dataset_path else None
    inputs = {"--dataset_path": data.dataset_path, "--feature_spec": spec_path,
              "--saved_model_input_path": saved.saved_model_input_path}
    restored = {"--restore_checkpoint_path": saved.restore_checkpoint_path}
    checkpoint_roots = restored | {"--save_checkpoint_path": saved.save_checkpoint_path}
    if log_path:  # a log may sit beside checkpoints (e.g. run1/log.json), never inside one
        refuse_overlap(log_path, "--log_path", inputs)
        for flag, root in checkpoint_roots.items():
            checkpoint.refuse_inside_checkpoints(log_path, "--log_path", root, flag)
        check_log_file(log_path, "--log_path")
    if tensorboard_dir:  # beside checkpoints like the log, never inside one or an input
        refuse_overlap(tensorboard_dir, "--tensorboard_dir", inputs)
        for flag, root in checkpoint_roots.items():
            checkpoint.refuse_inside_checkpoints(tensorboard_dir, "--tensorboard_dir", root, flag)
        check_output_dir(tensorboard_dir, "--tensorboard_dir")
    if saved.save_checkpoint_path:  # may equal the restored root: a resumed run saves next to it
        refuse_overlap(saved.save_checkpoint_path, "--save_checkpoint_path", inputs)
        check_output_dir(saved.save_checkpoint_path, "--save_checkpoint_path")
    if saved.saved_model_output_path:
        refuse_overlap(saved.saved_model_output_path, "--saved_model_output_path",
                       inputs | checkpoint_roots | {"--log_path": log_path})
        check_export_target(saved.saved_model_output_path, "--saved_model_output_path")


def _ints(values) -> list:
    return [int(v) for v in values]


def run_precision(devices: DeviceConfig) -> Precision:
    """The layers' compute dtype and the start-up line saying why (precision.choose_precision over
    --amp, --fp16, the visible GPU and this CPU's bf16 units). Valid once configure_tensorflow has
    chosen the devices."""
    import tensorflow as tf

    from recsys.runtime.precision import choose_precision, host_cpu_bf16_support

    return choose_precision(devices.amp, devices.fp16, bool(tf.config.list_logical_devices("GPU")),
                            devices.loss_scale, host_cpu_bf16_support())


def configure_tensorflow(config: JobConfig, local_rank: int) -> Precision:
    """Devices, precision policy, eager mode and determinism, before any op runs (the run shell has set
    the thread counts); returns the run's precision (decided here, once the devices are chosen)."""
    import tensorflow as tf

    devices, the_run = config.devices, config.run
    if devices.cpu:
        tf.config.set_visible_devices([], "GPU")
    else:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
            tf.config.experimental.set_memory_growth(gpus[local_rank % len(gpus)], True)
    precision = run_precision(devices)
    dtype = precision.compute_dtype
    if dtype != tf.float32:
        tf.keras.mixed_precision.set_global_policy("float16" if devices.fp16 else f"mixed_{dtype.name}")
    tf.config.run_functions_eagerly(the_run.run_eagerly)
    if the_run.tfdata_debug:
        tf.data.experimental.enable_debug_mode()
    tf.keras.utils.set_random_seed(the_run.seed)
    if the_run.deterministic:
        tf.config.experimental.enable_op_determinism()
    return precision


def synthetic_hotness(values: List[str], num_tables: int) -> List[int]:
    """--synthetic_dataset_hotness as one value per table (a single value applies to every table)."""
    hotness = _ints(values)
    return hotness * num_tables if len(hotness) == 1 else hotness


def load_feature_spec(data: DataConfig):
    """The dataset's spec, or the default spec of the synthetic-data flags."""
    from datasets import load_feature_spec as load

    def as_list(values: Optional[Tuple[int, ...]]) -> Optional[List[int]]:
        return None if values is None else list(values)

    return load(dataset_type=data.dataset_type, dataset_path=data.dataset_path, feature_spec_name=data.feature_spec,
                use_feature_spec=data.synthetic_use_feature_spec,
                num_numerical_features=data.synthetic_num_numerical_features,
                cardinalities=list(data.synthetic_cardinalities), hotness=list(data.synthetic_hotness),
                allow_external_paths=data.allow_external_data_paths,
                hugectr_cardinalities=as_list(data.hugectr_cardinalities), hugectr_dense_log=data.hugectr_dense_log,
                num_embeddings_per_feature=as_list(data.num_embeddings_per_feature))


def build_pipelines(config: JobConfig, spec, rank: int, world_size: int, reads, compute_dtype):
    """This rank's train and test pipelines, reading what `reads` (the plan's decision) says."""
    from dataloader import PipelineConfig, create_input_pipelines

    data = config.data
    return create_input_pipelines(spec, PipelineConfig(
        dataset_type=data.dataset_type, train_batch_size=data.batch_size, eval_batch_size=data.valid_batch_size,
        rank=rank, world_size=world_size, reads=reads, shuffle_batch_order=data.shuffle_batch_order,
        seed=config.run.seed, compute_dtype=compute_dtype, synthetic_train_batches=data.synthetic_train_batches,
        synthetic_eval_batches=data.synthetic_valid_batches, validate_data=data.validate_data))


def memory_budget(config: JobConfig, local_rank: int):
    """The per-rank device budget for embedding state, with what each table costs there (§2.14)."""
    import tensorflow as tf

    from recsys.runtime.devices import gpu_total_memory_bytes
    from recsys.training.optimizers import embedding_slot_count
    from recsys.sparse.sharding import MemoryBudget, table_budget_from_device

    devices = config.devices
    gpus = tf.config.list_physical_devices("GPU")
    if devices.cpu:
        device_bytes = 0
    elif devices.embedding_budget_bytes is not None:
        device_bytes = devices.embedding_budget_bytes
    else:  # the GPU configure_tensorflow gave this rank; no GPU: tables stay where the ops run
        total = gpu_total_memory_bytes(local_rank % len(gpus)) if gpus else None
        device_bytes = None if total is None else table_budget_from_device(total)
    return MemoryBudget(device_bytes=device_bytes, value_bytes=2 if devices.fp16 else 4,
                        optimizer_slots=embedding_slot_count(config.network.training.optimizer),
                        update_rows=config.data.batch_size)


def sharding_plan(config: JobConfig, spec, widths: Tuple[int, ...], rank: int, world_size: int):
    """Which rank holds which table (of `widths`, `table_widths`'), column slice or row block, and
    in which memory tier (--print_sharding_plan)."""
    from recsys.runtime import distributed as dist
    from recsys.sparse.sharding import plan_sharding
    from recsys.runtime.logger import print_rank0

    sharding = config.sharding
    plan = plan_sharding(spec.cardinalities, widths, world_size, sharding.dist_strategy,
                         sharding.column_slice_threshold, sharding.data_parallel_threshold,
                         memory_budget(config, dist.local_rank()), sharding.row_slice_threshold,
                         hotness=spec.hotness, poolings=spec.poolings)
    if sharding.print_sharding_plan:
        print_rank0(plan.describe(), rank=rank)
    return plan


def communication_plan(config: JobConfig, plan, trainer) -> str:
    """--print_sharding_plan's second part: the bytes every collective of a training step sends
    from each rank (the communication model over the plan and the built stack) and, with
    --plan_link_gbps, the predicted exchange and step times; this job's ranks per host."""
    from factory import communication_layout
    from recsys.runtime import distributed as dist
    from recsys.sparse import comm_model

    sharding = config.sharding
    layout = communication_layout(trainer, config.data.batch_size, sharding.data_parallel_input)
    network = (comm_model.Network(sharding.plan_link_gbps, dist.local_size(), sharding.plan_intra_host_gbps,
                                  sharding.plan_latency_us) if sharding.plan_link_gbps else None)
    return comm_model.describe(plan, layout, network, sharding.plan_compute_ms)


def model_options(config: JobConfig, spec, interaction_name: str, compute_dtype):
    """The stack's options from the configuration; bfloat16 needs no loss scaling (float32's exponent range)."""
    import tensorflow as tf

    from factory import ModelOptions

    devices, network = config.devices, config.network
    loss_scale = float(devices.loss_scale) if compute_dtype == tf.float16 and devices.amp else None
    return ModelOptions(
        num_numerical_features=len(spec.numerical_names), compute_dtype=compute_dtype,
        model=dataclasses.replace(network.settings, interaction=interaction_name),
        training=dataclasses.replace(network.training, loss_scale=loss_scale))


def prepare_checkpoints(config: JobConfig, state, steps_per_epoch: int, rank: int) -> str:
    """Before any training: check --restore_checkpoint_path (in train mode, that steps are left)
    and --save_checkpoint_path (checkpoint.check_save_folder, on every rank), then restore.
    Returns this run's lineage id: the restored checkpoint's, or a new one."""
    from recsys.training import checkpoint
    from recsys.runtime.logger import print_rank0

    the_run, save_path = config.run, config.checkpoints.save_checkpoint_path
    source = resume_source(config, rank)
    resumed = checkpoint.open_checkpoint(source) if source else None
    lineage = checkpoint.run_lineage(resumed)
    state.global_batch_size = config.data.batch_size  # recorded in its checkpoints: what their step counts
    if the_run.mode == "train" and resumed is not None:
        checkpoint.check_batch_size(resumed, config.data.batch_size, "--batch_size")
        checkpoint.check_resume_step(resumed, the_run.epochs * steps_per_epoch, the_run.max_steps)
    if the_run.mode == "train" and save_path:
        checkpoint.check_save_folder(save_path, state.model_config, state.feature_names, lineage,
                                     resumed, "--save_checkpoint_path")
    if resumed is not None:
        checkpoint.restore(resumed, state)
        print_rank0(f"restored {resumed.path} (step {resumed.step})", rank=rank)
    return lineage


def resume_source(config: JobConfig, rank: int) -> Optional[str]:
    """The checkpoint (or root) training starts from: with --auto_resume the save folder when it
    holds a checkpoint (its newest is this run's own lineage: check_save_folder keeps other runs'
    out of it), else --restore_checkpoint_path."""
    from recsys.training import checkpoint
    from recsys.runtime.logger import print_rank0

    saved = config.checkpoints
    if saved.auto_resume and config.run.mode == "train" and checkpoint.list_checkpoints(saved.save_checkpoint_path):
        print_rank0(f"--auto_resume: resuming from the newest checkpoint in --save_checkpoint_path "
                    f"{saved.save_checkpoint_path}", rank=rank)
        return saved.save_checkpoint_path
    return saved.restore_checkpoint_path


def save_folder(config: JobConfig) -> Tuple[Optional[str], str]:
    """The folder this run saves checkpoints into, held for its lifetime (run_shell), and its flag:
    --save_checkpoint_path in --mode train, else none."""
    if config.run.mode != "train" or not config.checkpoints.save_checkpoint_path:
        return None, "--save_checkpoint_path"
    return config.checkpoints.save_checkpoint_path, "--save_checkpoint_path"


def log_parameters(logger, parameters: Dict[str, Any], world_size: int, lineage: str) -> None:
    """The run's flags (`JobConfig.parameters`) and its history (run_record.RUN_KEY: the checkpoint
    lineage) as the log's first record, written once the inputs have been read."""
    from recsys.runtime.run_record import RUN_KEY

    logger.log_parameters(parameters | {"world_size": world_size, RUN_KEY: lineage})


def inference_batches(max_steps: int, available: int, valid_batch_size: int) -> int:
    """Batches `--mode inference` runs: --max_steps (1000 when -1), at most the test data's batches.

    Latencies are timed after the warm-up batches, so a run no longer than the warm-up is refused
    instead of reporting NaN.
    """
    batches = min(max_steps if max_steps >= 0 else 1000, available)
    if batches <= INFERENCE_WARMUP_BATCHES:
        raise UsageError(f"--mode inference times the batches after {INFERENCE_WARMUP_BATCHES} warm-up batches but "
                         f"would run only {batches}: --max_steps {max_steps}, and the test data has {available} "
                         f"batches of --valid_batch_size {valid_batch_size}")
    return batches


@dataclass
class Job:
    """What a mode runs with, once the inputs are checked and the weights are in place."""
    config: JobConfig
    rank: int
    logger: DllLogger
    pipelines: InputPipelines
    evaluator: Evaluator
    inference_batches: Optional[int] = None
    trainer: Optional[Trainer] = None  # None when the weights come from --saved_model_input_path
    state: Optional[TrainingState] = None
    lineage: str = ""
    features: Optional[ServedFeatures] = None  # the dataset's, recorded in an export


def prepare_job(config: JobConfig, rank: int, world_size: int, logger, precision: Precision) -> Job:
    """Spec, plan, pipelines and weights (built and restored, or a SavedModel), in that order, so
    that every input is checked before anything is written; layers compute in `precision`."""
    import saved_model
    from factory import build_trainer
    from recsys.training.trainer import Evaluator
    from recsys.runtime.logger import print_rank0

    network, saved_model_input_path = config.network, config.checkpoints.saved_model_input_path
    auc_thresholds = config.run.auc_thresholds
    print_rank0(f"precision: as exported in {saved_model_input_path} (its graph fixes it)"
                if saved_model_input_path else precision.message, rank=rank)
    dtype = precision.compute_dtype
    spec = load_feature_spec(config.data)
    check_preset_dataset(network.preset, spec.hotness, spec.cardinalities, spec.categorical_names)
    widths = table_widths(embedding_dims(network.embedding_dim), len(spec.cardinalities),  # before any plan
                          cross=network.settings.interaction == "cross",
                          bottom_mlp_width=network.settings.bottom_mlp_dims[-1])
    features = saved_model.ServedFeatures(spec.numerical_names, spec.categorical_names, spec.hotness)
    if saved_model_input_path:  # an export made for other features is refused before any batch
        predict = saved_model.load_predict_fn(saved_model_input_path, features)
        pipelines = build_pipelines(config, spec, rank, world_size, None, dtype)
        return Job(config, rank, logger, pipelines, inference_batches=_inference_batches(config, pipelines),
                   evaluator=Evaluator(predict, auc_thresholds))
    interaction_name = chosen_interaction(network, rank)
    plan = sharding_plan(config, spec, widths, rank, world_size)
    reads = plan.reads(rank, config.sharding.data_parallel_input)
    pipelines = build_pipelines(config, spec, rank, world_size, reads, dtype)
    if pipelines.teacher_auc is not None:
        print_rank0(f"synthetic data: teacher AUC {pipelines.teacher_auc:.5f}", rank=rank)
    batches = _inference_batches(config, pipelines)
    trainer = build_trainer(plan, rank, reads, model_options(config, spec, interaction_name, dtype))
    if config.sharding.print_sharding_plan:
        print_rank0(communication_plan(config, plan, trainer), rank=rank)
    placement = trainer.model.embedding.placement()
    counts = ", ".join(f"{placement.count(kind)} {kind}" for kind in ("device", "cpu", "replicated", "remote")
                       if placement.count(kind))
    print_rank0(f"embedding tables on rank {rank}: {counts}", rank=rank)
    state = trainer.training_state(spec.categorical_names, network.training.optimizer)
    lineage = prepare_checkpoints(config, state, pipelines.train_steps, rank)
    return Job(config, rank, logger, pipelines, Evaluator.for_model(trainer.model, auc_thresholds), batches,
               trainer, state, lineage, features)


def chosen_interaction(network: NetworkConfig, rank: int) -> str:
    """The cross network, or the dot implementation that --dot_interaction (or V5 --interaction)
    names, resolved once. dlrm.py's default dot_custom_cuda runs the fastest dot there is when no
    GPU is visible, saying so; asked for on the command line, it needs a GPU."""
    import interaction
    from recsys.runtime.logger import print_rank0

    settings = network.settings
    if settings.interaction == "cross":
        print_rank0(f"interaction: DCNv2 cross network, {settings.num_cross_layers} layers, projection "
                    f"{settings.cross_layer_projection_dim or 'full rank'}", rank=rank)
        return "cross"
    requested = settings.interaction
    fallback = network.dot_falls_back and interaction.visible_gpu() is None
    name = interaction.resolve_interaction_name("auto" if fallback else requested)
    how = (" (auto)" if requested == "auto" else
           " (--interaction dot_custom_cuda needs a GPU and none is visible)" if fallback else "")
    print_rank0(f"dot interaction: {name}{how}", rank=rank)
    return name


def announce_accepted_flags(config: JobConfig, rank: int, world_size: int) -> None:
    """One line for each flag of another version given on the command line: what it means here; and
    for a table layout flag given on several ranks, where the hybrid-parallel layer's slices decide."""
    from recsys.runtime.logger import print_rank0

    for name in config.accepted_flags_given:
        _, version, meaning = ACCEPTED_FLAGS[name]
        print_rank0(f"--{name} ({version}): {meaning}", rank=rank)
    for name, value in config.layout_flags_given if world_size > 1 else ():
        print_rank0(f"--{name} {value}: on {world_size} ranks each rank keeps its slices of the "
                    "tables (the sharding plan) as one variable each; the layout flags apply to one process",
                    rank=rank)


def announce_sok_aliases(rank: int) -> None:
    """Apply the SOK benchmark's flags (apply_sok_aliases) and say what each became, one line each."""
    from interaction import visible_gpu
    from recsys.runtime.logger import print_rank0

    for line in apply_sok_aliases(FLAGS, gpu_visible=not FLAGS.cpu and visible_gpu() is not None):
        print_rank0(line, rank=rank)


def _inference_batches(config: JobConfig, pipelines) -> Optional[int]:
    if config.run.mode != "inference":
        return None
    return inference_batches(config.run.max_steps, pipelines.eval_steps, config.data.valid_batch_size)


def announce_evaluations(evals_per_epoch: int, steps_per_epoch: int, rank: int) -> None:
    """Say so when an epoch is too short for --evals_per_epoch distinct evaluation points."""
    from recsys.training.trainer import eval_points
    from recsys.runtime.logger import print_rank0

    points = len(eval_points(steps_per_epoch, evals_per_epoch))
    if points < evals_per_epoch:
        print_rank0(f"--evals_per_epoch {evals_per_epoch}: an epoch has only {steps_per_epoch} steps, so "
                    f"{points} evaluation(s) run per epoch", rank=rank)


def run_train(job: Job) -> int:
    """--mode train: the epochs, periodic evaluations and checkpoints, then the final record.
    A stop signal ends training after the current step with a checkpoint (stop_signals); the
    exit code is then the signal's."""
    from recsys.training import checkpoint
    from recsys.runtime import distributed as dist
    import saved_model
    from recsys.runtime.stop_signals import STOP
    from recsys.runtime.tensorboard_log import TensorBoardScalars
    from recsys.training.trainer import LoopConfig, train_loop
    from recsys.runtime.logger import print_rank0

    the_run, saved = job.config.run, job.config.checkpoints
    if the_run.max_steps == 0:  # validate_flags allows it only to save the initial weights
        print_rank0("--max_steps 0: no training step runs; the checkpoint holds the initial weights", rank=job.rank)
    announce_evaluations(the_run.evals_per_epoch, job.pipelines.train_steps, job.rank)
    saved_steps = []

    def save(step: int) -> None:
        saved_steps.append(step)
        path = checkpoint.save(saved.save_checkpoint_path, step, job.state, job.lineage, keep=saved.keep_checkpoints,
                               writer=job.rank == 0)
        dist.barrier()
        print_rank0(f"checkpoint saved: {path}", rank=job.rank)

    tensorboard = TensorBoardScalars(the_run.tensorboard_dir) if the_run.tensorboard_dir and job.rank == 0 else None

    def record_scalars(step: int, group: str, scalars: Dict[str, float]) -> None:
        job.logger.log(step=step, data=scalars, echo=False)  # the progress line has shown them
        if tensorboard:
            tensorboard.write(step, group, scalars)

    loop_config = LoopConfig(
        epochs=the_run.epochs, steps_per_epoch=job.pipelines.train_steps, global_batch_size=job.config.data.batch_size,
        max_steps=the_run.max_steps, evals_per_epoch=the_run.evals_per_epoch, print_freq=the_run.print_freq,
        checkpoint_every_n_steps=saved.checkpoint_every_n_steps, profiler_start_step=the_run.profiler_start_step,
        profile_this_rank=job.rank == the_run.profiled_rank, evaluate_at_end=the_run.eval_in_last,
        target_auc=the_run.target_auc)
    STOP.graceful = True  # from here a signal finishes the step and saves (train_loop, below)
    try:
        result = train_loop(job.trainer, job.evaluator, job.pipelines.train, job.pipelines.test, loop_config,
                            save_checkpoint=save if saved.save_checkpoint_path else None,
                            record_scalars=record_scalars, stop=STOP)
    finally:
        if tensorboard:
            tensorboard.close()
    if saved.save_checkpoint_path and result.steps not in saved_steps:
        save(result.steps)
    if result.stopped_by is not None:
        return stopped_early(result, loop_config, job)
    if saved.saved_model_output_path:  # single process only (validate_flags)
        exported = saved_model.export(job.trainer.model, saved.saved_model_output_path, features=job.features)
        print(f"SavedModel exported to: {exported}", flush=True)
    utils.log_final(job.logger, final_record(result, job))
    return 0


def final_record(result, job: Job) -> Dict[str, Any]:
    """The final log record of a training run: speed, the best evaluation, the last loss."""
    from recsys.runtime.logger import print_rank0

    the_run = job.config.run
    mean_step = result.mean_step_time_s
    record = {"throughput": float("nan") if math.isnan(mean_step) else job.config.data.batch_size / mean_step,
              "mean_step_time_ms": mean_step * 1000}
    if result.evaluations:
        record |= {"auc": result.best_auc, "validation_loss": result.min_validation_loss}
    else:
        print_rank0(f"no evaluation ran before training ended (--max_steps {the_run.max_steps}, --evals_per_epoch "
                    f"{the_run.evals_per_epoch}): the final record has no auc or validation_loss", rank=job.rank)
    record |= {"train_loss": result.train_loss, "evaluations": len(result.evaluations)}
    if result.target_reached_at is not None:
        record |= {"target_auc": the_run.target_auc, "target_auc_step": result.target_reached_at}
    teacher_auc = job.pipelines.teacher_auc
    return record | ({"teacher_auc": teacher_auc} if teacher_auc is not None else {})


def stopped_early(result, loop_config, job: Job) -> int:
    """After a stop signal: say where training stopped, what was saved and how to resume; every
    rank then leaves together (a rank's early exit would make the launcher kill the others)."""
    from recsys.runtime import distributed as dist
    from recsys.runtime.cli import signal_exit_code
    from recsys.runtime.stop_signals import signal_name
    from recsys.runtime.logger import print_rank0

    rank, save_path = job.rank, job.config.checkpoints.save_checkpoint_path
    job.logger.log(step=(), data={"stopped_by": signal_name(result.stopped_by), "steps": result.steps}, echo=False)
    where = f"stopped by {signal_name(result.stopped_by)} after step {result.steps} of {loop_config.total_steps}"
    if save_path:
        print_rank0(f"{where}; checkpoint saved in {save_path}. To resume, run the same command "
                    f"with --restore_checkpoint_path {save_path} (or add --auto_resume)", rank=rank)
    else:
        print_rank0(f"{where}; nothing was saved (no --save_checkpoint_path)", rank=rank)
    dist.barrier()
    return signal_exit_code(result.stopped_by)


def run_eval(job: Job) -> None:
    """--mode eval: one pass over the test data; `test_loss` is the log loss beside which the
    normalized entropy and the calibration stand (recsys.runtime.metrics.quality_metrics). A stop
    signal ends it at the next batch (StopNow: one line, exit 128+N), never inside a TensorFlow op."""
    from recsys.runtime.stop_signals import STOP

    with STOP.deferred() as stop_if_signalled:
        result = job.evaluator.evaluate(job.pipelines.test, between_batches=stop_if_signalled)
    utils.log_final(job.logger, {"auc": result.auc, "test_loss": result.loss,
                                 "normalized_entropy": result.normalized_entropy, "calibration": result.calibration})


def run_inference(job: Job) -> None:
    """--mode inference: per-batch latencies over the batches `inference_batches` allows; a stop
    signal ends it at the next batch, as in run_eval."""
    from recsys.runtime.stop_signals import STOP
    from recsys.training.trainer import percentiles

    with STOP.deferred() as stop_if_signalled:
        latencies, result = job.evaluator.benchmark_inference(job.pipelines.test, job.inference_batches,
                                                              warmup_batches=INFERENCE_WARMUP_BATCHES,
                                                              between_batches=stop_if_signalled)
    stats = percentiles(latencies)
    utils.log_final(job.logger, {"mean_inference_throughput": job.config.data.valid_batch_size / stats["mean"],
                           "mean_inference_latency": stats["mean"], "p50_inference_latency": stats["p50"],
                           "p90_inference_latency": stats["p90"], "p95_inference_latency": stats["p95"],
                           "p99_inference_latency": stats["p99"], "auc": result.auc,
                           "measured_batches": len(latencies)})


def run_deploy(job: Job) -> None:
    """--mode deploy: export the restored weights as a SavedModel."""
    import saved_model
    from recsys.runtime.logger import print_rank0

    exported = saved_model.export(job.trainer.model, job.config.checkpoints.saved_model_output_path,
                                  fp16=job.config.devices.fp16, features=job.features)
    print_rank0(f"deployed to: {exported}", rank=job.rank)


MODES: Dict[str, Callable[[Job], Optional[int]]] = {"train": run_train, "eval": run_eval, "inference": run_inference,
                                           "deploy": run_deploy}


def run_mode(config: JobConfig, rank: int, world_size: int, logger, precision: Precision) -> int:
    """Prepare the job, check its run record (run_record), log its parameters, then run --mode; returns
    the exit code."""
    from recsys.runtime import run_record

    the_run = config.run
    announce_accepted_flags(config, rank, world_size)
    job = prepare_job(config, rank, world_size, logger, precision)
    # the default --log_path (one file in the working folder) takes runs in turn, each one's records
    # after its PARAMETER record; one given, as the TensorBoard folder, is this run's history's only
    run_record.check_run_record(rank, the_run.log_path, "--log_path", job.lineage or None,
                                [("--tensorboard_dir", the_run.tensorboard_dir)],
                                "choose another --log_path and --tensorboard_dir (or move the files away), or "
                                "resume that run from its checkpoint", not the_run.log_path_given)
    log_parameters(logger, config.parameters, world_size, job.lineage)
    return MODES[the_run.mode](job) or 0


def user_error_types() -> tuple:
    """Exceptions caused by bad input: reported as one line and a non-zero exit, not a traceback."""
    from recsys.training.checkpoint import CheckpointError
    from recsys.data.feature_spec import FeatureSpecError
    from recsys.runtime.folder_lock import FolderLockedError
    from interaction import InteractionUnavailableError
    from recsys.training.trainer import NonFiniteLossError

    return (UsageError, FeatureSpecError, CheckpointError, InteractionUnavailableError, NonFiniteLossError,
            FolderLockedError, ValueError, FileNotFoundError)


def run(argv) -> int:
    """The whole run inside the run shell (recsys/runtime/run_shell.py); returns the exit code (docs/dlrm.md,
    Exit codes)."""
    from recsys.runtime import run_shell

    del argv
    if FLAGS.xla:  # before the first TensorFlow import (in the shell)
        os.environ["TF_XLA_FLAGS"] = ("--tf_xla_auto_jit=fusible" + (" --tf_xla_cpu_global_jit" if FLAGS.cpu else "")
                                      + " " + os.environ.get("TF_XLA_FLAGS", "")).strip()
    return run_shell.run(run_shell.ShellConfig(log_path=FLAGS.log_path, user_errors=user_error_types,
                                               inter_op_threads=FLAGS.inter_op_parallelism,
                                               intra_op_threads=FLAGS.intra_op_parallelism, cpu=FLAGS.cpu,
                                               affinity=FLAGS.affinity), run_job)


def run_job(session) -> int:
    """The flags applied, checked and read into the run's configuration (config_from_flags: from
    here on nothing reads FLAGS), the outputs claimed (run_shell.Session), then --mode."""
    rank, world_size = session.rank, session.world_size
    apply_preset(FLAGS)
    announce_sok_aliases(rank)
    validate_flags(FLAGS, world_size)
    config = config_from_flags(FLAGS)
    precision = configure_tensorflow(config, session.local_rank)
    session.claim_outputs(lambda: check_output_paths(config), *save_folder(config))
    return run_mode(config, rank, world_size, session.logger, precision)


# --help's sections: V5's entry points define the model's flags and main.py the common ones; the
# common ones are cut further by topic. A flag not listed here is shown under "Other flags".
FLAG_GROUPS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("Model and optimizer (V5: the flags dlrm.py and dcnv2.py define)", (
        "batch_size", "valid_batch_size", "embedding_dim", "bottom_mlp_dims", "top_mlp_dims", "interaction",
        "dot_interaction", "num_cross_layers", "cross_layer_projection_dim", "optimizer", "learning_rate", "beta1",
        "beta2", "warmup_steps", "decay_start_step", "decay_steps", "preset")),
    ("Run: mode, length, evaluation, logging", (
        "mode", "epochs", "max_steps", "evals_per_epoch", "target_auc", "auc_thresholds", "print_freq", "log_path",
        "tensorboard_dir", "seed", "deterministic", "run_eagerly", "tfdata_debug", "profiler_start_step",
        "profiled_rank")),
    ("Checkpoints and SavedModel", (
        "save_checkpoint_path", "restore_checkpoint_path", "auto_resume", "checkpoint_every_n_steps",
        "keep_checkpoints", "saved_model_output_path", "saved_model_input_path", "save_input_signature")),
    ("Precision, devices and threads", (
        "amp", "fp16", "loss_scale", "xla", "cpu", "tf_gpu_memory_limit_gb", "cpu_offloading_threshold_gb",
        "inter_op_parallelism", "intra_op_parallelism", "affinity")),
    ("Embeddings and parallelism", (
        "embedding_trainable", "embedding_zeros_initializer", "gpu_embedding_type", "cpu_embedding_type",
        "dist_strategy", "column_slice_threshold", "row_slice_threshold", "data_parallel_threshold",
        "data_parallel_input", "print_sharding_plan", "plan_link_gbps", "plan_intra_host_gbps", "plan_latency_us",
        "plan_compute_ms", "fp16_allreduce", "pipeline_input", "micro_batches")),
    ("Dataset", (
        "dataset_path", "feature_spec", "dataset_type", "allow_external_data_paths", "validate_data",
        "shuffle_batch_order", "hugectr_cardinalities", "hugectr_dense_log", "num_embeddings_per_feature",
        "synthetic_dataset_use_feature_spec", "synthetic_dataset_train_batches", "synthetic_dataset_valid_batches",
        "synthetic_dataset_cardinalities", "synthetic_dataset_hotness", "synthetic_dataset_num_numerical_features")),
    ("The SOK DLRM benchmark's flags (each says at start-up what it became)", (
        "data_dir", "global_batch_size", "custom_interact", "eval_in_last", "early_stop",
        *(name for name, (_, version, _) in ACCEPTED_FLAGS.items() if version == "SOK"))),
    ("Flags of other versions, accepted (each says at start-up what it means here)",
     tuple(name for name, (_, version, _) in ACCEPTED_FLAGS.items() if version != "SOK")),
)
HELP_ARGUMENTS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")


def project_flags() -> List[Any]:
    """Every flag this project defines (main.py's; absl's own logging and debugging flags excluded)."""
    module = FLAGS.find_module_defining_flag("mode")
    return list(FLAGS.flags_by_module_dict()[module])


def help_text(doc: str) -> str:
    """--help: `doc`, then every project flag in FLAG_GROUPS' sections (the rest under "Other flags")."""
    by_name = {flag.name: flag for flag in project_flags()}
    listed = {name for _, names in FLAG_GROUPS for name in names}
    groups = [(title, [name for name in names if name in by_name]) for title, names in FLAG_GROUPS]
    groups.append(("Other flags", sorted(set(by_name) - listed)))
    sections = [f"{title}:\n" + "\n".join(utils.describe_flag(by_name[name]) for name in names)
                for title, names in groups if names]
    return "\n\n".join([doc.strip(), *sections, "absl's own flags (logging, debugging): --helpfull"]) + "\n"


def parse_flags_or_help(argv: List[str]) -> List[str]:
    """absl's flag parsing, except that --help (or -h) prints every flag grouped (help_text) and exits 0."""
    options = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    if any(arg in HELP_ARGUMENTS for arg in options):
        print(help_text(sys.modules["__main__"].__doc__ or ""), end="")
        sys.exit(0)
    return app.parse_flags_with_usage(argv)


# V5's defaults shared by dlrm.py and dcnv2.py where they differ from main.py's (V3/V4) ones.
# V5's synthetic hotness is 26 x 20; one value here applies to every table (the same at 26 tables).
V5_DEFAULTS = {"loss_scale": 65536, "column_slice_threshold": 5 * 10**9, "row_slice_threshold": 10 * 10**9,
               "synthetic_dataset_hotness": ["20"], "print_freq": 100}


def main(defaults: Optional[Dict[str, Any]] = None) -> None:
    """Parse the flags, with `defaults` over main.py's own (dlrm.py and dcnv2.py give V5's), and run."""
    for name, value in (defaults or {}).items():
        FLAGS.set_default(name, value)
    app.run(lambda argv: sys.exit(run(argv)), flags_parser=parse_flags_or_help)


if __name__ == "__main__":
    main()

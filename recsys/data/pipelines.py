"""How one rank reads its batches (`PipelineConfig`), the plain values every training format's
pipelines are built from (root `dataloader.create_input_pipelines`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tensorflow as tf

from recsys.data.batch import TableReads

DEFAULT_TRAIN_BATCHES = 64008  # batches of --dataset_type synthetic, and of a transcribed synthetic source
DEFAULT_EVAL_BATCHES = 1350


@dataclass(frozen=True)
class PipelineConfig:
    """How one rank reads its batches: plain values (main.py fills them from its flags).

    Batch sizes are global. `reads` says which categorical features this rank reads and for which
    rows (`ShardingPlan.reads`; None: every feature, local rows). `validate_data` reads every file
    once up front to check its values (not for synthetic data); `check_values` checks each batch as it is read
    (on by default; off only to measure its cost). The synthetic lengths are in batches.
    """
    dataset_type: str = "tf_raw"
    train_batch_size: int = 65536
    eval_batch_size: int = 65536
    rank: int = 0
    world_size: int = 1
    reads: Optional[TableReads] = None
    shuffle_batch_order: bool = False
    seed: int = 12345
    compute_dtype: tf.DType = tf.float32
    synthetic_train_batches: int = DEFAULT_TRAIN_BATCHES
    synthetic_eval_batches: int = DEFAULT_EVAL_BATCHES
    validate_data: bool = False
    check_values: bool = True

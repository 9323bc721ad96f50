"""The batch contract every layer shares: the element's keys and which rows of a global batch a rank owns.

An input element is `(features, labels)` with `features = {NUMERICAL_KEY: [local_b, n_num],
CATEGORICAL_KEY: tuple of int ids, one [b] tensor per feature}`. Rank r of W owns rows
[(r*B)//W, ((r+1)*B)//W) of a global batch of B samples: the loaders cut numericals and labels
by it, the hybrid embedding layer cuts looked-up rows by it, and the benchmarks size batches by it.
"""
from __future__ import annotations

from typing import Any, List, Tuple

NUMERICAL_KEY = "numerical_features"
CATEGORICAL_KEY = "categorical_features"


def rank_start(rank: Any, global_batch: Any, world_size: int) -> Any:
    """First row of `rank`'s local batch (`rank == world_size`: the end of the batch).

    The one formula; `global_batch` (and `rank`) may be Python ints or int32 tensors.
    """
    return (rank * global_batch) // world_size


def local_slice(global_batch: int, rank: int, world_size: int) -> Tuple[int, int]:
    """Rows [lo, hi) of a global batch that `rank` owns."""
    return rank_start(rank, global_batch, world_size), rank_start(rank + 1, global_batch, world_size)


def local_sizes(global_batch: int, world_size: int) -> List[int]:
    """The local batch size of every rank."""
    return [hi - lo for lo, hi in (local_slice(global_batch, r, world_size) for r in range(world_size))]

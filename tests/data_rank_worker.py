"""Runs on every rank under horovodrun: builds this rank's input pipelines and saves what it read.

Usage: data_rank_worker.py DATASET_DIR OUTPUT_DIR TRAIN_BATCH EVAL_BATCH
For the data-parallel and the model-parallel input (rank r owns categorical features i with
i % world_size == r), saves one .npz per (mode, split) with every batch's arrays concatenated.
"""
import os
import sys
from typing import Dict, List

import numpy as np

import dataloader
import datasets
from recsys.runtime import distributed as dist
from recsys.data.batch import TableReads


def open_pipelines(dataset_path=None, *, spec=None, owned=None, **config) -> dataloader.InputPipelines:
    """The pipelines of the spec in `dataset_path` (or of `spec`), with `PipelineConfig(**config)`;
    `owned`: read the global batch of only those categorical features (model-parallel input)."""
    spec = spec or datasets.load_feature_spec(dataset_path=dataset_path)
    reads = None if owned is None else TableReads(tuple(owned), global_batch=True)
    return dataloader.create_input_pipelines(spec, dataloader.PipelineConfig(reads=reads, **config))


def collect_epoch(dataset) -> Dict[str, np.ndarray]:
    """One epoch of (features, labels), each component concatenated over the batches."""
    parts: Dict[str, List[np.ndarray]] = {}
    for features, labels in dataset:
        arrays = {"numerical": features["numerical_features"].numpy(), "labels": labels.numpy()}
        for i, ids in enumerate(features["categorical_features"]):
            arrays[f"categorical_{i}"] = ids.numpy()
        for name, array in arrays.items():
            parts.setdefault(name, []).append(array)
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def main(dataset_dir: str, output_dir: str, train_batch: int, eval_batch: int) -> None:
    dist.init()
    rank, size = dist.rank(), dist.size()
    num_categorical = 4
    for mode, owned in (("data_parallel", None),
                        ("model_parallel", [i for i in range(num_categorical) if i % size == rank])):
        pipelines = open_pipelines(dataset_dir, owned=owned, train_batch_size=train_batch,
                                   eval_batch_size=eval_batch, rank=rank, world_size=size)
        for split, dataset in (("train", pipelines.train), ("test", pipelines.test)):
            np.savez(os.path.join(output_dir, f"{mode}_{split}_rank{rank}.npz"),
                     **collect_epoch(dataset))
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

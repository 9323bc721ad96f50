"""A toy dataset format, whole in this one module, to show what adding a format takes: importing it
registers `toy_npy` (`data_formats.register_format`), after which the loader trains on it and
`dataloading.transcribe` lists and reads it; nothing else in the repository names it.

Layout: `cardinalities.json` (a list, one per table) and, per mapping, `<mapping>_labels.npy`
(bool [n]), `<mapping>_numerical.npy` (float16 [n, k]) and `<mapping>_ids.npy` (int32 [n, tables]).
"""
import json
import os
from typing import Any, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from recsys.data.batch import TableReads
from recsys.data.batch_reader import BatchReader
from recsys.data.data_errors import DataError, check_ids, check_labels, check_numericals, unsigned_cardinalities
from recsys.data.data_formats import register_format
from recsys.data.feature_spec import FeatureSpec

CARDINALITIES_FILE = "cardinalities.json"


def write_toy(folder: str, cardinalities: List[int], splits: Mapping[str, Tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """Write a toy dataset: {mapping: (labels [n] bool, numerical [n, k] float16, ids [n, tables] int32)}."""
    os.makedirs(folder)
    with open(os.path.join(folder, CARDINALITIES_FILE), "w") as f:
        json.dump(cardinalities, f)
    for mapping, arrays in splits.items():
        for part, array in zip(("labels", "numerical", "ids"), arrays):
            np.save(os.path.join(folder, f"{mapping}_{part}.npy"), array)


def load_spec(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    with open(os.path.join(dataset_path, CARDINALITIES_FILE)) as f:
        cardinalities = json.load(f)
    numerical = np.load(os.path.join(dataset_path, "train_numerical.npy"), mmap_mode="r")
    spec = FeatureSpec.get_default_feature_spec(numerical.shape[1], cardinalities, os.path.abspath(dataset_path))
    spec.source_spec = None  # no split-binary files: the reader below knows the layout
    return spec


class ToyReader(BatchReader):
    """The rows a rank needs, copied out of memory-mapped arrays and checked as every reader checks them."""

    def __init__(self, spec: FeatureSpec, mapping: str, global_batch_size: int, *, rank: int = 0,
                 world_size: int = 1, reads: Optional[TableReads] = None, drop_remainder: bool = True,
                 numerical_dtype: tf.DType = tf.float32, check_values: bool = True):
        reads = reads or TableReads.every_table(len(spec.categorical_names))
        self._paths = [os.path.join(spec.base_directory, f"{mapping}_{part}.npy") for part in ("labels", "numerical", "ids")]
        self._labels, self._numerical, self._ids = (np.load(path, mmap_mode="r") for path in self._paths)
        self._spec, self._mapping, self._tables, self._check = spec, mapping, list(reads.tables), check_values
        groups = [(np.dtype(np.int32), list(range(len(self._tables))))] if self._tables else []
        super().__init__(len(self._labels), global_batch_size, rank=rank, world_size=world_size, reads=reads,
                         drop_remainder=drop_remainder, numerical_dtype=numerical_dtype,
                         categorical_features=[spec.categorical_names[i] for i in self._tables],
                         num_numerical=self._numerical.shape[1], groups=groups)

    def _read(self, batch_index: int) -> Tuple[List[np.ndarray], Optional[DataError]]:
        first, rows, id_first, id_rows = self.rank_rows(batch_index)
        labels = np.array(self._labels[first:first + rows])
        numerical = np.array(self._numerical[first:first + rows])
        arrays = [labels, numerical]
        if self._tables:
            arrays.append(np.ascontiguousarray(self._ids[id_first:id_first + id_rows, self._tables].T))
        if not self._check:
            return arrays, None
        try:
            check_labels(labels, self._paths[0], self._spec.label_name, self._mapping, first)
            check_numericals(numerical, self._paths[1], self._spec.numerical_names, self._mapping, first)
            if self._tables:
                cardinalities = [self._spec.cardinalities[i] for i in self._tables]
                check_ids(arrays[2], unsigned_cardinalities(cardinalities, np.int32), [self._paths[2]] * len(self._tables),
                          self.categorical_features, self._mapping, id_first)
        except DataError as error:
            return arrays, error
        return arrays, None


register_format("toy_npy", training=True, source=True, load_spec=load_spec, reader=ToyReader)

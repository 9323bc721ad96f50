"""One request's inputs checked against the serving contract before the model sees them; numpy only.

Every problem is one `RequestError` line naming the input (and, for ids, the feature and column) and
what was expected: a missing or unknown input, a wrong dtype or shape, inputs of different batch
sizes, NaN or inf numericals, an id outside its table (or -1 where the feature is one-hot). The
server answers it as HTTP 400 / gRPC INVALID_ARGUMENT and goes on serving.
"""
from __future__ import annotations

from typing import Dict, Mapping

import numpy as np

from deployment.contract import CATEGORICAL_INPUT, NUMERICAL_INPUT, ServingContract


class RequestError(ValueError):
    """A request that breaks the contract; its message is the one line the client gets."""


class RequestChecker:
    """Checks requests against one contract; the per-column id bounds are computed once."""

    def __init__(self, contract: ServingContract) -> None:
        self.contract = contract
        self._column_feature = contract.column_features()
        cardinality = np.array([f.cardinality for f in contract.categorical], dtype=np.int64)
        multi_hot = np.array([f.hotness > 1 for f in contract.categorical], dtype=bool)
        self._high = cardinality[self._column_feature]
        self._low = np.where(multi_hot[self._column_feature], contract.pad_id, 0)

    def check(self, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """`inputs` as the model's feed when they keep the contract, else RequestError (one line)."""
        specs = self.contract.inputs
        for spec in specs:
            if spec.name not in inputs:
                raise RequestError(f"input '{spec.name}' is missing: expected {spec.dtype} {list(spec.shape)}")
        unknown = sorted(set(inputs) - {spec.name for spec in specs})
        if unknown:
            raise RequestError(f"input '{unknown[0]}' is not an input of this model: expected only "
                               f"{[spec.name for spec in specs]}")
        batch = None
        for spec in specs:
            array = np.asarray(inputs[spec.name])
            if array.dtype != np.dtype(spec.dtype):
                raise RequestError(f"input '{spec.name}' has dtype {array.dtype}: expected {spec.dtype}")
            if array.ndim != 2 or array.shape[1] != spec.width:
                raise RequestError(f"input '{spec.name}' has shape {list(array.shape)}: expected "
                                   f"[batch, {spec.width}]")
            if batch is not None and array.shape[0] != batch:
                raise RequestError(f"input '{spec.name}' has {array.shape[0]} rows: expected {batch}, as "
                                   f"'{specs[0].name}'")
            batch = array.shape[0]
        self._check_numericals(np.asarray(inputs[NUMERICAL_INPUT]))
        self._check_ids(np.asarray(inputs[CATEGORICAL_INPUT]))
        return {spec.name: np.asarray(inputs[spec.name]) for spec in specs}

    def _check_numericals(self, numerical: np.ndarray) -> None:
        bad = ~np.isfinite(numerical)
        if bad.any():
            row, column = (int(i) for i in np.argwhere(bad)[0])
            raise RequestError(f"input '{NUMERICAL_INPUT}' has {numerical[row, column]} at row {row}, column {column} "
                               f"({self.contract.numerical_names[column]!r}): expected finite values")

    def _check_ids(self, ids: np.ndarray) -> None:
        bad = (ids < self._low) | (ids >= self._high)
        if not bad.any():
            return
        row, column = (int(i) for i in np.argwhere(bad)[0])
        feature = self.contract.categorical[self._column_feature[column]]
        allowed = f"0 <= id < {feature.cardinality}"
        if feature.hotness > 1:
            allowed = f"{self.contract.pad_id} (padding) or {allowed}"
        raise RequestError(f"input '{CATEGORICAL_INPUT}' has id {ids[row, column]} at row {row}, column {column} "
                           f"(feature {feature.name!r}): expected {allowed}")

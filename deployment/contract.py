"""An export folder's `serving.json` (the serving contract of issue 41), read and checked; numpy only.

The contract names the ONNX file, the two inputs (numerical float32 `[B, n_num]`, categorical int32
`[B, sum of hotness]`), the output (`probabilities` float32 `[B, 1]`) and each categorical feature's
cardinality and hotness, from which the serving side checks every request's values
(`deployment.requests`). `ServingContract.mismatch` tells whether a newer export can replace a served
one: same inputs, outputs, numerical names and features (a new version of the same model).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

CONTRACT_FILE = "serving.json"
FORMAT = "dlrm-tf2-serving"
FORMAT_VERSION = 1
MODELS = ("dlrm", "dcnv2", "wide_and_deep")
TABLE_DTYPES = ("float32", "int8")
NUMERICAL_INPUT = "numerical_features"
CATEGORICAL_INPUT = "categorical_features"
OUTPUT = "probabilities"
# max |ONNX Runtime - TensorFlow| of a probability with float32 tables (the export's check), and
# max |served - in-process| (deployment.score)
PROBABILITY_TOLERANCE = 1e-5
# The one layout of the contract: the name, dtype and trailing width of each input and the output.
EXPECTED_INPUTS = ((NUMERICAL_INPUT, "float32"), (CATEGORICAL_INPUT, "int32"))
EXPECTED_OUTPUTS = ((OUTPUT, "float32"),)


class ContractError(ValueError):
    """A serving.json that breaks the contract; the message is one line naming the file and key."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, numpy dtype name and shape (`-1` for the batch dimension)."""
    name: str
    dtype: str
    shape: Tuple[int, ...]

    @property
    def width(self) -> int:
        """The trailing dimension (the one a request must match)."""
        return self.shape[-1]


@dataclass(frozen=True)
class CategoricalFeature:
    """A categorical feature: valid ids are 0 <= id < cardinality; it owns `hotness` columns."""
    name: str
    cardinality: int
    hotness: int


@dataclass(frozen=True)
class ServingContract:
    """A parsed, checked serving.json; `folder` is the export folder it came from."""
    folder: Path
    model: str
    onnx: str
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    numerical_names: Tuple[str, ...]
    categorical: Tuple[CategoricalFeature, ...]
    pad_id: int
    table_dtype: str
    checkpoint: str
    step: int
    checks: Optional[Dict[str, Any]]
    check_samples: Optional[str] = None  # the export check's samples (inputs, labels, TF's probabilities)

    @property
    def onnx_path(self) -> Path:
        return self.folder / self.onnx

    @property
    def num_numerical(self) -> int:
        return len(self.numerical_names)

    @property
    def num_categorical_columns(self) -> int:
        return sum(feature.hotness for feature in self.categorical)

    def input(self, name: str) -> TensorSpec:
        return next(spec for spec in self.inputs if spec.name == name)

    def column_features(self) -> np.ndarray:
        """The feature index of each column of `categorical_features`."""
        return np.repeat(np.arange(len(self.categorical)), [f.hotness for f in self.categorical])

    def signature(self) -> Dict[str, Any]:
        """What a replacing version must keep: its inputs, outputs, numerical names, features, pad id."""
        return {"inputs": self.inputs, "outputs": self.outputs, "numerical_names": self.numerical_names,
                "categorical": self.categorical, "pad_id": self.pad_id}

    def mismatch(self, other: "ServingContract", mine_label: str = "the served") -> Optional[str]:
        """Why `other` cannot replace this contract's model (the first difference, this one called
        `mine_label`), or None."""
        mine, theirs = self.signature(), other.signature()
        for key in mine:
            if mine[key] == theirs[key]:
                continue
            if key == "categorical":
                return _feature_difference(self.categorical, other.categorical, mine_label)
            return f"{key} {_describe(theirs[key])} differ from {mine_label} {_describe(mine[key])}"
        return None


def _describe(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], TensorSpec):
        return "[" + ", ".join(f"{spec.name} {spec.dtype} {list(spec.shape)}" for spec in value) + "]"
    return str(list(value) if isinstance(value, tuple) else value)


def _feature_difference(served: Tuple[CategoricalFeature, ...], new: Tuple[CategoricalFeature, ...],
                        label: str) -> str:
    if len(served) != len(new):
        return f"categorical: {len(new)} features differ from {label} {len(served)}"
    for old, feature in zip(served, new):
        if old != feature:
            return (f"categorical feature {feature.name!r} (cardinality {feature.cardinality}, hotness "
                    f"{feature.hotness}) differs from {label} {old.name!r} (cardinality {old.cardinality}, "
                    f"hotness {old.hotness})")
    return "categorical features differ"


def _require(condition: bool, where: Path, message: str) -> None:
    if not condition:
        raise ContractError(f"{where}: {message}")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_specs(raw: Any, expected: Tuple[Tuple[str, str], ...], key: str, where: Path) -> Tuple[TensorSpec, ...]:
    _require(isinstance(raw, list) and len(raw) == len(expected), where,
             f"'{key}' must list {len(expected)} tensors ({', '.join(name for name, _ in expected)})")
    specs = []
    for entry, (name, dtype) in zip(raw, expected):
        _require(isinstance(entry, dict) and entry.get("name") == name, where,
                 f"'{key}' must be, in order, {[n for n, _ in expected]}; got {entry!r}")
        _require(entry.get("dtype") == dtype, where, f"{key} '{name}': dtype must be {dtype}, got {entry.get('dtype')!r}")
        shape = entry.get("shape")
        _require(isinstance(shape, list) and len(shape) == 2 and shape[0] == -1 and _int(shape[1]) and shape[1] >= 0,
                 where, f"{key} '{name}': shape must be [-1, width], got {shape!r}")
        specs.append(TensorSpec(name, dtype, tuple(shape)))
    return tuple(specs)


def parse_contract(raw: Any, folder: Path) -> ServingContract:
    """The contract of `raw` (serving.json's decoded JSON), every key checked; `folder` holds the export."""
    where = folder / CONTRACT_FILE
    _require(isinstance(raw, dict), where, "must be a JSON object")
    _require(raw.get("format") == FORMAT and raw.get("version") == FORMAT_VERSION, where,
             f"'format'/'version' must be {FORMAT!r}/{FORMAT_VERSION}, got {raw.get('format')!r}/{raw.get('version')!r}")
    for key in ("model", "onnx", "inputs", "outputs", "numerical_names", "categorical", "pad_id", "table_dtype",
                "checkpoint", "step"):
        _require(key in raw, where, f"missing key '{key}'")
    _require(raw["model"] in MODELS, where, f"'model' must be one of {list(MODELS)}, got {raw['model']!r}")
    _require(raw["table_dtype"] in TABLE_DTYPES, where,
             f"'table_dtype' must be one of {list(TABLE_DTYPES)}, got {raw['table_dtype']!r}")
    _require(isinstance(raw["onnx"], str) and raw["onnx"] and "/" not in raw["onnx"], where,
             f"'onnx' must be a file name in the export folder, got {raw['onnx']!r}")
    inputs = _tensor_specs(raw["inputs"], EXPECTED_INPUTS, "inputs", where)
    outputs = _tensor_specs(raw["outputs"], EXPECTED_OUTPUTS, "outputs", where)
    _require(outputs[0].width == 1, where, f"outputs '{OUTPUT}': shape must be [-1, 1], got {list(outputs[0].shape)}")
    names = raw["numerical_names"]
    _require(isinstance(names, list) and all(isinstance(n, str) for n in names), where,
             "'numerical_names' must be a list of names")
    _require(len(names) == inputs[0].width, where,
             f"'numerical_names' has {len(names)} names but input '{NUMERICAL_INPUT}' is {inputs[0].width} wide")
    features = []
    for index, entry in enumerate(raw["categorical"] if isinstance(raw["categorical"], list) else [None]):
        _require(isinstance(entry, dict) and isinstance(entry.get("name"), str) and _int(entry.get("cardinality"))
                 and entry["cardinality"] > 0 and _int(entry.get("hotness")) and entry["hotness"] > 0, where,
                 f"categorical[{index}] must be {{name, cardinality > 0, hotness > 0}}, got {entry!r}")
        features.append(CategoricalFeature(entry["name"], entry["cardinality"], entry["hotness"]))
    columns = sum(feature.hotness for feature in features)
    _require(columns == inputs[1].width, where,
             f"the categorical features' hotness adds up to {columns} but input '{CATEGORICAL_INPUT}' is "
             f"{inputs[1].width} wide")
    _require(_int(raw["pad_id"]) and raw["pad_id"] < 0, where, f"'pad_id' must be a negative int, got {raw['pad_id']!r}")
    _require(_int(raw["step"]) and raw["step"] >= 0, where, f"'step' must be an int >= 0, got {raw['step']!r}")
    checks = raw.get("checks")
    _require(checks is None or isinstance(checks, dict), where, "'checks' must be an object when given")
    samples = raw.get("check_samples")
    _require(samples is None or (isinstance(samples, str) and samples and "/" not in samples), where,
             f"'check_samples' must be a file name in the export folder when given, got {samples!r}")
    return ServingContract(folder=folder, model=raw["model"], onnx=raw["onnx"], inputs=inputs, outputs=outputs,
                           numerical_names=tuple(names), categorical=tuple(features), pad_id=raw["pad_id"],
                           table_dtype=raw["table_dtype"], checkpoint=str(raw["checkpoint"]), step=raw["step"],
                           checks=checks, check_samples=samples)


def load_contract(folder: Path) -> ServingContract:
    """The checked contract of the export folder `folder`; ContractError (one line) when it is absent,
    unreadable or breaks the contract, or when its ONNX file is missing."""
    folder = Path(folder)
    where = folder / CONTRACT_FILE
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContractError(f"{where}: not found (an export folder holds serving.json and model.onnx)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ContractError(f"{where}: not readable as JSON ({error})") from None
    contract = parse_contract(raw, folder)
    _require(contract.onnx_path.is_file(), where, f"names {contract.onnx!r}, which is not in {folder}")
    return contract


def example_batch(contract: ServingContract, rows: int, seed: int = 0) -> List[np.ndarray]:
    """`rows` valid requests' inputs for `contract` (numericals N(0, 1), ids uniform in each table;
    multi-hot features padded from a random length on), in the order of its inputs."""
    rng = np.random.default_rng(seed)
    numerical = rng.standard_normal((rows, contract.num_numerical)).astype(np.float32)
    columns = []
    for feature in contract.categorical:
        ids = rng.integers(0, feature.cardinality, size=(rows, feature.hotness), dtype=np.int64)
        if feature.hotness > 1:
            lengths = rng.integers(1, feature.hotness + 1, size=(rows, 1))
            ids[np.arange(feature.hotness)[None, :] >= lengths] = contract.pad_id
        columns.append(ids)
    categorical = np.concatenate(columns, axis=1).astype(np.int32) if columns else np.zeros((rows, 0), np.int32)
    return [numerical, categorical]

"""Export folders for the serving tests, made here with `onnx.helper` (no TensorFlow, no checkpoint).

`make_export` writes what `python -m deployment.export` writes (model.onnx + serving.json, the
contract of docs/serving.md) for a tiny DLRM-like network: per feature a Gather from its table (a
multi-hot feature's ids masked where they are the pad id and summed), concatenated with the
numericals, one MatMul plus bias, a sigmoid -> `probabilities` [B, 1]. Different seeds give different
weights (a "newer checkpoint" of the same model); other `num_numerical` or `features` give a model with
other widths or features. Tests may swap in real exports: they only read the folder.

    python tests/serving_fixtures.py OUT_DIR [--seed S] [--num_numerical N] [--corrupt]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# (name, cardinality, hotness): two one-hot features and one multi-hot one.
FEATURES: Tuple[Tuple[str, int, int], ...] = (("cat_0", 10, 1), ("cat_1", 7, 1), ("cat_2", 5, 2))
NUM_NUMERICAL = 3
DIM = 4
PAD_ID = -1


def tiny_model(seed: int, num_numerical: int, features: Sequence[Tuple[str, int, int]]) -> onnx.ModelProto:
    """The network of the module doc with weights drawn from `seed`."""
    rng = np.random.default_rng(seed)
    inits, nodes, pooled = [], [], []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    column = 0
    axes = const("axis1", np.array([1], np.int64))
    zero = const("zero", np.array(0, np.int32))
    for name, cardinality, hotness in features:
        table = const(f"{name}_table", rng.normal(0, 0.5, (cardinality, DIM)).astype(np.float32))
        start = const(f"{name}_start", np.array([column], np.int64))
        end = const(f"{name}_end", np.array([column + hotness], np.int64))
        column += hotness
        nodes += [helper.make_node("Slice", ["categorical_features", start, end, axes], [f"{name}_ids"]),
                  helper.make_node("Max", [f"{name}_ids", zero], [f"{name}_safe"]),  # pad id -> row 0, masked below
                  helper.make_node("Gather", [table, f"{name}_safe"], [f"{name}_rows"]),  # [B, h, D]
                  helper.make_node("GreaterOrEqual", [f"{name}_ids", zero], [f"{name}_real"]),
                  helper.make_node("Cast", [f"{name}_real"], [f"{name}_mask2"], to=TensorProto.FLOAT),
                  helper.make_node("Unsqueeze", [f"{name}_mask2", const(f"{name}_axis2", np.array([2], np.int64))],
                                   [f"{name}_mask"]),
                  helper.make_node("Mul", [f"{name}_rows", f"{name}_mask"], [f"{name}_kept"]),
                  helper.make_node("ReduceSum", [f"{name}_kept", axes], [f"{name}_vec"], keepdims=0)]
        pooled.append(f"{name}_vec")
    width = num_numerical + DIM * len(features)
    weight = const("weight", rng.normal(0, 0.5, (width, 1)).astype(np.float32))
    bias = const("bias", np.array([rng.normal(0, 0.1)], np.float32))
    nodes += [helper.make_node("Concat", ["numerical_features", *pooled], ["joined"], axis=1),
              helper.make_node("MatMul", ["joined", weight], ["logit0"]),
              helper.make_node("Add", ["logit0", bias], ["logit"]),
              helper.make_node("Sigmoid", ["logit"], ["probabilities"])]
    graph = helper.make_graph(
        nodes, "tiny_dlrm",
        [helper.make_tensor_value_info("numerical_features", TensorProto.FLOAT, ["batch", num_numerical]),
         helper.make_tensor_value_info("categorical_features", TensorProto.INT32, ["batch", column])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older ONNX Runtime releases too
    onnx.checker.check_model(model)
    return model


def make_export(folder: Path, seed: int = 0, num_numerical: int = NUM_NUMERICAL,
                features: Sequence[Tuple[str, int, int]] = FEATURES, step: int = 0, corrupt: bool = False) -> Path:
    """Writes the export folder `folder` (made if absent) and returns it; `corrupt`: model.onnx is
    cut short (a broken copy), serving.json stays good."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = tiny_model(seed, num_numerical, features).SerializeToString()
    (folder / "model.onnx").write_bytes(data[: len(data) // 3] if corrupt else data)
    columns = sum(hotness for _, _, hotness in features)
    contract = {
        "format": "dlrm-tf2-serving", "version": 1, "model": "dlrm", "onnx": "model.onnx",
        "inputs": [{"name": "numerical_features", "dtype": "float32", "shape": [-1, num_numerical]},
                   {"name": "categorical_features", "dtype": "int32", "shape": [-1, columns]}],
        "outputs": [{"name": "probabilities", "dtype": "float32", "shape": [-1, 1]}],
        "numerical_names": [f"num_{i}" for i in range(num_numerical)],
        "categorical": [{"name": n, "cardinality": c, "hotness": h} for n, c, h in features],
        "pad_id": PAD_ID, "table_dtype": "float32", "checkpoint": f"tiny-seed-{seed}", "step": step,
    }
    (folder / "serving.json").write_text(json.dumps(contract, indent=1))
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="write a tiny export folder for the serving tests")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_numerical", type=int, default=NUM_NUMERICAL)
    parser.add_argument("--corrupt", action="store_true")
    args = parser.parse_args()
    print(make_export(args.out_dir, args.seed, args.num_numerical, corrupt=args.corrupt))

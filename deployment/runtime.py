"""An export folder opened for inference: its contract, its ONNX Runtime session, checked together.

`open_export` is the one way the serving side loads a model (the Triton model, the refresh check of
`deployment.serve`, the in-process side of `bench.serving`): it refuses, with one `ContractError`
line, an export whose ONNX file does not load or whose graph's inputs and outputs are not the
contract's, or which gives no finite [rows, 1] probabilities for a valid batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping

import numpy as np
import onnxruntime as ort

from deployment.contract import ContractError, ServingContract, example_batch, load_contract
from deployment.requests import RequestChecker

ORT_DTYPES = {"tensor(float)": "float32", "tensor(int32)": "int32"}


@dataclass
class LoadedExport:
    """An export's contract, its request checker and its ONNX Runtime session."""
    contract: ServingContract
    checker: RequestChecker
    session: ort.InferenceSession

    def predict(self, feed: Mapping[str, np.ndarray]) -> np.ndarray:
        """The probabilities `[rows, 1]` for an already checked feed."""
        return self.session.run([self.contract.outputs[0].name], dict(feed))[0]


def _graph_tensors(tensors: list) -> Dict[str, tuple]:
    return {t.name: (ORT_DTYPES.get(t.type, t.type), t.shape[-1] if t.shape else None) for t in tensors}


def open_export(folder: Path, threads: int = 0) -> LoadedExport:
    """The export in `folder`, loaded and checked (see the module doc); `threads`: ONNX Runtime's
    intra-op threads (0: its default)."""
    contract = load_contract(Path(folder))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(contract.onnx_path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ONNX Runtime raises its own classes for a corrupt or invalid graph
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ContractError(f"{contract.onnx_path}: ONNX Runtime cannot load it ({message})") from None
    for kind, declared, actual in (("input", contract.inputs, session.get_inputs()),
                                   ("output", contract.outputs, session.get_outputs())):
        graph = _graph_tensors(actual)
        wanted = {spec.name: (spec.dtype, spec.width) for spec in declared}
        if graph != wanted:
            raise ContractError(f"{contract.onnx_path}: the graph's {kind}s {graph} are not serving.json's {wanted}")
    loaded = LoadedExport(contract, RequestChecker(contract), session)
    numerical, categorical = example_batch(contract, rows=2)
    probabilities = loaded.predict({contract.inputs[0].name: numerical, contract.inputs[1].name: categorical})
    if probabilities.shape != (2, 1) or not np.all(np.isfinite(probabilities)):
        raise ContractError(f"{contract.onnx_path}: gives {probabilities.dtype} {list(probabilities.shape)} "
                            "for 2 valid rows: expected finite float32 [2, 1]")
    return loaded

"""The model `deployment.serve` runs inside Triton's Python backend (the one nvidia-pytriton ships).

Triton loads this file as each version's `model.py`: `initialize` opens the version folder's export
(`deployment.runtime.open_export`: contract + ONNX Runtime session, checked), and `execute` gets the
requests the dynamic batcher gathered: each is checked on its own (`deployment.requests`), a bad one
answered with its one-line error as INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT) while the others
run through the session in one call. Triton itself has already refused a missing input, a wrong
dtype or a wrong width against config.pbtxt, with the same statuses.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the backend's stub, not a package

from deployment.requests import RequestError
from deployment.runtime import open_export


class TritonPythonModel:
    """One model instance: an export's session and checker (Triton's Python-backend interface)."""

    def initialize(self, args: Dict[str, str]) -> None:
        """Opens this version's export; an export that fails its checks fails the load (Triton then
        keeps serving the version it had)."""
        config = json.loads(args["model_config"])
        threads = int(config.get("parameters", {}).get("onnx_threads", {}).get("string_value", "0"))
        folder = Path(args["model_repository"]) / args["model_version"]
        self.export = open_export(folder, threads=threads)
        self.output_name = self.export.contract.outputs[0].name

    def execute(self, requests: List[Any]) -> List[Any]:
        """One response per request: its probabilities, or its error line (INVALID_ARG)."""
        responses: List[Any] = [None] * len(requests)
        feeds, valid = [], []
        for index, request in enumerate(requests):
            inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            try:
                feeds.append(self.export.checker.check(inputs))
            except RequestError as error:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
                continue
            valid.append(index)
        if valid:
            names = [spec.name for spec in self.export.contract.inputs]
            batch = {name: np.concatenate([feed[name] for feed in feeds]) for name in names}
            probabilities = self.export.predict(batch)
            ends = np.cumsum([len(feed[names[0]]) for feed in feeds])[:-1]
            for index, part in zip(valid, np.split(probabilities, ends)):
                responses[index] = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output_name, part)])
        return responses

"""Serving: the exported model (ONNX + serving.json), its Triton server, its model repository."""

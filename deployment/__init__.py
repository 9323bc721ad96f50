"""Serving: the ONNX export of a checkpoint (export, onnx_graph, quantize) and its server."""

"""Serving: the ONNX export of a checkpoint (export, onnx_graph, quantize), its Triton server and model
repository (serve, triton_model, repository), and the contract between them (contract, requests, runtime)."""

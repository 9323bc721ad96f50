"""The machinery under the reference's commands, one package per layer (docs/architecture.md, Layers):

  runtime   processes, files, logging, signals, collectives, precision, metrics (no data, no model)
  data      the batch contract, the FeatureSpec, the registry of data formats and one module per format
  sparse    the embedding tables' machinery: the sharding planner, lookups, the hybrid-parallel layer
  training  the model configuration, optimizers, checkpoints and the training loop

A package imports only from the packages above it in this list (tests/test_layers.py keeps that
true); the root modules (main.py, model.py, ...) and `wide_and_deep/` build on all of them.
"""

"""Training, for any model: the one model configuration, the optimizers (with the fused sparse
updates), world-size-independent checkpoints and the training step, evaluation and loop."""

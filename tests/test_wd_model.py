"""Wide & Deep's training step with the tables' fused optimizer kernels (EmbeddingSparseFtrl and
EmbeddingSparseRmsprop) against the all-Keras step: a small model trained a few steps both ways ends
with the same weights, slots and iteration counts; the decision follows the model's kernels and fp16
loss scaling."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from recsys.runtime import custom_ops
from multiproc import require
from wide_and_deep import features as F
from wide_and_deep import wd_model

CONFIG = wd_model.WideDeepConfig(hidden_units=(32, 16), buckets={n: 40 + 7 * i for i, n in enumerate(F.CATEGORICAL_NAMES)})


@pytest.fixture(autouse=True)
def _op_built():
    require(custom_ops.op_package.is_built(), f"the custom op library is not built ({custom_ops.op_package.BUILD_HINT})")


def train(use_kernel: bool, steps: int = 3):
    model = wd_model.WideAndDeep(CONFIG, use_kernel=use_kernel)
    model.build_all()
    optimizers = wd_model.build_optimizers(model, CONFIG, loss_scaling=False)
    assert optimizers.fused_tables == use_kernel
    trainer = wd_model.TrainStep(model, optimizers, CONFIG.seed)
    rng = np.random.default_rng(5)
    for step in range(steps):
        ids = np.stack([rng.integers(0, CONFIG.buckets[n] // 3, 256) for n in F.CATEGORICAL_NAMES], 1)  # repeats
        batch = {"categorical": tf.constant(ids, tf.int64),
                 "numeric": tf.constant(rng.random((256, len(F.NUMERIC_FEATURES)), np.float32)),
                 "label": tf.constant(rng.integers(0, 2, 256).astype(np.float32)),
                 "display_id": tf.constant(np.arange(256) // 4, tf.int64), "row": tf.constant(np.arange(256), tf.int64)}
        optimizers.deep_lr.assign(0.01 * (step + 1))
        trainer.step(batch, tf.constant(step, tf.int64), tf.zeros(3))
    return model, optimizers


def test_fused_table_steps_train_like_keras():
    fused_model, fused_opts = train(use_kernel=True)
    keras_model, keras_opts = train(use_kernel=False)
    for name, variable in keras_model.named_variables().items():
        np.testing.assert_allclose(fused_model.named_variables()[name].numpy(), variable.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    fused_slots = wd_model.optimizer_slots(fused_model, fused_opts)
    for name, slots in wd_model.optimizer_slots(keras_model, keras_opts).items():
        for slot, variable in slots.items():
            np.testing.assert_allclose(fused_slots[name][slot].numpy(), variable.numpy(), rtol=1e-5, atol=1e-7,
                                       err_msg=f"{name} {slot}")
    for name, counter in wd_model.optimizer_counters(keras_opts).items():
        assert int(wd_model.optimizer_counters(fused_opts)[name].numpy()) == int(counter.numpy()) == 3


def test_loss_scaling_keeps_the_keras_table_steps():
    model = wd_model.WideAndDeep(CONFIG, use_kernel=True)
    model.build_all()
    assert not wd_model.build_optimizers(model, CONFIG, loss_scaling=True).fused_tables

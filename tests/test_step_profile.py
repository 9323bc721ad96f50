"""bench.step_profile: a real profiled step of a small DLRM, its op time by part of the step."""
from __future__ import annotations

from bench.step_profile import CATEGORIES, IDLE, OTHER, OpEvent, categorize, profile_breakdown, summarize


def test_a_profiled_step_puts_its_op_time_in_the_parts_of_the_model():
    import numpy as np
    import tensorflow as tf

    from factory import ModelOptions, build_trainer
    from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
    from recsys.sparse.sharding import MemoryBudget, plan_sharding
    from recsys.training.model_config import DlrmSettings, TrainingSettings

    cardinalities = [1000] * 4
    plan = plan_sharding(cardinalities, (16,) * 4, 1, budget=MemoryBudget(device_bytes=0))
    trainer = build_trainer(plan, 0, plan.reads(0), ModelOptions(
        num_numerical_features=3, model=DlrmSettings(bottom_mlp_dims=[32, 16], top_mlp_dims=[64, 1]),
        training=TrainingSettings(learning_rate=0.1, warmup_steps=0, decay_start_step=10**9, decay_steps=1)))
    rng = np.random.default_rng(0)
    batch = ({NUMERICAL_KEY: tf.constant(rng.random((256, 3), np.float32)),
              CATEGORICAL_KEY: tuple(tf.constant(rng.integers(0, 1000, 256, np.int32)) for _ in cardinalities)},
             tf.constant((rng.random((256, 1)) < 0.5).astype(np.float32)))
    trainer.train_step(*batch)[0].numpy()  # traced before the profile
    parts = profile_breakdown(lambda: trainer.train_step(*batch)[0].numpy(), 3)
    assert set(parts) == {name for name, _ in CATEGORIES} | {OTHER, IDLE}
    for part in ("embedding forward", "embedding update", "bottom MLP forward", "bottom MLP backward",
                 "top MLP forward", "top MLP backward", "interaction forward", "dense optimizer"):
        assert parts[part] > 0, (part, parts)
    assert parts[OTHER] < 0.25 * sum(parts.values()), parts  # the model's ops land in its parts


def test_each_instant_is_split_among_the_ops_running_then():
    """Two ops overlapping for 2 ms of their 4: each gets half of the overlap; the wall time no op ran is idle."""
    events = [OpEvent("dlrm/top_mlp/dense_0/Relu:_MklNativeFusedMatMul", 0.0, 4.0),
              OpEvent("EmbeddingSparseSgd:EmbeddingSparseSgd", 2.0, 6.0)]
    parts = summarize(events, steps=2, wall_ms=10.0)
    assert parts["top MLP forward"] == parts["embedding update"] == 1.5  # (2 + 2 / 2) ms over 2 steps
    assert parts[IDLE] == 2.0 and sum(parts.values()) == 5.0


def test_categories_read_the_scope_and_the_backward_prefix():
    assert categorize("gradient_tape/dlrm/top_mlp/dense_1/MatMul/MatMul:_MklMatMul") == "top MLP backward"
    assert categorize("dlrm/top_mlp/dense_1/Relu:_MklNativeFusedMatMul") == "top MLP forward"
    assert categorize("EmbeddingSparseSgd:EmbeddingSparseSgd") == "embedding update"
    assert categorize("ResourceApplyGradientDescent_8:ResourceApplyGradientDescent") == "dense optimizer"
    assert categorize("HorovodAlltoall_embeddings_mb0:HorovodAlltoall") == "collectives"
    assert categorize("gradient_tape/dlrm/interaction/GatherV2/UnsortedSegmentSum:UnsortedSegmentSum") == \
        "interaction backward"

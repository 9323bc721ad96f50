"""Exchanges overlapped with compute on 2 real ranks: pipelined input and micro-batches end with the
weights of the plain step (across an epoch boundary, evaluations and a checkpoint-resume), and the
traced steps leave the exchanges free to run beside the compute (bench.multihost's worker)."""
import json

import numpy as np
import pytest

from multiproc import assert_ok, run_horovod
from test_main import SMALL, checkpoint_arrays

# 4 batches an epoch, 8 steps over 2 epochs, an evaluation mid-epoch; tables 0 and 3 row-sliced,
# 1 and 2 model-parallel (so data-parallel input exchanges ids); Adam's slots compared too.
TRAIN = SMALL + ["--deterministic", "--cpu", "--optimizer", "adam", "--row_slice_threshold", "200",
                 "--synthetic_dataset_train_batches", "4", "--epochs", "2", "--evals_per_epoch", "2"]


def train(tmp_path, name, extra, steps, restore=None):
    """8 steps' training on 2 ranks (Gloo) into the checkpoint folder `name`; its arrays."""
    args = ["main.py", *TRAIN, *extra, "--max_steps", str(steps), "--log_path", str(tmp_path / f"{name}.json"),
            "--save_checkpoint_path", str(tmp_path / name)]
    assert_ok(run_horovod(args + (["--restore_checkpoint_path", str(tmp_path / restore)] if restore else []),
                          np=2, transport="gloo"))
    return checkpoint_arrays(tmp_path / name)


@pytest.fixture(scope="module")
def plain_weights(tmp_path_factory):
    """The weights after 8 plain steps: data-parallel input exchanged inside each step, one batch."""
    return train(tmp_path_factory.mktemp("plain"), "plain", ["--data_parallel_input", "--nopipeline_input"], 8)


@pytest.mark.parametrize("extra, resume_at", [
    (["--data_parallel_input", "--micro_batches", "2"], 5),  # pipelined (the default) and micro-batches, resumed
    (["--micro_batches", "2"], None),  # model-parallel input: micro-batches cut from the global batch
], ids=["pipelined-micro_batches-resumed", "micro_batches-model_parallel_input"])
def test_overlapped_training_ends_with_the_plain_weights(tmp_path, plain_weights, extra, resume_at):
    if resume_at:
        train(tmp_path, "first", extra, resume_at)
        weights = train(tmp_path, "resumed", extra, 8, restore="first")
    else:
        weights = train(tmp_path, "straight", extra, 8)
    assert weights.keys() == plain_weights.keys()
    for name, plain in plain_weights.items():
        np.testing.assert_allclose(weights[name], plain, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.any(plain_weights["embeddings/feature_1.m.npy"] != 0)  # a model-parallel table trained


def test_steps_leave_the_exchanges_free_to_overlap_compute():
    """The pipelined step's id all-to-all (the next batch's) depends on nothing of the step; in both
    steps the embedding all-to-all is independent of the bottom MLP and its gradient all-to-all of
    the dense allreduce; the unpipelined step's ids feed it. The worker's timings come back too."""
    options = {"cardinalities": [300] * 4, "dim": 8, "batch": 64, "bottom": [16, 8], "top": [16, 1],
               "micro_batches": 2, "steps": 1, "batches": 2}
    result = run_horovod(["-m", "bench.multihost", "--worker", json.dumps(options)], np=2, transport="gloo")
    assert_ok(result)
    line = next(line for line in result.stdout.splitlines() if "MULTIHOST_RESULT " in line)
    ranks = json.loads(line.split("MULTIHOST_RESULT ", 1)[1])
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["overlap"]["pipelined"] == {"ids_vs_step": True, "embeddings_vs_bottom_mlp": True,
                                             "embedding_grads_vs_dense_allreduce": True}
        assert r["overlap"]["unpipelined"] == {"ids_vs_step": False, "embeddings_vs_bottom_mlp": True,
                                               "embedding_grads_vs_dense_allreduce": True}
        assert all(r[key] > 0 for key in ("unpipelined_ms", "pipelined_ms", "compute_ms", "exchange_ms",
                                          "exchange_beside_compute_ms"))

"""The same --seed gives the same initial model whatever the layout and the number of ranks (issue 12).

Initial values depend only on (seed, table, row, column) for tables and on (seed, layer) for the
MLPs, so 1 process and 2 ranks start from the same weights and, after the same steps, end with
the same weights.
"""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from recsys.sparse.hybrid_embedding import HybridEmbedding
from model import Dlrm
from recsys.training.model_config import DlrmConfig
from factory import single_process_model
from multiproc import assert_ok, run_horovod, run_python
from recsys.sparse.sharding import plan_sharding
from test_main import SMALL, checkpoint_arrays

CARDINALITIES = [50, 20, 7, 30, 3]
DIM = 8


def _config(**overrides) -> DlrmConfig:
    return DlrmConfig(num_numerical_features=5, cardinalities=CARDINALITIES, embedding_dim=(DIM,) * len(CARDINALITIES),
                      bottom_mlp_dims=[16, DIM], top_mlp_dims=[16, 1], seed=11, **overrides)


def _model(config: DlrmConfig, layer=None) -> Dlrm:
    model = Dlrm(config, layer) if layer is not None else single_process_model(config)
    model.build_weights()
    return model


def _tables(model: Dlrm) -> list:
    return [view.read_rows(0, view.rows) for view in model.table_views()]


def test_every_layout_starts_from_the_same_tables_and_mlps():
    reference = _model(_config(embedding_type="multitable"))
    tf.random.uniform([100], seed=3)  # other random draws in between change nothing
    fused_offloaded = _model(_config(embedding_type="fused", host_tables=[0, 3]))
    assert fused_offloaded.embedding.placement().count("cpu") > 0
    for expected, actual in zip(_tables(reference), _tables(fused_offloaded)):
        np.testing.assert_array_equal(actual, expected)
    for name, weight in reference.dense_weight_map().items():
        np.testing.assert_array_equal(fused_offloaded.dense_weight_map()[name].numpy(), weight.numpy(), err_msg=name)
    other_seed = _model(dataclasses.replace(_config(), seed=12))
    assert not np.array_equal(_tables(other_seed)[0], _tables(reference)[0])
    assert not np.array_equal(other_seed.dense_weight_map()["top_mlp_layer_0_kernel"].numpy(),
                              reference.dense_weight_map()["top_mlp_layer_0_kernel"].numpy())


def test_column_slices_row_blocks_and_replicas_on_any_rank_hold_the_same_values():
    reference = _tables(_model(_config()))
    plan = plan_sharding(CARDINALITIES, (DIM,) * len(CARDINALITIES), 4, "memory_balanced", column_slice_threshold=100,
                         data_parallel_threshold=30, row_slice_threshold=300)
    assert plan.replicated and any(p.width < DIM for p in plan.pieces) and plan.row_sliced == [0]
    blocks = []
    for rank in range(plan.world_size):
        layer = HybridEmbedding(plan, rank, plan.reads(rank), seed=11)
        layer.build(None)
        for piece, variable in zip(layer.local_pieces, layer.piece_variables):
            np.testing.assert_array_equal(variable.numpy(), reference[piece.table][:, piece.col_start:piece.col_end],
                                          err_msg=f"rank {rank} table {piece.table}")
        for table, variable in layer.replicated_tables.items():
            np.testing.assert_array_equal(variable.numpy(), reference[table])
        blocks.append(layer.row_blocks[0].numpy())
    assert [len(block) for block in blocks] == [13, 13, 12, 12]  # 50 rows: the first 50 % 4 ranks hold one more
    np.testing.assert_array_equal(np.concatenate(blocks), reference[0])


@pytest.mark.parametrize("transport", ["gloo"])
def test_one_and_two_ranks_train_to_the_same_weights_from_the_seed(tmp_path, transport):
    args = SMALL + ["--deterministic", "--cpu", "--column_slice_threshold", "200", "--max_steps", "6"]
    assert_ok(run_python(["main.py", *args, "--save_checkpoint_path", str(tmp_path / "one"),
                          "--log_path", str(tmp_path / "1.json")]))
    assert_ok(run_horovod(["main.py", *args, "--save_checkpoint_path", str(tmp_path / "two"),
                           "--log_path", str(tmp_path / "2.json")], np=2, transport=transport))
    one, two = checkpoint_arrays(tmp_path / "one"), checkpoint_arrays(tmp_path / "two")
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)

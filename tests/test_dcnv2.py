"""V5 (DLRM_and_DCNv2): the cross network, per-table embedding widths, dlrm.py / dcnv2.py, and the
flags of other versions that launch scripts still pass."""
import numpy as np
import pytest
import tensorflow as tf

from recsys.training import checkpoint
import interaction
from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY
from factory import single_process_model
from recsys.training.model_config import DlrmConfig
from multiproc import assert_ok, run_horovod, run_python
from test_main import SMALL_DATA, checkpoint_arrays, final_record

CARDINALITIES = [50, 20, 7, 30]
WIDTHS = [8, 4, 4, 16]
DCN_MODEL = ["--embedding_dim", ",".join(map(str, WIDTHS)), "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
             "--num_cross_layers", "2", "--cross_layer_projection_dim", "4", "--print_freq", "1000"]
# One id per table: dcnv2.py's synthetic default is V5's 20 ids per table (tests/test_multihot_e2e.py).
DCN = DCN_MODEL + SMALL_DATA + ["--synthetic_dataset_hotness", "1", "--learning_rate", "0.01", "--warmup_steps", "2",
                                "--seed", "7"]


def dcnv2_py(args, **kwargs):
    return run_python(["dcnv2.py", *args], **kwargs)


@pytest.mark.parametrize("projection_dim", [3, 0], ids=["low-rank", "full-rank"])
def test_cross_network_is_x0_times_w_x_plus_b_plus_x(projection_dim):
    width = 13
    network = interaction.CrossNetwork(num_layers=2, projection_dim=projection_dim, seed=5)
    x0 = tf.random.stateless_normal([4, width], [1, 2])
    output = network(x0).numpy()
    assert output.shape == (4, interaction.cross_output_width(width)) == (4, 16)
    np.testing.assert_array_equal(output[:, width:], 0)
    weights = network.weight_map()
    assert len(weights) == 2 * (3 if projection_dim else 2)
    x = x0.numpy()
    for layer in range(2):
        kernel = weights[f"cross_layer_{layer}_{'v' if projection_dim else 'w'}_kernel"].numpy()
        if projection_dim:
            kernel = weights[f"cross_layer_{layer}_u_kernel"].numpy() @ kernel
        bias = weights[f"cross_layer_{layer}_bias"].numpy()
        np.testing.assert_array_equal(bias, 0)
        x = x0.numpy() * (x @ kernel + bias) + x
    np.testing.assert_allclose(output[:, :width], x, rtol=1e-5, atol=1e-6)
    for name, weight in weights.items():  # truncated normal: within two standard deviations (0.05)
        if "kernel" in name:
            assert np.abs(weight.numpy()).max() <= 0.1 + 1e-6, name


def test_embedding_dim_takes_an_integer_a_list_or_a_json_file(tmp_path):
    import main

    widths = tmp_path / "dims.json"
    widths.write_text("[8, 4, 4, 16]")
    assert [main.embedding_dims(v) for v in ("128", "8,4,4,16", str(widths))] == [128, WIDTHS, WIDTHS]
    widths.write_text('{"dims": 8}')
    with pytest.raises(main.UsageError, match="dims.json: the file must hold a JSON list of integers"):
        main.embedding_dims(str(widths))


def test_mixed_widths_flow_through_every_embedding_layout():
    """Offloaded, fused and multitable groups of several widths give the same vectors, in feature order."""
    def model(**overrides):
        config = DlrmConfig(num_numerical_features=5, cardinalities=CARDINALITIES, embedding_dim=tuple(WIDTHS),
                            bottom_mlp_dims=[16, 8], top_mlp_dims=[16, 1], interaction="cross", seed=3, **overrides)
        built = single_process_model(config)
        built.build_weights()
        return built

    ids = tuple(tf.constant(np.arange(6) % c, tf.int32) for c in CARDINALITIES)
    reference = model(embedding_type="multitable")
    expected = reference.embedding(ids).numpy()
    assert expected.shape == (6, sum(WIDTHS))
    for overrides in ({"embedding_type": "fused"}, {"embedding_type": "fused", "host_tables": [0, 3]}):
        other = model(**overrides)
        np.testing.assert_array_equal(other.embedding(ids).numpy(), expected)
    tables = [view.read_rows(0, view.rows) for view in reference.table_views()]
    assert [t.shape for t in tables] == [(c, w) for c, w in zip(CARDINALITIES, WIDTHS)]
    np.testing.assert_array_equal(expected[:, 8:12], tables[1][np.arange(6) % 20])
    with pytest.raises(ValueError, match="the dot interaction needs every table of one width"):
        single_process_model(DlrmConfig(num_numerical_features=5, cardinalities=CARDINALITIES,
                                        embedding_dim=tuple(WIDTHS), bottom_mlp_dims=[16, 8], top_mlp_dims=[16, 1]))


def test_dcnv2_trains_resumes_exactly_evaluates_and_exports(tmp_path):
    """dcnv2.py with mixed widths: a run cut and resumed equals the full run; eval and inference run
    from the checkpoint; the SavedModel predicts what the live model does."""
    common = DCN + ["--deterministic", "--epochs", "2"]
    assert_ok(dcnv2_py(common + ["--save_checkpoint_path", str(tmp_path / "full"), "--log_path", str(tmp_path / "f")]))
    assert_ok(dcnv2_py(common + ["--max_steps", "17", "--save_checkpoint_path", str(tmp_path / "part")]))
    assert_ok(dcnv2_py(common + ["--restore_checkpoint_path", str(tmp_path / "part"),
                                 "--save_checkpoint_path", str(tmp_path / "resumed")]))
    full, resumed = checkpoint_arrays(tmp_path / "full"), checkpoint_arrays(tmp_path / "resumed")
    assert full.keys() == resumed.keys() and "dense/cross_layer_1_u_kernel.npy" in full
    assert any(".m.npy" in name for name in full)  # dcnv2.py's default optimizer is Adam
    for name in full:
        np.testing.assert_array_equal(full[name], resumed[name], err_msg=name)

    ckpt = str(tmp_path / "full")
    assert_ok(dcnv2_py(DCN + ["--mode", "eval", "--restore_checkpoint_path", ckpt, "--log_path", str(tmp_path / "e")]))
    assert_ok(dcnv2_py(DCN + ["--mode", "inference", "--restore_checkpoint_path", ckpt, "--max_steps", "12",
                              "--synthetic_dataset_valid_batches", "12", "--log_path", str(tmp_path / "i")]))
    assert final_record(tmp_path / "i")["measured_batches"] == 2
    exported = tmp_path / "saved_model"
    assert_ok(dcnv2_py(DCN + ["--mode", "deploy", "--restore_checkpoint_path", ckpt,
                              "--saved_model_output_path", str(exported)]))

    config = DlrmConfig(num_numerical_features=5, cardinalities=CARDINALITIES, embedding_dim=tuple(WIDTHS),
                        bottom_mlp_dims=[16, 8], top_mlp_dims=[16, 1], interaction="cross", num_cross_layers=2,
                        cross_layer_projection_dim=4)
    live = single_process_model(config)
    live.build_weights()
    for table, array in zip(live.table_views(), checkpoint.table_arrays(ckpt)):
        table.write_rows(0, table.rows, np.asarray(array))
    for name, variable in live.dense_weight_map().items():
        variable.assign(full[f"dense/{name}.npy"])
    rng = np.random.default_rng(0)
    numerical = rng.random((6, 5)).astype(np.float32)
    categorical = np.stack([rng.integers(0, c, 6) for c in CARDINALITIES], axis=1).astype(np.int32)
    expected = tf.sigmoid(live({NUMERICAL_KEY: numerical,
                                CATEGORICAL_KEY: tuple(tf.constant(c) for c in categorical.T)})).numpy()
    served = tf.saved_model.load(str(exported)).signatures["serving_default"](
        numerical_features=tf.constant(numerical), categorical_features=tf.constant(categorical))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-5)
    assert_ok(dcnv2_py(DCN + ["--mode", "eval", "--saved_model_input_path", str(exported),
                              "--log_path", str(tmp_path / "s")]))
    assert final_record(tmp_path / "s")["auc"] == pytest.approx(final_record(tmp_path / "e")["auc"], abs=1e-6)


def test_dcnv2_on_two_ranks_equals_one_process(tmp_path):
    """Mixed widths, column slices, a replicated table and host-memory tables on 2 ranks."""
    args = DCN + ["--deterministic", "--cpu", "--column_slice_threshold", "100", "--data_parallel_threshold", "40",
                  "--max_steps", "6"]
    assert_ok(dcnv2_py(args + ["--save_checkpoint_path", str(tmp_path / "one"), "--log_path", str(tmp_path / "1")]))
    result = run_horovod(["dcnv2.py", *args, "--print_sharding_plan", "--save_checkpoint_path", str(tmp_path / "two"),
                          "--log_path", str(tmp_path / "2")], np=2, transport="gloo")
    assert_ok(result)
    assert "table 0[cols" in result.stdout and "replicated on every rank: tables [2]" in result.stdout
    one, two = checkpoint_arrays(tmp_path / "one"), checkpoint_arrays(tmp_path / "two")
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_dcnv2_with_amp_and_xla_and_zero_initialised_tables(tmp_path):
    result = dcnv2_py(DCN + ["--amp", "--xla", "--embedding_zeros_initializer", "--max_steps", "4",
                             "--save_checkpoint_path", str(tmp_path / "c"), "--log_path", str(tmp_path / "l")])
    assert_ok(result)
    assert "interaction: DCNv2 cross network, 2 layers, projection 4" in result.stdout
    assert np.isfinite(final_record(tmp_path / "l")["train_loss"])


def test_dcnv2_learns_to_the_teacher(tmp_path):
    """Mixed widths; more steps than the dot model needs (test_main): the cross network learns the
    teacher's pairwise dot products more slowly (measured: AUC 0.773 against the teacher's 0.788)."""
    log = tmp_path / "log.json"
    assert_ok(dcnv2_py(["--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", "100,100,80,80,60,60,50,50",
                        "--synthetic_dataset_hotness", "1",
                        "--synthetic_dataset_train_batches", "800", "--synthetic_dataset_valid_batches", "20",
                        "--batch_size", "1024", "--valid_batch_size", "4096", "--epochs", "4",
                        "--embedding_dim", "16,16,8,8,8,8,4,4", "--bottom_mlp_dims", "64,16",
                        "--top_mlp_dims", "128,64,1", "--learning_rate", "0.005", "--warmup_steps", "50",
                        "--print_freq", "800", "--log_path", str(log)], timeout=900))
    data = final_record(log)
    assert data["teacher_auc"] - data["auc"] < 0.02, data


def test_dlrm_py_runs_dot_and_honours_the_v5_flags(tmp_path):
    """dlrm.py's dot_custom_cuda default on a machine without GPU; --cpu_offloading_threshold_gb as
    the device budget; --embedding_zeros_initializer; --tfdata_debug; --beta1/--beta2."""
    result = run_python(["dlrm.py", "--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
                         *SMALL_DATA, "--max_steps", "0", "--save_checkpoint_path", str(tmp_path / "c"),
                         "--cpu_offloading_threshold_gb", "0", "--print_sharding_plan", "--embedding_zeros_initializer",
                         "--tfdata_debug", "--log_path", str(tmp_path / "l")])
    assert_ok(result)
    assert "(--interaction dot_custom_cuda needs a GPU and none is visible)" in result.stdout
    assert "device budget 0.00 GiB per rank" in result.stdout and "embedding tables on rank 0: 4 cpu" in result.stdout
    tables = {name: array for name, array in checkpoint_arrays(tmp_path / "c").items() if name.startswith("embeddings/")}
    assert len(tables) == 4 and all(not array.any() for array in tables.values())

    from recsys.training.optimizers import make_optimizers

    dense, embedding = make_optimizers("adam", beta_1=0.5, beta_2=0.75)
    assert (dense.beta_1, dense.beta_2, embedding.beta_1, embedding.beta_2) == (0.5, 0.75, 0.5, 0.75)


def test_the_v3_slurm_example_flags_still_launch(tmp_path):
    """The reference's V3 slurm_multinode.sh command, on small synthetic data and two ranks."""
    v3 = ["--amp", "--tf_gpu_memory_limit_gb", "73", "--columnwise_split", "--data_parallel_bottom_mlp",
          "--embedding_dim", "512", "--bottom_mlp_dims", "512,256,512"]
    result = run_horovod(["main.py", *v3, *SMALL_DATA, "--top_mlp_dims", "16,1", "--max_steps", "2",
                          "--dot_interaction", "tensorflow", "--log_path", str(tmp_path / "l")], np=2, transport="gloo")
    assert_ok(result)
    assert "--columnwise_split (V3): column slicing is decided by --column_slice_threshold" in result.stdout
    assert "--data_parallel_bottom_mlp (V3): the bottom MLP is always data parallel" in result.stdout

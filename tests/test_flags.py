"""main.py flags: every bad value or combination is one error line naming the flag, exit 2, no
traceback, and nothing written. Checks that stop before any work run `main.run` in this process
(its real error path, milliseconds per case); the rest run main.py as a subprocess."""
import pytest
from absl import flags

import main
from multiproc import snapshot
from test_main import SMALL, main_py

FLAGS = flags.FLAGS


def assert_refused(code, stderr, message, root, before):
    """Exit 2, exactly one error line and it holds `message`, no traceback, `root` unchanged."""
    assert code == 2, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], stderr[-3000:]
    assert "Traceback" not in stderr
    assert snapshot(root) == before


def run_in_process(args, capsys):
    """main.run with `args` parsed as main.py's flags; returns (exit code, stderr)."""
    capsys.readouterr()
    FLAGS(["main.py", *args])
    try:
        code = main.run([])
    finally:
        FLAGS.unparse_flags()
    return code, capsys.readouterr().err


def refused_in_process(args, message, tmp_path, capsys):
    """A flag error caught before any work: `main.run` refuses and `tmp_path` stays as it was."""
    before = snapshot(tmp_path)
    code, stderr = run_in_process(SMALL + ["--log_path", str(tmp_path / "log.json")] + args, capsys)
    assert_refused(code, stderr, message, tmp_path, before)


RESTORE = ["--restore_checkpoint_path", "/nonexistent/ckpt"]  # never read: the flags are refused first

BAD_VALUES = [
    (["--global_batch_size", "0"], "--global_batch_size must be >= 1, got 0"),
    (["--early_stop", "-2"], "--early_stop must be >= -1 (<= 0: off), got -2"),
    (["--target_auc", "0"], "--target_auc must be in (0, 1], got 0.0"),
    (["--micro_batches", "0"], "--micro_batches must be >= 1, got 0"),
    (["--learning_rate", "-0.5"], "--learning_rate must be a finite number >= 0, got -0.5"),
    (["--learning_rate", "nan"], "--learning_rate must be a finite number >= 0, got nan"),
    (["--learning_rate", "inf"], "--learning_rate must be a finite number >= 0, got inf"),
    (["--batch_size", "0"], "--batch_size must be >= 1, got 0"),
    (["--valid_batch_size", "0"], "--valid_batch_size must be >= 1, got 0"),
    (["--checkpoint_every_n_steps", "-1"], "--checkpoint_every_n_steps must be >= 0"),
    (["--keep_checkpoints", "0"], "--keep_checkpoints must be >= 1, got 0"),
    (["--loss_scale", "0"], "--loss_scale must be >= 1, got 0"),
    (["--auc_thresholds", "1"], "--auc_thresholds must be >= 2, got 1"),
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--max_steps", "-2"], "--max_steps must be -1 (no limit) or >= 0, got -2"),
    (["--embedding_dim", "0"], "--embedding_dim must be >= 1, got 0"),
    (["--evals_per_epoch", "-1"], "--evals_per_epoch must be >= 0, got -1"),
    (["--print_freq", "0"], "--print_freq must be a whole number of steps >= 1, got 0.0"),
    (["--print_freq", "2.5"], "--print_freq must be a whole number of steps >= 1, got 2.5"),
    (["--warmup_steps", "-1"], "--warmup_steps must be >= 0, got -1"),
    (["--decay_start_step", "-1"], "--decay_start_step must be >= 0, got -1"),
    (["--decay_steps", "-1"], "--decay_steps must be >= 0, got -1"),
    (["--profiler_start_step", "-1"], "--profiler_start_step must be >= 0, got -1"),
    (["--profiled_rank", "-1"], "--profiled_rank must be >= 0, got -1"),
    (["--inter_op_parallelism", "-1"], "--inter_op_parallelism must be >= 0"),
    (["--intra_op_parallelism", "-1"], "--intra_op_parallelism must be >= 0"),
    (["--tf_gpu_memory_limit_gb", "-1"], "--tf_gpu_memory_limit_gb must be >= 0, got -1"),
    (["--synthetic_dataset_train_batches", "0"], "--synthetic_dataset_train_batches must be >= 1, got 0"),
    (["--synthetic_dataset_valid_batches", "0"], "--synthetic_dataset_valid_batches must be >= 1, got 0"),
    (["--synthetic_dataset_num_numerical_features", "0"], "--synthetic_dataset_num_numerical_features must be >= 1"),
    (["--column_slice_threshold", "0"], "--column_slice_threshold must be >= 1"),
    (["--data_parallel_threshold", "-1"], "--data_parallel_threshold must be >= 0"),
    (["--row_slice_threshold", "0"], "--row_slice_threshold must be >= 1 (elements), got 0"),
    (["--seed", "-1"], "--seed must be in [0, 2**32), got -1"),
    (["--top_mlp_dims", "16,x"], "--top_mlp_dims must be a comma-separated list of integers, got 16,x"),
    (["--synthetic_dataset_cardinalities", "50,0"], "--synthetic_dataset_cardinalities needs positive integers"),
    (["--num_cross_layers", "0"], "--num_cross_layers must be >= 1, got 0"),
    (["--cross_layer_projection_dim", "-1"], "--cross_layer_projection_dim must be >= 0 (0: full rank), got -1"),
    (["--beta1", "1"], "--beta1 must be in [0, 1), got 1.0"),
    (["--beta2", "-0.1"], "--beta2 must be in [0, 1), got -0.1"),
    (["--cpu_offloading_threshold_gb", "-1"], "--cpu_offloading_threshold_gb must be >= 0, got -1"),
    (["--plan_link_gbps", "0", "--print_sharding_plan"], "--plan_link_gbps must be a finite number > 0, got 0.0"),
    (["--plan_intra_host_gbps", "inf"], "--plan_intra_host_gbps must be a finite number > 0, got inf"),
    (["--plan_latency_us", "-1"], "--plan_latency_us must be a finite number >= 0, got -1.0"),
    (["--plan_compute_ms", "nan"], "--plan_compute_ms must be a finite number >= 0, got nan"),
    (["--embedding_dim", "8,x"], "--embedding_dim must be an integer, a comma list of integers or a JSON file"),
    (["--embedding_dim", "/nonexistent/dims.json"], "--embedding_dim /nonexistent/dims.json: cannot read a JSON"),
]

BAD_COMBINATIONS = [
    (["--max_steps", "0"], "--max_steps 0 trains nothing"),
    (["--profiler_start_step", "5"], "--profiled_rank 1 does not exist in a 1-process run"),
    (["--mode", "eval"], "--mode eval needs trained weights: give --restore_checkpoint_path or "
                         "--saved_model_input_path"),
    (["--mode", "inference"], "--mode inference needs trained weights"),
    (["--mode", "deploy", "--saved_model_output_path", "/nonexistent/out"],
     "--mode deploy needs trained weights: give --restore_checkpoint_path (random"),
    (["--mode", "deploy"] + RESTORE, "--mode deploy needs --saved_model_output_path"),
    (["--mode", "eval", "--save_checkpoint_path", "/nonexistent/c"] + RESTORE,
     "--save_checkpoint_path is written by --mode train only, not --mode eval"),
    (["--mode", "eval", "--tensorboard_dir", "/nonexistent/tb"] + RESTORE,
     "--tensorboard_dir is written by --mode train only, not --mode eval"),
    (["--mode", "inference", "--saved_model_output_path", "/nonexistent/s"] + RESTORE,
     "--saved_model_output_path is written by --mode train or deploy only, not --mode inference"),
    (["--amp", "--fp16"], "--amp and --fp16 are mutually exclusive"),
    (["--cpu_offloading_threshold_gb", "4", "--tf_gpu_memory_limit_gb", "4"],
     "--cpu_offloading_threshold_gb (V5) and --tf_gpu_memory_limit_gb set the same embedding budget"),
    (["--embedding_dim", "16,16,16,8", "--synthetic_dataset_cardinalities", "50,20,7,30",
      "--bottom_mlp_dims", "16"], "the dot interaction needs every table of one width"),
    (["--interaction", "dot_custom_cuda", "--cpu"], "--dot_interaction custom_cuda: no GPU is visible"),
    (["--fp16"], "--fp16 is for inference and export only"),
    (["--micro_batches", "3"], "--micro_batches 3 on 1 rank(s) needs --batch_size divisible by 3"),
    (["--dot_interaction", "custom_cuda", "--cpu"], "--dot_interaction custom_cuda: no GPU is visible (with --cpu"),
    (["--dataset_type", "tf_raw"], "--dataset_path is required with --dataset_type tf_raw"),
    (["--synthetic_dataset_use_feature_spec"], "--synthetic_dataset_use_feature_spec needs --dataset_path"),
    (["--checkpoint_every_n_steps", "2"], "--checkpoint_every_n_steps needs --save_checkpoint_path"),
    (RESTORE + ["--saved_model_input_path", "/nonexistent/s"],
     "--restore_checkpoint_path and --saved_model_input_path cannot be used together"),
    (["--saved_model_input_path", "/nonexistent/s"], "--saved_model_input_path serves eval and inference only"),
    (["--plan_link_gbps", "10"], "--plan_link_gbps needs --print_sharding_plan"),
    (["--print_sharding_plan", "--plan_compute_ms", "3"], "--plan_compute_ms needs --plan_link_gbps"),
]


@pytest.mark.parametrize("args, message", BAD_VALUES + BAD_COMBINATIONS,
                         ids=[" ".join(a) for a, _ in BAD_VALUES + BAD_COMBINATIONS])
def test_bad_flag_is_one_error_line_before_any_work(tmp_path, capsys, args, message):
    refused_in_process(args, message, tmp_path, capsys)


def test_a_bad_peer_timeout_is_one_error_line_before_any_work(tmp_path, capsys, monkeypatch):
    """DLRM_PEER_TIMEOUT (the peer watch's patience, read once by the run shell) is input like a flag."""
    monkeypatch.setenv("DLRM_PEER_TIMEOUT", "soon")
    refused_in_process([], "DLRM_PEER_TIMEOUT='soon': expected the seconds a silent peer is waited for (a number "
                           ">= 0; 0 turns the peer watch off)", tmp_path, capsys)


BAD_WIDTHS = [  # SMALL has 4 tables and the dot interaction on a bottom MLP ending in 8
    (["--embedding_dim", "8,8,8"], "--embedding_dim lists 3 widths for 4 tables"),
    (["--embedding_dim", "8,0,8,8"], "--embedding_dim must be >= 1, got 8,0,8,8"),
    (["--embedding_dim", "8,8,8,16"], "the dot interaction needs every table of one width equal to the last "
                                      "--bottom_mlp_dims entry (8), got --embedding_dim 8,8,8,16"),
    (["--embedding_dim", "16"], "got --embedding_dim 16; use --interaction cross for mixed widths"),
]


@pytest.mark.parametrize("args, message", BAD_WIDTHS, ids=[" ".join(a) for a, _ in BAD_WIDTHS])
def test_bad_widths_are_refused_before_any_plan_or_pipeline(tmp_path, capsys, monkeypatch, args, message):
    """--embedding_dim's rules are checked once, as soon as the feature spec gives the number of
    tables: the run stops with the one error line before the sharding plan or a pipeline is made."""
    def never(*_):
        raise AssertionError("a plan or a pipeline was built before --embedding_dim was checked")

    monkeypatch.setattr(main, "sharding_plan", never)
    monkeypatch.setattr(main, "build_pipelines", never)
    refused_in_process(args, message, tmp_path, capsys)


def test_every_numeric_flag_is_range_checked():
    numeric = {flag.name for flag in FLAGS.get_flags_for_module(main) if flag.flag_type() in ("int", "float")}
    checked = {name for name, _, _ in main.NUMERIC_FLAGS}
    assert numeric == checked
    tested = {args[0][2:] for args, _ in BAD_VALUES}
    assert checked <= tested


def test_dist_strategy_offers_exactly_the_planner_strategies():
    from recsys.sparse.sharding import STRATEGIES

    assert sorted(FLAGS["dist_strategy"].parser.enum_values) == sorted(STRATEGIES)
    with pytest.raises(flags.IllegalFlagValueError, match="--dist_strategy=round_robin: value should be one of"):
        FLAGS(["main.py", "--dist_strategy", "round_robin"])
    FLAGS.unparse_flags()


@pytest.mark.parametrize("args", [
    ["--learning_rate", "0", "--evals_per_epoch", "0", "--warmup_steps", "0", "--decay_steps", "0"],
    ["--max_steps", "-1", "--print_freq", "1.0", "--inter_op_parallelism", "0", "--intra_op_parallelism", "0"],
    ["--max_steps", "0", "--save_checkpoint_path", "/nonexistent/c"],
    ["--profiler_start_step", "0", "--profiled_rank", "0", "--seed", str(2 ** 32 - 1)],
    ["--mode", "eval", "--restore_checkpoint_path", "/nonexistent/c", "--max_steps", "0"],
    ["--mode", "inference", "--saved_model_input_path", "/nonexistent/s"],
], ids=lambda a: " ".join(a))
def test_boundary_values_are_accepted(args):
    FLAGS(["main.py", *SMALL, *args])
    try:
        main.validate_flags(FLAGS, world_size=1)
    finally:
        FLAGS.unparse_flags()


@pytest.mark.parametrize("args, message", [
    (["--print_freq", "2.5"], "--print_freq must be a whole number of steps >= 1, got 2.5"),
    (["--bottom_mlp_dims", "16,4"], "--embedding_dim"),
    (["--restore_checkpoint_path", "/nonexistent/ckpt"], "/nonexistent/ckpt: no checkpoint found"),
], ids=["validated", "model config", "restore"])
def test_main_py_exits_2_with_one_error_line(tmp_path, args, message):
    before = snapshot(tmp_path)
    result = main_py(SMALL + args + ["--log_path", str(tmp_path / "log.json")], timeout=180)
    assert_refused(result.returncode, result.stderr, message, tmp_path, before)


@pytest.mark.parametrize("program, defaults", [("main.py", {"print_freq": "'1000.0'", "optimizer": "'sgd'"}),
                                               ("dlrm.py", {"print_freq": "'100.0'", "optimizer": "'sgd'"}),
                                               ("dcnv2.py", {"print_freq": "'100.0'", "optimizer": "'adam'"})])
def test_help_lists_every_flag_in_the_groups(program, defaults):
    """--help (not only --helpfull) shows every project flag once, in main.FLAG_GROUPS' sections and
    order, with the entry point's own defaults (V3's print_freq 1000 in main.py, V5's 100)."""
    import re

    from multiproc import run_python

    result = run_python([program, "--help"], timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    shown = re.findall(r"^  --(?:\[no\])?(\w+):", out, re.M)
    names = [flag.name for flag in main.project_flags()]
    assert sorted(shown) == sorted(names) and len(shown) == len(set(shown))
    titles = [title for title, _ in main.FLAG_GROUPS]
    positions = [out.index(f"\n{title}:\n") for title in titles]
    assert positions == sorted(positions)
    sections = dict(zip(titles, out.split("\n\n")[-len(titles) - 1:-1]))  # help_text's layout: one block each
    for title, members in main.FLAG_GROUPS:
        assert re.findall(r"^  --(?:\[no\])?(\w+):", sections[title], re.M) == list(members)
    for name, value in defaults.items():
        assert re.search(rf"^  --{name}: [^\n]*\n(?:    [^\n]*\n)*?    \(default: {re.escape(value)}\)$", out, re.M)


@pytest.mark.parametrize("flag, device_bytes", [("--cpu_offloading_threshold_gb", 3 * 10**9),  # V5: GB
                                                ("--tf_gpu_memory_limit_gb", 3 << 30)])  # V3: GiB
def test_the_embedding_budget_flags_keep_their_versions_units(flag, device_bytes):
    FLAGS(["main.py", flag, "3"])
    try:
        assert main.memory_budget(main.config_from_flags(FLAGS), 0).device_bytes == device_bytes
    finally:
        FLAGS.unparse_flags()


# main.py's functions that may read the flags: their application, validation and --help, and the one
# building the run's configuration (config_from_flags); every other function takes the configuration.
FLAG_READERS = {"apply_preset", "sok_alias_targets", "apply_sok_aliases", "announce_sok_aliases", "_check_values",
                "validate_flags", "config_from_flags", "settings_from_flags", "run", "run_job", "project_flags",
                "main"}


def flag_reading_functions(source: str) -> set:
    """The functions of `source` (nested ones and lambdas included) that name FLAGS or take the
    flags as `opts` (main.py's name for FLAGS passed in)."""
    import ast

    readers = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            takes_opts = any(arg.arg == "opts" for arg in node.args.args + node.args.kwonlyargs)
            if takes_opts or any(isinstance(name, ast.Name) and name.id == "FLAGS" for name in ast.walk(node)):
                readers.add(getattr(node, "name", "<lambda>"))
    return readers


def test_only_the_entry_points_flag_functions_read_flags():
    """After config_from_flags nothing in main.py reads FLAGS: the job runs on the configuration."""
    from pathlib import Path

    source = Path(main.__file__).read_text()
    assert flag_reading_functions(source) == FLAG_READERS
    # The check sees a stray read, and a function handed the flags instead of the configuration.
    leaked = source.replace("def run_eval(job: Job) -> None:\n", "def run_eval(job: Job) -> None:\n    FLAGS.mode\n")
    assert flag_reading_functions(leaked) - FLAG_READERS == {"run_eval"}
    handed = source.replace("def check_output_paths(config: JobConfig)", "def check_output_paths(opts: Any)")
    assert flag_reading_functions(handed) - FLAG_READERS == {"check_output_paths"}

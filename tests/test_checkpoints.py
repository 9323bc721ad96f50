"""Checkpoints never lose data and are never silently wrong: lineage-aware pruning, the save-folder
check before training, manifest and value validation on restore, no partial output on failure.

Most cases call checkpoint.py directly on a tiny in-process TrainingState; the end-to-end cases run
main.py and check the exit code, the one error line, no traceback and the untouched file system.
"""
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from recsys.training import checkpoint
from recsys.training.checkpoint import CheckpointError
from recsys.sparse.tables import CHUNK_BYTES, TableSlice
from multiproc import REPO_ROOT, assert_ok, assert_one_error, launch_env, snapshot
from recsys.runtime.safe_io import OutputPathError
from test_main import SMALL, main_py

CONFIG = {"embedding_dim": 4, "optimizer": "sgd"}
NAMES = ["cat_0", "cat_1"]


def tiny_state(seed=0, step=5, rows=(50, 20), table_dtype=np.float32):
    """Two tables, one dense weight and the step counter: a TrainingState without a model."""
    rng = np.random.default_rng(seed)
    tables = [TableSlice(tf.Variable(rng.random((n, 4)).astype(table_dtype)), 0, n) for n in rows]
    return checkpoint.TrainingState(
        model_config=dict(CONFIG), feature_names=list(NAMES), tables=tables, table_slots=[{} for _ in rows],
        dense={"w": tf.Variable(rng.random((3, 2)).astype(np.float32))}, dense_slots={},
        counters={checkpoint.STEP_COUNTER: tf.Variable(step, dtype=tf.int64)})


def write(root, step, lineage, state=None):
    """A checkpoint at `step` (nothing pruned)."""
    return checkpoint.save(str(root), step, state or tiny_state(step=step), lineage, keep=0)


def edit_manifest(path, change):
    """Apply `change` to the manifest in place (its return value is ignored)."""
    manifest_path = os.path.join(str(path), checkpoint.MANIFEST)
    with open(manifest_path) as f:
        manifest = json.load(f)
    change(manifest)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


def make_legacy(path):
    """What a checkpoint written before lineages (and file dtypes/shapes) were recorded looks like."""
    def strip(manifest):
        del manifest["lineage"]
        for entry in manifest["files"]:
            del entry["dtype"], entry["shape"]
    edit_manifest(path, strip)


def replace_array(path, relative, array):
    """Overwrite one array file and re-record its size and checksum: a consistent but wrong checkpoint."""
    file_path = os.path.join(str(path), relative)
    np.save(file_path, array, allow_pickle=True)

    def record(manifest):
        for entry in manifest["files"]:
            if entry["file"] == relative:
                entry["bytes"] = os.path.getsize(file_path)
                entry["sha256"] = hashlib.sha256(open(file_path, "rb").read()).hexdigest()
                entry.pop("dtype", None)
                entry.pop("shape", None)
    edit_manifest(path, record)


def steps_in(root):
    return [(int(os.path.basename(p)[5:]), checkpoint.read_manifest(p).lineage)
            for p in checkpoint.list_checkpoints(str(root))]


# ---- pruning and overwriting ----

def test_pruning_removes_only_older_checkpoints_of_this_lineage(tmp_path):
    root = tmp_path / "ckpt"
    make_legacy(write(root, 1, "old"))
    write(root, 2, "other")
    write(root, 100, "other")  # a longer run: used to make keep-last-K delete the new checkpoint
    write(root, 7, "mine")  # this lineage's future, e.g. of an abandoned branch
    (root / ".step_000000009.tmp-999999" / "embeddings").mkdir(parents=True)  # a dead writer's leftover
    for step in (3, 4, 5):
        checkpoint.save(str(root), step, tiny_state(step=step), "mine", keep=2)
    assert steps_in(root) == [(1, None), (2, "other"), (4, "mine"), (5, "mine"), (7, "mine"), (100, "other")]
    checkpoint.save(str(root), 6, tiny_state(step=6), "mine", keep=1)
    assert steps_in(root) == [(1, None), (2, "other"), (6, "mine"), (7, "mine"), (100, "other")]
    assert (root / ".step_000000009.tmp-999999").is_dir()
    assert checkpoint.resolve(str(root)).endswith("step_000000100")


def test_save_never_overwrites_another_lineage_and_replaces_its_own_whole(tmp_path):
    root = tmp_path / "ckpt"
    write(root, 3, "other")
    make_legacy(write(root, 4, "old"))
    (root / "step_000000005").mkdir()  # made by hand: no manifest
    before = snapshot(root)
    for step, reason in ((3, "belongs to another run"), (4, "belongs to another run"),
                         (5, "is not a readable checkpoint")):
        final = root / f"step_{step:09d}"
        with pytest.raises(CheckpointError, match=f"^{re.escape(str(final))} already exists and {reason}"):
            checkpoint.save(str(root), step, tiny_state(step=step), "mine")
    assert snapshot(root) == before
    write(root, 6, "mine", tiny_state(seed=1, step=6))
    write(root, 6, "mine", tiny_state(seed=2, step=6))
    restored = tiny_state(seed=3)
    checkpoint.restore(checkpoint.open_checkpoint(str(root / "step_000000006")), restored)
    np.testing.assert_array_equal(restored.tables[0].variable.numpy(), tiny_state(seed=2).tables[0].variable.numpy())
    assert sorted(os.listdir(root)) == ["step_000000003", "step_000000004", "step_000000005", "step_000000006"]


def test_writer_failure_leaves_no_partial_output(tmp_path):
    root = tmp_path / "ckpt"
    write(root, 1, "mine")
    before = snapshot(root)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (500, limit[1]))  # the first table (928 bytes) cannot be written
    try:
        with pytest.raises(CheckpointError, match=f"^{re.escape(str(root / 'step_000000002'))}: cannot write "
                                                  f"the checkpoint: .*File too large"):
            checkpoint.save(str(root), 2, tiny_state(step=2), "mine")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert snapshot(root) == before
    bad = tiny_state(step=2)
    bad.tables[1].variable[3, 1].assign(float("inf"))
    with pytest.raises(CheckpointError, match=re.escape(f"{root / 'step_000000002' / 'embeddings/feature_1.npy'}: "
                                                       f"holds NaN or Inf values (rows 0-19)")):
        checkpoint.save(str(root), 2, bad, "mine")
    assert snapshot(root) == before


# ---- the save folder, checked before training ----

def _foreign_model(root):
    write(root, 3, "other", tiny_state(step=3))
    edit_manifest(root / "step_000000003", lambda m: m["model_config"].update(embedding_dim=8))


def _foreign_features(root):
    write(root, 3, "other", tiny_state(step=3))
    edit_manifest(root / "step_000000003", lambda m: m.update(feature_names=["cat_1", "cat_0"]))


def _unreadable(root):
    write(root, 3, "mine")
    (root / "step_000000003" / checkpoint.MANIFEST).write_text('{"step": ')


@pytest.mark.parametrize("prepare, resumed_from, message", [
    (_foreign_model, None, "holds checkpoints of another model (step_000000003: embedding_dim: checkpoint 8, current 4); "
                           "choose an empty folder"),
    (_foreign_features, None, "holds checkpoints of another model (step_000000003: feature order: checkpoint "
                              "['cat_1', 'cat_0'], current ['cat_0', 'cat_1'])"),
    (lambda root: write(root, 3, "other"), None, "holds checkpoints of another run (step_000000003); resume with "
                                                 "--restore_checkpoint_path {root}, or choose an empty folder"),
    (lambda root: make_legacy(write(root, 3, "old")), None, "holds checkpoints of another run (step_000000003)"),
    (_unreadable, None, "holds an unreadable checkpoint ({root}/step_000000003/manifest.json: cannot read"),
    # Resumed elsewhere at step 5: this lineage's step 9 here would pass for the run's newest checkpoint.
    (lambda root: [write(root, s, "mine") for s in (2, 9)], "elsewhere",
     "holds step_000000009, newer than the restored step 5; it would be mistaken for this run's newest "
     "checkpoint: move it away or choose an empty folder"),
    (lambda root: [write(root, s, "mine") for s in (5, 9)], "here", "holds step_000000009, newer than the restored step 5"),
    (lambda root: [write(root, 5, "mine"), write(root, 7, "other")], "here", "holds step_000000007, newer than the"),
])
def test_save_folder_refusals(tmp_path, prepare, resumed_from, message):
    root = tmp_path / "ckpt"
    prepare(root)
    resumed = None
    if resumed_from == "here":
        resumed = checkpoint.read_manifest(str(root / "step_000000005"))
    elif resumed_from == "elsewhere":
        resumed = checkpoint.read_manifest(write(tmp_path / "elsewhere", 5, "mine"))
    before = snapshot(tmp_path)
    lineage = checkpoint.run_lineage(resumed)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.check_save_folder(str(root), CONFIG, NAMES, lineage, resumed, "--save_checkpoint_path")
    text = str(raised.value)
    assert text.startswith(f"--save_checkpoint_path {root} ") and message.format(root=root) in text
    assert "\n" not in text and snapshot(tmp_path) == before


def test_save_folder_acceptances_write_nothing(tmp_path):
    def check(root, resumed=None):
        before = snapshot(tmp_path)
        checkpoint.check_save_folder(str(root), CONFIG, NAMES, checkpoint.run_lineage(resumed), resumed, "--s")
        assert snapshot(tmp_path) == before

    check(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()
    stale = tmp_path / "stale"
    (stale / ".step_000000004.tmp-999999" / "embeddings").mkdir(parents=True)
    (stale / ".tmp-step_000000004-999").mkdir()  # the older temporary name
    check(stale)
    # Resuming in place: older checkpoints of other models, runs and formats stay, unpruned.
    here = tmp_path / "here"
    _foreign_model(here)
    make_legacy(write(here, 4, "old"))
    write(here, 6, "mine")
    check(here, checkpoint.open_checkpoint(str(here)))
    # Resuming elsewhere into a folder holding only the restored checkpoint's ancestors.
    ancestors = tmp_path / "ancestors"
    write(ancestors, 2, "mine")
    check(ancestors, checkpoint.read_manifest(write(tmp_path / "elsewhere", 5, "mine")))


def test_save_folder_that_is_a_file_or_a_checkpoint_is_refused(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OutputPathError, match=re.escape(f"--s {a_file} exists and is not a directory")):
        checkpoint.check_save_folder(str(a_file), CONFIG, NAMES, "mine", None, "--s")
    step_dir = write(tmp_path / "ckpt", 3, "mine")
    with pytest.raises(CheckpointError, match=re.escape(f"--s {step_dir} is itself a checkpoint")):
        checkpoint.check_save_folder(step_dir, CONFIG, NAMES, "mine", None, "--s")


# ---- restore validation ----

def _set(field, value):
    return lambda m: m.update({field: value})


def _set_entry(field, value):
    return lambda m: m["files"][0].update({field: value})


def _drop_entry_field(field):
    return lambda m: m["files"][0].pop(field)


@pytest.mark.parametrize("change, message", [
    (_set("format_version", 2), "format_version 2, this code reads 1"),
    (lambda m: m.pop("files"), "the field 'files' is missing"),
    (lambda m: m.pop("step"), "the field 'step' is missing"),
    (_set("step", -1), "step must be a non-negative integer, got -1"),
    (_set("step", "5"), "step must be a non-negative integer, got '5'"),
    (_set("step", True), "step must be a non-negative integer, got True"),
    (_set("lineage", 7), "lineage must be a non-empty string, got 7"),
    (_set("model_config", [4]), "model_config must be an object"),
    (_set("feature_names", [0, 1]), "feature_names must be a list of strings"),
    (_set("files", {"a": 1}), "files must be a list, got dict"),
    (lambda m: m["files"].insert(0, "x"), "files[0] must be an object, got 'x'"),
    (_drop_entry_field("sha256"), "files[0] lacks the field 'sha256'"),
    (_set_entry("file", "../../etc/passwd"), "files[0].file must be a relative path inside the checkpoint"),
    (_set_entry("bytes", "928"), "files[0].bytes must be a non-negative integer, got '928'"),
    (_set_entry("sha256", "abc"), "files[0].sha256 must be 64 lowercase hex digits"),
    (_set_entry("dtype", "nonsense"), "files[0].dtype is not a numpy dtype: 'nonsense'"),
    (_set_entry("shape", [50, "4"]), "files[0].shape must be a list of non-negative integers"),
    (lambda m: m["files"].append(dict(m["files"][0])), "repeats 'embeddings/feature_0.npy'"),
])
def test_hand_edited_manifest_is_refused_naming_field_and_file(tmp_path, change, message):
    path = write(tmp_path / "ckpt", 5, "mine")
    edit_manifest(path, change)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.restore(checkpoint.open_checkpoint(str(tmp_path / "ckpt")), tiny_state(seed=1))
    text = str(raised.value)
    assert text.startswith(os.path.join(path, checkpoint.MANIFEST)) and message in text and "\n" not in text
    assert snapshot(tmp_path) == before


def test_unparsable_or_missing_entries_are_refused(tmp_path):
    path = write(tmp_path / "ckpt", 5, "mine")
    manifest_path = os.path.join(path, checkpoint.MANIFEST)
    text = open(manifest_path).read()
    open(manifest_path, "w").write("[1, 2]")
    with pytest.raises(CheckpointError, match=f"^{re.escape(manifest_path)}: the manifest must be a JSON object"):
        checkpoint.open_checkpoint(path)
    open(manifest_path, "w").write(text)
    edit_manifest(path, lambda m: m.update(files=[e for e in m["files"] if e["file"] != "dense/w.npy"]))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(path)}: the checkpoint lacks \['dense/w.npy'\]"):
        checkpoint.restore(checkpoint.open_checkpoint(path), tiny_state(seed=1))
    open(manifest_path, "w").write(text[:len(text) // 2])
    with pytest.raises(CheckpointError, match=f"^{re.escape(manifest_path)}: cannot read the checkpoint manifest: "):
        checkpoint.open_checkpoint(path)


@pytest.mark.parametrize("relative, array, message", [
    ("embeddings/feature_0.npy", np.zeros((50, 4), np.int32), "dtype int32, the model expects floating point"),
    ("embeddings/feature_0.npy", np.zeros((49, 4), np.float32), "shape (49, 4), the model expects (50, 4)"),
    ("embeddings/feature_0.npy", np.array([None] * 4, dtype=object), "dtype object, the model expects floating"),
    ("dense/w.npy", np.array([[1, 2], [3, np.inf], [5, 6]], np.float32), "holds NaN or Inf values"),
    ("state/lr_schedule_step.npy", np.array(-1, np.int64), "counter value -1 is outside [0, "),
    ("state/lr_schedule_step.npy", np.array(5.0), "dtype float64, the model expects integers"),
    ("state/lr_schedule_step.npy", np.array(4, np.int64), "holds step 4, the manifest's step is 5"),
])
def test_restore_checks_every_value(tmp_path, relative, array, message):
    path = write(tmp_path / "ckpt", 5, "mine")
    replace_array(path, relative, array)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.restore(checkpoint.open_checkpoint(path), tiny_state(seed=1))
    assert str(raised.value).startswith(os.path.join(path, relative)) and message in str(raised.value)


def test_restore_checks_sizes_headers_and_checksums(tmp_path):
    path = write(tmp_path / "ckpt", 5, "mine")
    table = os.path.join(path, "embeddings/feature_1.npy")
    data = open(table, "rb").read()
    cases = [(lambda: edit_manifest(path, _set_entry("dtype", "<f8")), "dtype float32, the manifest records float64"),
             (lambda: edit_manifest(path, _set_entry("shape", [5, 40])), "shape (50, 4), the manifest records (5, 40)"),
             (lambda: open(table, "wb").write(data[:-4]), "missing or truncated (the manifest records 448 bytes)"),
             (lambda: open(table, "wb").write(data[:-1] + bytes([data[-1] ^ 0xFF])), "checksum mismatch, the file is damaged")]
    text = open(os.path.join(path, checkpoint.MANIFEST)).read()
    for damage, message in cases:
        damage()
        with pytest.raises(CheckpointError, match=r"embeddings/feature_\d.npy: " + re.escape(message)):
            checkpoint.restore(checkpoint.open_checkpoint(path), tiny_state(seed=1))
        open(os.path.join(path, checkpoint.MANIFEST), "w").write(text)
        open(table, "wb").write(data)
    replace_array(path, "embeddings/feature_1.npy", np.zeros((20, 4), np.float32))
    edit_manifest(path, lambda m: [e.update(bytes=e["bytes"] - 16) for e in m["files"] if e["file"].endswith("e_1.npy")])
    open(table, "ab").truncate(os.path.getsize(table) - 16)  # size and manifest agree, the header does not
    with pytest.raises(CheckpointError, match="feature_1.npy: 432 bytes do not hold a float32 array of shape"):
        checkpoint.restore(checkpoint.open_checkpoint(path), tiny_state(seed=1), verify_checksums=False)


def test_non_finite_table_value_is_found_in_its_row_chunk(tmp_path):
    chunk_rows = CHUNK_BYTES // (4 * 4)
    rows = chunk_rows + 1000
    path = write(tmp_path / "ckpt", 5, "mine", tiny_state(step=5, rows=(rows, 20)))
    table = np.load(os.path.join(path, "embeddings/feature_0.npy"), mmap_mode="r+")
    table[rows - 1, 2] = np.nan  # in the second row chunk
    table.flush()
    del table
    with pytest.raises(CheckpointError, match=rf"feature_0.npy: holds NaN or Inf values \(rows {chunk_rows}-{rows - 1}\)"):
        checkpoint.restore(checkpoint.open_checkpoint(path), tiny_state(seed=1, rows=(rows, 20)), verify_checksums=False)


def test_narrowing_to_float16_must_not_overflow_and_legacy_checkpoints_restore(tmp_path):
    path = write(tmp_path / "ckpt", 5, "mine")
    make_legacy(path)
    restored = tiny_state(seed=1, table_dtype=np.float16)
    assert checkpoint.restore(checkpoint.open_checkpoint(path), restored) == 5
    np.testing.assert_allclose(restored.tables[0].variable.numpy(), tiny_state().tables[0].variable.numpy(), rtol=1e-3)
    replace_array(path, "embeddings/feature_0.npy", np.full((50, 4), 1e5, np.float32))
    with pytest.raises(CheckpointError, match="feature_0.npy: values overflow float16"):
        checkpoint.restore(checkpoint.open_checkpoint(path), tiny_state(seed=1, table_dtype=np.float16))


@pytest.mark.parametrize("step, total, max_steps, refused", [
    (5, 24, -1, False), (24, 24, -1, True), (30, 24, -1, True), (10, 24, 12, False), (10, 24, 8, True),
    (10, 24, 10, False),  # --max_steps naming the checkpoint's step: an explicit re-save
    (24, 24, 30, True), (30, 24, 30, False),
])
def test_nothing_left_to_train_is_an_error_unless_asked(tmp_path, step, total, max_steps, refused):
    manifest = checkpoint.read_manifest(write(tmp_path / "ckpt", step, "mine"))
    if not refused:
        checkpoint.check_resume_step(manifest, total, max_steps)
        return
    with pytest.raises(CheckpointError, match=re.escape(f"{manifest.path}: the checkpoint is at step {step}, at or "
                                                       f"beyond the end of training (--max_steps {max_steps}, ")):
        checkpoint.check_resume_step(manifest, total, max_steps)


# ---- end to end through main.py ----

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A SMALL run's checkpoints at steps 3 and 6 (read only: tests copy it)."""
    root = tmp_path_factory.mktemp("trained") / "ckpt"
    assert_ok(main_py(SMALL + ["--max_steps", "6", "--checkpoint_every_n_steps", "3", "--save_checkpoint_path",
                               str(root), "--log_path", str(root.parent / "log.json")]))
    return root


def test_fresh_run_into_a_used_folder_is_refused_and_resuming_in_place_prunes_only_its_lineage(tmp_path, trained):
    root = tmp_path / "ckpt"
    shutil.copytree(trained, root)
    before = snapshot(root)
    result = main_py(SMALL + ["--save_checkpoint_path", str(root), "--log_path", str(tmp_path / "logs" / "1.json")])
    assert_one_error(result, f"--save_checkpoint_path {root} holds checkpoints of another run (step_000000003); "
                                  f"resume with --restore_checkpoint_path {root}, or choose an empty folder", code=2)
    assert "checkpoint saved" not in result.stdout
    assert snapshot(root) == before
    lineage = checkpoint.read_manifest(str(root / "step_000000006")).lineage
    make_legacy(write(root, 1, "old"))  # another model's pre-lineage checkpoint: never pruned
    assert_ok(main_py(SMALL + ["--restore_checkpoint_path", str(root), "--save_checkpoint_path", str(root),
                               "--checkpoint_every_n_steps", "3", "--keep_checkpoints", "2", "--max_steps", "12",
                               "--log_path", str(tmp_path / "logs" / "2.json")]))
    assert steps_in(root) == [(1, None), (9, lineage), (12, lineage)]


def test_save_folder_of_another_model_is_refused_unless_resumed_from(tmp_path):
    root = tmp_path / "ckpt"
    write(root, 3, "other")
    before = snapshot(root)
    result = main_py(SMALL + ["--save_checkpoint_path", str(root), "--log_path", str(tmp_path / "1.json")])
    assert_one_error(result, f"--save_checkpoint_path {root} holds checkpoints of another model (step_000000003: ",
                          ": checkpoint ", ", current ", code=2)
    assert snapshot(root) == before
    result = main_py(SMALL + ["--restore_checkpoint_path", str(root), "--save_checkpoint_path", str(root),
                              "--log_path", str(tmp_path / "2.json")])
    assert_one_error(result, f"{root / 'step_000000003'}: the checkpoint was written for a different model: ", code=2)
    assert snapshot(root) == before


def test_resuming_past_max_steps_and_a_bad_manifest_are_one_line_errors(tmp_path, trained):
    root = tmp_path / "ckpt"
    shutil.copytree(trained, root)
    edit_manifest(root / "step_000000003", _set("step", "three"))
    before = snapshot(root)
    result = main_py(SMALL + ["--restore_checkpoint_path", str(root), "--max_steps", "4", "--save_checkpoint_path",
                              str(tmp_path / "out"), "--log_path", str(tmp_path / "logs" / "1.json")])
    assert_one_error(result, f"{root / 'step_000000006'}: the checkpoint is at step 6, at or beyond the end of "
                                  f"training (--max_steps 4, ", "pass --max_steps 6 to re-save it", code=2)
    result = main_py(SMALL + ["--mode", "eval", "--restore_checkpoint_path", str(root / "step_000000003"),
                              "--log_path", str(tmp_path / "logs" / "2.json")])
    assert_one_error(result, f"{root / 'step_000000003' / 'manifest.json'}: step must be a non-negative "
                                  f"integer, got 'three'", code=2)
    assert snapshot(root) == before and not (tmp_path / "out").exists()


def test_resuming_with_another_batch_size_is_refused(tmp_path, trained):
    """The step counts batches of the checkpoint's --batch_size: resumed at another, the schedule and
    the data position would be read in the wrong unit (W&D's --global_batch_size answers the same)."""
    root = tmp_path / "ckpt"
    shutil.copytree(trained, root)
    before = snapshot(root)
    result = main_py(SMALL + ["--batch_size", "128", "--restore_checkpoint_path", str(root), "--save_checkpoint_path",
                              str(tmp_path / "out"), "--log_path", str(tmp_path / "log.json")])
    assert_one_error(result, f"--batch_size 128 differs from the 64 of the checkpoint {root / 'step_000000006'}",
                     "resume with --batch_size 64", code=2)
    assert snapshot(root) == before and not (tmp_path / "out").exists() and not (tmp_path / "log.json").exists()


def test_full_disk_during_save_leaves_nothing_behind(tmp_path):
    root = tmp_path / "ckpt"
    args = [a if a != "50,20,7,30" else "8000,20,7,30" for a in SMALL]  # a 256 KB table

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    result = subprocess.run([sys.executable, "main.py", *args, "--max_steps", "2", "--save_checkpoint_path", str(root),
                             "--log_path", str(tmp_path / "log.json")], cwd=REPO_ROOT,
                            # PMIx's default shared-memory store writes files above the limit at MPI init.
                            env=launch_env({"PYTHONDONTWRITEBYTECODE": "1", "PMIX_MCA_gds": "hash"}),
                            capture_output=True, text=True,
                            timeout=300, preexec_fn=limit_file_size)
    assert_one_error(result, f"{root / 'step_000000002'}: cannot write the checkpoint: [Errno 27] File too large", code=2)
    assert not root.exists() or os.listdir(root) == []

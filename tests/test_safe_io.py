"""safe_io: overlap refusal, output-path checks and atomic writers leave nothing half-written."""
import os

import pytest

from recsys.runtime.safe_io import (OutputPathError, atomic_directory, atomic_file, check_output_dir, check_output_file,
                     refuse_overlap)


def test_refuse_overlap_both_directions_and_symlinks(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(data)
    for output, relation in ((data, "is"), (data / "sub", "lies inside"), (tmp_path, "contains"),
                             (link, "is")):
        with pytest.raises(OutputPathError, match=f"--out {output} {relation} --dataset_path"):
            refuse_overlap(str(output), "--out", {"--dataset_path": str(data), "--other": None})
    refuse_overlap(str(tmp_path / "data2"), "--out", {"--dataset_path": str(data)})


def test_output_checks_name_the_flag(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(OutputPathError, match="--log_path .* is a directory"):
        check_output_file(str(tmp_path), "--log_path")
    with pytest.raises(OutputPathError, match="--log_path .*f is a file, not a directory"):
        check_output_file(str(a_file / "log.json"), "--log_path")
    with pytest.raises(OutputPathError, match="--save_checkpoint_path .* is not a directory"):
        check_output_dir(str(a_file), "--save_checkpoint_path")
    check_output_dir(str(tmp_path / "new" / "deeper"), "--x")
    check_output_file(str(tmp_path / "new" / "log.json"), "--x")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OutputPathError, match="not writable"):
            check_output_dir(str(locked / "out"), "--x")


def test_atomic_directory_replaces_whole_or_not_at_all(tmp_path):
    final = tmp_path / "out"
    with atomic_directory(str(final)) as tmp:
        (open(os.path.join(tmp, "a"), "w")).write("1")
    assert (final / "a").read_text() == "1"
    with pytest.raises(OutputPathError, match="already exists"):
        with atomic_directory(str(final)):
            pass
    with pytest.raises(RuntimeError):
        with atomic_directory(str(final), replace=True) as tmp:
            (open(os.path.join(tmp, "b"), "w")).write("2")
            raise RuntimeError("boom")
    assert sorted(os.listdir(tmp_path)) == ["out"] and os.listdir(final) == ["a"]
    with atomic_directory(str(final), replace=True) as tmp:
        (open(os.path.join(tmp, "b"), "w")).write("2")
    assert os.listdir(final) == ["b"] and sorted(os.listdir(tmp_path)) == ["out"]


def test_failed_atomic_directory_leaves_no_parent_it_made(tmp_path):
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError):
        with atomic_directory(str(tmp_path / "kept" / "a" / "b" / "out")):
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []
    with atomic_directory(str(tmp_path / "kept" / "a" / "out")):
        pass
    assert os.listdir(tmp_path / "kept" / "a") == ["out"]


def test_atomic_file_keeps_the_old_file_on_failure(tmp_path):
    final = tmp_path / "f.txt"
    final.write_text("old")
    with pytest.raises(KeyError):
        with atomic_file(str(final)) as handle:
            handle.write("new")
            raise KeyError("x")
    assert final.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]
    with atomic_file(str(final)) as handle:
        handle.write("new")
    assert final.read_text() == "new" and os.listdir(tmp_path) == ["f.txt"]

"""Output-path safety for every writer: checked before any work, never onto an input, never half-written.

Entry points check each output path before they read or compute anything (`check_output_file`,
`check_output_dir`, `refuse_overlap`, `check_replaceable` for a folder replaced whole), so a bad
path costs one error line, not hours of training.
Writers (checkpoints, SavedModel export, transcribe, gen_csv, synthetic data, preprocessing) build
their output in a hidden temporary sibling and rename it into place once it is complete
(`atomic_directory`, `atomic_file`): a failure leaves neither partial output nor a stray temporary,
nor a parent folder made for the output. A thread that must end the process at once (the peer
watch, the stop-signal watchdog) goes through `exit_now`, which waits out a rename in progress, so
an output is never left between its renames.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from typing import IO, Iterable, Iterator, Mapping, Optional, Tuple

# Held while a staged output is renamed into place (two renames when it replaces one); `exit_now` takes it.
_RENAMING = threading.Lock()
RENAME_WAIT_S = 30.0
_TEMPORARY = re.compile(r"\.(?P<output>.+)\.tmp-(?P<pid>[0-9]+)(\.old)?")


class OutputPathError(ValueError):
    """An output path is unusable, or writing it would destroy an input; the message names both."""


def real_path(path: str) -> str:
    """Absolute path with symbolic links resolved, so two spellings of one place compare equal."""
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def _relation(output: str, other: str) -> Optional[str]:
    """How `output` relates to `other` on disk: 'is', 'lies inside', 'contains' or None."""
    a, b = real_path(output), real_path(other)
    if a == b:
        return "is"
    if a.startswith(b.rstrip(os.sep) + os.sep):
        return "lies inside"
    if b.startswith(a.rstrip(os.sep) + os.sep):
        return "contains"
    return None


def refuse_overlap(output: str, output_name: str, inputs: Mapping[str, Optional[str]]) -> None:
    """Raise if `output` equals, lies inside or contains any input path (None inputs are skipped).

    `inputs` maps a name for the message (a flag such as '--dataset_path') to the input's path.
    Containment counts both ways: replacing a folder that holds the dataset deletes the dataset.
    """
    for input_name, input_path in inputs.items():
        if not input_path:
            continue
        relation = _relation(output, input_path)
        if relation:
            raise OutputPathError(f"{output_name} {output} {relation} {input_name} {input_path}; "
                                  f"refusing to write onto an input")


def _nearest_existing(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _check_creatable(path: str, name: str) -> None:
    """The missing part of `path` can be created: its nearest existing ancestor is a writable folder."""
    ancestor = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(ancestor):
        raise OutputPathError(f"{name} {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(f"{name} {path}: directory {ancestor} is not writable")


def check_output_file(path: str, name: str) -> None:
    """`path` can be created or appended to as a regular file; else one error naming `name`."""
    if os.path.isdir(path):
        raise OutputPathError(f"{name} {path} is a directory; a file path is expected")
    if os.path.lexists(path):
        if not os.path.isfile(path):
            raise OutputPathError(f"{name} {path} exists and is not a regular file")
        if not os.access(path, os.W_OK):
            raise OutputPathError(f"{name} {path} is not writable")
        return
    _check_creatable(path, name)


def check_output_dir(path: str, name: str) -> None:
    """`path` is a writable folder or can be created as one; else one error naming `name`."""
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise OutputPathError(f"{name} {path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputPathError(f"{name} {path}: directory is not writable")
        return
    _check_creatable(path, name)


def check_replaceable(final: str, name: str, produced: Iterable[str], replace: bool) -> bool:
    """Check that the folder `final` may become a new folder holding the top-level entries `produced`.

    Returns whether `final` exists (pass it as `atomic_directory`'s `replace`). Absent or empty: fine.
    Holding anything: refused unless `replace`, and refused even then when it holds entries the new
    folder would not, since replacing the folder would delete them. The output is renamed into place
    from a sibling, so the parent must be writable and `final` must not be a mount point.
    """
    check_output_dir(final, name)
    _check_creatable(final, name)
    if not os.path.isdir(final):
        return False
    if os.path.islink(final):
        raise OutputPathError(f"{name} {final} is a symbolic link; the output would replace the link, "
                              f"not fill {real_path(final)}: give that folder instead")
    if os.path.ismount(final):
        raise OutputPathError(f"{name} {final} is a mount point; the output is built beside it and "
                              f"renamed into place, so choose a folder inside it")
    existing = sorted(os.listdir(final))
    if existing and not replace:
        raise OutputPathError(f"{name} {final} already holds {_listing(existing)}; refusing to "
                              f"overwrite it (pass --overwrite to replace it)")
    foreign = sorted(set(existing) - set(produced))
    if foreign:
        raise OutputPathError(f"{name} {final} holds {_listing(foreign)}, which the new output would "
                              f"not contain; refusing to delete them (move them away or choose "
                              f"another {name})")
    return True


def _listing(names: list) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def temporary_sibling(final: str) -> str:
    """A hidden name next to `final`, unique to this process: `.NAME.tmp-PID`."""
    final = os.path.abspath(final)
    return os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.tmp-{os.getpid()}")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _temporaries(parent: str) -> Iterator[Tuple[str, str, int]]:
    """(entry, the output it was for, its writer's pid) for every temporary in `parent`: a
    `temporary_sibling` or a publish's `.old`."""
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        found = _TEMPORARY.fullmatch(name)
        if found:
            yield os.path.join(parent, name), found["output"], int(found["pid"])


def remove_stale_temporaries(final: str) -> list:
    """Remove the temporary siblings of `final` left by a writer of this machine that no longer runs
    (killed with SIGKILL, say); returns their paths. Only for outputs one machine writes: a live writer
    of another machine sharing the folder would look dead."""
    final = os.path.abspath(final)
    removed = []
    for path, output, pid in _temporaries(os.path.dirname(final)):
        if output == os.path.basename(final) and pid != os.getpid() and not _process_exists(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove_foreign_temporaries(folder: str) -> list:
    """Remove every temporary in `folder` that this process did not make; returns their paths. Only
    for a folder this run holds alone (folder_lock): any other writer's temporary there is stale,
    whichever machine it ran on (a rank ended mid-save by a lost peer, a SIGKILL)."""
    removed = []
    for path, _, pid in _temporaries(folder):
        if pid != os.getpid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def exit_now(code: int) -> None:
    """End the process at once with `code` (os._exit: for a thread, which cannot end a main thread
    that is stuck in a collective), but never between a staged output's renames: one in progress is
    waited for (up to RENAME_WAIT_S, a hung file system is not)."""
    _RENAMING.acquire(timeout=RENAME_WAIT_S)
    os._exit(code)


def _rename_no_replace(source: str, target: str) -> None:
    """Rename a folder to a path that must not exist. POSIX rename silently replaces an empty
    folder at `target`, so a folder created there since the caller's check is refused instead."""
    try:
        os.mkdir(target)  # fails if anything is there now; claims the name otherwise
    except FileExistsError:
        raise OutputPathError(f"{target} appeared while this output was being written (another writer's?); "
                              f"refusing to replace it") from None
    try:
        os.rename(source, target)  # onto the empty folder just made
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(target)  # ours, unless another writer filled it meanwhile
        raise


class StagedDirectory:
    """A hidden temporary sibling of `final`, filled by the caller, then either published as
    `final` (`publish`) or removed (`discard`); for writers whose output outlives one block.

    An existing `final` is an error unless `replace` (the caller decides what may be replaced); on
    `publish` it is moved aside, the new folder renamed in, and the old one deleted, so `final`
    never holds a mixture, and a failed rename puts the old folder back. Without `replace`, a
    `final` that appeared after this check (another writer's) is never touched: publishing fails.
    """

    def __init__(self, final: str, replace: bool = False) -> None:
        self.final = os.path.abspath(final)
        self.replace = replace
        if os.path.lexists(self.final) and not replace:
            raise OutputPathError(f"{self.final} already exists; refusing to overwrite it")
        parent = os.path.dirname(self.final)
        self.created = []  # the parents made here, deepest first: `discard` removes them again
        while not os.path.lexists(parent):
            self.created.append(parent)
            parent = os.path.dirname(parent)
        os.makedirs(os.path.dirname(self.final), exist_ok=True)
        self.path = temporary_sibling(self.final)
        shutil.rmtree(self.path, ignore_errors=True)
        os.mkdir(self.path)

    def publish(self) -> None:
        """Rename the filled folder to `final`; on failure it is removed and `final` kept as it was."""
        try:
            if os.path.lexists(self.final) and not self.replace:
                raise OutputPathError(f"{self.final} appeared while this output was being written (another "
                                      f"writer's?); refusing to replace it")
            old = self.path + ".old"
            with _RENAMING:  # exit_now waits: `final` is never left missing or an empty folder
                if os.path.lexists(self.final):
                    os.rename(self.final, old)
                    try:
                        os.rename(self.path, self.final)
                    except BaseException:
                        os.rename(old, self.final)
                        raise
                else:
                    _rename_no_replace(self.path, self.final)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Remove the temporary folder and everything in it, and the parents made for it while they
        are empty; `final` is untouched."""
        shutil.rmtree(self.path, ignore_errors=True)
        for folder in self.created:
            try:
                os.rmdir(folder)
            except OSError:
                break


@contextlib.contextmanager
def atomic_directory(final: str, replace: bool = False) -> Iterator[str]:
    """Yield an empty temporary sibling folder; once the block succeeds, it becomes `final`
    (see StagedDirectory). If the block raises, the temporary folder is removed and `final` is
    untouched."""
    staged = None
    try:
        staged = StagedDirectory(final, replace)
        yield staged.path
    except BaseException:
        if staged is not None:
            staged.discard()
        else:  # a stop signal between the constructor's mkdir and its return: the name is this process's
            shutil.rmtree(temporary_sibling(os.path.abspath(final)), ignore_errors=True)
        raise
    staged.publish()


@contextlib.contextmanager
def atomic_file(final: str, mode: str = "w", replace: bool = True) -> Iterator[IO]:
    """Yield a file opened on a temporary sibling; once the block succeeds it replaces `final`."""
    if os.path.lexists(final) and not replace:
        raise OutputPathError(f"{final} already exists; refusing to overwrite it")
    tmp = temporary_sibling(final)
    try:
        with open(tmp, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise

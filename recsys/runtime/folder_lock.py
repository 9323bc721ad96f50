"""One run holds an output folder for its lifetime: an advisory lock on `<folder>/.dlrm.lock`.

Two jobs pointed at one `--save_checkpoint_path` would otherwise interleave their checkpoints. The
holder takes a POSIX record lock (`fcntl.lockf`, which local disks, NFS v3/v4 and Lustre mounted
with `flock` honour) on the lock file and records its host, pid, start time and command there, so
a second run is refused with one error naming the folder and the holder. The kernel (or the NFS
lock manager) drops the lock when the holding process dies, however it dies; a later run then
finds the dead run's record without its lock, says so and takes the folder over.

On a file system without record locks the lock falls back to creating the file exclusively; a
record left there by a dead process of the same host is taken over, one of another host is
reported with the command that clears it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Optional

LOCK_NAME = ".dlrm.lock"
# errnos of a file system that keeps no record locks (as opposed to one that is held)
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


class FolderLockedError(RuntimeError):
    """Another live run holds the folder; the message names the folder and the holder."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a folder's lock, as its lock file records it."""
    host: str
    pid: int
    started: str
    command: str

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, started {self.started}"

    def is_dead_here(self) -> bool:
        """This host's process `pid` no longer exists (other hosts cannot be checked)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _this_process() -> Holder:
    return Holder(socket.gethostname(), os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  " ".join(sys.argv)[:500])


def read_holder(path: str) -> Optional[Holder]:
    """The holder a lock file records; None when the file is absent, empty or unreadable. Never
    call it on a file this process has locked: closing any descriptor of a file drops the
    process's record locks on it (POSIX); `_read_holder_fd` reads through the locked one."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read_holder_fd(fd)
    finally:
        os.close(fd)


def _read_holder_fd(fd: int) -> Optional[Holder]:
    try:
        raw = json.loads(os.pread(fd, 1 << 16, 0).decode("utf-8"))
        return Holder(str(raw["host"]), int(raw["pid"]), str(raw["started"]), str(raw.get("command", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_holder(fd: int, holder: Holder) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder.__dict__) + "\n").encode(), 0)
    os.fsync(fd)


class FolderLock:
    """The held lock of one folder; `release` (or process exit) gives it back.

    `took_over` names the dead run whose lock this one replaced (None: the folder was free), so
    the caller can say so. A folder the lock had to create is removed again on release when the
    lock file is all it holds, so a run that fails before its first checkpoint leaves nothing.
    """

    def __init__(self, folder: str, fd: Optional[int], created_folder: bool, took_over: Optional[Holder]) -> None:
        self.folder = folder
        self.path = os.path.join(folder, LOCK_NAME)
        self._fd = fd  # None: held by exclusive creation, not by a record lock
        self._created_folder = created_folder
        self._held = True
        self.took_over = took_over

    def release(self) -> None:
        """Remove the lock file (the holder record) and give the lock back; idempotent."""
        if not self._held:
            return
        self._held = False
        with contextlib.suppress(OSError):
            os.remove(self.path)  # still held: no other run can be between its open and its lock
        if self._fd is not None:
            os.close(self._fd)
        if self._created_folder:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # only if empty: a checkpoint written meanwhile stays


def acquire(folder: str, name: str) -> FolderLock:
    """Hold `folder` (created when missing) for this process; `name` (a flag) is used in errors.

    Raises FolderLockedError when a live run holds it. The lock file is opened, locked, then
    checked to still be the file at its path (a releasing run removes it), else tried again.
    """
    created = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise _locked_error(folder, name, read_holder(path)) from None
            if error.errno in _NO_LOCKS:
                return _acquire_by_creation(folder, name, created)
            raise
        if _same_file(fd, path):
            previous = _read_holder_fd(fd)
            _write_holder(fd, _this_process())
            return FolderLock(folder, fd, created, previous)
        os.close(fd)  # removed by its releasing holder between our open and our lock
    raise FolderLockedError(f"{name} {folder}: could not take the lock {path} (it keeps being replaced)")


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _locked_error(folder: str, name: str, holder: Optional[Holder]) -> FolderLockedError:
    who = holder.describe() if holder else "a process whose record is not written yet"
    return FolderLockedError(f"{name} {folder} is in use by another run ({who}); two runs saving into one "
                             f"folder would mix their checkpoints: wait for it to end, or choose another folder")


def _acquire_by_creation(folder: str, name: str, created: bool) -> FolderLock:
    """The lock where the file system keeps no record locks: exclusive creation of the lock file."""
    path = os.path.join(folder, LOCK_NAME)
    took_over = None
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = read_holder(path)
            if holder is None or not holder.is_dead_here():
                error = _locked_error(folder, name, holder)
                raise FolderLockedError(f"{error} (this file system keeps no locks: if that run has ended, "
                                        f"remove {path})") from None
            took_over = holder
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        _write_holder(fd, _this_process())
        os.close(fd)
        return FolderLock(folder, None, created, took_over)
    raise FolderLockedError(f"{name} {folder}: could not create the lock {path}")

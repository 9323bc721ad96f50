"""SIGINT, SIGTERM and SIGUSR1 as a request to stop cleanly (docs/architecture.md, Stopping).

What a cluster sends when a job must end: Ctrl-C (SIGINT), the time limit or a preemption (SIGTERM,
from Slurm, Kubernetes or horovodrun), and Slurm's advance warning (`--signal=USR1@<seconds>`).
Training treats the first one as a request: the current step (and an evaluation or checkpoint in
progress) finishes, the ranks agree on the step to stop after (`Trainer.train_next` carries each
rank's request through the step's loss allreduce), the run saves a checkpoint and exits with
`cli.signal_exit_code(signal)`. A second signal stops at once (`StopNow`). Outside training, where nothing is
worth finishing, the first signal already raises `StopNow`.
Nothing here touches TensorFlow; handlers only set a flag or raise, as Python requires.

Python runs a handler only when the main thread is back in the interpreter. A rank blocked in a
collective whose peer died (`mpirun` then sends SIGTERM to the survivors and waits) would never get
there, so a watchdog thread learns of every stop signal from the interpreter's wakeup descriptor
and ends the process (exit 128 + N, no checkpoint) when no handler has run `HANDLER_DEADLINE_S`
seconds later.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional

from recsys.runtime.cli import signal_exit_code, stderr_line
from recsys.runtime.safe_io import exit_now

HANDLER_DEADLINE_S = 30.0

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class StopNow(BaseException):
    """Raised by a signal handler to stop at once (a BaseException, as KeyboardInterrupt is, so
    that no `except Exception` swallows it and every atomic writer discards its temporary)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum

    def report(self) -> int:
        """The one line an entry point prints for it, and its exit code. Every writer is atomic, so
        what is on disk is whole."""
        stderr_line(f"stopped by {self}: the run ended before finishing; outputs already on disk are complete, "
                    f"nothing half-written remains")
        return signal_exit_code(self.signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequest:
    """Installs the handlers of STOP_SIGNALS and remembers the first signal received.

    `graceful`: the first signal only sets `signum` (training polls it at step boundaries); the
    second raises StopNow. Not graceful: the first raises StopNow.
    """

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.graceful = False
        self._deferring = False  # inside `deferred`: a first signal is recorded without a word
        self._handled = 0  # handler runs so far: proof that the main thread is in the interpreter

    def install(self) -> None:
        """The handlers, and the watchdog of a main thread that cannot run them (main thread only)."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_end,), name="stop-signal-watchdog", daemon=True).start()

    def _watch(self, read_end: int) -> None:
        """For every stop signal the interpreter receives: end the process if no handler has run
        within HANDLER_DEADLINE_S (the main thread is stuck, e.g. in a collective of a dead peer)."""
        while True:
            received = os.read(read_end, 1)
            if not received:
                return
            signum, handled_before = received[0], self._handled
            if signum not in STOP_SIGNALS:
                continue
            deadline = time.monotonic() + HANDLER_DEADLINE_S
            while time.monotonic() < deadline and self._handled == handled_before:
                time.sleep(0.1)
            if self._handled == handled_before:
                stderr_line(f"received {signal_name(signum)}, but the run has not reached a point where it can "
                            f"stop in {HANDLER_DEADLINE_S:.0f} s (blocked, e.g. waiting for a rank that is gone): "
                            f"exiting without a checkpoint; the checkpoints on disk are whole")
                exit_now(signal_exit_code(signum))

    @contextlib.contextmanager
    def deferred(self) -> Iterator[Callable[[], None]]:
        """Work with nothing worth finishing that runs in native code a raised exception could leave
        corrupt (TensorFlow eager ops: StopNow raised inside one aborted a Wide & Deep evaluation with
        heap corruption): within, the first signal is only recorded, and the yielded check, called at
        safe points (batch boundaries), raises StopNow for it. A second signal still stops at once."""
        previous = self.graceful, self._deferring
        self.graceful, self._deferring = True, True
        try:
            yield self._raise_if_received
        finally:
            self.graceful, self._deferring = previous

    def _raise_if_received(self) -> None:
        if self.signum is not None:
            raise StopNow(self.signum)

    def ignore_further(self) -> None:
        """Ignore the stop signals from now on: the run has ended and is leaving (a launcher that
        ends the other ranks once one exits must not turn their exit into a traceback)."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        self._handled += 1
        if self.signum is not None or not self.graceful:
            self.signum = self.signum or signum
            raise StopNow(signum)
        self.signum = signum
        if self._deferring:
            return
        stderr_line(f"received {signal_name(signum)}: finishing the current step, then saving and stopping "
                    f"(send it again to stop at once)")


# The process's one request, installed by the entry point (main.run) before any work.
STOP = StopRequest()


def run_stopping_at_once(body: Callable[[], int]) -> int:
    """`body`'s exit code, run as an entry point with no work worth finishing (a preprocessing, a
    conversion): the first stop signal raises StopNow, which unwinds every atomic writer (their
    temporaries removed) and ends as one line and exit 128 + N. Main thread only."""
    STOP.install()
    with contextlib.ExitStack() as leaving:
        leaving.callback(STOP.ignore_further)  # however it ends: a launcher's later signals print nothing
        try:
            return body()
        except StopNow as stop:
            return stop.report()
        except Exception:
            if STOP.signum is None:
                raise
            # a library caught the signal's StopNow and raised its own error (DuckDB: "Query
            # interrupted"); the run was still stopped by that signal
            return StopNow(STOP.signum).report()


def vote(signum: Optional[int]) -> list:
    """This rank's stop vote for the step's allreduce: 1.0 at the index of the signal received."""
    return [1.0 if signum == s else 0.0 for s in STOP_SIGNALS]


def agreed_signal(votes: Any) -> Optional[int]:
    """The signal the ranks agree to stop for, from the averaged votes (the same on every rank):
    the first of STOP_SIGNALS any rank received; None to go on."""
    for signum, share in zip(STOP_SIGNALS, votes):
        if share > 0:
            return int(signum)
    return None

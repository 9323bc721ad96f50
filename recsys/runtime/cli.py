"""The command-line convention every entry point follows: its exit codes and its one error line.

  0        success
  1        a failure during the run (an engine error, a lost disk, a bug: what the user's input
           did not cause), with its message or traceback
  2        bad input: a flag, path, feature spec, data file, raw line or checkpoint, reported as one
           `error: ...` line on stderr naming it, before anything is written
  128 + N  stopped by signal N (SIGINT 130, SIGTERM 143, SIGUSR1 138), as shells report signals
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

FAILURE = 1
BAD_INPUT = 2


def signal_exit_code(signum: int) -> int:
    """The exit status of a run ended by signal `signum`."""
    return 128 + signum


def stderr_line(text: str) -> None:
    """Write `text` and its newline to stderr in one write: stderr writes through, so `print` would
    send the newline as a second write, and mpirun's --tag-output tags each write it reads, leaving
    a bare `[1,0]<stderr>:` tag glued to the end of the line."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def bad_input(error: Any) -> int:
    """Print `error` as the one `error: ...` line (whitespace folded to single spaces, so an engine's
    multi-line message stays one line); returns BAD_INPUT, for `sys.exit` or `return`."""
    stderr_line(f"error: {' '.join(str(error).split())}")
    return BAD_INPUT


def failure(error: Any) -> int:
    """Print a failure during the run as one `error: ...` line; returns FAILURE."""
    stderr_line(f"error: {' '.join(str(error).split())}")
    return FAILURE


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are the one `error: ...` line and BAD_INPUT, not the usage text."""

    def error(self, message: str) -> NoReturn:
        sys.exit(bad_input(message))

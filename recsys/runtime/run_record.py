"""A run's record (its dllogger log, and beside it its TensorBoard events and, for Wide & Deep, its
args.json) belongs to one training history, so that no run overwrites or interleaves another's.

A history is a checkpoint lineage (recsys/training/checkpoint.py): a fresh run starts one, a resumed
run continues its checkpoint's. Each run names its lineage in its log's PARAMETER record
(`RUN_KEY`), so a log shows whose records follow each PARAMETER record. Before a run writes anything,
`check_run_record` lets it continue only its own history's record (a resume appends to it; its
TensorBoard events join the same folder) and refuses, with one line naming the file and the way out,
a record of another run. Both entry points call it: the same mistake gets the same answer.

`read_runs` splits a log into its runs (consecutive runs of one lineage are one history, resumed):
scripts/plot_log.py draws one history, never two stacked.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from recsys.runtime.logger import read_dllogger_file
from recsys.runtime.safe_io import OutputPathError

RUN_KEY = "run_lineage"  # the PARAMETER record's field naming the run's checkpoint lineage


class RunRecordError(OutputPathError):
    """A run would write into another run's record; the message names the file and the way out."""


@dataclass
class LoggedRun:
    """One training history in a log: its lineage (None: not recorded) and its records in order."""
    lineage: Optional[str]
    first_record: int  # 1-based number of its first record in the log
    records: List[Dict[str, Any]] = field(default_factory=list)


def read_runs(log_path: str) -> List[LoggedRun]:
    """The log's histories in order: a PARAMETER record starts a run (the records a run writes before
    it, in a log's first run, belong to it), joined to the one before when both name the same lineage
    (a resume). Raises what reading the file raises (OSError, ValueError)."""
    runs: List[LoggedRun] = []
    named = False  # whether the last run has had its PARAMETER record
    for number, record in enumerate(read_dllogger_file(log_path), start=1):
        if record.get("step") == "PARAMETER":
            lineage = (record.get("data") or {}).get(RUN_KEY) or None
            if runs and not named:  # the records a run writes before its parameters (metric formats)
                runs[-1].lineage = lineage
            elif not runs or lineage is None or runs[-1].lineage != lineage:
                runs.append(LoggedRun(lineage, number))
            named = True
        elif not runs:
            runs.append(LoggedRun(None, number))
        runs[-1].records.append(record)
    return runs


def _holds_files(path: str) -> bool:
    """A file, or a folder with anything in it."""
    return os.path.isfile(path) or (os.path.isdir(path) and bool(os.listdir(path)))


def check_run_record(rank: int, log_path: Optional[str], log_flag: str, lineage: Optional[str],
                     beside: Sequence[Tuple[str, str]], way_out: str, log_holds_runs_in_turn: bool = False) -> None:
    """Refuse (RunRecordError, on every rank) a run whose record would mix with another run's.

    Rank 0 judges, with its own lineage (the one its log records), and every rank gets the verdict
    (a collective: every rank calls it at the same point), so that no rank reads a record rank 0 has
    meanwhile begun. `log_path` (named `log_flag`) may be continued only when its last run is this
    run's `lineage` (None: a run with no checkpoint history, which continues nothing). `beside`:
    (flag, path) of the record's other files (an args.json, a TensorBoard folder): holding anything,
    they too must belong to the log's last run, this one. `log_holds_runs_in_turn`: a log by design
    shared by runs one after another (DLRM's default `--log_path` in the working folder), whose runs
    its PARAMETER records delimit; it is not refused itself but vouches only for its last run's
    files. `way_out` ends the message: how to write a new record or continue the old one.
    """
    from recsys.runtime import distributed as dist

    message = dist.rank0_verdict(
        rank, lambda: _judge(log_path, log_flag, lineage, beside, way_out, log_holds_runs_in_turn), (RunRecordError,))
    if message:
        raise RunRecordError(message)


def _judge(log_path: Optional[str], log_flag: str, lineage: Optional[str], beside: Sequence[Tuple[str, str]],
           way_out: str, log_holds_runs_in_turn: bool) -> None:
    """check_run_record's rule on this process's view of the files."""
    last = None
    if log_path and os.path.isfile(log_path) and os.path.getsize(log_path) > 0:
        try:
            runs = read_runs(log_path)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise RunRecordError(f"{log_flag} {log_path} cannot be read as a dllogger log ({error})") from None
        last = runs[-1].lineage if runs else None
        ours = lineage is not None and last == lineage
        if runs and not ours and not log_holds_runs_in_turn:
            raise RunRecordError(f"{log_flag} {log_path} holds the record of another run; {way_out}")
    for flag, path in beside:
        if path and _holds_files(path) and (lineage is None or last != lineage):
            raise RunRecordError(f"{flag} {path} holds the record of another run; {way_out}")

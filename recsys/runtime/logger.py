"""Small shared helpers: a dllogger-compatible logger, rank-aware printing and step timing.

NVIDIA's dllogger is not on PyPI; `DllLogger` writes the same file format, one record per line:
`DLLL {"timestamp": ..., "datetime": ..., "elapsedtime": ..., "type": "LOG", "step": ..., "data": {...}}`
or, for metric metadata, `"type": "METADATA", "metric": ..., "metadata": {...}`, so existing
dllogger log parsers read these files unchanged.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from typing import Any, Dict, Iterable, Optional, TextIO, Tuple, Union

from recsys.runtime.safe_io import OutputPathError, check_output_file

_PREFIX = "DLLL "
Step = Union[str, int, Tuple[Any, ...]]


def _plain(value: Any) -> Any:
    """JSON-serialisable form of numpy/TF scalars and containers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def _step_text(step: Step) -> str:
    if isinstance(step, tuple):
        return " ".join(str(s) for s in step) if step else "()"
    return str(step)


class DllLogger:
    """Writes `DLLL {json}` lines to a file and readable lines to stdout.

    `enabled=False` (the default on ranks other than 0) makes every call a no-op, so callers
    never branch on the rank.
    """

    def __init__(self, log_path: Optional[str], enabled: bool = True, stdout: TextIO = sys.stdout) -> None:
        self.enabled = enabled
        self._stdout = stdout
        self._start = time.time()
        self._formats: Dict[str, str] = {}
        self._path = log_path if enabled and log_path else None
        self._file: Optional[TextIO] = None

    def _write(self, record: Dict[str, Any]) -> None:
        """Append one record; the file (and its folder) is created at the first record, so a run
        that stops before logging anything leaves no file behind."""
        if self._path is None:
            return
        now = time.time()
        line = {"timestamp": str(now), "datetime": str(_dt.datetime.fromtimestamp(now)),
                "elapsedtime": str(now - self._start)}
        line.update(record)
        if self._file is None:
            os.makedirs(os.path.dirname(os.path.abspath(self._path)), exist_ok=True)
            self._file = open(self._path, "a", buffering=1)
        self._file.write(_PREFIX + json.dumps(line) + "\n")

    def metadata(self, metric: str, metadata: Dict[str, Any]) -> None:
        """Declare a metric's unit and stdout format (e.g. {'unit': 's', 'format': ':.5f'})."""
        if not self.enabled:
            return
        if "format" in metadata:
            self._formats[metric] = metadata["format"]
        self._write({"type": "METADATA", "metric": metric, "metadata": _plain(metadata)})

    def log(self, step: Step, data: Dict[str, Any], echo: bool = True) -> None:
        """One LOG record; `step` is a tuple (empty for end-of-run), an int or 'PARAMETER'.
        `echo=False` writes the file only (for values a readable line has already shown)."""
        if not self.enabled:
            return
        data = _plain(data)
        self._write({"type": "LOG", "step": _plain(step), "data": data})
        if not echo:
            return
        fields = " ".join(f"{k} : {self._format(k, v)}" for k, v in data.items())
        print(f"DLL {_dt.datetime.now():%Y-%m-%d %H:%M:%S.%f} - {_step_text(step)} {fields}",
              file=self._stdout, flush=True)

    def _format(self, metric: str, value: Any) -> str:
        spec = self._formats.get(metric)
        if spec and isinstance(value, (int, float)):
            return ("{" + spec + "}").format(value)
        return str(value)

    def log_parameters(self, parameters: Dict[str, Any]) -> None:
        """All run parameters as one `step='PARAMETER'` record, as the reference logs its flags."""
        self.log("PARAMETER", parameters)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def check_log_file(path: str, name: str) -> None:
    """`path` can take `DLLL` records: a new file, or an existing dllogger log to append to.

    Any other existing file is refused (OutputPathError naming `name`): appending records to a
    feature spec, a manifest or a script would corrupt it.
    """
    check_output_file(path, name)
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as f:
            head = f.read(len(_PREFIX))
        if head != _PREFIX.encode():
            raise OutputPathError(f"{name} {path} exists and is not a dllogger log; refusing to append to it")


def read_dllogger_file(path: str) -> Iterable[Dict[str, Any]]:
    """Parse the records of a `DLLL {json}` file (lines without the prefix are skipped)."""
    with open(path) as f:
        for line in f:
            if line.startswith(_PREFIX):
                yield json.loads(line[len(_PREFIX):])


def print_rank0(*args: Any, rank: int = 0, **kwargs: Any) -> None:
    """print() on rank 0 only; other ranks stay quiet."""
    if rank == 0:
        print(*args, flush=True, **kwargs)


class StepTimer:
    """Measures mean step time over windows after a warm-up, as the reference's progress lines do;
    the one step clock of both models (DLRM's progress lines, Wide & Deep's --benchmark)."""

    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.measured_steps = 0
        self.measured_seconds = 0.0
        self._window_start: Optional[float] = None
        self._window_steps = 0
        self._created = time.perf_counter()
        self._first_done: Optional[float] = None
        self._last_done = self._created
        self._steps_done = 0

    def step_done(self, step: int) -> Optional[float]:
        """Call after every step (0-based); steps before the warm-up are not measured. Returns a
        measured step's seconds (since the previous call; None before the clock runs), which a
        benchmark logs per step (Wide & Deep's samples/s)."""
        previous, self._last_done = self._last_done, time.perf_counter()
        self._steps_done += 1
        if self._first_done is None:
            self._first_done = self._last_done
        if step + 1 == self.warmup_steps or (self._window_start is None and step + 1 > self.warmup_steps):
            self._window_start = time.perf_counter()
            self._window_steps = 0
            return None
        if self._window_start is None:
            return None
        self._window_steps += 1
        return self._last_done - previous

    def close_window(self) -> Optional[float]:
        """End the current window; return its mean step time in seconds (None if empty)."""
        if self._window_start is None or self._window_steps == 0:
            return None
        elapsed = time.perf_counter() - self._window_start
        self.measured_seconds += elapsed
        self.measured_steps += self._window_steps
        mean = elapsed / self._window_steps
        self._window_start = time.perf_counter()
        self._window_steps = 0
        return mean

    def mean_step_time(self) -> float:
        """Mean over all closed windows; a run too short for the warm-up is measured whole: the
        steps after the first (which traces the graph), or that one step; NaN without steps."""
        self.close_window()
        if self.measured_steps:
            return self.measured_seconds / self.measured_steps
        if self._steps_done > 1:
            return (self._last_done - self._first_done) / (self._steps_done - 1)
        return self._last_done - self._created if self._steps_done else float("nan")

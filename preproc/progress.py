"""Per-stage progress lines for long preprocessing runs: fraction done, lines/s and ETA while a stage
runs, then its time and rate (both engines print them; bench/preproc.py reads the stage lines)."""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO


class Progress:
    """Prints `[<engine>] stage ...` lines to `stream` every `interval` seconds (0: only the stage
    start and end lines)."""

    def __init__(self, engine: str, interval: float, stream: TextIO = sys.stdout) -> None:
        self.engine = engine
        self.interval = interval
        self.stream = stream

    def say(self, message: str) -> None:
        print(f"[{self.engine}] {message}", file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str, lines: int, fraction: Callable[[], float], what: str = "") -> Iterator[None]:
        """Reports `fraction()` (0..1, `what` says of what) of `lines` lines while the body runs."""
        start = time.monotonic()
        self.say(f"stage {name}: {lines:,} lines")
        done = threading.Event()

        def report() -> None:
            while not done.wait(self.interval):
                part = min(max(fraction(), 0.0), 1.0)
                elapsed = time.monotonic() - start
                rate = part * lines / elapsed if elapsed > 0 else 0.0
                eta = f"{(1 - part) * lines / rate:.0f} s" if rate > 0 else "?"
                self.say(f"stage {name}: {100 * part:.0f}%{what}, {rate:,.0f} lines/s, ETA {eta}")

        if self.interval > 0:
            threading.Thread(target=report, daemon=True).start()
        try:
            yield
        finally:
            done.set()
        elapsed = time.monotonic() - start
        self.say(f"stage {name} done: {elapsed:.1f} s, {lines / max(elapsed, 1e-9):,.0f} lines/s")

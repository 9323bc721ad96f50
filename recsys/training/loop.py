"""The epoch loop both models train in: DLRM's `trainer.train_loop` and Wide & Deep's `main._train`.

`run_epochs` owns the structure the two share: steps over epochs from a resumed step (each epoch's
batches opened from the step's place in it), every step timed by one `StepTimer` and carrying this
rank's stop vote, the ranks' agreed stop signal read after it, then a progress report at a cadence,
an evaluation at points within the epoch and a checkpoint at a cadence, in that order. What a model
does at each point (its step, progress text, evaluation, save) is its `LoopParts`.

A stop agreed after a step ends the loop before anything else of that step (progress, evaluation,
checkpoint): the caller saves and says how to resume.

Left to each model, as they differ in meaning: how an epoch's batches are read (DLRM takes them
inside its step's graph; W&D reads a seeded per-epoch record order in Python), what a progress
report holds (DLRM: the step clock's throughput and ETA; W&D: the reference's metrics of the step's
batch, no timing), the end of a run (DLRM: a last evaluation and the non-finite-loss check; W&D:
the last evaluation repeated as the final record, or --benchmark's mean), and the save on a stop
(each entry point names its own resume flags).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Dict, Optional, Protocol

import tensorflow as tf

from recsys.runtime.logger import StepTimer
from recsys.runtime.stop_signals import StopRequest, agreed_signal, vote

# Takes a group of scalars at a global step ("train" at progress reports, "eval" after evaluations) for
# the log and TensorBoard; each model names its own scalars.
ScalarRecorder = Callable[[int, str, Dict[str, float]], None]


class IntervalMean:
    """The growth of a running total per step between readings: at a progress report, the mean
    training loss over the steps since the previous report (the total: the losses summed step by
    step), or the seconds per step a step spent in collectives."""

    def __init__(self, start_step: int, start_total: float) -> None:
        self._mark = (start_step, start_total)  # (global step, total) at the last reading

    def read(self, step: int, total: float) -> float:
        """The total's growth per step from the last reading (or the run's start) to `total` after
        global step `step`; NaN when no step passed."""
        last_step, last_total = self._mark
        self._mark = (step, total)
        return (total - last_total) / (step - last_step) if step > last_step else float("nan")


@dataclass(frozen=True)
class Cadence:
    """Where the loop ends and when it reports, evaluates and saves; steps are counted after each step."""
    steps_per_epoch: int
    end_step: int  # the global step training ends at
    print_freq: int = 0  # a progress report after every that many steps; 0: none
    eval_points: AbstractSet[int] = frozenset()  # 0-based steps within an epoch after which to evaluate
    checkpoint_every_n_steps: int = 0  # a save after every that many steps; 0: none
    timer_warmup_steps: int = 0  # the steps after the start that the StepTimer does not measure


class LoopParts(Protocol):
    """A model's side of the loop."""

    def open_epoch(self, epoch: int, offset: int, steps: int) -> Any:
        """The batches of `epoch` from its batch `offset` on (at most `steps` are taken)."""
        ...

    def step(self, batches: Any, step: int, stop_vote: tf.Tensor) -> Optional[tf.Tensor]:
        """Train on the next of `batches` as global step `step` (0-based) with this rank's stop vote;
        returns the ranks' averaged votes (stop_signals.vote), or None when `batches` has run out."""
        ...

    def progress(self, step: int, timer: StepTimer) -> None:
        """Report after `step` steps; `timer` is the loop's clock, whose window the report may close."""
        ...

    def evaluate(self, step: int) -> bool:
        """Evaluate after `step` steps; True ends training there."""
        ...

    def save(self, step: int) -> None:
        """Save a checkpoint after `step` steps."""
        ...


@dataclass
class LoopEnd:
    """Where the loop ended: the global step, its clock, and why it ended before `Cadence.end_step`."""
    step: int
    timer: StepTimer
    stopped_by: Optional[int] = None  # the signal the ranks agreed to stop for
    ended_by_evaluation: bool = False  # an evaluation ended training (LoopParts.evaluate returned True)


def run_epochs(parts: LoopParts, cadence: Cadence, start_step: int, stop: Optional[StopRequest]) -> LoopEnd:
    """Train from `start_step` (a restored run resumes in place) to `cadence.end_step`, or until the
    ranks agree on a signal `stop` received (None: nothing votes to stop) or an evaluation ends it.

    An epoch whose batches yield none is an error (RuntimeError): training would not advance.
    """
    timer = StepTimer(warmup_steps=cadence.timer_warmup_steps)
    end = LoopEnd(step=start_step, timer=timer)
    step = start_step
    while step < cadence.end_step:
        epoch, offset = divmod(step, cadence.steps_per_epoch)
        epoch_start = step
        epoch_steps = min(cadence.steps_per_epoch - offset, cadence.end_step - step)
        batches = parts.open_epoch(epoch, offset, epoch_steps)
        for _ in range(epoch_steps):
            votes = parts.step(batches, step, tf.constant(vote(stop.signum if stop else None), tf.float32))
            if votes is None:
                break
            timer.step_done(step - start_step)
            in_epoch = step % cadence.steps_per_epoch
            step += 1
            end.step = step
            end.stopped_by = agreed_signal(votes.numpy())
            if end.stopped_by is not None:
                return end
            if cadence.print_freq > 0 and step % cadence.print_freq == 0:
                parts.progress(step, timer)
            if in_epoch in cadence.eval_points and parts.evaluate(step):
                end.ended_by_evaluation = True
                return end
            if cadence.checkpoint_every_n_steps > 0 and step % cadence.checkpoint_every_n_steps == 0:
                parts.save(step)
        if step == epoch_start:
            raise RuntimeError(f"the training data yielded no batch at step {step} (epoch {epoch}, batch {offset})")
    return end

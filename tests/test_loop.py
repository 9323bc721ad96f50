"""The shared epoch loop (recsys/training/loop.py) with scripted parts: the order of what follows a step,
resuming inside an epoch, the stop vote ending a step's work, an evaluation ending training, an empty epoch."""
import signal

import pytest
import tensorflow as tf

from recsys.runtime.stop_signals import STOP_SIGNALS, StopRequest, vote
from recsys.training.loop import Cadence, run_epochs


class ScriptedParts:
    """Batches are (epoch, index) pairs; every call is written to `calls`. `stop_at`: the step whose votes
    carry SIGTERM; `end_at`: the step whose evaluation ends training; `batches_per_epoch`: the data's length."""

    def __init__(self, batches_per_epoch, stop_at=None, end_at=None):
        self.calls, self.batches_per_epoch, self.stop_at, self.end_at = [], batches_per_epoch, stop_at, end_at
        self.votes_seen = []

    def open_epoch(self, epoch, offset, steps):
        self.calls.append(("open", epoch, offset, steps))
        return iter([(epoch, i) for i in range(offset, self.batches_per_epoch)])

    def step(self, batches, step, stop_vote):
        batch = next(batches, None)
        if batch is None:
            return None
        self.votes_seen.append(stop_vote.numpy().tolist())
        self.calls.append(("step", step, batch))
        return tf.constant(vote(signal.SIGTERM if step == self.stop_at else None), tf.float32)

    def progress(self, step, timer):
        self.calls.append(("progress", step))

    def evaluate(self, step):
        self.calls.append(("evaluate", step))
        return step == self.end_at

    def save(self, step):
        self.calls.append(("save", step))


def test_each_step_is_followed_by_progress_evaluation_and_save_in_that_order():
    parts = ScriptedParts(4)
    cadence = Cadence(steps_per_epoch=4, end_step=8, print_freq=2, eval_points=frozenset({3}), checkpoint_every_n_steps=4)
    end = run_epochs(parts, cadence, 0, stop=None)
    assert (end.step, end.stopped_by, end.ended_by_evaluation) == (8, None, False)
    assert parts.calls == [
        ("open", 0, 0, 4), ("step", 0, (0, 0)), ("step", 1, (0, 1)), ("progress", 2), ("step", 2, (0, 2)),
        ("step", 3, (0, 3)), ("progress", 4), ("evaluate", 4), ("save", 4),
        ("open", 1, 0, 4), ("step", 4, (1, 0)), ("step", 5, (1, 1)), ("progress", 6), ("step", 6, (1, 2)),
        ("step", 7, (1, 3)), ("progress", 8), ("evaluate", 8), ("save", 8)]
    assert parts.votes_seen == [[0.0] * len(STOP_SIGNALS)] * 8


def test_a_resumed_run_opens_its_epoch_at_its_step_and_ends_at_end_step():
    parts = ScriptedParts(4)
    end = run_epochs(parts, Cadence(steps_per_epoch=4, end_step=7), 2, stop=None)
    assert end.step == 7
    assert parts.calls == [("open", 0, 2, 2), ("step", 2, (0, 2)), ("step", 3, (0, 3)),
                           ("open", 1, 0, 3), ("step", 4, (1, 0)), ("step", 5, (1, 1)), ("step", 6, (1, 2))]


def test_an_agreed_stop_ends_the_loop_before_that_steps_progress_evaluation_and_save():
    parts = ScriptedParts(4, stop_at=3)
    request = StopRequest()
    request.signum = signal.SIGUSR1
    cadence = Cadence(steps_per_epoch=4, end_step=8, print_freq=1, eval_points=frozenset({3}), checkpoint_every_n_steps=1)
    end = run_epochs(parts, cadence, 0, stop=request)
    assert (end.step, end.stopped_by) == (4, signal.SIGTERM)
    assert parts.calls[-2:] == [("save", 3), ("step", 3, (0, 3))]
    assert parts.votes_seen[0] == vote(signal.SIGUSR1)  # this rank's request rides every step


def test_an_evaluation_can_end_training_before_the_steps_save():
    parts = ScriptedParts(4, end_at=2)
    cadence = Cadence(steps_per_epoch=4, end_step=8, eval_points=frozenset({1, 3}), checkpoint_every_n_steps=2)
    end = run_epochs(parts, cadence, 0, stop=None)
    assert (end.step, end.ended_by_evaluation) == (2, True)
    assert parts.calls[-1] == ("evaluate", 2)


def test_an_epoch_without_batches_is_an_error():
    parts = ScriptedParts(2)  # the data holds 2 batches an epoch, the cadence says 4
    with pytest.raises(RuntimeError, match=r"yielded no batch at step 2 \(epoch 0, batch 2\)"):
        run_epochs(parts, Cadence(steps_per_epoch=4, end_step=8), 0, stop=None)

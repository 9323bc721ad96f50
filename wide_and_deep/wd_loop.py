"""Wide & Deep's side of the shared epoch loop (recsys/training/loop.py, `LoopParts`).

What stays the reference's: the step with the schedule's deep rate, a progress record of the step's
own batch (accuracy, AUC, loss: the reference logs no timing there; this project adds the mean loss
over the steps since the previous record, `mean_loss`), the evaluation after each epoch
(MAP@12 among its metrics, main.evaluate) followed by a checkpoint, and under --benchmark each
step's samples/s, from main.Benchmark's own clock (its warm-up is --benchmark_warmup_steps, and it
also times --evaluate --benchmark), not the loop's. main._train picks the cadence of each mode and
ends the run.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import tensorflow as tf

from recsys.runtime import distributed as dist
from recsys.runtime.logger import StepTimer, print_rank0
from recsys.runtime.metrics import exact_auc
from recsys.training import checkpoint
from recsys.training.loop import IntervalMean, ScalarRecorder
from wide_and_deep import wd_data, wd_metrics, wd_model


class WideDeepLoopParts:
    """The LoopParts of a W&D run (`run`: main.Run). `evaluate` is the per-epoch evaluation, whose
    record the run's final record repeats (`evaluation`); `record` logs a group of scalars at a step;
    `speed`, under --benchmark only, turns the steps done so far into the last step's samples/s
    (None before its clock runs), logged at every step."""

    def __init__(self, run: Any, evaluate: Callable[[], Dict[str, float]], record: ScalarRecorder,
                 speed: Optional[Callable[[int], Optional[float]]], start_step: int) -> None:
        self.run, self.record, self.speed, self.start_step = run, record, speed, start_step
        self._evaluate = evaluate
        self.trainer = wd_model.TrainStep(run.model, run.optimizers, run.args.seed, run.args.xla)
        self.evaluation: Dict[str, float] = {}
        self.last: Optional[Tuple[Dict[str, tf.Tensor], tf.Tensor, tf.Tensor]] = None  # batch, loss, probabilities
        self.batches: Optional[Iterator[Dict[str, tf.Tensor]]] = None  # the training stream (open_epoch)
        self.loss_sum = 0.0  # every step's loss summed, for progress records' mean over their interval
        self.mean_loss = IntervalMean(start_step, 0.0)

    def open_epoch(self, epoch: int, offset: int, steps: int) -> Iterator[Dict[str, tf.Tensor]]:
        """This rank's batches from step `offset` of `epoch` on: one endless dataset of the epochs in turn
        (wd_data.train_record_stream), opened at the run's first epoch. The loop takes every step of an
        epoch before it opens the next, so the stream then stands at that epoch's first batch: no epoch
        boundary builds a dataset (which stalled that step for about a second, a third of --benchmark's
        figure on small data)."""
        if self.batches is None:
            run = self.run
            groups = wd_data.train_record_stream(len(run.data.train), run.data.train_records_per_step, run.rank,
                                                 run.world_size, run.args.seed, epoch, offset)
            self.batches = iter(run.data.train.dataset(groups, run.config.buckets))
        return self.batches

    def step(self, batches: Iterator[Dict[str, tf.Tensor]], step: int, stop_vote: tf.Tensor) -> Optional[tf.Tensor]:
        batch = next(batches, None)
        if batch is None:
            return None
        run = self.run
        run.optimizers.deep_lr.assign(wd_model.deep_learning_rate(step, run.data.steps_per_epoch, run.config))
        loss, probabilities, votes = self.trainer.step(batch, tf.constant(step, tf.int64), stop_vote)
        run.step.assign(step + 1)
        self.last = batch, loss, probabilities
        self.loss_sum += float(loss)  # the step's votes are read next: this waits for nothing more
        if self.speed is not None:
            samples_per_s = self.speed(step + 1 - self.start_step)
            if samples_per_s is not None:
                run.logger.log(step=(step + 1,), data={"batch_samplesps": samples_per_s})
        return votes

    def progress(self, step: int, timer: StepTimer) -> None:
        """The reference's record of the last step (rank 0's batch's accuracy and AUC, the step's
        loss) and the mean loss since the previous record (`mean_loss`); the loop's clock is not reported."""
        batch, loss, probabilities = self.last
        labels, predicted = batch["label"].numpy(), probabilities.numpy()
        self.record(step, "train", {"binary_accuracy": wd_metrics.binary_accuracy(labels, predicted),
                                    "auc": exact_auc(labels, predicted), "loss": float(loss.numpy()),
                                    "mean_loss": self.mean_loss.read(step, self.loss_sum)})

    def evaluate(self, step: int) -> bool:
        """The epoch's evaluation, logged; it never ends training."""
        self.evaluation = self._evaluate()
        self.record(step, "eval", self.evaluation)
        return False

    def save(self, step: int) -> None:
        """The one checkpoint --model_dir keeps, written by rank 0; every rank waits until it is whole."""
        run = self.run
        path = checkpoint.save(run.args.model_dir, step, run.state, run.lineage, keep=1, writer=run.rank == 0)
        dist.barrier()
        print_rank0(f"checkpoint saved: {path}", rank=run.rank)

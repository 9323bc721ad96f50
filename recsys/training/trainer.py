"""Training step, evaluation and DLRM's epoch loop (reference §2.11, §7): `train_loop` runs the
shared loop (loop.run_epochs) with DLRM's step, progress line, evaluations and saves.

The step runs data parallel: each rank computes its local batch's loss; dense gradients are
averaged over ranks with one fused allreduce. The embedding layer routes its own gradients
(`reduce_gradients`: model-parallel pieces stay local and sparse, tables held whole on every rank
are averaged). The trainer also names the variables a checkpoint holds (`training_state`).
"""
from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.runtime import distributed as dist
from recsys.runtime import metrics
from recsys.training.checkpoint import STEP_COUNTER, TrainingState
from recsys.training.loop import Cadence, IntervalMean, ScalarRecorder, run_epochs
from recsys.training.optimizers import Optimizer
from recsys.data.pipeline_errors import surface_data_errors
from recsys.runtime.stop_signals import STOP_SIGNALS, StopRequest
from recsys.runtime.logger import StepTimer, print_rank0
from recsys.runtime.tracing import traced


class TrainableModel(Protocol):
    """What the trainer asks of a model (root `model.Dlrm` keeps it): called on a batch's features it
    returns the logits; its variables split into dense ones and embedding tables, whose layer routes
    its own gradients; its tables and dense weights are named for checkpoints."""
    config: Any
    embedding: Any
    dense_variables: List[tf.Variable]
    embedding_variables: List[tf.Variable]

    def __call__(self, *args: Any, **kwargs: Any) -> tf.Tensor:
        """The logits of a batch's features (`ids_exchanged=True`: features from `exchange_ids`;
        `tag` names a micro-batch's collectives apart)."""
        ...

    def micro_batches(self, features: Dict[str, Any], labels: tf.Tensor, parts: int) -> List[Tuple[Any, tf.Tensor]]:
        """The batch as `parts` micro-batches of (features, labels)."""
        ...

    def exchange_ids(self, features: Dict[str, Any], tag: str = "") -> Dict[str, Any]:
        """The features with their ids exchanged between the ranks (what needs no weight)."""
        ...

    def table_views(self, selector: Optional[Callable[[tf.Variable], tf.Variable]] = None) -> list:
        ...

    def dense_weight_map(self) -> Dict[str, tf.Variable]:
        ...


class Schedule(Protocol):
    """The learning-rate schedule the trainer advances once per step (root `lr_scheduler`)."""
    step: tf.Variable

    def advance(self) -> tf.Tensor:
        ...


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or Inf; training stops and no checkpoint is written."""


@dataclass
class EvalResult:
    """One evaluation: AUC, log loss (`loss`), and metrics.quality_metrics' normalized entropy and calibration."""
    auc: float
    loss: float
    num_samples: int
    normalized_entropy: float = float("nan")
    calibration: float = float("nan")


@dataclass
class TrainResult:
    """End of a training run; the evaluation summaries are None when no evaluation ran."""
    steps: int
    mean_step_time_s: float
    train_loss: float
    evaluations: List[EvalResult] = field(default_factory=list)
    stopped_by: Optional[int] = None  # the signal the ranks stopped for, None when training ran to its end
    target_reached_at: Optional[int] = None  # the step whose evaluation reached LoopConfig.target_auc

    @property
    def best_auc(self) -> Optional[float]:
        """Best AUC over the evaluations; NaN if none had a defined AUC (one label class)."""
        if not self.evaluations:
            return None
        return max((e.auc for e in self.evaluations if math.isfinite(e.auc)), default=float("nan"))

    @property
    def min_validation_loss(self) -> Optional[float]:
        """Lowest validation loss over the evaluations."""
        if not self.evaluations:
            return None
        return min(e.loss for e in self.evaluations)


def eval_points(steps_per_epoch: int, evals_per_epoch: int) -> List[int]:
    """0-based steps within an epoch after which to evaluate (§7)."""
    if evals_per_epoch <= 0:
        return []
    return sorted({int(round(x)) for x in np.linspace(0, steps_per_epoch - 1, evals_per_epoch + 1)[1:]})


# The dense gradients cross ranks in this many fused allreduces, the last layers' first, so that
# theirs runs while the backward pass computes the first layers' (distributed.bucketed_allreduce).
DENSE_GRADIENT_BUCKETS = 4

# One step's batch, ready for the weights: per micro-batch its features with the ids exchanged
# (`TrainableModel.exchange_ids`) and its labels.
Prepared = Tuple[Tuple[Dict[str, Any], tf.Tensor], ...]


class Trainer:
    """Owns the compiled train and predict functions of a model and its optimizers.

    `micro_batches` N > 1 runs each step's local batch as N micro-batches in one graph: each its own
    forward pass and exchanges (collectives named apart), their losses weighted by their rows and
    summed, so one backward pass gives the whole batch's gradients (the same weights as one batch,
    to float rounding) while one micro-batch's exchange can run during another's compute.
    `pipeline_input` (where the embedding layer exchanges ids: `exchanges_ids`) makes
    `train_pipelined` available: a step on a batch whose ids were exchanged before it, which
    exchanges the next batch's ids in the same graph, with no dependency on the step's compute.
    """

    def __init__(self, model: TrainableModel, dense_optimizer: Optimizer, embedding_optimizer: Optimizer,
                 scheduler: Schedule, loss_scale: Optional[float] = None,
                 fp16_allreduce: bool = False, micro_batches: int = 1, pipeline_input: bool = False) -> None:
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
        self.model = model
        self.fp16_allreduce = fp16_allreduce
        self.dense_optimizer = dense_optimizer
        self.embedding_optimizer = embedding_optimizer
        self.scheduler = scheduler
        self.loss_scale = loss_scale
        self.micro_batches = micro_batches
        self.pipelined = pipeline_input and bool(model.embedding.exchanges_ids)
        dense_optimizer.build(model.dense_variables)
        embedding_optimizer.build(model.embedding_variables)
        with tf.device("/CPU:0"):
            self.first_nonfinite_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="first_nonfinite_step")
            # seconds of the steps so far with a collective they wait for in flight (progress lines' comm share)
            self.communication_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                                     name="communication_seconds")
            # every step's loss (averaged over ranks) summed: progress lines report its mean over their interval
            self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_sum")
        # decided once: whether steps time their collectives (several ranks, op determinism off)
        self.times_communication = dist.size() > 1 and dist.collectives_can_be_timed()
        self.train_step = traced(self._train_step)
        self.train_next = traced(self._train_next)
        self.exchange_next = traced(self._exchange_next)
        # The carried batch's ragged ids change length from step to step: one trace for all of them.
        self.train_pipelined = traced(self._train_pipelined, reduce_retracing=True)

    def check_finite(self) -> None:
        """Raise NonFiniteLossError if any step so far had a NaN/Inf loss.

        The step records that on the device, so the host reads it only here: at progress lines,
        before evaluations and checkpoints, and at the end, never once per step.
        """
        first = int(self.first_nonfinite_step.numpy())
        if first >= 0:
            raise NonFiniteLossError(f"training loss became NaN or Inf at step {first}; stopping without "
                                     f"writing a checkpoint (the last one saved is intact)")

    def _tag(self, part: int) -> str:
        """The suffix of micro-batch `part`'s collective names (none without micro-batches)."""
        return f"_mb{part}" if self.micro_batches > 1 else ""

    def prepare(self, features: Dict[str, Any], labels: tf.Tensor) -> Prepared:
        """The batch's micro-batches with their ids exchanged: all of a step that reads no weight."""
        parts = self.model.micro_batches(features, labels, self.micro_batches)
        return tuple((self.model.exchange_ids(part_features, self._tag(part)), part_labels)
                     for part, (part_features, part_labels) in enumerate(parts))

    def _train_step(self, features: Dict[str, tf.Tensor], labels: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        loss, learning_rate, _, _ = self._timed_step(lambda: self.prepare(features, labels),
                                                     tf.zeros([len(STOP_SIGNALS)]))
        return loss, learning_rate

    def _timed_step(self, prepare: Callable[[], Prepared], stop_vote: tf.Tensor,
                    prefetch: Callable[[], Prepared] = tuple) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, Prepared]:
        """`_step` on `prepare()`'s batch and `prefetch()`'s next batch (pipelined input), adding to
        `communication_seconds` the time the step had a collective it waits for in flight: its own
        (the batch's id exchange included when `prepare` exchanges it), and whatever of the next
        batch's exchange outlasts the step."""
        with dist.timed_collectives() as ahead:
            upcoming = prefetch()
        with dist.timed_collectives() as waited:
            loss, learning_rate, stop_votes = self._step(prepare(), stop_vote)
        waited.add_outlasting(ahead, after=stop_votes)
        self.communication_seconds.assign_add(waited.in_flight_seconds())
        return loss, learning_rate, stop_votes, upcoming

    def _loss(self, prepared: Prepared) -> tf.Tensor:
        """The local batch's mean loss: with micro-batches, each one's mean weighted by its share
        of the rows, summed."""
        losses, rows = [], []
        for part, (features, labels) in enumerate(prepared):
            logits = self.model(features, training=True, ids_exchanged=True, tag=self._tag(part))
            losses.append(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)))
            rows.append(tf.cast(tf.shape(labels)[0], losses[-1].dtype))
        if len(losses) == 1:
            return losses[0]
        total = tf.add_n(rows)
        return tf.add_n([loss * (count / total) for loss, count in zip(losses, rows)])

    def _step(self, prepared: Prepared, stop_vote: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """One step on a prepared batch (`prepare`); returns the mean loss over ranks, the learning
        rate, and the ranks' averaged stop votes (stop_signals.vote), which ride the loss's
        allreduce: no extra collective."""
        step = self.scheduler.step.read_value()
        learning_rate = self.scheduler.advance()
        dense_vars, embedding_vars = self.model.dense_variables, self.model.embedding_variables
        with tf.GradientTape() as tape:
            loss = self._loss(prepared)
            scaled_loss = loss * self.loss_scale if self.loss_scale else loss
        gradients = tape.gradient(scaled_loss, dense_vars + embedding_vars)
        if self.loss_scale:
            gradients = [dist.scale_gradient(g, 1.0 / self.loss_scale) for g in gradients]
        dense_grads = (dist.bucketed_allreduce(gradients[:len(dense_vars)], DENSE_GRADIENT_BUCKETS,
                                               fp16=self.fp16_allreduce) if dense_vars else [])
        embedding_grads = self.model.embedding.reduce_gradients(gradients[len(dense_vars):])
        dense_pairs = list(zip(dense_grads, dense_vars))
        embedding_pairs = list(zip(embedding_grads, embedding_vars))
        if self.dense_optimizer is self.embedding_optimizer:
            self.dense_optimizer.apply(dense_pairs + embedding_pairs, learning_rate)
        else:
            self.dense_optimizer.apply(dense_pairs, learning_rate)
            self.embedding_optimizer.apply(embedding_pairs, learning_rate)
        reduced = dist.allreduce(tf.concat([tf.cast(loss, tf.float32)[None], stop_vote], 0), name="train_loss")
        loss, stop_votes = reduced[0], reduced[1:]
        first_bad = self.first_nonfinite_step.read_value()
        self.first_nonfinite_step.assign(tf.where((first_bad < 0) & ~tf.math.is_finite(loss), step, first_bad))
        self.loss_sum.assign_add(tf.cast(loss, tf.float64))
        return loss, learning_rate, stop_votes

    def _train_next(self, batches: tf.data.Iterator,
                    stop_vote: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """`_step` on the iterator's next batch, taken inside the step's graph: the batch's
        tensors never become Python objects (a Python-side `next` costs tens of microseconds per
        tensor, a batch has one per feature), so the loader runs at its in-graph rate."""
        loss, learning_rate, stop_votes, _ = self._timed_step(lambda: self.prepare(*next(batches)), stop_vote)
        return loss, learning_rate, stop_votes

    def _exchange_next(self, batches: tf.data.Iterator) -> Prepared:
        """The iterator's next batch, prepared (`prepare`): fills the input pipeline at an epoch's
        first step, before `train_pipelined` carries it on."""
        return self.prepare(*next(batches))

    def _train_pipelined(self, batches: tf.data.Iterator, prepared: Prepared, stop_vote: tf.Tensor,
                         prefetch: bool) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, Prepared]:
        """`_step` on `prepared` (this step's batch, its ids exchanged by the previous call or by
        `exchange_next`) and, with `prefetch`, the iterator's next batch prepared in the same graph:
        its id exchange depends on nothing of this step, so it runs while this step computes.
        Returns the step's results and the next batch (empty without `prefetch`: the epoch's last
        step). The same weights as `train_next` on the same batches: only the time the ids are
        exchanged moves."""
        return self._timed_step(lambda: prepared, stop_vote,
                                (lambda: self._exchange_next(batches)) if prefetch else tuple)

    def training_state(self, feature_names: Sequence[str], optimizer_name: str) -> TrainingState:
        """The variables a checkpoint saves and restores, named in the global per-table layout."""
        model, dense_optimizer, embedding_optimizer = self.model, self.dense_optimizer, self.embedding_optimizer
        tables = model.table_views()
        slot_names = embedding_optimizer.slot_names if model.embedding_variables else ()
        slot_views = {slot: model.table_views(lambda v, slot=slot: embedding_optimizer.slot_variables(v)[slot])
                      for slot in slot_names}
        counters = {STEP_COUNTER: self.scheduler.step, "dense_optimizer_iterations": dense_optimizer.iterations}
        if embedding_optimizer is not dense_optimizer:
            counters["embedding_optimizer_iterations"] = embedding_optimizer.iterations
        dense = model.dense_weight_map()
        return TrainingState(
            model_config=model.config.shape_fields() | {"optimizer": optimizer_name},
            feature_names=list(feature_names), tables=tables,
            table_slots=[{slot: views[i] for slot, views in slot_views.items()} for i in range(len(tables))],
            dense=dense, dense_slots={name: dense_optimizer.slot_variables(v) for name, v in dense.items()},
            counters=counters)


PredictFn = Callable[[Dict[str, tf.Tensor]], tf.Tensor]


class Evaluator:
    """AUC, log loss, normalized entropy and calibration over every sample of every rank, from any
    function that returns logits.

    An evaluation longer than `progress_interval_s` prints its progress on rank 0 every that many
    seconds (a full Criteo test set takes minutes).
    """

    def __init__(self, predict: PredictFn, auc_thresholds: Optional[int] = None,
                 progress_interval_s: float = 30.0) -> None:
        self.predict = predict
        self.auc_thresholds = auc_thresholds
        self.progress_interval_s = progress_interval_s

    @classmethod
    def for_model(cls, model: TrainableModel, auc_thresholds: Optional[int] = None) -> "Evaluator":
        return cls(traced(lambda features: model(features, training=False)), auc_thresholds)

    @surface_data_errors()
    def _gather_predictions(self, dataset: tf.data.Dataset, max_batches: Optional[int] = None,
                            latencies: Optional[List[float]] = None, progress: bool = False,
                            between_batches: Optional[Callable[[], None]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Logits and labels of every rank, concatenated; optionally per-batch fetch+forward latency,
        or (`progress`) a progress line on rank 0 every `progress_interval_s` seconds. `between_batches`
        runs before each batch: the one point where a caller may raise (a deferred stop signal), outside
        TensorFlow's ops."""
        logits, labels = [], []
        iterator = iter(dataset)
        batch = 0
        total = int(tf.data.experimental.cardinality(dataset))
        started = last_report = time.perf_counter()
        report = progress and dist.rank() == 0
        while max_batches is None or batch < max_batches:
            if between_batches is not None:
                between_batches()
            start = time.perf_counter()
            try:
                features, batch_labels = next(iterator)
            except StopIteration:
                break
            batch_logits = self.predict(features).numpy()
            if latencies is not None:
                latencies.append(time.perf_counter() - start)
            logits.append(batch_logits.reshape(-1))
            labels.append(batch_labels.numpy().reshape(-1))
            batch += 1
            if report and time.perf_counter() - last_report >= self.progress_interval_s:
                last_report = time.perf_counter()
                print(evaluation_progress(batch, total, last_report - started), flush=True)
        local_logits = np.concatenate(logits) if logits else np.zeros([0], np.float32)
        local_labels = np.concatenate(labels) if labels else np.zeros([0], np.float32)
        return (dist.allgather(tf.constant(local_logits, tf.float32)).numpy(),
                dist.allgather(tf.constant(local_labels, tf.float32)).numpy())

    def _score(self, logits: np.ndarray, labels: np.ndarray) -> EvalResult:
        auc = (metrics.threshold_auc(labels, logits, self.auc_thresholds) if self.auc_thresholds
               else metrics.exact_auc(labels, logits))
        quality = metrics.quality_metrics(labels, logits=logits)
        return EvalResult(auc=auc, loss=quality["log_loss"], num_samples=labels.size,
                          normalized_entropy=quality["normalized_entropy"], calibration=quality["calibration"])

    def _score_once(self, logits: np.ndarray, labels: np.ndarray) -> EvalResult:
        """The metrics computed on rank 0 alone (an exact AUC sorts every sample) and sent to all."""
        result = self._score(logits, labels) if dist.rank() == 0 else None
        return dist.broadcast_object(result, root_rank=0) if dist.size() > 1 else result

    def evaluate(self, dataset: tf.data.Dataset,
                 between_batches: Optional[Callable[[], None]] = None) -> EvalResult:
        """AUC and log loss over every sample of every rank (`between_batches`: see _gather_predictions)."""
        logits, labels = self._gather_predictions(dataset, progress=True, between_batches=between_batches)
        return self._score_once(logits, labels)

    def benchmark_inference(self, dataset: tf.data.Dataset, max_batches: int, warmup_batches: int = 10,
                            between_batches: Optional[Callable[[], None]] = None) -> Tuple[List[float], EvalResult]:
        """Per-batch latencies (fetch + forward) after warm-up, and the metrics of the batches run.

        The latencies list is empty when the dataset ends within the warm-up; callers check the
        length first (main.inference_batches) so that no NaN statistics are reported.
        """
        latencies: List[float] = []
        logits, labels = self._gather_predictions(dataset, max_batches, latencies, between_batches=between_batches)
        return latencies[warmup_batches:], self._score_once(logits, labels)


@dataclass
class LoopConfig:
    epochs: int
    steps_per_epoch: int
    global_batch_size: int
    max_steps: int = -1
    evals_per_epoch: int = 1
    print_freq: int = 100
    checkpoint_every_n_steps: int = 0
    profiler_start_step: Optional[int] = None
    profiler_logdir: str = "logdir"
    profile_this_rank: bool = False
    evaluate_at_end: bool = False  # one more evaluation after the last step, unless one just ran (SOK's eval_in_last)
    target_auc: Optional[float] = None  # stop after the evaluation whose AUC reaches it

    @property
    def total_steps(self) -> int:
        """The step training ends at: every epoch's steps, capped by `max_steps` when >= 0."""
        total = self.epochs * self.steps_per_epoch
        return total if self.max_steps < 0 else min(total, self.max_steps)


def duration_text(seconds: float) -> str:
    """H:MM:SS of a duration in seconds."""
    return str(datetime.timedelta(seconds=round(seconds)))


def evaluation_progress(batches_done: int, total_batches: int, elapsed_s: float) -> str:
    """An evaluation's progress line on rank 0; `total_batches` < 0 when the dataset's length is unknown."""
    rate = batches_done / max(elapsed_s, 1e-9)
    if total_batches > 0:
        return (f"evaluation: {batches_done}/{total_batches} batches ({100 * batches_done / total_batches:.0f}%), "
                f"{rate:.1f} batches/s, eta={duration_text((total_batches - batches_done) / rate)}")
    return f"evaluation: {batches_done} batches, {rate:.1f} batches/s"


def progress_line(step: int, total_steps: int, epoch: int, total_epochs: int, scalars: Dict[str, float],
                  eta_s: float) -> str:
    """The reference's progress line (its `loss`: the last step's) with the step out of the total, the
    1-based epoch, the mean loss over the steps since the previous line (`mean_loss`) and the time left;
    with peers, also the share of a step spent communicating (`communication_share`)."""
    communication = (f"comm_wait={scalars['communication_share']:.1%}, " if "communication_share" in scalars else "")
    return (f"step={step}/{total_steps}, epoch={epoch}/{total_epochs}, "
            f"throughput={scalars['throughput'] / 1e6:.3f}M, step_time={scalars['step_time_ms']:.3f} ms, "
            f"learning_rate={scalars['learning_rate']:.4f}, loss={scalars['loss']:.8f}, "
            f"mean_loss={scalars['mean_loss']:.8f}, {communication}eta={duration_text(eta_s)}")


class _DlrmLoopParts:
    """DLRM's side of the epoch loop (loop.LoopParts): the in-graph step over the prefetched epoch,
    the reference's progress line, evaluations with the target-AUC stop, and the non-finite-loss
    check before every host read, evaluation and checkpoint. `record_scalars` gets group "train"
    (loss, the last step's; mean_loss, the mean over the steps since the previous progress point;
    learning_rate, throughput in samples/s, step_time_ms; with peers communication_share, the share
    of a step with a collective it waits for in flight, unless op determinism is on) at each
    progress line and group "eval" (auc, validation_loss) after each evaluation."""

    def __init__(self, trainer: Trainer, evaluator: Evaluator, train_dataset: tf.data.Dataset,
                 test_dataset: tf.data.Dataset, config: LoopConfig, save_checkpoint: Optional[Callable[[int], None]],
                 record_scalars: Optional[ScalarRecorder], start_step: int) -> None:
        self.trainer, self.evaluator, self.config = trainer, evaluator, config
        self.train_dataset, self.test_dataset = train_dataset, test_dataset
        self.save_checkpoint, self.record_scalars = save_checkpoint, record_scalars
        self.rank = dist.rank()
        self.total_epochs = math.ceil(config.total_steps / config.steps_per_epoch)
        self.loss: Optional[tf.Tensor] = None  # the last step's, read on the host only at progress lines and the end
        self.learning_rate: Optional[tf.Tensor] = None
        self.evaluations: List[EvalResult] = []
        self.evaluated_at: Optional[int] = None
        self.reached_at: Optional[int] = None  # the step whose evaluation reached config.target_auc
        self.upcoming: Optional[Prepared] = None  # pipelined input: the next batch, its ids exchanged
        self.steps_left = 0  # steps the open epoch still takes
        # per step since the previous progress point: the loss (trainer.loss_sum), the seconds in collectives
        self.mean_loss = IntervalMean(start_step, float(trainer.loss_sum.numpy()))
        self.communication = IntervalMean(start_step, float(trainer.communication_seconds.numpy()))

    def open_epoch(self, epoch: int, offset: int, steps: int) -> tf.data.Iterator:
        """The epoch's batches from `offset` on; the input pipeline starts empty (filled by the
        epoch's first step), so a resumed run exchanges exactly the batches an unbroken one did."""
        self.upcoming, self.steps_left = None, steps
        return iter(prefetch_to_device(self.train_dataset.skip(offset).take(steps)))

    def step(self, batches: tf.data.Iterator, step: int, stop_vote: tf.Tensor) -> Optional[tf.Tensor]:
        """One training step; pipelined (Trainer.train_pipelined), it trains on the batch the
        previous step exchanged and exchanges the next, except at the epoch's last step. What it
        carries is only ids, so evaluations and checkpoints between steps leave it valid, and a
        stop or the epoch's end simply drops it."""
        _maybe_profile(self.config, step, self.rank)
        try:
            if not self.trainer.pipelined:
                self.loss, self.learning_rate, stop_votes = self.trainer.train_next(batches, stop_vote)
                return stop_votes
            if self.upcoming is None:
                self.upcoming = self.trainer.exchange_next(batches)
        except tf.errors.OutOfRangeError:
            return None
        self.steps_left -= 1
        self.loss, self.learning_rate, stop_votes, upcoming = self.trainer.train_pipelined(
            batches, self.upcoming, stop_vote, self.steps_left > 0)
        self.upcoming = upcoming or None
        return stop_votes

    def progress(self, step: int, timer: StepTimer) -> None:
        """The progress line (and `record_scalars`) once the timer has a window; the loss read is the
        window's one host synchronisation, so the window closes after it."""
        self.trainer.check_finite()
        train_loss = float(self.loss.numpy())
        window = timer.close_window()
        mean_loss = self.mean_loss.read(step, float(self.trainer.loss_sum.numpy()))
        measured = self.trainer.times_communication
        # every progress point, so that a line's figure leaves out the warm-up's first steps, whose
        # collectives wait for the slowest rank to trace its graph
        communication_per_step = (self.communication.read(step, float(self.trainer.communication_seconds.numpy()))
                                  if measured else 0.0)
        if window is None:
            return
        total_steps = self.config.total_steps
        scalars = {"loss": train_loss, "mean_loss": mean_loss, "learning_rate": float(self.learning_rate),
                   "throughput": self.config.global_batch_size / window, "step_time_ms": window * 1000}
        if measured:
            scalars["communication_share"] = min(1.0, communication_per_step / window)
        eta_s = (total_steps - step) * timer.mean_step_time()
        epoch = (step - 1) // self.config.steps_per_epoch + 1
        print_rank0(progress_line(step, total_steps, epoch, self.total_epochs, scalars, eta_s), rank=self.rank)
        if self.record_scalars:
            self.record_scalars(step, "train", scalars)

    def evaluate(self, step: int) -> bool:
        """Evaluate after `step` steps; True when the AUC reached the target."""
        self.trainer.check_finite()
        result = self.evaluator.evaluate(self.test_dataset)
        self.evaluations.append(result)
        self.evaluated_at = step
        print_rank0(f"Evaluation completed, AUC: {result.auc:.6f}, test_loss: {result.loss:.6f}, "
                    f"step: {step}, samples: {result.num_samples}", rank=self.rank)
        if self.record_scalars:
            self.record_scalars(step, "eval", {"auc": result.auc, "validation_loss": result.loss})
        target = self.config.target_auc
        if target is None or not result.auc >= target:  # NaN (one label class) never reaches
            return False
        print_rank0(f"target AUC {target} reached at step {step} (AUC {result.auc:.6f}): training stops",
                    rank=self.rank)
        self.reached_at = step
        return True

    def save(self, step: int) -> None:
        self.trainer.check_finite()
        self.save_checkpoint(step)


@surface_data_errors()
def train_loop(trainer: Trainer, evaluator: Evaluator, train_dataset: tf.data.Dataset, test_dataset: tf.data.Dataset,
               config: LoopConfig, save_checkpoint: Optional[Callable[[int], None]] = None,
               record_scalars: Optional[ScalarRecorder] = None, stop: Optional[StopRequest] = None) -> TrainResult:
    """Run epochs from the scheduler's current step (so a restored run resumes in place), in the
    shared epoch loop (loop.run_epochs) with DLRM's parts (`_DlrmLoopParts`).

    A signal `stop` records ends the loop after the step in which every rank learns of it (the
    votes ride the step's loss allreduce), before that step's progress line, evaluation or
    checkpoint; the result's `stopped_by` names it and the caller saves.

    Progress lines (and `record_scalars`) come every `print_freq` steps after the timer's warm-up,
    where the host reads the loss anyway: they add no synchronisation to the steps between (the
    steps sum their losses on the device for the line's mean over its interval). The ETA is the
    steps left at the mean step time so far (whose windows include the evaluations and checkpoints
    that ran in them).
    """
    start_step = int(trainer.scheduler.step.numpy())
    parts = _DlrmLoopParts(trainer, evaluator, train_dataset, test_dataset, config, save_checkpoint, record_scalars,
                           start_step)
    cadence = Cadence(
        steps_per_epoch=config.steps_per_epoch, end_step=config.total_steps, print_freq=config.print_freq,
        eval_points=frozenset(eval_points(config.steps_per_epoch, config.evals_per_epoch)),
        checkpoint_every_n_steps=config.checkpoint_every_n_steps if save_checkpoint else 0,
        timer_warmup_steps=2 * config.print_freq)
    end = run_epochs(parts, cadence, start_step, stop)
    trainer.check_finite()
    if (config.evaluate_at_end and end.stopped_by is None and not end.ended_by_evaluation
            and parts.evaluated_at != end.step):
        parts.evaluate(end.step)
    train_loss = float(parts.loss.numpy()) if end.step > start_step else float("nan")
    return TrainResult(steps=end.step, mean_step_time_s=end.timer.mean_step_time(), train_loss=train_loss,
                       evaluations=parts.evaluations, stopped_by=end.stopped_by, target_reached_at=parts.reached_at)


def prefetch_to_device(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """On a GPU, stage the next batches in device memory while the current step runs, so the
    host-to-device copy overlaps the step; on the CPU the dataset is returned as it is. Must be the
    pipeline's last transformation."""
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        return dataset
    return dataset.apply(tf.data.experimental.prefetch_to_device(gpus[0].name, buffer_size=2))


def _maybe_profile(config: LoopConfig, step: int, rank: int) -> None:
    if config.profiler_start_step is None or not config.profile_this_rank:
        return
    if step == config.profiler_start_step:
        tf.profiler.experimental.start(config.profiler_logdir)
    elif step == config.profiler_start_step + 100:
        tf.profiler.experimental.stop()


def percentiles(latencies: Sequence[float]) -> Dict[str, float]:
    """Mean and p50/p90/p95/p99 of per-batch latencies, in seconds; at least one is needed."""
    values = np.asarray(latencies, np.float64)
    if values.size == 0:
        raise ValueError("no latency was measured (every batch run was a warm-up batch)")
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)), "p95": float(np.percentile(values, 95)),
            "p99": float(np.percentile(values, 99))}

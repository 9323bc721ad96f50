"""Wide & Deep for TensorFlow 2: train, `--evaluate`, `--benchmark` (reference V1 `main.py`, §1, §2, §8).

Run from this folder as the reference's users do: `python main.py [--amp] [--xla]`,
`horovodrun -np N python main.py` or `mpiexec -np N python main.py`, `python main.py --evaluate
--use_checkpoint`, `python main.py --benchmark [--evaluate]`. Every flag of the reference keeps its
name and default; `--seed` and `--print_freq` (the reference: a progress record every 100 steps) are
added. Bad input is one `error: ...` line on stderr and exit 2.

Differences from the reference (docs/wide_and_deep.md): each rank reads a disjoint share of the records;
an epoch is exactly `train records // records per step` updates, the short last record trained on like
the others (the reference made one uncounted update more); a resume continues the schedule and the epoch
where it stopped; `--amp` on a CPU computes in bfloat16 where the CPU has bf16 units (the reference
refused `--cpu --amp`); `--evaluate` needs trained weights (`--use_checkpoint`) unless it only measures
speed (`--benchmark`); evaluation also logs MAP@12 over whole displays (`exact_map_val`) and AUC,
accuracy, loss, normalized entropy and calibration over every eval row; `--xla` compiles the step's
forward and backward pass (the reference: auto-clustering); `--affinity` shares out the CPUs the process may use by local rank
(cpu_affinity.py; the reference: the cores near each GPU); the TensorBoard events go to
`--results_dir/event_files` (the reference: `--model_dir`'s).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence

from recsys.data import data_formats  # plain Python: the W&D formats' names without importing them (or TensorFlow)
from recsys.runtime.cli import ArgumentParser
from recsys.runtime.cpu_affinity import MODES as AFFINITIES
from recsys.runtime.logger import StepTimer

PRINT_FREQ = 100  # the reference's fixed interval of progress records, --print_freq's default
EVENT_FILES = "event_files"  # the TensorBoard folder inside --results_dir (the reference's name, in --model_dir)


class UsageError(ValueError):
    """A flag value or combination is invalid; the message names the flag."""


def build_parser() -> argparse.ArgumentParser:
    """The reference's flags (V1 trainer/utils/arguments.py) with their defaults, plus --seed."""
    p = ArgumentParser(description="Wide & Deep on the Outbrain TFRecords")
    p.add_argument("--train_data_pattern", nargs="+", default=["/outbrain/tfrecords/train/part*"],
                   help="Glob(s) of the training TFRecords")
    p.add_argument("--eval_data_pattern", nargs="+", default=["/outbrain/tfrecords/eval/part*"],
                   help="Glob(s) of the evaluation TFRecords")
    p.add_argument("--transformed_metadata_path", default="/outbrain/tfrecords",
                   help="Folder holding the data's metadata.json (the reference: its TFT metadata), or the "
                        "feature_spec.yaml of --dataset_type split_binary")
    p.add_argument("--dataset_type", default="tfrecords", choices=data_formats.names("training", "wide_and_deep"),
                   help="Data format (this project's; the registry's Wide & Deep formats): the reference's "
                        "pre-batched TFRecords, or split-binary files described by a feature spec")
    p.add_argument("--use_checkpoint", action="store_true",
                   help="Start from the newest checkpoint in --model_dir (training resumes where it stopped)")
    p.add_argument("--model_dir", default="/outbrain/checkpoints", help="Checkpoint folder")
    p.add_argument("--results_dir", default="/results", help="Folder of the log and args.json")
    p.add_argument("--log_filename", default="log.json", help="dllogger file name inside --results_dir")
    p.add_argument("--training_set_size", type=int, default=59761827,
                   help="Training rows; given, it must equal the data's metadata.json train_rows")
    p.add_argument("--global_batch_size", type=int, default=131072, help="Training rows per step, all ranks")
    p.add_argument("--eval_batch_size", type=int, default=131072, help="Evaluation rows per batch, all ranks")
    p.add_argument("--num_epochs", type=int, default=20)
    p.add_argument("--amp", action="store_true",
                   help="float16 compute with dynamic loss scaling on a GPU; bfloat16 on a CPU with bf16 units")
    p.add_argument("--xla", action="store_true",
                   help="XLA compiles each step's forward and backward pass, and the evaluation forward pass")
    p.add_argument("--linear_learning_rate", type=float, default=0.02, help="FTRL rate of the wide part")
    p.add_argument("--deep_learning_rate", type=float, default=0.00012, help="RMSprop peak rate of the deep part")
    p.add_argument("--deep_warmup_epochs", type=float, default=6, help="Linear warmup of the deep rate")
    p.add_argument("--deep_hidden_units", type=int, nargs="+", default=[1024] * 5)
    p.add_argument("--deep_dropout", type=float, default=0.1)
    p.add_argument("--evaluate", action="store_true", help="Only evaluate (with --use_checkpoint's weights)")
    p.add_argument("--benchmark", action="store_true", help="Measure training (or --evaluate) throughput")
    p.add_argument("--benchmark_warmup_steps", type=int, default=500)
    p.add_argument("--benchmark_steps", type=int, default=1000)
    p.add_argument("--affinity", choices=AFFINITIES, default="socket_unique_interleaved",
                   help="Which of the CPUs it may use each rank runs on, by its local rank (cpu_affinity.py)")
    p.add_argument("--cpu", action="store_true", help="Run on the CPU even where a GPU is visible")
    p.add_argument("--seed", type=int, default=0,
                   help="Seed of the weights, the record order and the dropout masks (this project's)")
    p.add_argument("--print_freq", type=int, default=PRINT_FREQ,
                   help="Training steps between progress records (this project's flag; the reference: every 100)")
    return p


@dataclass(frozen=True)
class Options:
    """The run's flags as typed values (build_parser's, in its order); the job reads only these."""
    train_data_pattern: List[str]
    eval_data_pattern: List[str]
    transformed_metadata_path: str
    dataset_type: str
    use_checkpoint: bool
    model_dir: str
    results_dir: str
    log_filename: str
    training_set_size: int
    global_batch_size: int
    eval_batch_size: int
    num_epochs: int
    amp: bool
    xla: bool
    linear_learning_rate: float
    deep_learning_rate: float
    deep_warmup_epochs: float
    deep_hidden_units: List[int]
    deep_dropout: float
    evaluate: bool
    benchmark: bool
    benchmark_warmup_steps: int
    benchmark_steps: int
    affinity: str
    cpu: bool
    seed: int
    print_freq: int
    given: FrozenSet[str] = frozenset()  # the flags the command line set (a default's value is not given)

    def flags(self) -> Dict[str, Any]:
        """Every flag and its value, as args.json and the log's parameters record them."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "given"}


def parse_options(argv: Optional[Sequence[str]] = None) -> Options:
    """The command line (sys.argv's when None) as Options; a bad flag is one `error:` line and exit 2."""
    namespace = build_parser().parse_args(argv)
    words = sys.argv[1:] if argv is None else list(argv)
    given = frozenset(name for name in vars(namespace)
                      if any(w == f"--{name}" or w.startswith(f"--{name}=") for w in words))
    return Options(**vars(namespace), given=given)


def validate(args: Options, world_size: int) -> None:
    """The reference's asserts and this implementation's limits; each failure names its flag."""
    from wide_and_deep.features import PREBATCH_SIZE

    for name in ("global_batch_size", "eval_batch_size", "num_epochs", "benchmark_steps", "print_freq"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("linear_learning_rate", "deep_learning_rate", "deep_warmup_epochs"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"--{name} must be a finite number >= 0, got {value}")
    if not 0 <= args.deep_dropout < 1:
        raise UsageError(f"--deep_dropout must be in [0, 1), got {args.deep_dropout}")
    if min(args.deep_hidden_units) < 1:
        raise UsageError(f"--deep_hidden_units must be positive, got {args.deep_hidden_units}")
    if args.benchmark_warmup_steps < 0:
        raise UsageError(f"--benchmark_warmup_steps must be >= 0, got {args.benchmark_warmup_steps}")
    if not 0 <= args.seed < 2 ** 31:
        raise UsageError(f"--seed must be in [0, 2**31), got {args.seed}")
    if args.benchmark and args.benchmark_warmup_steps >= args.benchmark_steps:
        raise UsageError(f"--benchmark_warmup_steps {args.benchmark_warmup_steps} must be below --benchmark_steps "
                         f"{args.benchmark_steps}")
    if args.benchmark and args.benchmark_steps < 2:  # the clock starts after step max(warmup, 1)
        raise UsageError(f"--benchmark_steps {args.benchmark_steps} leaves no step to time: the clock starts after "
                         f"the first step, so it must be at least 2")
    if args.deep_warmup_epochs > args.num_epochs:
        raise UsageError(f"--deep_warmup_epochs {args.deep_warmup_epochs:g} exceeds --num_epochs {args.num_epochs}")
    if args.evaluate and not args.use_checkpoint and not args.benchmark:
        raise UsageError("--evaluate needs trained weights: add --use_checkpoint (random weights are evaluated only "
                         "for speed, with --benchmark)")
    if args.use_checkpoint and not os.path.isdir(args.model_dir):  # a typo must not start a fresh full run
        raise UsageError(f"--use_checkpoint: --model_dir {args.model_dir} does not exist (an existing empty folder "
                         f"starts fresh)")
    for name in ("global_batch_size", "eval_batch_size"):
        value = getattr(args, name)
        if value % (world_size * PREBATCH_SIZE):
            raise UsageError(f"--{name} {value} must divide into {world_size} rank(s) x whole records of "
                             f"{PREBATCH_SIZE} rows (a multiple of {world_size * PREBATCH_SIZE})")


def check_outputs(args: Options) -> None:
    """The log, args.json and checkpoint folder can be written and touch no input (OutputPathError)."""
    from recsys.training import checkpoint
    from recsys.runtime.safe_io import check_output_dir, refuse_overlap
    from recsys.runtime.logger import check_log_file

    inputs = {"--transformed_metadata_path": args.transformed_metadata_path}
    inputs.update({f"--train_data_pattern {p}": os.path.dirname(p) for p in args.train_data_pattern})
    inputs.update({f"--eval_data_pattern {p}": os.path.dirname(p) for p in args.eval_data_pattern})
    refuse_overlap(args.results_dir, "--results_dir", inputs)
    check_output_dir(args.results_dir, "--results_dir")
    log_path = os.path.join(args.results_dir, args.log_filename)
    checkpoint.refuse_inside_checkpoints(log_path, "--log_filename", args.model_dir, "--model_dir")
    check_log_file(log_path, "--results_dir/--log_filename")
    if saves_checkpoints(args):
        refuse_overlap(args.model_dir, "--model_dir", inputs)
        check_output_dir(args.model_dir, "--model_dir")
        check_output_dir(os.path.join(args.results_dir, EVENT_FILES), "--results_dir's TensorBoard folder")


def check_run_record(args: Options, rank: int, lineage: str) -> None:
    """--results_dir's log, args.json and TensorBoard events may only be this run's own history's
    (`lineage`: the restored checkpoint's, or a fresh run's new one that no record names): a resume
    continues them, a fresh run into a folder holding another run's record is refused
    (recsys/runtime/run_record.py; every rank calls it)."""
    from recsys.runtime import run_record

    run_record.check_run_record(
        rank, os.path.join(args.results_dir, args.log_filename), "--results_dir/--log_filename", lineage,
        [("--results_dir", os.path.join(args.results_dir, name)) for name in ("args.json", EVENT_FILES)],
        "choose a new --results_dir (or move its files away), or resume that run with --use_checkpoint and its "
        "--model_dir")


def saves_checkpoints(args: Options) -> bool:
    return not args.evaluate and not args.benchmark


@dataclass
class Data:
    """The splits (wd_data.Split) and the per-rank batch geometry. Training reads every record, the
    short last one too: in a step holding it one rank's batch is smaller (wd_model.TrainStep)."""
    train: Any
    eval: Any
    steps_per_epoch: int
    train_records_per_step: int
    eval_records_per_rank: int


def open_data(args: Options, world_size: int) -> Data:
    """The --dataset_type format's description of the data and both splits' records (through the
    registry, wd_data.open_splits), checked against each other and the flags."""
    from wide_and_deep import wd_data
    from wide_and_deep.features import PREBATCH_SIZE

    options = {flag: getattr(args, flag) for flag in ("train_data_pattern", "eval_data_pattern")}
    try:
        data_formats.check_options(args.dataset_type, {k: v if k in args.given else None for k, v in options.items()})
    except ValueError as error:
        raise UsageError(str(error)) from None
    train, evaluation = wd_data.open_splits(args.dataset_type, args.transformed_metadata_path, options)
    if "training_set_size" in args.given and args.training_set_size != train.rows:
        raise UsageError(f"--training_set_size {args.training_set_size} differs from the {train.rows} train rows "
                         f"of the --dataset_type {args.dataset_type} data in {args.transformed_metadata_path}")
    records_per_step = args.global_batch_size // PREBATCH_SIZE
    steps = wd_data.train_steps_per_epoch(len(train), records_per_step)
    if steps == 0 and not args.evaluate:
        raise UsageError(f"--global_batch_size {args.global_batch_size} needs {records_per_step} records of "
                         f"{PREBATCH_SIZE} rows per step; the training data holds {len(train)} ({train.rows} rows)")
    if evaluation.buckets != train.buckets:
        raise UsageError(f"the --dataset_type {args.dataset_type} data in {args.transformed_metadata_path} gives its "
                         f"train and eval splits different buckets: {train.buckets} and {evaluation.buckets}")
    return Data(train, evaluation, steps, records_per_step, args.eval_batch_size // world_size // PREBATCH_SIZE)


def configure_tensorflow(args: Options, local_rank: int):
    """Devices and precision policy; returns (compute dtype, fp16 loss scaling?, the precision line)."""
    import tensorflow as tf

    from recsys.runtime.precision import choose_precision, host_cpu_bf16_support

    gpus = [] if args.cpu else tf.config.list_physical_devices("GPU")
    if args.cpu:
        tf.config.set_visible_devices([], "GPU")
    elif gpus:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
        tf.config.experimental.set_memory_growth(gpus[local_rank % len(gpus)], True)
    precision = choose_precision(args.amp, False, bool(gpus), 0, host_cpu_bf16_support())
    dtype, message = precision.compute_dtype, precision.message
    if dtype == tf.float16:  # the reference's AMP: dynamic scaling, one scale per optimizer
        message = "precision: --amp on a GPU: float16 compute, float32 weights, dynamic loss scaling"
    if dtype != tf.float32:
        tf.keras.mixed_precision.set_global_policy(f"mixed_{dtype.name}")
    return dtype, dtype == tf.float16, message


@dataclass
class Run:
    """Everything a mode needs, built once the inputs are checked."""
    args: Options
    rank: int
    world_size: int
    logger: Any
    data: Data
    config: Any
    model: Any
    optimizers: Any
    state: Any
    step: Any  # tf.Variable: counted training steps (the schedule's position)
    lineage: str
    predict: Any  # the compiled eval forward pass

    @property
    def total_steps(self) -> int:
        return self.args.num_epochs * self.data.steps_per_epoch


def build(args: Options, rank: int, world_size: int, logger, loss_scaling: bool) -> Run:
    """Data index, save-folder check, model and optimizers, restored weights: in that order, so that
    every input is checked before anything heavy runs or anything is written."""
    import tensorflow as tf

    from recsys.training import checkpoint
    from recsys.runtime.logger import print_rank0
    from wide_and_deep import features as F
    from wide_and_deep import wd_model

    data = open_data(args, world_size)
    config = wd_model.WideDeepConfig(tuple(args.deep_hidden_units), args.deep_dropout, args.linear_learning_rate,
                                     args.deep_learning_rate, args.deep_warmup_epochs, args.num_epochs, args.seed,
                                     dict(data.train.buckets))
    resumed = None
    if args.use_checkpoint:
        if checkpoint.list_checkpoints(args.model_dir):
            resumed = checkpoint.open_checkpoint(args.model_dir)
        elif args.evaluate and not args.benchmark:
            raise UsageError(f"--use_checkpoint: --model_dir {args.model_dir} holds no checkpoint to evaluate")
        else:
            print_rank0(f"--use_checkpoint: --model_dir {args.model_dir} holds no checkpoint yet; starting fresh",
                        rank=rank)
    lineage = checkpoint.run_lineage(resumed)
    check_run_record(args, rank, lineage)
    if saves_checkpoints(args) and resumed is not None:
        checkpoint.check_batch_size(resumed, args.global_batch_size, "--global_batch_size")
    if saves_checkpoints(args):
        checkpoint.check_save_folder(args.model_dir, config.describe(), F.deep_input_order(), lineage, resumed,
                                     "--model_dir", resume_hint="--use_checkpoint")
    # XLA cannot compile the op package's kernels: under --xla the hidden layers run in TensorFlow ops
    # (the same values) and the tables' steps are Keras's.
    model = wd_model.WideAndDeep(config, use_kernel=False if args.xla else None)
    model.build_all()
    optimizers = wd_model.build_optimizers(model, config, loss_scaling)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    state = checkpoint.TrainingState(
        config.describe(), F.deep_input_order(), [], [], model.named_variables(),
        wd_model.optimizer_slots(model, optimizers),
        {checkpoint.STEP_COUNTER: step, **wd_model.optimizer_counters(optimizers)}, args.global_batch_size)
    if resumed is not None:
        checkpoint.restore(resumed, state)
        print_rank0(f"restored {resumed.path} (step {resumed.step})", rank=rank)
    run = Run(args, rank, world_size, logger, data, config, model, optimizers, state, step, lineage,
              wd_model.predict_fn(model, args.xla))
    if saves_checkpoints(args) and int(step.numpy()) >= run.total_steps:
        raise UsageError(f"--model_dir {args.model_dir}: its checkpoint is at step {int(step.numpy())}, the end of "
                         f"--num_epochs {args.num_epochs} x {data.steps_per_epoch} steps; nothing is left to train")
    return run


class Benchmark:
    """--benchmark's length and clock: the project's StepTimer, started after step max(warmup, 1) as
    the reference's clock was; each later step's samples/s, and at `steps` their mean."""

    def __init__(self, warmup: int, steps: int, batch: int) -> None:
        self.steps, self.batch = steps, batch
        self.timer = StepTimer(warmup_steps=max(warmup, 1))

    def tick(self, done: int) -> Optional[float]:
        """After `done` steps: the last step's samples/s once the clock runs (None before)."""
        seconds = self.timer.step_done(done - 1)
        return None if seconds is None else self.batch / seconds

    def finished(self, done: int) -> bool:
        return done >= self.steps

    def mean(self) -> float:
        """Samples/s over the measured steps."""
        return self.batch / self.timer.mean_step_time()


def evaluate(run: Run, endless_benchmark: Optional[Benchmark] = None,
             between_batches: Callable[[], None] = lambda: None) -> Dict[str, float]:
    """One pass over this rank's eval records; the reference's MAP@12 (per batch, per-rank mean, ranks
    averaged) and, from every row gathered on rank 0, exact MAP@12, AUC, accuracy, loss, normalized
    entropy and calibration (recsys.runtime.metrics.quality_metrics).
    `endless_benchmark` (`--evaluate --benchmark`): pass after pass from one endless dataset, each batch's
    samples/s logged, until its steps are done; their mean is the result.
    `between_batches` runs before each batch (`--evaluate`: where a stop signal ends the run)."""
    import numpy as np
    import tensorflow as tf

    from recsys.runtime import distributed as dist
    from recsys.runtime.metrics import exact_auc, quality_metrics
    from wide_and_deep import wd_data, wd_metrics

    ap_sum, groups, parts, done = 0.0, 0, [], 0
    record_groups = wd_data.eval_record_groups if endless_benchmark is None else wd_data.endless_eval_record_groups
    batches = run.data.eval.dataset(record_groups(len(run.data.eval), run.data.eval_records_per_rank, run.rank,
                                                  run.world_size), run.config.buckets)
    for batch in batches:
        between_batches()
        probabilities = run.predict(batch["categorical"], batch["numeric"]).numpy()
        if endless_benchmark is not None:
            done += 1
            speed = endless_benchmark.tick(done)
            if speed is not None:
                run.logger.log(step=(done,), data={"batch_samplesps": speed * run.world_size})
            if endless_benchmark.finished(done):
                return {"validation_throughput": endless_benchmark.mean() * run.world_size}
            continue
        labels, ids = batch["label"].numpy(), batch["display_id"].numpy()
        total, count = wd_metrics.map12_sums(ids, labels, probabilities)
        ap_sum, groups = ap_sum + total, groups + count
        parts.append((ids, labels, probabilities))
    rank_map = ap_sum / groups if groups else float("nan")
    streaming = float(dist.allreduce(tf.constant(rank_map, tf.float64), name="wd_streaming_map").numpy())
    columns = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, dtype) for i, dtype in
               enumerate((np.int64, np.float32, np.float32))]
    ids, labels, probabilities = (dist.allgather(tf.constant(c), name=f"wd_eval_{i}").numpy()
                                  for i, c in enumerate(columns))
    result = None
    if run.rank == 0:
        quality = quality_metrics(labels, probabilities)
        result = {"binary_accuracy_val": wd_metrics.binary_accuracy(labels, probabilities),
                  "auc_val": exact_auc(labels, probabilities), "loss_val": wd_metrics.bce(labels, probabilities),
                  "normalized_entropy_val": quality["normalized_entropy"], "calibration_val": quality["calibration"],
                  "streaming_map_val": streaming, "exact_map_val": wd_metrics.exact_map12(ids, labels, probabilities)}
    return dist.broadcast_object(result, root_rank=0)


def train(run: Run) -> int:
    """Training (`_train`) with its scalars also written as TensorBoard events in --results_dir/event_files
    (rank 0; not under --benchmark)."""
    from recsys.runtime.tensorboard_log import TensorBoardScalars

    tensorboard = None
    if run.rank == 0 and not run.args.benchmark:
        tensorboard = TensorBoardScalars(os.path.join(run.args.results_dir, EVENT_FILES))
    try:
        return _train(run, tensorboard)
    finally:
        if tensorboard is not None:
            tensorboard.close()


def _train(run: Run, tensorboard) -> int:
    """The epochs from the restored step in the shared epoch loop (recsys/training/loop.py) with W&D's
    parts (wd_loop.WideDeepLoopParts): a progress record every --print_freq steps, evaluation and a
    checkpoint after each epoch; a stop signal saves and exits 128+N. --benchmark runs --benchmark_steps
    steps across epochs of one endless dataset (wd_loop), logging each one's samples/s and then their
    mean; it neither evaluates nor saves, and only a second stop signal ends it (at once)."""
    from recsys.runtime.cli import signal_exit_code
    from recsys.runtime.logger import print_rank0
    from recsys.runtime.stop_signals import STOP, signal_name
    from recsys.training.loop import Cadence, run_epochs
    from wide_and_deep.wd_loop import WideDeepLoopParts

    args, steps_per_epoch = run.args, run.data.steps_per_epoch

    def record(step: int, group: str, scalars: Dict[str, float]) -> None:
        run.logger.log(step=(step, run.total_steps), data=scalars)
        if tensorboard is not None:
            tensorboard.write(step, group, scalars)
    start = int(run.step.numpy())
    bench = Benchmark(args.benchmark_warmup_steps, args.benchmark_steps, args.global_batch_size) \
        if args.benchmark else None
    parts = WideDeepLoopParts(run, lambda: evaluate(run), record, bench.tick if bench else None, start)
    STOP.graceful = True
    if bench is not None:
        run_epochs(parts, Cadence(steps_per_epoch=steps_per_epoch, end_step=start + args.benchmark_steps), start,
                   stop=None)
        run.logger.log(step=(), data={"train_throughput": bench.mean()})
        return 0
    cadence = Cadence(steps_per_epoch=steps_per_epoch, end_step=run.total_steps, print_freq=args.print_freq,
                      eval_points=frozenset({steps_per_epoch - 1}), checkpoint_every_n_steps=steps_per_epoch)
    end = run_epochs(parts, cadence, start, stop=STOP)
    if end.stopped_by is not None:
        parts.save(end.step)
        print_rank0(f"stopped by {signal_name(end.stopped_by)} after step {end.step} of {run.total_steps}; "
                    f"checkpoint saved in {args.model_dir}: run the same command with --use_checkpoint to resume",
                    rank=run.rank)
        return signal_exit_code(end.stopped_by)
    run.logger.log(step=(), data=parts.evaluation)
    return 0


def run_evaluate(run: Run) -> int:
    """--evaluate: one pass (or, with --benchmark, the throughput of endless eval batches). A stop signal
    ends it at the next batch (StopNow, one line and exit 128+N), never inside a TensorFlow op."""
    from recsys.runtime.stop_signals import STOP

    args = run.args
    benchmark = None
    if args.benchmark:
        benchmark = Benchmark(args.benchmark_warmup_steps, args.benchmark_steps, args.eval_batch_size // run.world_size)
    with STOP.deferred() as stop_if_signalled:
        result = evaluate(run, benchmark, between_batches=stop_if_signalled)
    run.logger.log(step=(), data=result)
    return 0


def log_formats(logger) -> None:
    for metric in ("binary_accuracy", "auc", "loss", "mean_loss", "binary_accuracy_val", "auc_val", "loss_val",
                   "normalized_entropy_val", "calibration_val", "streaming_map_val", "exact_map_val"):
        logger.metadata(metric, {"format": ":.4f"})
    for metric in ("batch_samplesps", "train_throughput", "validation_throughput"):
        logger.metadata(metric, {"unit": "samples/s", "format": ":.1f"})


def write_args(args: Options, world_size: int) -> None:
    """The run's flags as args.json in --results_dir (rank 0), written whole or not at all."""
    from recsys.runtime.safe_io import atomic_file

    with atomic_file(os.path.join(args.results_dir, "args.json")) as f:
        json.dump(args.flags() | {"world_size": world_size}, f, indent=1)


def user_errors() -> tuple:
    """Exceptions caused by bad input: one `error:` line and exit 2 (run_shell), not a traceback."""
    from recsys.data.data_errors import DataError
    from recsys.data.feature_spec import FeatureSpecError
    from recsys.runtime.safe_io import OutputPathError
    from recsys.training.checkpoint import CheckpointError

    return UsageError, DataError, FeatureSpecError, CheckpointError, OutputPathError, FileNotFoundError


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, then check, build and run inside the run shell (recsys/runtime/run_shell.py); returns
    the exit code."""
    from recsys.runtime import run_shell

    args = parse_options(argv)
    shell = run_shell.ShellConfig(log_path=os.path.join(args.results_dir, args.log_filename), user_errors=user_errors,
                                  cpu=args.cpu, affinity=args.affinity)
    return run_shell.run(shell, lambda session: run_job(args, session))


def run_job(args: Options, session) -> int:
    """The flags checked, the outputs claimed (run_shell.Session; the shell has bound this rank to its
    CPUs by --affinity), then the model built and trained or evaluated."""
    from recsys.runtime import distributed as dist
    from recsys.runtime import run_record
    from recsys.runtime.logger import print_rank0
    from wide_and_deep.wd_data import surface_record_errors

    rank, world_size, logger = session.rank, session.world_size, session.logger
    validate(args, world_size)
    session.claim_outputs(lambda: check_outputs(args), args.model_dir if saves_checkpoints(args) else None,
                          "--model_dir")
    dtype, loss_scaling, precision_line = configure_tensorflow(args, session.local_rank)
    print_rank0(precision_line, rank=rank)
    run = build(args, rank, world_size, logger, loss_scaling)
    log_formats(logger)
    logger.log_parameters(args.flags() | {"world_size": world_size, run_record.RUN_KEY: run.lineage})
    if rank == 0:
        write_args(args, world_size)
    with surface_record_errors():
        code = run_evaluate(run) if args.evaluate else train(run)
    dist.barrier()
    return code


if __name__ == "__main__":
    sys.exit(main())

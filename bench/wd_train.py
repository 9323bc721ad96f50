"""Wide & Deep training speed on this machine's CPU: ours against the reference's approach, in one run.

Both train the reference's model size (13 tables at the features contract's buckets and widths, 90.9M
weights; deep MLP 5 x 1024, dropout 0.1) with FTRL 0.02 on the wide part and RMSprop(rho 0.5) on the
deep part (Keras's legacy optimizers: the TF 2.4 ones the reference ran, which update only the rows a
batch touches), on the same in-memory batches of uniform random ids, numerics and labels, fp32:

- ours: wide_and_deep.wd_model.TrainStep (grouped tables: four gathers and four sparse updates a step;
  each hidden layer's bias, ReLU and dropout one pass of the op package's BiasReluDropout);
- reference: written plainly as V1 does it, `tf.keras.experimental.WideDeepModel` over a linear and a
  DNN Keras model built from one `Input` per feature and one `Embedding` layer per table (1-wide in the
  linear model, the code's width in the DNN), Keras Dense + Dropout layers, one persistent GradientTape,
  each optimizer applied to its model's variables, the step a tf.function;
- on a CPU with bf16 units, both again under Keras's mixed_bfloat16 policy: ours is what `--amp` runs
  on such a CPU; the reference's main.py refuses `--cpu --amp`, so its bf16 row is Keras's policy
  applied to its approach, for a like-for-like comparison.

All models are built first, then timed round-robin, one step each per round, for `--steps` rounds after
`--warmup` rounds (the first traces the graphs), so a change of the machine's load touches every row
alike; a row's step time is the median of its rounds and samples/s is batch / that. The batch is the
reference's 131072 by default (about 10 s a step on 2 cores, 12 GB for the four models; the MLP's
matmuls are 5.3M multiply-adds per sample, x3 for training); --batch_size 16384 for a quick look. oneDNN is on for both (TF_ENABLE_ONEDNN_OPTS=1 unless
set, as the entry points set it).
Writes bench/results/wd_train.json and prints a table.
Usage: python -m bench.wd_train [--batch_size N] [--steps N] [--warmup N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "wd_train.json")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from recsys.runtime.cpu_settings import cpu_model_name  # noqa: E402
from recsys.runtime.precision import host_cpu_bf16_support  # noqa: E402
from wide_and_deep import features as F  # noqa: E402
from wide_and_deep import wd_model  # noqa: E402


def batches(batch_size: int, count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = np.stack([rng.integers(0, F.BUCKETS[n], batch_size) for n in F.CATEGORICAL_NAMES], 1)
        out.append({"categorical": tf.constant(ids, tf.int64),
                    "numeric": tf.constant(rng.random((batch_size, len(F.NUMERIC_FEATURES)), np.float32)),
                    "label": tf.constant(rng.integers(0, 2, batch_size).astype(np.float32)),
                    "display_id": tf.constant(np.arange(batch_size) // 6, tf.int64),
                    "row": tf.constant(np.arange(batch_size), tf.int64)})
    return out


def reference_model(hidden, dropout):
    """V1's model written plainly: per-feature Inputs and Embedding layers, Keras WideDeepModel."""
    inputs = {n: tf.keras.Input((1,), dtype=tf.int32, name=n) for n in F.CATEGORICAL_NAMES}
    inputs.update({n: tf.keras.Input((1,), dtype=tf.float32, name=n) for n in F.NUMERIC_FEATURES})
    numerics = tf.keras.layers.Concatenate()([inputs[n] for n in F.NUMERIC_FEATURES])
    wide_terms = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(F.BUCKETS[n], 1)(inputs[n]))
                  for n in F.CATEGORICAL_NAMES]
    wide_logit = tf.keras.layers.Add()(wide_terms + [tf.keras.layers.Dense(1)(numerics)])
    linear = tf.keras.Model(inputs, wide_logit)
    deep_inputs = {n: tf.keras.layers.Flatten()(tf.keras.layers.Embedding(
        F.BUCKETS[n], F.EMBEDDING_DIMS[n], embeddings_initializer="glorot_normal")(inputs[n]))
        for n in F.CATEGORICAL_NAMES}
    deep_inputs.update({n: inputs[n] for n in F.NUMERIC_FEATURES})
    x = tf.keras.layers.Concatenate()([deep_inputs[n] for n in F.deep_input_order()])
    for units in hidden:
        x = tf.keras.layers.Dropout(dropout)(tf.keras.layers.Dense(units, activation="relu")(x))
    dnn = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))
    return tf.keras.experimental.WideDeepModel(linear, dnn, activation="sigmoid"), linear, dnn


def reference_step(hidden, dropout):
    model, linear, dnn = reference_model(hidden, dropout)
    wide_opt = tf.keras.optimizers.legacy.Ftrl(0.02)
    deep_opt = tf.keras.optimizers.legacy.RMSprop(0.00012, rho=0.5)
    bce = tf.keras.losses.BinaryCrossentropy()

    @tf.function
    def step(features, labels):
        with tf.GradientTape(persistent=True) as tape:
            loss = bce(labels, model(features, training=True))
        wide_opt.apply_gradients(zip(tape.gradient(loss, linear.trainable_variables), linear.trainable_variables))
        deep_opt.apply_gradients(zip(tape.gradient(loss, dnn.trainable_variables), dnn.trainable_variables))
        return loss

    def run(batch):
        features = {n: tf.cast(batch["categorical"][:, i:i + 1], tf.int32) for i, n in enumerate(F.CATEGORICAL_NAMES)}
        features.update({n: batch["numeric"][:, i:i + 1] for i, n in enumerate(F.NUMERIC_FEATURES)})
        return step(features, batch["label"][:, None])
    return run, sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def ours_step(hidden, dropout):
    config = wd_model.WideDeepConfig(hidden_units=tuple(hidden), dropout=dropout)
    model = wd_model.WideAndDeep(config)
    model.build_all()
    trainer = wd_model.TrainStep(model, wd_model.build_optimizers(model, config, False), seed=0)
    counter = iter(range(1 << 30))
    votes = tf.zeros(3)
    return (lambda batch: trainer.step(batch, tf.constant(next(counter), tf.int64), votes)[0],
            sum(int(np.prod(v.shape)) for v in model.trainable_variables))


def timed_round_robin(runs: dict, data: list, warmup: int, steps: int) -> dict:
    """Median seconds of one step of each run, the runs taking turns step by step."""
    times = {name: [] for name in runs}
    for round_number in range(warmup + steps):
        for name, run in runs.items():
            start = time.perf_counter()
            run(data[round_number % len(data)]).numpy()
            if round_number >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=131072)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    hidden, dropout = [1024] * 5, 0.1
    data = batches(args.batch_size, 2)
    bf16 = host_cpu_bf16_support()
    plan = [("ours", ours_step, "float32"), ("reference_keras_widedeep", reference_step, "float32")]
    if bf16.supported:
        plan += [("ours_amp_bf16", ours_step, "mixed_bfloat16"),
                 ("reference_keras_widedeep_bf16", reference_step, "mixed_bfloat16")]
    runs, parameters, policies = {}, {}, {}
    for name, build, policy in plan:
        tf.keras.mixed_precision.set_global_policy(policy)
        runs[name], parameters[name] = build(hidden, dropout)
        policies[name] = policy
    tf.keras.mixed_precision.set_global_policy("float32")
    step_seconds = timed_round_robin(runs, data, args.warmup, args.steps)
    rows = {name: {"samples_per_s": args.batch_size / seconds, "step_s": seconds, "parameters": parameters[name],
                   "policy": policies[name]} for name, seconds in step_seconds.items()}
    rate = {name: row["samples_per_s"] for name, row in rows.items()}
    speedups = {"fp32_vs_fp32": rate["ours"] / rate["reference_keras_widedeep"]}
    if bf16.supported:
        speedups["bf16_vs_keras_bf16"] = rate["ours_amp_bf16"] / rate["reference_keras_widedeep_bf16"]
        speedups["amp_vs_reference_cpu_mode"] = rate["ours_amp_bf16"] / rate["reference_keras_widedeep"]
    result = {"batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup, "cpu": cpu_model_name(),
              "threads": os.cpu_count(), "cpu_bf16": bf16.evidence, "load_average": os.getloadavg(), "rows": rows,
              "speedups": speedups, "target_speedup": 1.5,
              "command": f"python -m bench.wd_train --batch_size {args.batch_size} --steps {args.steps} "
                         f"--warmup {args.warmup}"}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(RESULTS + ".tmp", RESULTS)
    print(f"Wide & Deep training, batch {args.batch_size}, {result['cpu']} ({result['threads']} threads), "
          f"median of {args.steps} round-robin steps")
    print(f"{'implementation':32} {'policy':>15} {'samples/s':>10} {'step s':>8} {'parameters':>11}")
    for name, row in rows.items():
        print(f"{name:32} {row['policy']:>15} {row['samples_per_s']:10.0f} {row['step_s']:8.3f} {row['parameters']:11d}")
    print(f"ours / reference, both fp32: {speedups['fp32_vs_fp32']:.2f}x")
    if bf16.supported:
        print(f"ours / reference, both bf16 (Keras mixed_bfloat16): {speedups['bf16_vs_keras_bf16']:.2f}x")
        print(f"ours --amp (bf16) / the reference's CPU mode (fp32; it refuses --cpu --amp): "
              f"{speedups['amp_vs_reference_cpu_mode']:.2f}x (target 1.5x)")

if __name__ == "__main__":
    main()

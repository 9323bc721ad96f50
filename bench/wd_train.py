"""Wide & Deep training speed on this machine's CPU: ours against the reference's approach, in one run.

Both train the reference's model size (13 tables at the features contract's buckets and widths, 90.9M
weights; deep MLP 5 x 1024, dropout 0.1) with FTRL 0.02 on the wide part and RMSprop(rho 0.5) on the
deep part (Keras's legacy optimizers: the TF 2.4 ones the reference ran, which update only the rows a
batch touches), on the same in-memory batches of uniform random ids, numerics and labels, fp32:

- ours: wide_and_deep.wd_model.TrainStep (grouped tables: four gathers and four sparse updates a step);
- ours_amp_bf16 (on a CPU with bf16 units): ours under `--amp`, bfloat16 compute, float32 weights;
- reference: written plainly as V1 does it, `tf.keras.experimental.WideDeepModel` over a linear and a
  DNN Keras model built from one `Input` per feature and one `Embedding` layer per table (1-wide in the
  linear model, the code's width in the DNN), one persistent GradientTape, each optimizer applied to its
  model's variables, the step a tf.function.

Each is timed over `--steps` steps after `--warmup` steps (the first traces the graph); samples/s is
batch x steps / seconds. The batch is 16384 by default: the reference's 131072 takes minutes per step on
a small CPU (the MLP's matmuls are 5.3M multiply-adds per sample, x3 for training).
Writes bench/results/wd_train.json and prints a table.
Usage: python -m bench.wd_train [--batch_size N] [--steps N] [--warmup N]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "wd_train.json")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from precision import host_cpu_bf16_support  # noqa: E402
from wide_and_deep import features as F  # noqa: E402
from wide_and_deep import wd_model  # noqa: E402


def batches(batch_size: int, count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = np.stack([rng.integers(0, F.BUCKETS[n], batch_size) for n in F.CATEGORICAL_NAMES], 1)
        out.append({"categorical": tf.constant(ids, tf.int64),
                    "numeric": tf.constant(rng.random((batch_size, len(F.NUMERIC_FEATURES)), np.float32)),
                    "label": tf.constant(rng.integers(0, 2, batch_size).astype(np.float32))})
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


def timed(run, data, warmup, steps):
    for i in range(warmup):
        run(data[i % len(data)]).numpy()
    start = time.perf_counter()
    for i in range(steps):
        run(data[(warmup + i) % len(data)]).numpy()
    return time.perf_counter() - start


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.processor()
    except OSError:
        return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    hidden, dropout = [1024] * 5, 0.1
    data = batches(args.batch_size, 2)
    rows = {}
    bf16 = host_cpu_bf16_support()
    runs = [("ours", ours_step, "float32"), ("reference_keras_widedeep", reference_step, "float32")]
    if bf16.supported:
        runs.append(("ours_amp_bf16", ours_step, "mixed_bfloat16"))
    for name, build, policy in runs:
        tf.keras.mixed_precision.set_global_policy(policy)
        run, params = build(hidden, dropout)
        seconds = timed(run, data, args.warmup, args.steps)
        rows[name] = {"samples_per_s": args.batch_size * args.steps / seconds, "step_s": seconds / args.steps,
                      "parameters": params, "policy": policy}
        del run
    speedup = rows["ours"]["samples_per_s"] / rows["reference_keras_widedeep"]["samples_per_s"]
    result = {"batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup, "cpu": cpu_name(),
              "threads": os.cpu_count(), "cpu_bf16": bf16.evidence, "load_average": os.getloadavg(), "rows": rows, "speedup": speedup,
              "target_speedup": 1.5}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(RESULTS + ".tmp", RESULTS)
    print(f"Wide & Deep training, batch {args.batch_size}, fp32, {result['cpu']} ({result['threads']} threads)")
    print(f"{'implementation':28} {'samples/s':>12} {'step s':>8} {'parameters':>12}")
    for name, row in rows.items():
        print(f"{name:28} {row['samples_per_s']:12.0f} {row['step_s']:8.3f} {row['parameters']:12d}")
    print(f"speedup ours / reference (both fp32): {speedup:.2f}x (target 1.5x)")
    if "ours_amp_bf16" in rows:
        print(f"speedup ours --amp (bf16) / reference fp32: "
              f"{rows['ours_amp_bf16']['samples_per_s'] / rows['reference_keras_widedeep']['samples_per_s']:.2f}x")


if __name__ == "__main__":
    main()

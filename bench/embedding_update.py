"""The sparse embedding update of one training step: the fused multi-threaded op against
TensorFlow's per-table ops.

cpu-bench tables (26 x 100,000 rows, dim 128, float32, host memory), one gradient of `batch` random
ids per table (repeats included), for SGD, lazy Adam and Adagrad. Each measurement runs
`apply` in a tf.function in its own process (tables and slots take up to 4 GB); fused and TF
paths alternate over --rounds rounds (a busy machine slows both alike) and the best mean step
time of each is kept. Writes bench/results/embedding_update.json and prints a table.
Usage: python -m bench.embedding_update [--batch_sizes 2048,4096] [--rounds 2] [--steps 20]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RESULTS = os.path.join(REPO, "bench", "results", "embedding_update.json")
NUM_TABLES, ROWS, DIM = 26, 100_000, 128
OPTIMIZER_NAMES = ("sgd", "lazy_adam", "adagrad")


def step_time_ms(name: str, fused: bool, batch: int, steps: int) -> float:
    """Mean time of one `apply` over all tables (after two warm-up steps that touch the pages)."""
    import numpy as np
    import tensorflow as tf

    from recsys.training.optimizers import SGD, Adagrad, Adam

    rng = np.random.default_rng(0)
    grads = [tf.IndexedSlices(tf.constant(rng.standard_normal((batch, DIM)).astype(np.float32)),
                              tf.constant(rng.integers(0, ROWS, batch).astype(np.int32)))
             for _ in range(NUM_TABLES)]
    tables = [tf.Variable(tf.zeros([ROWS, DIM])) for _ in range(NUM_TABLES)]
    optimizer = {"sgd": SGD, "lazy_adam": Adam, "adagrad": Adagrad}[name](fused_sparse_updates=fused)
    optimizer.build(tables)
    apply = tf.function(lambda: optimizer.apply(list(zip(grads, tables)), tf.constant(0.01)))
    apply()
    apply()
    start = time.perf_counter()
    for _ in range(steps):
        apply()
    return (time.perf_counter() - start) / steps * 1000


def measure(name: str, fused: bool, batch: int, steps: int) -> float:
    """step_time_ms in a fresh process."""
    out = subprocess.run([sys.executable, "-m", "bench.embedding_update", "--worker", name, str(int(fused)), str(batch), str(steps)],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(step_time_ms(sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_sizes", default="2048,4096")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rows = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for name in OPTIMIZER_NAMES:
            best = {True: float("inf"), False: float("inf")}
            for _ in range(args.rounds):
                for fused in (False, True):
                    best[fused] = min(best[fused], measure(name, fused, batch, args.steps))
            rows.append({"batch_size": batch, "optimizer": name, "tensorflow_ms": best[False],
                         "fused_ms": best[True], "speedup": best[False] / best[True]})
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"tables": f"{NUM_TABLES} x {ROWS} x {DIM} float32", "threads": os.cpu_count(),
                   "load_average": os.getloadavg(), "command": "python -m bench.embedding_update",
                   "runs": rows}, f, indent=1)
    print(f"{'batch':>6} {'optimizer':>10} {'TF ops ms':>10} {'fused ms':>9} {'speed-up':>9}")
    for r in rows:
        print(f"{r['batch_size']:>6} {r['optimizer']:>10} {r['tensorflow_ms']:>10.2f} {r['fused_ms']:>9.2f} "
              f"{r['speedup']:>8.2f}x")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()

"""Runs on every rank under horovodrun: exercises distributed.py and saves what each rank got."""
import sys

import numpy as np
import tensorflow as tf

from recsys.runtime import distributed as dist


@tf.function
def exchange_with_gradient(x: tf.Tensor, splits: tf.Tensor, weights: tf.Tensor, name=None):
    """alltoall inside tf.function, and the gradient of sum(received * weights) w.r.t. x."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        received, received_splits = dist.alltoall(x, splits=splits, name=name)
        loss = tf.reduce_sum(received * weights)
    return received, received_splits, tape.gradient(loss, x)


def main(output_prefix: str) -> None:
    dist.init()
    rank, size = dist.rank(), dist.size()
    base = tf.constant([1.0, 2.0, 3.0]) * (rank + 1)
    results = {
        "rank": np.array(rank), "size": np.array(size), "local_rank": np.array(dist.local_rank()),
        "allreduce_sum": dist.allreduce(base, average=False).numpy(),
        "allreduce_avg": dist.allreduce(base, average=True).numpy(),
        "allgather": dist.allgather(tf.fill([rank + 1, 2], float(rank))).numpy(),
        "broadcast": dist.broadcast(tf.constant([10.0 + rank, 20.0 + rank]), root_rank=1).numpy(),
        "allgather_object": np.array(dist.allgather_object({"rank": rank})[::-1][0]["rank"]),
    }
    # 1 + 2**-20 survives float32 but rounds to 1 in float16: the compressed sum shows the cast.
    fine = tf.constant([1.0 + 2.0 ** -20 if rank == 0 else 1.0, 3.0])
    for fp16 in (False, True):
        results[f"grouped_sum_fp16_{fp16}"] = dist.grouped_allreduce([fine], average=False, fp16=fp16)[0].numpy()
    # Tensors of 1..5 elements, in 3 buckets: tensor n's elements average to 1.5 n (ranks 0, 1 give
    # n, 2 n), back in the tensors' order.
    tensors = [tf.fill([n], float((rank + 1) * n)) for n in (1, 2, 3, 4, 5)]
    results["bucketed_sums"] = np.concatenate([t.numpy() for t in dist.bucketed_allreduce(tensors, 3)])
    # Rank r sends splits[r][d] rows to rank d; row values encode (source rank, row index).
    splits = tf.constant([[1, 3], [2, 2]][rank], dtype=tf.int32)
    x = tf.constant([[100.0 * rank + i, -(100.0 * rank + i)] for i in range(4)])
    received_rows = int(tf.reduce_sum([[1, 2], [3, 2]][rank]))
    weights = tf.reshape(tf.range(received_rows * 2, dtype=tf.float32), [received_rows, 2]) + 1000.0 * rank
    received, received_splits, grad = exchange_with_gradient(x, splits, weights)
    results.update(alltoall=received.numpy(), alltoall_splits=received_splits.numpy(),
                   alltoall_grad=grad.numpy())
    # bfloat16 (Horovod takes none: it travels as its bits) and named: the values and weights are
    # small integers, exact in bfloat16, so both must equal the float32 exchange's.
    received, _, grad = exchange_with_gradient(tf.cast(x, tf.bfloat16), splits, tf.cast(weights, tf.bfloat16),
                                               "bf16_rows")
    results.update(alltoall_bf16=tf.cast(received, tf.float32).numpy(), alltoall_bf16_grad=tf.cast(grad, tf.float32).numpy())
    dist.barrier()
    np.savez(f"{output_prefix}.rank{rank}.npz", **results)


if __name__ == "__main__":
    main(sys.argv[1])

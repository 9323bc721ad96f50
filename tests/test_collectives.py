"""distributed.py over real `horovodrun -np 2` (Gloo and MPI), and as a single process."""
import os

import numpy as np
import pytest

from multiproc import assert_ok, run_horovod

# What rank r sends and receives in collectives_worker.py's alltoall.
SENT_ROWS = {0: [0.0, 1.0, 2.0, 3.0], 1: [100.0, 101.0, 102.0, 103.0]}
RECEIVED_ROWS = {0: [0.0, 100.0, 101.0], 1: [1.0, 2.0, 3.0, 102.0, 103.0]}
RECEIVED_SPLITS = {0: [1, 2], 1: [3, 2]}


def _weights(rank: int) -> np.ndarray:
    rows = len(RECEIVED_ROWS[rank])
    return np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + 1000.0 * rank


def _bfloat16(values: np.ndarray) -> np.ndarray:
    """`values` rounded to bfloat16 (nearest even), as float32."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _expected_gradient(rank: int) -> np.ndarray:
    """d(sum(received*w))/dx: each sent row gets the weight row at the place it landed."""
    grad = np.zeros((4, 2), np.float32)
    for i, value in enumerate(SENT_ROWS[rank]):
        for dest in (0, 1):
            if value in RECEIVED_ROWS[dest]:
                grad[i] = _weights(dest)[RECEIVED_ROWS[dest].index(value)]
    return grad


@pytest.mark.parametrize("transport", ["gloo", "mpi"])
def test_collectives_two_processes(tmp_path, transport):
    prefix = str(tmp_path / "out")
    assert_ok(run_horovod(["tests/collectives_worker.py", prefix], np=2, transport=transport, timeout=240))
    base = np.array([1.0, 2.0, 3.0], np.float32)
    for rank in (0, 1):
        got = np.load(f"{prefix}.rank{rank}.npz")
        assert int(got["rank"]) == rank and int(got["size"]) == 2 and int(got["local_rank"]) == rank
        np.testing.assert_array_equal(got["allreduce_sum"], base * 3)
        np.testing.assert_array_equal(got["allreduce_avg"], base * 1.5)
        np.testing.assert_array_equal(got["allgather"], np.array([[0, 0], [1, 1], [1, 1]], np.float32))
        np.testing.assert_array_equal(got["broadcast"], np.array([11.0, 21.0], np.float32))
        assert int(got["allgather_object"]) == 1
        np.testing.assert_array_equal(got["grouped_sum_fp16_False"], np.array([2.0 + 2.0 ** -20, 6.0], np.float32))
        np.testing.assert_array_equal(got["grouped_sum_fp16_True"], np.array([2.0, 6.0], np.float32))  # via float16
        np.testing.assert_array_equal(got["bucketed_sums"], np.repeat([1.5 * n for n in range(1, 6)], range(1, 6)))
        expected_rows = np.array([[v, -v] for v in RECEIVED_ROWS[rank]], np.float32)
        np.testing.assert_array_equal(got["alltoall"], expected_rows)
        np.testing.assert_array_equal(got["alltoall_splits"], RECEIVED_SPLITS[rank])
        np.testing.assert_array_equal(got["alltoall_grad"], _expected_gradient(rank))
        # bfloat16 travels as its bits: the same rows, and each gradient row is one weight row, rounded
        np.testing.assert_array_equal(got["alltoall_bf16"], expected_rows)
        np.testing.assert_array_equal(got["alltoall_bf16_grad"], _bfloat16(_expected_gradient(rank)))


def test_gradient_buckets_hold_about_equal_elements_the_last_tensors_first():
    from recsys.runtime.distributed import gradient_buckets

    assert gradient_buckets([10, 1, 100, 5, 1000, 10, 500, 2], 4) == [[6, 7], [4, 5], [3], [0, 1, 2]]
    assert gradient_buckets([1] * 8, 4) == [[6, 7], [4, 5], [2, 3], [0, 1]]
    assert gradient_buckets([7], 4) == [[0]] and gradient_buckets([], 4) == []


def test_single_process_collectives_are_identities():
    import tensorflow as tf

    from recsys.runtime import distributed as dist

    assert os.environ.get("HOROVOD_SIZE") is None
    dist.init()
    assert (dist.rank(), dist.size(), dist.local_rank(), dist.is_distributed()) == (0, 1, 0, False)
    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    np.testing.assert_array_equal(dist.allreduce(x).numpy(), x.numpy())
    received, splits = dist.alltoall(x)
    np.testing.assert_array_equal(received.numpy(), x.numpy())
    np.testing.assert_array_equal(splits.numpy(), [3])
    np.testing.assert_array_equal(dist.allgather(x).numpy(), x.numpy())
    np.testing.assert_array_equal(dist.broadcast(x).numpy(), x.numpy())
    assert dist.allgather_object("a") == ["a"] and dist.broadcast_object({"k": 1}) == {"k": 1}
    dist.barrier()


def test_the_collective_clock_measures_the_time_any_collective_is_in_flight():
    """A step's communication time is the union of its collectives' in-flight intervals (overlapping
    ones counted once, gaps not at all); a collective it does not wait for (the next batch's ids)
    counts only for what outlasts the step."""
    import tensorflow as tf

    from recsys.runtime import distributed as dist
    from recsys.runtime.distributed import CollectiveClock

    if not dist.collectives_can_be_timed():  # the suite runs with TF_DETERMINISTIC_OPS=1 (conftest)
        import subprocess
        import sys
        env = dict(os.environ, TF_DETERMINISTIC_OPS="0")
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                                 f"{__file__}::test_the_collective_clock_measures_the_time_any_collective_is_in_flight"],
                                env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:]
        return

    def clock_of(intervals):
        clock = CollectiveClock()
        clock.intervals = [(tf.constant(start, tf.float64), tf.constant(end, tf.float64)) for start, end in intervals]
        return clock

    assert float(clock_of([]).in_flight_seconds()) == 0.0
    assert float(clock_of([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (2.5, 2.75)]).in_flight_seconds()) == 4.0
    waited, ahead = clock_of([(0.0, 1.0)]), clock_of([(0.5, 1e12)])  # the next batch's exchange, ending far later
    waited.add_outlasting(ahead, after=tf.constant(0.0))
    outlasting = float(waited.in_flight_seconds()) - 1.0
    assert 0.0 < outlasting < 1e12 - 1.5e9  # counted from when the step was done (now, about 1.8e9 s), not from 0.5
    early = clock_of([(0.0, 1.0)])
    early.add_outlasting(clock_of([(0.5, 0.75)]), after=tf.constant(0.0))  # ended before the step did: no wait
    assert float(early.in_flight_seconds()) == 1.0

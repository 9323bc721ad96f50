"""The communication model (recsys/sparse/comm_model.py): its arithmetic on plain plans, and one
2-rank run where every collective of a training step sends exactly the bytes it predicts."""
import json
from pathlib import Path

import pytest

from multiproc import assert_ok, run_horovod
from recsys.sparse.comm_model import (ALLREDUCE, ALLTOALL, Collective, Network, StepLayout, collective_ms, describe,
                                      predict_exchange, predict_step, step_collectives)
from recsys.sparse.sharding import plan_sharding


def sends(collective):
    return [list(row) for row in collective.sends]


def test_every_collective_of_a_step_on_two_ranks():
    # table 0 on rank 0, table 1 (5 ids per sample) on rank 1, table 2 replicated (2 ids per sample)
    plan = plan_sharding([1000, 1000, 10], (8,) * 3, 2, "basic", data_parallel_threshold=80, hotness=[1, 5, 2])
    layout = StepLayout(64, exchange_bytes=2, table_bytes=4, dense_weights=1000, data_parallel_input=True)
    collectives = {c.name: c for c in step_collectives(plan, layout)}
    assert list(collectives) == ["ids", "embeddings", "embeddings_grad", "dense_gradients",
                                 "replicated_embedding_grad_0", "train_loss"]
    assert sends(collectives["ids"]) == [[0, 32 * 5 * 4], [32 * 1 * 4, 0]]  # the ids the other rank's table needs
    # the other rank's local batch x the width held x 2 bytes, and back
    assert sends(collectives["embeddings"]) == sends(collectives["embeddings_grad"]) == [[0, 32 * 8 * 2], [512, 0]]
    assert collectives["dense_gradients"].sent_by(0) == 2 * (2 - 1) * 4000 // 2  # ring: 2 (W-1)/W of the buffer
    assert collectives["replicated_embedding_grad_0"].buffer == (32 * 2 * (8 * 4 + 4),) * 2  # values + int32 indices
    assert collectives["replicated_embedding_grad_0"].sent_by(1) == 32 * 2 * 36  # ring allgather: all blocks but one
    assert collectives["train_loss"].buffer == (16, 16)  # the loss and three stop votes
    model_parallel_input = [c.name for c in step_collectives(plan, StepLayout(64, dense_weights=1000))]
    assert "ids" not in model_parallel_input  # the loaders read the global batch of the held tables
    one_process = plan_sharding([1000, 1000, 10], (8,) * 3, 1)
    assert step_collectives(one_process, layout) == []
    assert describe(one_process, layout).endswith("none on one process")


def test_row_sliced_tables_count_their_expected_routing():
    plan = plan_sharding([100, 50], (8, 8), 2, "basic", row_slice_threshold=800, hotness=[2, 1])
    assert plan.row_sliced == [0]
    collectives = {c.name: c for c in step_collectives(plan, StepLayout(64))}
    ids, vectors = collectives["row_sliced_table_0_ids"], collectives["row_sliced_table_0_vectors"]
    assert not ids.exact and not vectors.exact
    assert sends(ids) == [[0, 32 * 2 * 4 // 2], [32 * 2 * 4 // 2, 0]]  # half of 2 ids per sample leave
    # a sample has ids on the other owner with probability 1 - (1/2)^2: one partial sum (8 floats) back
    assert sends(vectors) == [[0, 32 * 3 // 4 * 8 * 4], [32 * 3 // 4 * 8 * 4, 0]]
    assert sends(collectives["row_sliced_table_0_vectors_grad"]) == sends(vectors)
    assert "row_sliced_table_0_ids (alltoall, forward, expected for uniform ids)" in describe(plan, StepLayout(64))


def test_time_of_collectives_on_hosts_and_the_step():
    ring = Collective("dense", ALLREDUCE, "after", buffer=(4_000_000,) * 4)
    pairs = Collective("outputs", ALLTOALL, "forward",
                       sends=tuple(tuple(0 if s == d else 1_000_000 for d in range(4)) for s in range(4)))
    two_hosts = Network(link_gbps=8, ranks_per_host=2, intra_host_gbps=80, latency_us=10)  # 1 GB/s, 10 GB/s
    # ring: every host link carries what one rank sends (6 MB); 6 messages of 10 us
    assert collective_ms(ring, two_hosts) == pytest.approx(6.0 + 0.06)
    # all-to-all: each host sends 2 ranks x 2 MB off the host; within it 1 MB per rank at 10 GB/s
    assert collective_ms(pairs, two_hosts) == pytest.approx(4.0 + 0.03)
    one_host = Network(link_gbps=8, ranks_per_host=4, intra_host_gbps=80)
    assert collective_ms(pairs, one_host) == pytest.approx(0.3)
    assert collective_ms(pairs, Network(link_gbps=8, ranks_per_host=4)) == 0  # within a host, not counted

    plan = plan_sharding([1000] * 4, (8,) * 4, 4, "basic")
    layout = StepLayout(4096, dense_weights=100_000)
    prediction = predict_step(plan, layout, Network(link_gbps=1), compute_ms=5.0)
    assert prediction.exchange_ms == pytest.approx(sum(ms for _, ms in prediction.collective_ms))
    assert prediction.step_ms == pytest.approx(5.0 + prediction.exchange_ms)
    assert prediction.overlapped_step_ms == max(5.0, prediction.exchange_ms)
    times = dict(prediction.collective_ms)
    in_step = times["embeddings"] + times["embeddings_grad"]
    after = times["dense_gradients"] + times["train_loss"]
    assert (prediction.in_step_ms, prediction.after_ms) == pytest.approx((in_step, after))
    # pipelined: 1/4 of the in-step exchanges and everything after the backward stay exposed
    assert prediction.pipelined_step_ms(4) == pytest.approx(in_step / 4 + after + 5.0)  # compute-bound here
    wire_bound = predict_step(plan, layout, Network(link_gbps=0.01), compute_ms=5.0)
    assert wire_bound.pipelined_step_ms(4) == pytest.approx(wire_bound.exchange_ms)
    # collectives that take 1.5x as long beside the compute (hosts sharing cores) stretch the hidden part
    hidden = wire_bound.exchange_ms - (wire_bound.in_step_ms / 4 + wire_bound.after_ms)
    assert wire_bound.pipelined_step_ms(4, beside_compute=1.5) == pytest.approx(wire_bound.exchange_ms + 0.5 * hidden)
    assert prediction.pipelined_step_ms(4, beside_compute=1.5) == pytest.approx(in_step / 4 + after + 5.0)
    # embeddings forward: each rank sends 3 x 1024 samples x 8 floats = 96 KiB at 1 Gb/s
    assert dict(prediction.collective_ms)["embeddings"] == pytest.approx(3 * 1024 * 8 * 4 * 8 / 1e9 * 1e3)
    exchange, step = predict_exchange(plan, 4096, exchange_bytes=4, table_bytes=4, dense_weights=100_000,
                                      link_gbps=1, compute_ms=5.0)
    assert (exchange, step) == pytest.approx((prediction.exchange_ms, prediction.step_ms))
    half = predict_exchange(plan, 4096, exchange_bytes=4, table_bytes=4, dense_weights=100_000, link_gbps=1,
                            compute_ms=5.0, fp16_allreduce=True)[0]
    dense_ms = dict(prediction.collective_ms)["dense_gradients"]
    assert half == pytest.approx(exchange - dense_ms / 2)


def test_two_ranks_send_exactly_the_predicted_bytes(tmp_path):
    """Both input modes, every kind of table (tests/comm_worker.py): Horovod's collectives recorded
    during one eager training step equal the model's bytes, collective by collective and rank by rank."""
    output = tmp_path / "differences.json"
    assert_ok(run_horovod(["tests/comm_worker.py", str(output)], np=2, transport="gloo", timeout=240))
    ranks = json.loads(output.read_text())
    assert [r["differences"] for r in ranks] == [[], []]
    assert {"ids", "embeddings", "embeddings_grad", "row_sliced_table_6_ids", "row_sliced_table_6_vectors",
            "row_sliced_table_6_vectors_grad", "dense_gradients", "replicated_embedding_grad_1",
            "train_loss"} <= set(ranks[0]["checked"])


def test_the_scaling_doc_holds_the_tables_the_model_prints(capsys):
    """docs/scaling.md's tables are `python -m scripts.scaling_tables`'s output, unchanged."""
    from scripts import scaling_tables

    scaling_tables.main([])
    printed = capsys.readouterr().out.rstrip("\n")
    doc = (Path(__file__).resolve().parent.parent / "docs" / "scaling.md").read_text()
    assert f"<!-- scaling_tables -->\n{printed}\n<!-- /scaling_tables -->" in doc

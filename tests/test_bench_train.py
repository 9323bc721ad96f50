"""bench.train's model-FLOP utilisation: a disturbed matmul-peak measurement is refused, not recorded."""
import pytest

from bench.train import add_mfu


def test_a_utilisation_above_one_stops_the_bench_naming_the_precision_and_peak():
    rows = [{"precision": "fp32", "batch_size": 4096, "achieved_flops_per_s": 170e9},
            {"precision": "bf16", "batch_size": 4096, "achieved_flops_per_s": 290e9}]
    assert [round(r["mfu"], 2) for r in add_mfu([dict(r) for r in rows], {"fp32": 200e9, "bf16": 400e9})] == [0.85, 0.72]
    with pytest.raises(SystemExit, match=r"the bf16 matmul peak measured 215\.0 GFLOP/s, below the 290\.0 .*MFU 1\.35"):
        add_mfu([dict(r) for r in rows], {"fp32": 200e9, "bf16": 215e9})

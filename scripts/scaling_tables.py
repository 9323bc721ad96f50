"""The tables of docs/scaling.md, from the communication model (recsys/sparse/comm_model.py) on paper.

Usage: python -m scripts.scaling_tables   (from the repository root; prints Markdown)

The configurations are the reference's DLRM defaults (global batch 65536, embedding dim 128, bottom
MLP 512-256-128, top MLP 1024-1024-512-256-1, 13 numericals, SGD, AMP: the exchange in float16,
tables and dense gradients in float32) on the Criteo 1TB tables at frequency thresholds 15, 3 and 0
(the reference's small, large and extra-large models), planned as main.py plans them on 80 GB GPUs.
The compute time is not modelled: it is the published 1xA100 AMP step of the small model (4.54M
samples/s, so 14.43 ms per 65536 samples), split evenly over the ranks.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import List, Optional, Sequence

from model import dense_weight_count
from recsys.data.feature_spec import CRITEO_VARIANTS
from recsys.sparse.comm_model import Network, StepLayout, predict_step, step_collectives
from recsys.sparse.sharding import HOST_VALUE_BYTES, MemoryBudget, ShardingPlan, plan_sharding, table_budget_from_device
from recsys.training.model_config import DlrmConfig

BATCH = 65536
DIM = 128
GPU_BYTES = 81559 * 2**20  # what an 80 GB A100 reports
COLUMN_SLICE_THRESHOLD = 10 * 1000**3  # main.py's default
NVLINK_GBPS = 2400  # A100 NVLink 3 through NVSwitch: 300 GB/s each way per GPU
PCIE_GBPS = 200  # PCIe 4.0 x16: about 25 GB/s each way in practice
PUBLISHED_1GPU_SMALL = 4.54e6  # samples/s, V3 README, 1xA100 80GB, AMP
COMPUTE_1GPU_MS = BATCH / PUBLISHED_1GPU_SMALL * 1e3
MODELS = {"small": "criteo_t15_synthetic", "large": "criteo_t3_synthetic", "extra large": "criteo_t0_synthetic"}


@dataclass(frozen=True)
class Row:
    """One configuration: the model, its GPUs and hosts, the network, and the published samples/s."""
    model: str
    gpus: int
    gpus_per_host: int
    link_gbps: float
    published: Optional[float] = None
    device_budget: Optional[int] = None  # per GPU; None: what an 80 GB GPU leaves for tables


def config(model: str) -> DlrmConfig:
    cardinalities = CRITEO_VARIANTS[MODELS[model]]
    return DlrmConfig(num_numerical_features=13, cardinalities=cardinalities, embedding_dim=(DIM,) * len(cardinalities),
                      bottom_mlp_dims=[512, 256, 128], top_mlp_dims=[1024, 1024, 512, 256, 1], interaction="tensorflow")


def plan(row: Row) -> ShardingPlan:
    cardinalities = CRITEO_VARIANTS[MODELS[row.model]]
    budget = row.device_budget if row.device_budget is not None else table_budget_from_device(GPU_BYTES)
    return plan_sharding(cardinalities, (DIM,) * len(cardinalities), row.gpus, "memory_balanced",
                         COLUMN_SLICE_THRESHOLD, budget=MemoryBudget(budget, update_rows=BATCH))


def layout(model: str) -> StepLayout:
    return StepLayout(BATCH, exchange_bytes=2, table_bytes=4, dense_weights=dense_weight_count(config(model)))


def host_transfer_ms(the_plan: ShardingPlan) -> float:
    """One process with tables in host memory: their pooled vectors for the batch to the GPU and
    their gradients back over PCIe (float32, one vector per sample and table each way). Not a
    collective, so not in the communication model; a lower bound of what offloading costs."""
    widths = sum(p.width for p in the_plan.items_on(0) if the_plan.on_host(0, p.table, p.col_start))
    return 2 * BATCH * widths * HOST_VALUE_BYTES * 8 / (PCIE_GBPS * 1e9) * 1e3


def table(rows: Sequence[Row]) -> List[str]:
    lines = ["| model | GPUs (hosts) | link per host | most bytes a rank sends per step | exchange ms | "
             "compute ms | step ms: unpipelined / overlapped | predicted samples/s | published samples/s (step ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        the_plan, the_layout = plan(row), layout(row.model)
        hosts = row.gpus // row.gpus_per_host
        compute, model = COMPUTE_1GPU_MS / row.gpus, row.model
        if row.gpus == 1 and the_plan.host_tables(0):
            transfer = host_transfer_ms(the_plan)
            compute += transfer
            model += f", {len(the_plan.host_tables(0))} tables in host memory (+{transfer:.1f} ms PCIe)"
        prediction = predict_step(the_plan, the_layout, Network(row.link_gbps, row.gpus_per_host, NVLINK_GBPS),
                                  compute)
        collectives = step_collectives(the_plan, the_layout)
        sent = max((sum(c.sent_by(r) for c in collectives) for r in range(row.gpus)), default=0)
        link = f"{row.link_gbps:g} Gb/s" if hosts > 1 else "(one host)"
        rate = f"{BATCH / prediction.step_ms / 1e3:.2f}M - {BATCH / prediction.overlapped_step_ms / 1e3:.2f}M"
        published = f"{row.published / 1e6:.3g}M ({BATCH / row.published * 1e3:.2f})" if row.published else ""
        lines.append(f"| {model} | {row.gpus} ({hosts}) | {link} | {sent / 1e6:.1f} MB | "
                     f"{prediction.exchange_ms:.2f} | {compute:.2f} | "
                     f"{prediction.step_ms:.2f} / {prediction.overlapped_step_ms:.2f} | {rate} | {published} |")
    return lines


def collectives_table(row: Row) -> List[str]:
    """Every collective of one configuration's step: the bytes rank 0 sends and its time."""
    the_plan, the_layout = plan(row), layout(row.model)
    times = dict(predict_step(the_plan, the_layout, Network(row.link_gbps, row.gpus_per_host, NVLINK_GBPS)).collective_ms)
    lines = ["| collective | kind | phase | bytes rank 0 sends | ms |", "|---|---|---|---|---|"]
    for c in step_collectives(the_plan, the_layout):
        lines.append(f"| `{c.name}` | {c.kind} | {c.phase} | {c.sent_by(0) / 1e6:.2f} MB | {times[c.name]:.3f} |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Print every table of docs/scaling.md (`argv`: the command line, only --help)."""
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(f"Dense weights: {layout('small').dense_weights:,}; compute per step on one A100: "
          f"{COMPUTE_1GPU_MS:.2f} ms (calibrated).\n")
    print("Published configurations (DGX A100: 8 GPUs on NVSwitch, one host):\n")
    print("\n".join(table([Row("small", 1, 1, 200, PUBLISHED_1GPU_SMALL), Row("large", 8, 8, 200, 13.38e6),
                           Row("extra large", 8, 8, 200, 11.9e6),
                           Row("extra large", 1, 1, 200, 0.768e6)])))
    print("\nThe large model's step on 8 GPUs, collective by collective (rank 0):\n")
    print("\n".join(collectives_table(Row("large", 8, 8, 200))))
    for link in (200, 1600):
        print(f"\nThe large model on 2-16 hosts of 8 A100s, {link} Gb/s per host:\n")
        print("\n".join(table([Row("large", 8 * hosts, 8, link) for hosts in (2, 4, 8, 16)])))
    wide = plan(Row("large", 128, 8, 200))
    columns = [sum(wide.width_on(r) for r in range(h * 8, h * 8 + 8)) for h in range(16)]
    print(f"\nColumns of the embedding output each host holds (large model, 16 hosts of 8): {columns}")
    print("\nThe extra-large model on 2-16 hosts of 1 A100, 200 Gb/s per host:\n")
    print("\n".join(table([Row("extra large", hosts, 1, 200) for hosts in (2, 4, 8, 16)])))


if __name__ == "__main__":
    main()

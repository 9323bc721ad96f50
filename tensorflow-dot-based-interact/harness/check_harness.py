"""Runs the standalone CUDA harness and checks its results against the NumPy reference.

Writes a JSON summary (per-case errors, achieved bandwidth as a fraction of peak) and exits
non-zero when a case is out of tolerance. Needs a CUDA GPU, NumPy, and no TensorFlow.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from numpy_reference import interaction_reference, max_scaled_error  # noqa: E402

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = PACKAGE_ROOT.parent / "bench" / "results" / "interaction_cuda.json"
# Exact fp32 kernels vs fp32 rounding; TF32 rounds operands to 10 mantissa bits; fp16 rounds the
# result to half (inputs are exact halves, accumulation is fp32).
TOLERANCE = {"simt_fp32": 1e-5, "tensor_core_tf32": 5e-3, "tensor_core_fp16": 5e-3}
HALF_SIMT_TOLERANCE = 2e-3
BANDWIDTH_TARGET = 0.6


def check_case(directory: Path, case: dict) -> dict:
    """Errors of one correctness case against the reference, and whether they pass."""
    load = lambda part: np.load(directory / f"{case['name']}_{part}.npy")  # noqa: E731
    expected = interaction_reference(load("input"), load("upstream"))
    actual = (load("output"), load("grad"), load("bottom_grad"))
    errors = {part: max_scaled_error(a, e) for part, a, e in zip(("output", "grad", "bottom_grad"), actual, expected)}
    kernel = case["kernel_forward"]
    tolerance = HALF_SIMT_TOLERANCE if case["dtype"] == "float16" and kernel == "simt_fp32" else TOLERANCE[kernel]
    return {**case, "max_scaled_error": errors, "tolerance": tolerance,
            "passed": all(error <= tolerance for error in errors.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=PACKAGE_ROOT / "build" / "dbi_harness")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=65536, help="batch of the bandwidth cases")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([str(args.binary), "--output", work, "--repeats", str(args.repeats),
                        "--batch", str(args.batch)], check=True)
        manifest = json.loads((Path(work) / "manifest.json").read_text())
        cases = [check_case(Path(work), case) for case in manifest["cases"]]
    summary = {key: manifest[key] for key in ("device", "compute_capability", "peak_gb_per_s", "repeats")}
    summary.update(cases=cases, bandwidth=manifest["bandwidth"], bandwidth_target=BANDWIDTH_TARGET,
                   all_passed=all(case["passed"] for case in cases))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(summary, indent=2) + "\n")

    print(f"{manifest['device']} (sm {manifest['compute_capability']}), peak {manifest['peak_gb_per_s']:.0f} GB/s")
    for case in cases:
        worst = max(case["max_scaled_error"].values())
        print(f"{'ok  ' if case['passed'] else 'FAIL'} {case['name']:<24} {case['kernel_forward']:<18} "
              f"max error {worst:.2e} (tolerance {case['tolerance']:.0e})")
    for run in manifest["bandwidth"]:
        print(f"{run['dtype']:<8} {run['kernel']:<18} {run['direction']:<9} {run['ms']:8.3f} ms "
              f"{run['gb_per_s']:8.1f} GB/s  {100 * run['fraction_of_peak']:5.1f}% of peak")
    print(f"results: {args.results}")
    sys.exit(0 if summary["all_passed"] else 1)


if __name__ == "__main__":
    main()

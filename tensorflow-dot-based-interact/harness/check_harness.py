"""Runs the standalone CUDA harness and checks its results against the NumPy reference.

Writes a JSON summary (per-case errors and kernels, achieved bandwidth as a fraction of the
device's peak) and prints a table. With --peer-binary (reference_peer.cu built against a copy of
NVIDIA DeepLearningExamples) the reference's kernels are timed in the same run, and the summary
holds their entries too and, per mode and direction, how many times faster ours are. Exits 1 when a case is out of tolerance or ran another
kernel than the dispatcher's rules give, 3 when NumPy is missing (the bandwidth is still
written, correctness is marked unchecked). Needs a CUDA GPU and no TensorFlow.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = PACKAGE_ROOT.parent / "bench" / "results" / "interaction_cuda.json"
# Scaled error bounds (numpy_reference.max_scaled_error). fp32 with TF32 off: fp32 summation
# (SIMT) or 3xTF32 products (about 21 mantissa bits each). TF32 rounds both operands to 10 mantissa bits (2^-11 each). fp16: inputs are exact
# halves, the sums are fp32, the result is rounded once to half (2^-11).
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 2e-3}
# Forward + backward at Criteo's shape, the fraction of the HBM peak to reach (issue 42): fp16 and
# TF32 80%, fp32 with TF32 off 60%.
BANDWIDTH_TARGET = {"fp16": 0.80, "tf32": 0.80, "fp32": 0.60}
# Forward + backward at that shape, how many times faster than the reference's kernels: fp16 and
# TF32 at least 1.3x; fp32 with TF32 off (3xTF32 here, SIMT there) at least 2x.
PEER_TARGET = {"fp16": 1.3, "tf32": 1.3, "fp32": 2.0}
NUMPY_MISSING_EXIT = 3


def expected_kernel(mode: str, shape: list[int], major: int, offset: int) -> str:
    """The kernel the dispatcher must pick: tensor cores on compute 8.0+ for F <= 32, D <= 128,
    rows of whole 16-byte vectors and aligned buffers (fp32 with TF32 off: 3xTF32); SIMT
    otherwise."""
    _, num_vectors, dim = shape
    element_bytes = 2 if mode == "fp16" else 4
    fits = major >= 8 and num_vectors <= 32 and dim <= 128 and dim * element_bytes % 16 == 0 and offset == 0
    tensor_core = {"fp16": "tensor_core_fp16", "tf32": "tensor_core_tf32", "fp32": "tensor_core_3xtf32"}
    return tensor_core[mode] if fits else "simt_fp32"


def check_case(directory: Path, case: dict, major: int) -> dict:
    """Errors of one correctness case against the reference, and whether it passes."""
    import numpy as np

    from numpy_reference import interaction_reference, max_scaled_error

    def load(part: str) -> np.ndarray:
        return np.load(directory / f"{case['name']}_{part}.npy")

    with np.errstate(invalid="ignore", over="ignore"):  # a poisoned case's sample 0
        output, grad, bottom_grad = interaction_reference(load("input"), load("upstream"))
    if not case["fold"]:
        grad[:, 0, :] -= bottom_grad
    actual = {"output": load("output"), "grad": load("grad"), "bottom_grad": load("bottom_grad")}
    expected = {"output": output, "grad": grad, "bottom_grad": bottom_grad}
    if case.get("poisoned"):  # the infinity's own sample is whatever it is; no other may change
        actual = {part: values[1:] for part, values in actual.items()}
        expected = {part: values[1:] for part, values in expected.items()}
    errors = {part: max_scaled_error(actual[part], expected[part]) for part in actual}
    tolerance = TOLERANCE[case["mode"]]
    kernel = expected_kernel(case["mode"], case["shape"], major, case["offset"])
    kernels_ok = case["kernel_forward"] == kernel and case["kernel_backward"] == kernel
    # NaN (an element never written: the outputs start as NaN) fails the comparison.
    within = all(error <= tolerance for error in errors.values())
    return {**case, "expected_kernel": kernel, "max_scaled_error": errors, "tolerance": tolerance,
            "passed": bool(within and kernels_ok)}


def summarize_bandwidth(manifest: dict) -> list[dict]:
    """Bandwidth entries with the fraction of the measured copy bandwidth added."""
    copy = manifest["copy_gb_per_s"]
    return [{**run, "fraction_of_copy": run["gb_per_s"] / copy if copy else None,
             "fraction_of_peak": run["fraction_of_peak"] if manifest["peak_gb_per_s"] else None}
            for run in manifest["bandwidth"]]


def compare_with_peer(ours: list[dict], peer: list[dict], targets: dict = PEER_TARGET) -> list[dict]:
    """Per mode and direction: both times, the speed-up (reference ms / our ms) and, for forward +
    backward, its target (`targets`, by mode: a record's own for an old record) and whether it is
    met."""
    by_key = {(run["mode"], run["direction"]): run for run in peer}
    rows = []
    for run in ours:
        other = by_key.get((run["mode"], run["direction"]))
        if other is None:
            continue
        speedup = other["ms"] / run["ms"]
        row = {"mode": run["mode"], "direction": run["direction"], "ms": run["ms"], "reference_ms": other["ms"],
               "speedup": speedup, "fraction_of_peak": run["fraction_of_peak"],
               "reference_fraction_of_peak": other["fraction_of_peak"]}
        if run["direction"] == "forward+backward":
            row.update(target=targets[run["mode"]], target_met=speedup >= targets[run["mode"]])
        rows.append(row)
    return rows


def print_table(summary: dict) -> None:
    print(f"{summary['device']} (compute {summary['compute_capability']}), peak {summary['peak_gb_per_s']:.0f} GB/s "
          f"(memory clock x bus width), device copy {summary['copy_gb_per_s']:.0f} GB/s")
    for case in summary["cases"]:
        if "passed" not in case:
            continue
        worst = max(case["max_scaled_error"].values())
        print(f"{'ok  ' if case['passed'] else 'FAIL'} {case['name']:<28} {case['kernel_forward']:<17} "
              f"max error {worst:.2e} (tolerance {case['tolerance']:.0e})"
              + ("" if case["kernel_forward"] == case["expected_kernel"] else f" expected {case['expected_kernel']}"))
    print(f"{'shape':<16} {'mode':<5} {'kernel':<17} {'direction':<17} {'ms':>8} {'GB/s':>8} {'of peak':>8} "
          f"{'of copy':>8}")
    for run in summary["bandwidth"]:
        peak = f"{100 * run['fraction_of_peak']:7.1f}%" if run["fraction_of_peak"] is not None else "     n/a"
        copy = f"{100 * run['fraction_of_copy']:7.1f}%" if run["fraction_of_copy"] is not None else "     n/a"
        print(f"{'x'.join(map(str, run['shape'])):<16} {run['mode']:<5} {run['kernel']:<17} {run['direction']:<17} "
              f"{run['ms']:8.3f} {run['gb_per_s']:8.1f} {peak} {copy}")
    if summary.get("peer"):
        print(f"{'mode':<5} {'direction':<17} {'ours ms':>8} {'ref ms':>8} {'speed-up':>8} {'ours/peak':>9} "
              f"{'ref/peak':>9} target")
        for row in summary["peer"]["comparison"]:
            peak = f"{100 * row['fraction_of_peak']:8.1f}%" if row["fraction_of_peak"] is not None else "      n/a"
            reference_peak = (f"{100 * row['reference_fraction_of_peak']:8.1f}%"
                              if row["reference_fraction_of_peak"] is not None else "      n/a")
            target = (f"{row['target']:.2f}x {'met' if row['target_met'] else 'NOT met'}" if "target" in row else "")
            print(f"{row['mode']:<5} {row['direction']:<17} {row['ms']:8.3f} {row['reference_ms']:8.3f} "
                  f"{row['speedup']:7.2f}x {peak} {reference_peak} {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=PACKAGE_ROOT / "build" / "dbi_harness")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="the JSON summary to write")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=65536, help="batch of the bandwidth cases")
    parser.add_argument("--command", default=None, help="the command recorded in the JSON (default: this one)")
    parser.add_argument("--quick", action="store_true", help="correctness only (the harness's --quick)")
    parser.add_argument("--max-batch", type=int, default=None, help="cap the correctness batches")
    parser.add_argument("--peer-binary", type=Path, default=None,
                        help="reference_peer built against DeepLearningExamples: time the reference's kernels too")
    args = parser.parse_args()
    try:
        import numpy  # noqa: F401
        numpy_missing = None
    except ImportError as error:
        numpy_missing = f"not checked: NumPy is missing ({error})"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with tempfile.TemporaryDirectory() as work:
        command = [str(args.binary), "--output", work, "--repeats", str(args.repeats), "--batch", str(args.batch)]
        command += ["--quick"] if args.quick else []
        command += ["--max-batch", str(args.max_batch)] if args.max_batch else []
        harness = subprocess.run(command, check=False)
        if harness.returncode != 0:
            sys.exit(f"check_harness: {args.binary} failed (exit status {harness.returncode}); nothing written")
        manifest = json.loads((Path(work) / "manifest.json").read_text())
        peer = None
        if args.peer_binary is not None and not args.quick:
            peer_json = Path(work) / "peer.json"
            timed = subprocess.run([str(args.peer_binary), "--output", str(peer_json), "--repeats", str(args.repeats),
                                    "--batch", str(args.batch)], check=False)
            if timed.returncode != 0:
                sys.exit(f"check_harness: {args.peer_binary} failed (exit status {timed.returncode}); nothing written")
            peer = json.loads(peer_json.read_text())
        major = manifest["compute_capability"][0]
        cases = manifest["cases"] if numpy_missing else [check_case(Path(work), case, major)
                                                          for case in manifest["cases"]]
    bandwidth = summarize_bandwidth(manifest)
    target_runs = [run for run in bandwidth if run["direction"] == "forward+backward"]
    summary = {key: manifest[key] for key in ("device", "compute_capability", "multiprocessors", "memory_clock_khz",
                                              "bus_width_bits", "peak_gb_per_s", "copy_gb_per_s", "cuda_runtime",
                                              "cuda_driver", "repeats")}
    if peer is not None:
        peer_runs = summarize_bandwidth({**manifest, "bandwidth": peer["bandwidth"]})
        peer = {"source": peer["peer"], "bandwidth": peer_runs, "comparison": compare_with_peer(bandwidth, peer_runs)}
    summary.update(command=args.command or shlex.join([sys.executable, *sys.argv]), cases=cases, bandwidth=bandwidth,
                   peer=peer, peer_target=PEER_TARGET,
                   peer_target_met=(all(row["target_met"] for row in peer["comparison"] if "target" in row)
                                    if peer else None),
                   bandwidth_target=BANDWIDTH_TARGET,
                   bandwidth_target_met=(all((run["fraction_of_peak"] or 0) >= BANDWIDTH_TARGET[run["mode"]]
                                             for run in target_runs) if target_runs else None),
                   correctness=numpy_missing or ("all passed" if all(case["passed"] for case in cases)
                                                 else "FAILED"))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    partial = args.results.with_name(args.results.name + ".tmp")
    partial.write_text(json.dumps(summary, indent=2) + "\n")
    partial.replace(args.results)
    print_table(summary)
    met = {True: "met", False: "NOT met", None: "not measured"}[summary["bandwidth_target_met"]]
    goals = ", ".join(f"{mode} {share:.0%}" for mode, share in BANDWIDTH_TARGET.items())
    print(f"correctness: {summary['correctness']} ({len(cases)} cases); bandwidth target, of peak forward+backward "
          f"({goals}): {met}")
    if peer is not None:
        peer_met = "met" if summary["peer_target_met"] else "NOT met"
        goals = ", ".join(f"{mode} {speedup:g}x" for mode, speedup in PEER_TARGET.items())
        print(f"against the reference's kernels (forward+backward; {goals}): {peer_met}")
    print(f"results: {args.results}")
    if numpy_missing:
        print(numpy_missing, file=sys.stderr)
        sys.exit(NUMPY_MISSING_EXIT)
    sys.exit(0 if summary["correctness"] == "all passed" else 1)


if __name__ == "__main__":
    main()

"""Side-by-side measurement of the CUDA dot-interaction kernels' tuning choices on one GPU.

The tensor-core kernels' chunk size (bytes of each row a step stages), claimed residency
(blocks per SM, which also caps their registers) and how chunks arrive on sm_90+ (bulk copies or
per-lane cp.async) are build-time choices per precision and direction
(`cc/kernels/cuda/kernel_layout.h`, `make KERNEL_DEFINES=...`). This builds the
standalone harness once per variant, runs each one's correctness cases against NumPy and times
it at (N, 27, 128) (`harness/check_harness.py`), all in the same run on the same GPU, and writes
DIR/interaction_cuda_sweep.json with, per mode and direction, every candidate's time, fraction of
the HBM peak, registers and spills, then prints a table with the fastest marked.

Variant k takes the k-th candidate of every (precision, direction) list below, or the header's
choice where a list is shorter: a kernel's speed depends only on its own precision's and
direction's choices, so one build measures one candidate of each. Variant 0 is the header's
defaults. With --emulated the variants are built for the CPU emulation instead and only checked
for correctness (three samples per case): what a machine without a GPU can say about them.
--best-defines FILE writes the -D flags of the fastest candidate of every precision and
direction (none where the header's default won), which `KERNEL_DEFINES="$(cat FILE)"
scripts/gpu_interaction_check.sh` then builds, checks and records beside the reference.

Exit status: 0 when every variant built and passed; 1 when one did not; 2 for bad arguments, a
missing tool, or no GPU.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
OP_DIR = REPO_ROOT / "tensorflow-dot-based-interact"
RESULTS_NAME = "interaction_cuda_sweep.json"

# (row bytes, blocks per SM, bulk copies) per precision and direction; the first is
# kernel_layout.h's default. Bulk copies: 0 cp.async, 1 bulk copies in, 2 (backward) in and out.
# Variant 1 is the defaults with bulk copies in; variant 2 has the backward's bulk stores.
CANDIDATES: Dict[Tuple[str, str], List[Tuple[int, int, int]]] = {
    ("fp16", "forward"): [(128, 10, 0), (128, 10, 1), (128, 11, 0), (64, 10, 0)],
    ("fp16", "backward"): [(128, 8, 0), (128, 8, 1), (128, 8, 2), (64, 8, 2)],
    ("fp32", "forward"): [(256, 6, 0), (256, 6, 1), (128, 8, 0), (128, 9, 1)],
    ("fp32", "backward"): [(128, 6, 0), (128, 6, 1), (128, 6, 2), (64, 6, 0)],
}
# Harness modes and the precision whose choices their kernels take (fp32: 3xTF32).
MODE_PRECISION = {"fp16": "fp16", "tf32": "fp32", "fp32": "fp32"}
DIRECTIONS = ("forward", "backward")


def variant_choices(index: int) -> Dict[Tuple[str, str], Tuple[int, int, int]]:
    """The candidate variant `index` builds for each precision and direction."""
    return {key: options[index] if index < len(options) else options[0] for key, options in CANDIDATES.items()}


def choice_defines(precision: str, direction: str, choice: Tuple[int, int, int]) -> List[str]:
    """The -D flags that build `choice` for one precision and direction."""
    prefix = f"DBI_{precision.upper()}_{direction.upper()}"
    row_bytes, blocks, bulk = choice
    return [f"-D{prefix}_ROW_BYTES={row_bytes}", f"-D{prefix}_BLOCKS={blocks}", f"-D{prefix}_BULK={bulk}"]


def variant_defines(index: int) -> List[str]:
    """The -D flags of variant `index` (none for variant 0, the header's defaults)."""
    if index == 0:
        return []
    return [flag for (precision, direction), choice in variant_choices(index).items()
            for flag in choice_defines(precision, direction, choice)]


def fastest_choices(rows: List[dict]) -> Dict[Tuple[str, str], Tuple[int, int, int]]:
    """Per precision and direction, the candidate whose variant passed every correctness case
    with the least time summed over the modes that build with it (fp16: fp16; fp32: TF32 and
    3xTF32, which share the fp32 choices)."""
    chosen = {}
    for (precision, direction) in CANDIDATES:
        modes = [mode for mode, of in MODE_PRECISION.items() if of == precision]
        times: Dict[Tuple[int, int, int], List[float]] = {}
        for row in rows:
            if row["direction"] == direction and row["mode"] in modes and row["passed"] and row["ms"] is not None:
                times.setdefault((row["row_bytes"], row["blocks_per_sm"], row["bulk_copies"]), []).append(row["ms"])
        complete = {choice: sum(ms) for choice, ms in times.items() if len(ms) == len(modes)}
        if complete:
            chosen[(precision, direction)] = min(complete, key=complete.get)
    return chosen


def best_defines(rows: List[dict]) -> List[str]:
    """The -D flags of fastest_choices wherever they are not the header's default."""
    return [flag for (precision, direction), choice in fastest_choices(rows).items()
            if choice != CANDIDATES[(precision, direction)][0]
            for flag in choice_defines(precision, direction, choice)]


def gpu_architecture() -> Optional[str]:
    """This GPU's compute capability as the Makefile's CUDA_ARCHS wants it ("9.0" -> "90"), or
    None without nvidia-smi or a GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                           text=True, check=False)
    lines = query.stdout.split()
    return lines[0].replace(".", "") if query.returncode == 0 and lines else None


def build(index: int, work: Path, emulated: bool, arch: Optional[str], python: str) -> Tuple[Path, str]:
    """Builds variant `index`'s harness under `work`; (binary, error text or "")."""
    target_dir = work / f"v{index}"
    arguments = ["make", "-s", "-j2", "-C", str(OP_DIR), f"BUILD={target_dir}", f"PYTHON={python}",
                 f"KERNEL_DEFINES={' '.join(variant_defines(index))}"]
    if emulated:
        arguments.append("harness-emulated")
        binary = target_dir / "emulation" / "dbi_harness"
    else:
        arguments += ["harness", f"CUDA_ARCHS={arch}"]
        binary = target_dir / "dbi_harness"
    made = subprocess.run(arguments, capture_output=True, text=True, check=False)
    return binary, "" if made.returncode == 0 else (made.stderr or made.stdout)[-3000:]


def kernel_resources(usage: str) -> Dict[Tuple[str, str], Dict[str, int]]:
    """Registers, stack bytes (spills) and static shared memory of each tensor-core kernel, by
    (mode, direction), from `cuobjdump --dump-resource-usage` output."""
    found = {}
    for name, direction, count, stack, shared in re.findall(
            r"Function (\S*(Forward|Backward)TensorCoreKernel\S*):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+)", usage):
        mode = "fp16" if "__half" in name else "fp32" if "SplitTf32" in name else "tf32"
        found[(mode, direction.lower())] = {"registers": int(count), "stack_bytes": int(stack),
                                            "static_shared_bytes": int(shared)}
    return found


def registers(binary: Path) -> Dict[Tuple[str, str], Dict[str, int]]:
    """kernel_resources of a built harness; empty without cuobjdump."""
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        return {}
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", str(binary)], capture_output=True, text=True,
                           check=False).stdout
    return kernel_resources(usage)


def run_variant(index: int, binary: Path, work: Path, args: argparse.Namespace) -> dict:
    """Variant `index`'s correctness and, on a GPU, its times per mode and direction. The
    emulated variant runs the Makefile's harness-emulated-check on the build it already has."""
    if args.emulated:
        results = work / f"v{index}" / "emulation" / "interaction_emulated.json"
        command = ["make", "-s", "-C", str(OP_DIR), "harness-emulated-check", f"BUILD={work / f'v{index}'}",
                   f"PYTHON={args.python}", f"KERNEL_DEFINES={' '.join(variant_defines(index))}"]
    else:
        results = work / f"v{index}.json"
        command = [args.python, str(OP_DIR / "harness" / "check_harness.py"), "--binary", str(binary), "--results",
                   str(results), "--batch", str(args.batch), "--repeats", str(args.repeats)]
    checked = subprocess.run(command, capture_output=True, text=True, check=False)
    if not results.exists():
        return {"correctness": f"harness failed (exit {checked.returncode}): {checked.stderr[-2000:]}"}
    summary = json.loads(results.read_text())
    failed = [case["name"] for case in summary["cases"] if not case.get("passed", False)]
    return {"correctness": summary["correctness"], "failed_cases": failed,
            "device": summary["device"], "peak_gb_per_s": summary["peak_gb_per_s"],
            "bandwidth": [{key: run[key] for key in ("mode", "direction", "ms", "fraction_of_peak")}
                          for run in summary["bandwidth"] if run["direction"] in DIRECTIONS]}


def candidate_rows(variants: List[dict]) -> List[dict]:
    """Per mode and direction, every distinct candidate's measurement (the first variant that
    built it), the fastest of those whose variant passed every correctness case marked."""
    rows = []
    for mode, precision in MODE_PRECISION.items():
        for direction in DIRECTIONS:
            seen = set()
            group = []
            for variant in variants:
                choice = tuple(variant["choices"][f"{precision} {direction}"])
                if choice in seen:
                    continue
                seen.add(choice)
                timed = next((run for run in variant.get("bandwidth", [])
                              if (run["mode"], run["direction"]) == (mode, direction)), None)
                usage = variant["registers"].get(f"{mode} {direction}", {})
                group.append({"mode": mode, "direction": direction, "row_bytes": choice[0], "blocks_per_sm": choice[1],
                              "bulk_copies": choice[2], "variant": variant["index"],
                              "default": choice == CANDIDATES[(precision, direction)][0],
                              "passed": variant.get("correctness") == "all passed",
                              "ms": timed["ms"] if timed else None,
                              "fraction_of_peak": timed["fraction_of_peak"] if timed else None, **usage})
            timed_rows = [row for row in group if row["ms"] is not None and row["passed"]]
            fastest = min(timed_rows, key=lambda row: row["ms"]) if timed_rows else None
            for row in group:
                row["fastest"] = row is fastest
            rows += group
    return rows


def print_table(rows: List[dict]) -> None:
    print(f"{'mode':<5} {'direction':<9} {'row bytes':>9} {'blocks/SM':>9} {'copies':>8} {'regs':>5} {'spill':>5} "
          f"{'ms':>8} {'of peak':>8}")
    for row in rows:
        ms = f"{row['ms']:8.3f}" if row["ms"] is not None else "     n/a"
        peak = f"{100 * row['fraction_of_peak']:7.1f}%" if row["fraction_of_peak"] is not None else "     n/a"
        marks = (" default" if row["default"] else "") + (" fastest" if row["fastest"] else "")
        copies = {0: "cp.async", 1: "bulk in", 2: "bulk i/o"}[row["bulk_copies"]]
        print(f"{row['mode']:<5} {row['direction']:<9} {row['row_bytes']:>9} {row['blocks_per_sm']:>9} {copies:>8} "
              f"{row.get('registers', '-'):>5} {row.get('stack_bytes', '-'):>5} {ms} {peak}{marks}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "bench" / "results",
                        help=f"folder of {RESULTS_NAME} (default bench/results)")
    parser.add_argument("--batch", type=int, default=65536, help="batch of the timed cases")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--variants", default=None,
                        help="comma-separated variant numbers to build (default: all; 0 is the header's defaults)")
    parser.add_argument("--emulated", action="store_true", help="build for the CPU emulation: correctness only")
    parser.add_argument("--jobs", type=int, default=4, help="variants built at once")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs check_harness.py (NumPy)")
    parser.add_argument("--best-defines", type=Path, default=None,
                        help="write the fastest candidates' -D flags here (empty: the defaults won everywhere)")
    args = parser.parse_args()
    count = max(len(options) for options in CANDIDATES.values())
    try:
        indices = sorted({int(part) for part in args.variants.split(",")}) if args.variants else list(range(count))
    except ValueError:
        parser.error(f"--variants: {args.variants!r} is not a comma-separated list of numbers")
    if not all(0 <= index < count for index in indices):
        parser.error(f"--variants: numbers from 0 to {count - 1}")
    if args.batch < 1 or args.repeats < 1 or args.jobs < 1:
        parser.error("--batch, --repeats and --jobs must be positive")
    arch = None
    if not args.emulated:
        arch = gpu_architecture()
        if arch is None:
            print("interaction_cuda_sweep: no GPU (nvidia-smi found none); --emulated checks the variants on the CPU",
                  file=sys.stderr)
            return 2
        if shutil.which("nvcc") is None:
            print("interaction_cuda_sweep: nvcc not found", file=sys.stderr)
            return 2
    if args.best_defines is not None:
        try:
            tempfile.TemporaryFile(dir=args.best_defines.parent).close()
        except OSError as error:
            print(f"interaction_cuda_sweep: --best-defines {args.best_defines}: cannot write there ({error.strerror})",
                  file=sys.stderr)
            return 2
    try:  # refused before anything is built, not after minutes of it
        args.output.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=args.output).close()
    except OSError as error:
        print(f"interaction_cuda_sweep: --output {args.output}: cannot write there ({error.strerror})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            built = dict(zip(indices, pool.map(lambda index: build(index, work, args.emulated, arch, args.python),
                                               indices)))
        variants = []
        for index in indices:  # one at a time: the GPU is measured alone
            binary, error = built[index]
            variant = {"index": index, "defines": variant_defines(index),
                       "choices": {f"{precision} {direction}": list(choice)
                                   for (precision, direction), choice in variant_choices(index).items()},
                       "registers": {}}
            if error:
                variant["correctness"] = f"build failed: {error}"
            else:
                variant["registers"] = {f"{mode} {direction}": usage
                                        for (mode, direction), usage in registers(binary).items()}
                variant.update(run_variant(index, binary, work, args))
            variants.append(variant)
            print(f"variant {index} {' '.join(variant['defines']) or '(defaults)'}: {variant['correctness']}",
                  flush=True)
    rows = candidate_rows(variants)
    device = next((variant["device"] for variant in variants if "device" in variant), None)
    passed = all(variant["correctness"] == "all passed" for variant in variants)
    record = {"device": device, "emulated": args.emulated, "batch": args.batch, "repeats": args.repeats,
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "variants": variants,
              "candidates": rows, "all_passed": passed}
    partial = args.output / (RESULTS_NAME + ".tmp")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(args.output / RESULTS_NAME)
    measured = "correctness only, three samples per case" if args.emulated else f"timed at ({args.batch}, 27, 128)"
    print(f"{device}: {len(variants)} variants, {measured}")
    print_table(rows)
    print(f"results: {args.output / RESULTS_NAME}")
    if args.best_defines is not None and not args.emulated:
        best = " ".join(best_defines(rows))
        args.best_defines.write_text(best + "\n")
        print(f"fastest candidates: {best or 'the defaults'} ({args.best_defines})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

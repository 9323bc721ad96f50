"""The PyTorch reference DLRM (facebookresearch/dlrm, `dlrm_s_pytorch.py`) on the cpu-bench config,
for the side-by-side rows of bench/train.py.

The reference is not part of this repository: give a clone of https://github.com/facebookresearch/dlrm
with --dlrm_repo (or DLRM_PYTORCH_REPO). It runs in its own environment (PyTorch for the CPU,
scikit-learn, tensorboard, tqdm: what the script imports), which `--setup` creates once:

    python bench/reference/pytorch_dlrm.py --setup            # venv in ~/.cache/dlrm-bench/pytorch-venv
    python bench/reference/pytorch_dlrm.py --setup --torch_index "" --torch_requirement "torch==2.13.0+cpu"
                                                         # (a local wheel or mirror instead of PyTorch's index)
    python bench/reference/pytorch_dlrm.py --dlrm_repo ~/dlrm --batch_size 4096

The script trains on its own random data (one id per table, BCE loss, SGD at lr 0.01) with the
same tables and MLPs as cpu-bench; its top MLP takes the 479 interaction outputs (this project pads
to 480). Its timer covers the forward, backward and optimizer step of each iteration, not the data
generation. The rate is taken from the last print window (the first holds the warm-up).
Prints one JSON line: {"batch_size", "threads", "step_time_ms", "samples_per_s", "torch"}.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

VENV = Path.home() / ".cache" / "dlrm-bench" / "pytorch-venv"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PACKAGES = ["scikit-learn", "tensorboard", "numpy", "tqdm"]
# cpu-bench (bench/train.py): 26 tables of 100,000 rows, dim 128, 13 numericals.
TABLES = "-".join(["100000"] * 26)
BOTTOM = "13-512-256-128"
TOP = "479-1024-1024-512-256-1"  # 128 + 27*26/2 interaction outputs
WINDOW_LINE = re.compile(r"Finished training it (\d+)/(\d+) of epoch \d+, ([0-9.]+) ms/it")


def venv_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def setup(torch_requirement: str, torch_index: str, venv: Path = VENV) -> None:
    """Create the reference's environment (once; a second call only checks it). `torch_index` ''
    takes torch from pip's configured sources."""
    python = venv_python(venv)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + [torch_requirement] + (["--index-url", torch_index] if torch_index else []), check=True)
    subprocess.run(pip + PACKAGES, check=True)


def unavailable_reason(repo: Optional[str], venv: Path = VENV) -> Optional[str]:
    """Why the reference cannot run here (None when it can)."""
    if not repo:
        return "no --dlrm_repo / DLRM_PYTORCH_REPO (a clone of facebookresearch/dlrm)"
    if not (Path(repo) / "dlrm_s_pytorch.py").is_file():
        return f"{repo} has no dlrm_s_pytorch.py"
    if not venv_python(venv).exists():
        return f"no PyTorch environment at {venv} (python bench/reference/pytorch_dlrm.py --setup)"
    return None


def measure(repo: str, batch_size: int, steps: int, threads: int, venv: Path = VENV) -> dict:
    """Train `steps` timed iterations (after as many warm-up ones) and return the rate."""
    command = [str(venv_python(venv)), "dlrm_s_pytorch.py", "--arch-sparse-feature-size=128",
               f"--arch-embedding-size={TABLES}", f"--arch-mlp-bot={BOTTOM}", f"--arch-mlp-top={TOP}",
               "--data-generation=random", f"--data-size={2 * steps * batch_size}",
               f"--mini-batch-size={batch_size}", f"--num-batches={2 * steps}", "--num-indices-per-lookup=1",
               "--num-indices-per-lookup-fixed=True", "--loss-function=bce", "--learning-rate=0.01",
               "--optimizer=sgd", "--num-workers=0", "--nepochs=1", f"--print-freq={steps}", "--print-time",
               "--test-freq=-1"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=False)
    windows = WINDOW_LINE.findall(result.stdout)
    if result.returncode != 0 or len(windows) < 2:
        raise RuntimeError(f"the PyTorch reference failed (exit {result.returncode}):\n"
                           f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    step_ms = float(windows[-1][2])
    version = subprocess.run([str(venv_python(venv)), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    return {"batch_size": batch_size, "threads": threads, "step_time_ms": step_ms,
            "samples_per_s": batch_size / (step_ms / 1000), "torch": version}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help=f"create the PyTorch environment in {VENV}")
    parser.add_argument("--torch_requirement", default="torch", help="what --setup installs as torch")
    parser.add_argument("--torch_index", default=TORCH_INDEX,
                        help="the package index --setup takes torch from ('': pip's configured sources)")
    parser.add_argument("--dlrm_repo", default=os.environ.get("DLRM_PYTORCH_REPO"),
                        help="a clone of facebookresearch/dlrm (default: $DLRM_PYTORCH_REPO)")
    parser.add_argument("--batch_size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    if args.setup:
        setup(args.torch_requirement, args.torch_index)
        return 0
    reason = unavailable_reason(args.dlrm_repo)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    print(json.dumps(measure(args.dlrm_repo, args.batch_size, args.steps, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

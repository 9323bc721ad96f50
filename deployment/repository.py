"""A Triton model repository from an export folder, for users with a full Triton (ONNX Runtime backend).

    python -m deployment.repository EXPORT_DIR REPO_DIR [--version N] [--model_name NAME]

writes the layout of Triton's ONNX Runtime backend (the one V5's deployment uses):

    REPO_DIR/NAME/config.pbtxt          platform "onnxruntime_onnx", max_batch_size, dynamic batching
    REPO_DIR/NAME/N/model.onnx          (and serving.json, the contract the version was exported with)

A version folder appears whole (written beside it, then renamed), so a server polling the repository
(Triton's `--model-control-mode=poll`, or `deployment.serve`) never loads half a version. A new
version must keep the contract of the versions already there (`ServingContract.mismatch`). Default
version: one more than the highest present. The config text is shared with `deployment.serve`,
which serves the same inputs through Triton's Python backend.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from deployment.contract import CONTRACT_FILE, ContractError, ServingContract, load_contract

CONFIG_FILE = "config.pbtxt"
TRITON_DTYPES = {"float32": "TYPE_FP32", "int32": "TYPE_INT32"}
DEFAULT_MAX_BATCH_SIZE = 4096
DEFAULT_QUEUE_DELAY_US = 200


def model_config_text(contract: ServingContract, name: str, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                      queue_delay_us: int = DEFAULT_QUEUE_DELAY_US, backend: Optional[str] = None,
                      instances: int = 1, parameters: Optional[Dict[str, str]] = None) -> str:
    """Triton's config.pbtxt for `contract`'s inputs and output: the ONNX Runtime platform, or
    `backend` (deployment.serve's "python"); batch dimension implicit, dynamic batching on, the
    latest version served; `parameters`: the config's string parameters (the model reads them)."""
    def tensors(specs: Sequence) -> str:
        return ",\n".join(f'  {{ name: "{spec.name}" data_type: {TRITON_DTYPES[spec.dtype]} dims: [ {spec.width} ] }}'
                          for spec in specs)
    engine = f'backend: "{backend}"' if backend else 'platform: "onnxruntime_onnx"'
    model_file = "" if backend else f'default_model_filename: "{contract.onnx}"\n'
    return (f'name: "{name}"\n{engine}\n{model_file}max_batch_size: {max_batch_size}\n'
            f"input [\n{tensors(contract.inputs)}\n]\n"
            f"output [\n{tensors(contract.outputs)}\n]\n"
            f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}\n"
            f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
            "version_policy: { latest: { num_versions: 1 } }\n"
            + "".join(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
                      for key, value in (parameters or {}).items()))


def versions(model_dir: Path) -> List[int]:
    """The version folders of a repository's model folder, ascending (Triton's rule: numeric names
    without a leading zero)."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir()
                  if p.is_dir() and p.name.isdigit() and (p.name == "0" or not p.name.startswith("0")))


def add_version(export_dir: Path, repo_dir: Path, version: Optional[int] = None, model_name: Optional[str] = None,
                max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> Path:
    """Writes `export_dir` into `repo_dir` as `version` of `model_name` (default: the contract's model)
    and returns the version folder; ContractError (one line) on a bad export, a version already there
    or a contract other than the present versions'."""
    contract = load_contract(export_dir)
    model_dir = Path(repo_dir) / (model_name or contract.model)
    present = versions(model_dir)
    version = (present[-1] + 1 if present else 1) if version is None else version
    if version < 1:
        raise ContractError(f"--version {version}: a version is a number >= 1")
    target = model_dir / str(version)
    if target.exists():
        raise ContractError(f"{target}: version {version} is already there (versions are never rewritten)")
    if present:
        served = load_contract(model_dir / str(present[-1]))
        why = served.mismatch(contract, f"version {present[-1]}'s")
        if why:
            raise ContractError(f"{export_dir}: cannot be version {version} of {model_dir}: {why}")
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=model_dir))
    try:
        shutil.copy2(contract.onnx_path, staging / contract.onnx)
        shutil.copy2(export_dir / CONTRACT_FILE, staging / CONTRACT_FILE)
        os.chmod(staging, 0o755)
        config = model_dir / CONFIG_FILE
        if not config.exists():
            config_staging = model_dir / f".{CONFIG_FILE}.tmp"
            config_staging.write_text(model_config_text(contract, model_dir.name, max_batch_size))
            os.replace(config_staging, config)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m deployment.repository`: see the module doc. Exit 2 with one `error:` line on bad input."""
    parser = argparse.ArgumentParser(prog="python -m deployment.repository", description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", type=Path, help="an export folder (serving.json + model.onnx)")
    parser.add_argument("repo_dir", type=Path, help="the Triton model repository (made if absent)")
    parser.add_argument("--version", type=int, default=None, help="version number (default: the highest + 1)")
    parser.add_argument("--model_name", default=None, help="model folder name (default: serving.json's model)")
    parser.add_argument("--max_batch_size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                        help="config.pbtxt's max_batch_size (written with the first version)")
    args = parser.parse_args(argv)
    try:
        if args.max_batch_size < 1:
            raise ContractError(f"--max_batch_size {args.max_batch_size}: must be >= 1")
        target = add_version(args.export_dir, args.repo_dir, args.version, args.model_name, args.max_batch_size)
    except ContractError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

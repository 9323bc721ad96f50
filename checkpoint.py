"""World-size-independent checkpoints of the whole training state (ARCHITECTURE.md, Formats).

Layout of one checkpoint directory `<root>/step_<NNNNNNNNN>/`:
  manifest.json                   format version, step, model config, feature order, file list
                                  with sizes and sha256 checksums
  embeddings/feature_<i>.npy      table i in global layout, [cardinality, dim]
  embeddings/feature_<i>.<slot>.npy  its optimizer slots (Adam m and v), same layout
  dense/<weight>.npy, dense/<weight>.<slot>.npy   MLP weights and their slots
  state/<name>.npy                LR-schedule step and optimizer iteration counters
A checkpoint is written into a hidden temporary directory and renamed into place, so a process
killed mid-save leaves the previous checkpoints intact. Tables are read back with
`np.load(mmap_mode='r')` in row chunks and never held whole in memory.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from embedding import TableView, row_chunks

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step_(\d{9})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or does not match the model being restored."""


@dataclass
class TrainingState:
    """What a checkpoint holds, as variables to read from or assign to."""
    model_config: Dict[str, Any]
    feature_names: List[str]
    tables: List[TableView]
    table_slots: List[Dict[str, TableView]]
    dense: Dict[str, tf.Variable]
    dense_slots: Dict[str, Dict[str, tf.Variable]]
    counters: Dict[str, tf.Variable]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _require_finite(values: np.ndarray, what: str) -> None:
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
        raise CheckpointError(f"{what} holds NaN or Inf values; the checkpoint is not written")


def _save_table(path: Optional[str], table: TableView, what: str) -> None:
    """Write a table chunk by chunk into a .npy file; every rank reads (a collective for sharded
    tables), only the writer (path not None) writes."""
    out = (np.lib.format.open_memmap(path, mode="w+", dtype=table.numpy_dtype, shape=(table.rows, table.dim))
           if path else None)
    for start, end in row_chunks(table.rows, table.dim, table.numpy_dtype.itemsize):
        chunk = table.read_rows(start, end)
        _require_finite(chunk, what)
        if out is not None:
            out[start:end] = chunk
    if out is not None:
        out.flush()
        del out


def _load_table(path: str, table: TableView) -> None:
    """Each rank reads row chunks from a memory map and keeps its own rows or columns."""
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if array.shape != (table.rows, table.dim):
        raise CheckpointError(f"{path}: shape {array.shape}, the model expects {(table.rows, table.dim)}")
    for start, end in row_chunks(table.rows, table.dim, table.numpy_dtype.itemsize):
        table.write_rows(start, end, np.asarray(array[start:end]))


def _state_files(state: TrainingState) -> List[Tuple[str, Any]]:
    """(relative path, source) pairs: a TableView or a variable."""
    files: List[Tuple[str, Any]] = []
    for i, table in enumerate(state.tables):
        files.append((f"embeddings/feature_{i}.npy", table))
        for slot, slot_table in sorted(state.table_slots[i].items()):
            files.append((f"embeddings/feature_{i}.{slot}.npy", slot_table))
    for name, variable in sorted(state.dense.items()):
        files.append((f"dense/{name}.npy", variable))
        for slot, slot_variable in sorted(state.dense_slots.get(name, {}).items()):
            files.append((f"dense/{name}.{slot}.npy", slot_variable))
    for name, variable in sorted(state.counters.items()):
        files.append((f"state/{name}.npy", variable))
    return files


def save(root: str, step: int, state: TrainingState, keep: int = 3, writer: bool = True) -> str:
    """Write `<root>/step_<step>` atomically, then delete all but the newest `keep` checkpoints.

    Every rank calls it (sharded tables are gathered chunk by chunk); only the `writer` rank
    touches the file system.
    """
    final = os.path.join(root, f"step_{step:09d}")
    tmp = os.path.join(root, f".tmp-step_{step:09d}-{os.getpid()}")
    if writer:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        for sub in ("embeddings", "dense", "state"):
            os.makedirs(os.path.join(tmp, sub))
    entries = []
    try:
        for relative, source in _state_files(state):
            path = os.path.join(tmp, relative)
            if isinstance(source, TableView):
                _save_table(path if writer else None, source, relative)
            else:
                value = source.numpy()
                _require_finite(value, relative)
                if writer:
                    np.save(path, value, allow_pickle=False)
            if writer:
                entries.append({"file": relative, "bytes": os.path.getsize(path), "sha256": _sha256(path)})
    except CheckpointError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not writer:
        return final
    manifest = {"format_version": FORMAT_VERSION, "step": step, "model_config": state.model_config,
                "feature_names": state.feature_names, "files": entries}
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str) -> List[str]:
    """Complete checkpoints under `root`, oldest first (temporary directories are ignored)."""
    if not os.path.isdir(root):
        return []
    found = [os.path.join(root, d) for d in os.listdir(root)
             if STEP_DIR.match(d) and os.path.isfile(os.path.join(root, d, MANIFEST))]
    return sorted(found)


def resolve(path: str) -> str:
    """A checkpoint directory itself, or the newest complete one under a root."""
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(f"{path}: no checkpoint found (expected {MANIFEST} or step_* directories)")
    return found[-1]


def read_manifest(path: str) -> Dict[str, Any]:
    manifest_path = os.path.join(path, MANIFEST)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{manifest_path}: cannot read the checkpoint manifest: {e}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{manifest_path}: format version {manifest.get('format_version')}, "
                              f"this code reads {FORMAT_VERSION}")
    return manifest


def config_mismatches(saved: Dict[str, Any], current: Dict[str, Any]) -> List[str]:
    """Human-readable differences between a checkpoint's model config and the current one."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            lines.append(f"{key}: checkpoint {saved.get(key)!r}, current {current.get(key)!r}")
    return lines


def restore(path: str, state: TrainingState, verify_checksums: bool = True) -> int:
    """Load a checkpoint (or the newest under a root) into `state`; return its step."""
    path = resolve(path)
    manifest = read_manifest(path)
    mismatches = config_mismatches(manifest["model_config"], state.model_config)
    if manifest.get("feature_names") != state.feature_names:
        mismatches.append(f"feature order: checkpoint {manifest.get('feature_names')}, "
                          f"current {state.feature_names}")
    if mismatches:
        raise CheckpointError(f"{path}: the checkpoint was written for a different model:\n  "
                              + "\n  ".join(mismatches))
    recorded = {e["file"]: e for e in manifest["files"]}
    expected = _state_files(state)
    missing = [relative for relative, _ in expected if relative not in recorded]
    if missing:
        raise CheckpointError(f"{path}: the checkpoint lacks {missing} (e.g. optimizer slots of a "
                              f"different --optimizer)")
    for relative, source in expected:
        file_path = os.path.join(path, relative)
        entry = recorded[relative]
        if not os.path.isfile(file_path) or os.path.getsize(file_path) != entry["bytes"]:
            raise CheckpointError(f"{file_path}: missing or truncated (expected {entry['bytes']} bytes)")
        if verify_checksums and _sha256(file_path) != entry["sha256"]:
            raise CheckpointError(f"{file_path}: checksum mismatch, the file is damaged")
        if isinstance(source, TableView):
            _load_table(file_path, source)
        else:
            value = np.load(file_path, allow_pickle=False)
            if tuple(value.shape) != tuple(source.shape):
                raise CheckpointError(f"{file_path}: shape {value.shape}, the model expects {tuple(source.shape)}")
            source.assign(value)
    return int(manifest["step"])


def table_arrays(path: str) -> List[np.ndarray]:
    """The embedding tables of a checkpoint as read-only memory maps (for tests and tools)."""
    path = resolve(path)
    manifest = read_manifest(path)
    return [np.load(os.path.join(path, f"embeddings/feature_{i}.npy"), mmap_mode="r", allow_pickle=False)
            for i in range(len(manifest["feature_names"]))]



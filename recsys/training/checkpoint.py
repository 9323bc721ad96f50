"""World-size-independent checkpoints of the whole training state (docs/architecture.md, Formats).

Layout of one checkpoint directory `<root>/step_<NNNNNNNNN>/`:
  manifest.json                   format version, step, lineage, model config, feature order, the
                                  global batch size the step counts, file list with sizes, sha256
                                  checksums, dtypes and shapes
  embeddings/feature_<i>.npy      table i in global layout, [cardinality, dim]
  embeddings/feature_<i>.<slot>.npy  its optimizer slots (Adam m and v), same layout
  dense/<weight>.npy, dense/<weight>.<slot>.npy   MLP weights and their slots
  state/<name>.npy                LR-schedule step and optimizer iteration counters
A checkpoint is streamed into a hidden temporary sibling and renamed into place
(`safe_io.atomic_directory`): a failure removes the temporary, and a process killed mid-save leaves
the previous checkpoints intact (its stale temporary is ignored, never taken for a checkpoint).

The lineage id ties the checkpoints of one training history together: a fresh run draws a new
one, a resumed run inherits its checkpoint's. Keep-last-K pruning only ever deletes older
checkpoints of the run's own lineage, and `check_save_folder` refuses, before training, a folder
whose checkpoints this run could overwrite or be mistaken for. Checkpoints written before
lineages were recorded count as another lineage: restorable, never pruned.

Restoring validates every manifest field, then every file's size, .npy header, dtype and shape,
then streams tables in row chunks from `np.load(mmap_mode='r')`, refusing non-finite values, so
a table is never held whole in memory. Every error is a CheckpointError naming the file.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from recsys.sparse.tables import TableView, row_chunks
from recsys.runtime.safe_io import OutputPathError, atomic_directory, check_output_dir, real_path

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step_(\d{9})$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
STEP_COUNTER = "lr_schedule_step"  # the counter that must equal the manifest's step


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
    global_batch_size: Optional[int] = None  # the rows of one step, all ranks: what the step counts in


@dataclass(frozen=True)
class FileEntry:
    """One array file as the manifest records it (dtype and shape: None in older checkpoints)."""
    bytes: int
    sha256: str
    dtype: Optional[np.dtype]
    shape: Optional[Tuple[int, ...]]


@dataclass(frozen=True)
class Manifest:
    """The validated manifest of the checkpoint directory `path`."""
    path: str
    step: int
    lineage: Optional[str]  # None: written before lineages were recorded
    model_config: Dict[str, Any]
    feature_names: List[str]
    files: Dict[str, FileEntry]
    global_batch_size: Optional[int] = None  # None: not recorded (older checkpoints)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _require_finite(values: np.ndarray, what: str, rows: Optional[Tuple[int, int]] = None) -> None:
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
        where = f" (rows {rows[0]}-{rows[1] - 1})" if rows else ""
        raise CheckpointError(f"{what}: holds NaN or Inf values{where}")


# ---- writing ----

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


def _layout(source: Any) -> Tuple[np.dtype, Tuple[int, ...]]:
    """The dtype and shape a source (TableView or variable) has in the model."""
    if isinstance(source, TableView):
        return source.numpy_dtype, (source.rows, source.dim)
    return np.dtype(source.dtype.as_numpy_dtype), tuple(int(d) for d in source.shape)


def _checked_chunks(source: Any, what: str) -> Iterator[np.ndarray]:
    """A table in row chunks (every rank must read them: sharded reads are collectives), a
    variable in one piece; non-finite values are refused so no bad checkpoint is written."""
    if isinstance(source, TableView):
        for start, end in row_chunks(source.rows, source.dim, source.numpy_dtype.itemsize):
            chunk = source.read_rows(start, end)
            _require_finite(chunk, what, (start, end))
            yield chunk
    else:
        value = source.numpy()
        _require_finite(value, what)
        yield value


def _write_npy(path: str, dtype: np.dtype, shape: Tuple[int, ...], chunks: Iterator[np.ndarray]) -> Dict[str, Any]:
    """Stream chunks into a .npy file with plain writes (a full disk raises OSError, where a
    memory map would die of SIGBUS), hashing as it goes; return the manifest entry."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    digest = hashlib.sha256()
    with open(path, "xb") as f:
        blocks = (memoryview(np.ascontiguousarray(c, dtype)).cast("B") for c in chunks)
        for block in itertools.chain([header.getvalue()], blocks):
            f.write(block)
            digest.update(block)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    return {"bytes": size, "sha256": digest.hexdigest(), "dtype": dtype.str, "shape": list(shape)}


def _write_state(directory: Optional[str], state: TrainingState, final: str) -> List[Dict[str, Any]]:
    """Write every array of `state` under `directory` (the temporary of `final`, which errors
    name) and return the manifest's file list; with directory None only read (what non-writer
    ranks do, for the collectives)."""
    entries = []
    for relative, source in _state_files(state):
        dtype, shape = _layout(source)
        chunks = _checked_chunks(source, os.path.join(final, relative))
        if directory is None:
            for _ in chunks:
                pass
        else:
            entries.append({"file": relative} | _write_npy(os.path.join(directory, relative), dtype, shape, chunks))
    return entries


def _replaceable(final: str, lineage: str) -> bool:
    """Whether an existing step directory may be replaced: only one of this lineage."""
    if not os.path.lexists(final):
        return False
    try:
        existing = read_manifest(final)
    except CheckpointError as error:
        raise CheckpointError(f"{final} already exists and is not a readable checkpoint ({error}); "
                              f"refusing to overwrite it") from None
    if existing.lineage != lineage:
        raise CheckpointError(f"{final} already exists and belongs to another run; refusing to overwrite it")
    return True


def save(root: str, step: int, state: TrainingState, lineage: str, keep: int = 3, writer: bool = True) -> str:
    """Write `<root>/step_<step>` atomically, then prune this lineage's older checkpoints to `keep`.

    Every rank calls it (sharded tables are gathered chunk by chunk); only the `writer` rank
    touches the file system. A step directory of another lineage is never overwritten; one of
    this lineage is replaced whole.
    """
    final = os.path.join(root, f"step_{step:09d}")
    if not writer:
        _write_state(None, state, final)
        return final
    replace = _replaceable(final, lineage)
    try:
        with atomic_directory(final, replace=replace) as tmp:
            for sub in ("embeddings", "dense", "state"):
                os.mkdir(os.path.join(tmp, sub))
            manifest = {"format_version": FORMAT_VERSION, "step": step, "lineage": lineage,
                        "model_config": state.model_config, "feature_names": state.feature_names,
                        "files": _write_state(tmp, state, final)}
            if state.global_batch_size is not None:
                manifest["global_batch_size"] = state.global_batch_size
            with open(os.path.join(tmp, MANIFEST), "x") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
    except (OSError, OutputPathError) as error:
        raise CheckpointError(f"{final}: cannot write the checkpoint: {error}") from None
    _prune(root, lineage, step, keep)
    return final


def _prune(root: str, lineage: str, step: int, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints of `lineage` up to `step` (none if keep < 1);
    other lineages, unreadable manifests and anything newer than `step` are left alone."""
    if keep < 1:
        return
    ours = []
    for path in list_checkpoints(root):
        try:
            found = read_manifest(path)
        except CheckpointError:
            continue
        if found.lineage == lineage and found.step <= step:
            ours.append(path)
    for old in ours[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def run_lineage(resumed: Optional[Manifest]) -> str:
    """This run's lineage: the restored checkpoint's, or a new id for a fresh run (or one resumed
    from a checkpoint that predates lineages, whose folder-mates then stay unpruned)."""
    return resumed.lineage if resumed is not None and resumed.lineage else uuid.uuid4().hex


# ---- finding and validating ----

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


def _parse_file_entry(entry: Any, index: int, where: str) -> Tuple[str, FileEntry]:
    field = f"{where}: files[{index}]"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{field} must be an object, got {entry!r}")
    for key in ("file", "bytes", "sha256"):
        if key not in entry:
            raise CheckpointError(f"{field} lacks the field '{key}'")
    relative = entry["file"]
    if (not isinstance(relative, str) or not relative or os.path.isabs(relative)
            or ".." in relative.replace("\\", "/").split("/")):
        raise CheckpointError(f"{field}.file must be a relative path inside the checkpoint, got {relative!r}")
    if not _is_count(entry["bytes"]):
        raise CheckpointError(f"{field}.bytes must be a non-negative integer, got {entry['bytes']!r}")
    if not isinstance(entry["sha256"], str) or not SHA256.match(entry["sha256"]):
        raise CheckpointError(f"{field}.sha256 must be 64 lowercase hex digits, got {entry['sha256']!r}")
    dtype = shape = None
    if "dtype" in entry:
        try:
            dtype = np.dtype(entry["dtype"])
        except (TypeError, ValueError):
            raise CheckpointError(f"{field}.dtype is not a numpy dtype: {entry['dtype']!r}") from None
    if "shape" in entry:
        if not isinstance(entry["shape"], list) or not all(_is_count(d) for d in entry["shape"]):
            raise CheckpointError(f"{field}.shape must be a list of non-negative integers, got {entry['shape']!r}")
        shape = tuple(entry["shape"])
    return relative, FileEntry(entry["bytes"], entry["sha256"], dtype, shape)


def _parse_manifest(path: str, where: str, raw: Any) -> Manifest:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: the manifest must be a JSON object, got {type(raw).__name__}")
    version = raw.get("format_version")
    if not (_is_count(version) and version == FORMAT_VERSION):
        raise CheckpointError(f"{where}: format_version {version!r}, this code reads {FORMAT_VERSION}")
    for key in ("step", "model_config", "feature_names", "files"):
        if key not in raw:
            raise CheckpointError(f"{where}: the field '{key}' is missing")
    if not _is_count(raw["step"]):
        raise CheckpointError(f"{where}: step must be a non-negative integer, got {raw['step']!r}")
    lineage = raw.get("lineage")
    if "lineage" in raw and not (isinstance(lineage, str) and lineage):
        raise CheckpointError(f"{where}: lineage must be a non-empty string, got {lineage!r}")
    batch = raw.get("global_batch_size")
    if "global_batch_size" in raw and not (_is_count(batch) and batch > 0):
        raise CheckpointError(f"{where}: global_batch_size must be a positive integer, got {batch!r}")
    if not isinstance(raw["model_config"], dict):
        raise CheckpointError(f"{where}: model_config must be an object, got {raw['model_config']!r}")
    names = raw["feature_names"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{where}: feature_names must be a list of strings, got {names!r}")
    if not isinstance(raw["files"], list):
        raise CheckpointError(f"{where}: files must be a list, got {type(raw['files']).__name__}")
    files: Dict[str, FileEntry] = {}
    for index, entry in enumerate(raw["files"]):
        relative, parsed = _parse_file_entry(entry, index, where)
        if relative in files:
            raise CheckpointError(f"{where}: files[{index}] repeats {relative!r}")
        files[relative] = parsed
    return Manifest(path, raw["step"], lineage, raw["model_config"], names, files, batch)


def read_manifest(path: str) -> Manifest:
    """The validated manifest of checkpoint directory `path`; any defect names the field and file."""
    manifest_path = os.path.join(path, MANIFEST)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{manifest_path}: cannot read the checkpoint manifest: {e}") from None
    return _parse_manifest(path, manifest_path, raw)


def open_checkpoint(path: str) -> Manifest:
    """The manifest of a checkpoint directory, or of the newest checkpoint under a root."""
    return read_manifest(resolve(path))


def config_mismatches(saved: Dict[str, Any], current: Dict[str, Any]) -> List[str]:
    """Human-readable differences between a checkpoint's model config and the current one."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            lines.append(f"{key}: checkpoint {saved.get(key)!r}, current {current.get(key)!r}")
    return lines


def model_mismatches(manifest: Manifest, model_config: Dict[str, Any], feature_names: List[str]) -> List[str]:
    """Why a checkpoint cannot hold this model's weights: config differences, then feature order."""
    lines = config_mismatches(manifest.model_config, model_config)
    if manifest.feature_names != feature_names:
        lines.append(f"feature order: checkpoint {manifest.feature_names}, current {feature_names}")
    return lines


def refuse_inside_checkpoints(path: str, name: str, root: Optional[str], root_name: str) -> None:
    """A file written next to checkpoints (a log in the run's folder) is fine; one that is, contains,
    or lies inside a checkpoint directory (or the temporary of one) under `root` is refused."""
    if not root:
        return
    target, base = real_path(path), real_path(root)
    if target == base or base.startswith(target.rstrip(os.sep) + os.sep):
        raise OutputPathError(f"{name} {path} would overwrite {root_name} {root}")
    if not target.startswith(base.rstrip(os.sep) + os.sep):
        return
    first = os.path.relpath(target, base).split(os.sep)[0]
    if (os.path.isfile(os.path.join(base, MANIFEST)) or STEP_DIR.match(first) or first.startswith(".")
            or os.path.isfile(os.path.join(base, first, MANIFEST))):
        raise OutputPathError(f"{name} {path} lies inside a checkpoint of {root_name} {root}; "
                              f"write it beside the checkpoints instead")


def check_save_folder(root: str, model_config: Dict[str, Any], feature_names: List[str], lineage: str,
                      resumed: Optional[Manifest], name: str, resume_hint: Optional[str] = None) -> None:
    """Before training, refuse a save folder (flag `name`) whose checkpoints this run could
    overwrite or be mistaken for, so that the folder's newest checkpoint is always this run's.

    Refused: a file or unwritable folder; a checkpoint directory itself; unless the run resumes
    from this folder, any checkpoint of another model, another lineage, or unreadable; and any
    checkpoint newer than the restored step (another run's, or this lineage's abandoned future).
    Stale temporaries of dead writers are ignored. Nothing is written. `resume_hint` says how the
    entry point resumes from `root` (default: DLRM's --restore_checkpoint_path).
    """
    check_output_dir(root, name)
    if os.path.isfile(os.path.join(root, MANIFEST)):
        raise CheckpointError(f"{name} {root} is itself a checkpoint; save into an empty folder instead")
    resuming_here = resumed is not None and real_path(os.path.dirname(resumed.path)) == real_path(root)
    for path in list_checkpoints(root):
        if resumed is not None and real_path(path) == real_path(resumed.path):
            continue
        if not resuming_here:
            _check_folder_mate(root, path, model_config, feature_names, lineage, name,
                               resume_hint or f"--restore_checkpoint_path {root}")
        if resumed is not None and int(STEP_DIR.match(os.path.basename(path)).group(1)) > resumed.step:
            raise CheckpointError(
                f"{name} {root} holds {os.path.basename(path)}, newer than the restored step {resumed.step}; "
                f"it would be mistaken for this run's newest checkpoint: move it away or choose an empty folder")


def _check_folder_mate(root: str, path: str, model_config: Dict[str, Any], feature_names: List[str],
                       lineage: str, name: str, resume_hint: str) -> None:
    """A checkpoint already in the save folder of a run that does not resume from that folder
    must be of this model and lineage (an ancestor of the restored checkpoint)."""
    try:
        found = read_manifest(path)
    except CheckpointError as error:
        raise CheckpointError(f"{name} {root} holds an unreadable checkpoint ({error}); "
                              f"choose an empty folder") from None
    differences = model_mismatches(found, model_config, feature_names)
    if differences:
        raise CheckpointError(f"{name} {root} holds checkpoints of another model "
                              f"({os.path.basename(path)}: {differences[0]}); choose an empty folder")
    if found.lineage != lineage:
        raise CheckpointError(f"{name} {root} holds checkpoints of another run ({os.path.basename(path)}); "
                              f"resume with {resume_hint}, or choose an empty folder")


def check_resume_step(manifest: Manifest, total_steps: int, max_steps: int) -> None:
    """In training, a checkpoint at or past the end (`total_steps` = epochs x steps per epoch,
    capped by `max_steps` when >= 0) leaves nothing to train: an error, unless `max_steps` names
    its step exactly, an explicit request to re-save it (e.g. to move it to another world size)."""
    end = total_steps if max_steps < 0 else min(total_steps, max_steps)
    if manifest.step >= end and max_steps != manifest.step:
        raise CheckpointError(
            f"{manifest.path}: the checkpoint is at step {manifest.step}, at or beyond the end of training "
            f"(--max_steps {max_steps}, --epochs x steps per epoch = {total_steps}); nothing is left to train "
            f"(pass --max_steps {manifest.step} to re-save it without training)")


def check_batch_size(manifest: Manifest, global_batch_size: int, flag: str) -> None:
    """Training resumed from `manifest` must step in batches of its size: the step counts batches, so
    the schedule, the epoch's position and the data already read all follow from it (a step of
    another size would skip or repeat data and end the schedule early or late). `flag` names the
    entry point's batch flag in the message. A checkpoint that did not record its batch passes."""
    saved = manifest.global_batch_size
    if saved is not None and saved != global_batch_size:
        raise CheckpointError(
            f"{flag} {global_batch_size} differs from the {saved} of the checkpoint {manifest.path}, whose step "
            f"{manifest.step} counts batches of {saved} rows; resume with {flag} {saved}, or start a new run "
            f"in another folder")


def _read_header(path: str) -> Tuple[np.dtype, Tuple[int, ...], int]:
    """dtype, shape and data offset of a .npy file, without reading its data."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            return dtype, tuple(shape), f.tell()
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable .npy file: {e}") from None


def _check_file(path: str, entry: FileEntry, source: Any) -> None:
    """Size, header, dtype kind and shape of one file against its manifest entry and the model."""
    if not os.path.isfile(path) or os.path.getsize(path) != entry.bytes:
        raise CheckpointError(f"{path}: missing or truncated (the manifest records {entry.bytes} bytes)")
    dtype, shape, offset = _read_header(path)
    if entry.dtype is not None and entry.dtype != dtype:
        raise CheckpointError(f"{path}: dtype {dtype}, the manifest records {entry.dtype}")
    if entry.shape is not None and entry.shape != shape:
        raise CheckpointError(f"{path}: shape {shape}, the manifest records {entry.shape}")
    model_dtype, model_shape = _layout(source)
    kinds = "f" if model_dtype.kind == "f" else "iu"
    if dtype.kind not in kinds:
        raise CheckpointError(f"{path}: dtype {dtype}, the model expects {'floating point' if kinds == 'f' else 'integers'}")
    if shape != model_shape:
        raise CheckpointError(f"{path}: shape {shape}, the model expects {model_shape}")
    if offset + int(np.prod(shape)) * dtype.itemsize != entry.bytes:
        raise CheckpointError(f"{path}: {entry.bytes} bytes do not hold a {dtype} array of shape {shape}")


def _converted(values: np.ndarray, dtype: np.dtype, path: str, rows: Optional[Tuple[int, int]] = None) -> np.ndarray:
    """`values` in the model's dtype: finite floats (also after narrowing, e.g. to float16), or
    integer counters within range and non-negative."""
    _require_finite(values, path, rows)
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            converted = values.astype(dtype, copy=False)
        if not np.isfinite(converted).all():
            raise CheckpointError(f"{path}: values overflow {dtype}")
        return converted
    bad = values[(values < 0) | (values > np.iinfo(dtype).max)]
    if bad.size:
        raise CheckpointError(f"{path}: counter value {bad.flat[0]} is outside [0, {np.iinfo(dtype).max}]")
    return values.astype(dtype)


def _load(path: str, source: Any) -> None:
    """Assign one file to its source: a table streamed in row chunks, a variable whole."""
    dtype, _ = _layout(source)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        if isinstance(source, TableView):
            for start, end in row_chunks(source.rows, source.dim, dtype.itemsize):
                source.write_rows(start, end, _converted(np.asarray(array[start:end]), dtype, path, (start, end)))
        else:
            source.assign(_converted(np.asarray(array), dtype, path))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot be read: {e}") from None


def restore(manifest: Manifest, state: TrainingState, verify_checksums: bool = True) -> int:
    """Load a checkpoint into `state` after checking the model, every file and every value; return its step."""
    path = manifest.path
    mismatches = model_mismatches(manifest, state.model_config, state.feature_names)
    if mismatches:
        raise CheckpointError(f"{path}: the checkpoint was written for a different model: " + "; ".join(mismatches))
    expected = _state_files(state)
    missing = [relative for relative, _ in expected if relative not in manifest.files]
    if missing:
        raise CheckpointError(f"{path}: the checkpoint lacks {missing} (e.g. optimizer slots of a "
                              f"different --optimizer)")
    for relative, source in expected:
        _check_file(os.path.join(path, relative), manifest.files[relative], source)
    for relative, source in expected:
        file_path = os.path.join(path, relative)
        if verify_checksums and _sha256(file_path) != manifest.files[relative].sha256:
            raise CheckpointError(f"{file_path}: checksum mismatch, the file is damaged")
        _load(file_path, source)
    if STEP_COUNTER in state.counters and int(state.counters[STEP_COUNTER].numpy()) != manifest.step:
        raise CheckpointError(f"{os.path.join(path, 'state', STEP_COUNTER + '.npy')}: holds step "
                              f"{int(state.counters[STEP_COUNTER].numpy())}, the manifest's step is {manifest.step}")
    return manifest.step


def table_arrays(path: str) -> List[np.ndarray]:
    """The embedding tables of a checkpoint as read-only memory maps (for tests and tools)."""
    manifest = open_checkpoint(path)
    return [np.load(os.path.join(manifest.path, f"embeddings/feature_{i}.npy"), mmap_mode="r", allow_pickle=False)
            for i in range(len(manifest.feature_names))]

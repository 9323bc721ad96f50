"""The registry of dataset formats: every format registers itself once, and the rest reads it here.

A format is one module that calls `register_format` at its top level, once per format name: the
name, its roles (`training`: a `--dataset_type` of main.py; `source` and `destination`: a
`--src_dataset_type` / `--dst_dataset_type` of `dataloading.transcribe`), the options only it
reads (flags such as --hugectr_cardinalities, refused for every other format), the model it feeds
(`model`: "dlrm", the default, or "wide_and_deep", whose formats are listed only for it), and its hooks: how
it finds or derives its spec (`load_spec`), its reader (the loader builds a rank's pipelines and
transcribe reads a source from it; `pipelines` and `batches` serve formats without one) and its
writer. main.py's flag choices, `dataloader`'s dispatch and transcribe's lists are read from here.

Names without TensorFlow. main.py defines its flags before TensorFlow is imported (--xla must set
TF_XLA_FLAGS first), but the format modules import TensorFlow. So this module imports none of
them to list the formats: `FORMAT_MODULES` names every module that registers one, and their
`register_format(...)` calls are read from the source (`ast`, literal roles only); a format's
module is imported the first time one of its hooks is needed, which runs the very call it read.
A format registered from anywhere else (a test's module, a plug-in) is listed once that module is
imported. TensorFlow-free.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

if TYPE_CHECKING:
    from recsys.data.feature_spec import FeatureSpec

ROLES = ("training", "source", "destination")
DLRM = "dlrm"
# Every module that registers a format, in the order the formats are listed (the model packages'
# modules last; they are named, not imported, so this layer stays below them).
FORMAT_MODULES = (
    "recsys.data.column_data", "recsys.data.csv_data", "recsys.data.split_binary", "recsys.data.hugectr_data",
    "recsys.data.split_tfrecords", "recsys.data.synthetic_data", "recsys.data.torchrec_data",
    "wide_and_deep.wd_data", "wide_and_deep.wd_split_binary",
)
_CALL = "register_format"


@dataclass
class InputPipelines:
    """What the training loop consumes: one-epoch datasets (tf.data), their lengths and the spec."""
    train: Any
    test: Any
    feature_spec: "FeatureSpec"
    train_steps: int
    eval_steps: int
    teacher_auc: Optional[float] = None


@dataclass(frozen=True)
class Declaration:
    """What a format says of itself, readable without importing its module."""
    name: str
    module: str
    training: bool = False
    source: bool = False
    destination: bool = False
    own_options: Tuple[str, ...] = ()
    model: str = DLRM


@dataclass(frozen=True)
class DataFormat:
    """A registered format: its declaration and its hooks (see `register_format`)."""
    declaration: Declaration
    load_spec: Callable[[Optional[str], str, Mapping[str, Any]], "FeatureSpec"]
    reader: Optional[Callable[..., Any]] = None
    pipelines: Optional[Callable[..., InputPipelines]] = None
    validate: Optional[Callable[["FeatureSpec", Mapping[str, int]], None]] = None
    batches: Optional[Callable[..., Iterator[Any]]] = None
    generate: Optional[Callable[..., Tuple[Dict[str, int], Dict[str, Any]]]] = None
    writer: Optional[Callable[..., Any]] = None
    prebatched: bool = False
    metadata_key: Optional[str] = None
    scan: Optional[Callable[["FeatureSpec", int], "FeatureSpec"]] = None

    @property
    def name(self) -> str:
        return self.declaration.name


_registered: Dict[str, DataFormat] = {}
_declared: Optional[Dict[str, Declaration]] = None


def register_format(name: str, *, load_spec: Callable[[Optional[str], str, Mapping[str, Any]], "FeatureSpec"],
                    training: bool = False, source: bool = False, destination: bool = False,
                    own_options: Tuple[str, ...] = (), model: str = DLRM, reader: Optional[Callable[..., Any]] = None,
                    pipelines: Optional[Callable[..., InputPipelines]] = None,
                    validate: Optional[Callable[["FeatureSpec", Mapping[str, int]], None]] = None,
                    batches: Optional[Callable[..., Iterator[Any]]] = None,
                    generate: Optional[Callable[..., Tuple[Dict[str, int], Dict[str, Any]]]] = None,
                    writer: Optional[Callable[..., Any]] = None, prebatched: bool = False,
                    metadata_key: Optional[str] = None,
                    scan: Optional[Callable[["FeatureSpec", int], "FeatureSpec"]] = None) -> None:
    """Register format `name`; call it once per name at a module's top level, roles and
    `own_options` written as literals (they are read from the source without importing it).

    load_spec(dataset_path, spec_file_name, options) -> FeatureSpec: the checked spec (`options`: every
      option the caller has, e.g. allow_external_paths; the format reads those it needs).
    reader(spec, mapping, global_batch_size, *, rank, world_size, reads, drop_remainder,
      numerical_dtype, check_values): an object with `num_samples`, `len()` (batches),
      `dataset(shuffle_batch_order, seed)`, `check_every_batch()` and `batches()` (`batch.Samples`).
    pipelines(spec, config, reads) -> InputPipelines: instead of `reader`, for a format that serves
      both splits together (synthetic data drawn from one generator).
    validate(spec, {mapping: batch size}): the up-front scan of --validate_data (default: every
      batch of a `reader` with `check_every_batch`).
    batches(spec, mapping, batch_size, keep_remainder) -> Iterator[Samples]: a source without a reader.
    generate(writer, spec, {mapping: batches (-1: the default)}, batch_size, seed) -> (batches
      written per mapping, spec metadata for the destination): a source whose samples are made.
    writer(spec, destination, prebatch_size, overwrite, spec_file_name, output_name): a
      `staged_writer.SampleWriter` with `commit()`, a context manager that aborts on exit;
      `prebatched`: every appended batch is one stored batch of `prebatch_size` samples
      (the source's batch size must be it; no last partial batch).
    metadata_key: the FeatureSpec.metadata entry describing this format's files (not carried over).
    scan(spec, batch_size) -> FeatureSpec: a source whose spec is finished by reading its data once
      (CSV's `cardinality: auto`), every value checked; transcribe checks the destination first.
    model: the model the format feeds (a literal): DLRM's formats follow the hooks above; another
      model's (`wide_and_deep`) follow that model's reader contract (wide_and_deep/wd_data.py) and are
      listed only for it (`names(role, model)`).
    """
    if training and reader is None and pipelines is None:
        raise TypeError(f"format {name!r}: a training format needs a reader or pipelines")
    if source and reader is None and batches is None and generate is None:
        raise TypeError(f"format {name!r}: a source needs a reader, batches or generate")
    if destination and writer is None:
        raise TypeError(f"format {name!r}: a destination needs a writer")
    module = _caller_module()
    declaration = Declaration(name, module, training, source, destination, tuple(own_options), model)
    found = declarations().get(name)
    if name in _registered or (found is not None and found.module != module):
        where = found.module if found is not None else _registered[name].declaration.module
        raise ValueError(f"format {name!r} is registered twice: by {where} and by {module}")
    if found is not None and found != declaration:
        raise ValueError(f"format {name!r}: {module}'s register_format call declares {found}, registered {declaration}")
    _registered[name] = DataFormat(declaration, load_spec, reader, pipelines, validate, batches, generate,
                                   writer, prebatched, metadata_key, scan)
    _all_declarations()[name] = declaration


def _caller_module() -> str:
    """The module whose top level called `register_format`."""
    return sys._getframe(2).f_globals.get("__name__", "?")


def declarations() -> Dict[str, Declaration]:
    """Every format declared by a module of FORMAT_MODULES, and every one registered."""
    return dict(_all_declarations())


def _all_declarations() -> Dict[str, Declaration]:
    global _declared
    if _declared is None:
        _declared = {}
        for module in FORMAT_MODULES:
            found = importlib.util.find_spec(module)
            if found is None or not found.origin:
                raise ImportError(f"data_formats.FORMAT_MODULES names {module}, which does not exist")
            for declaration in _declared_in(found.origin, module):
                _declared.setdefault(declaration.name, declaration)
    return _declared


def _declared_in(path: str, module: str) -> List[Declaration]:
    """The formats `register_format` calls at the top level of `path` declare."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if _CALL + "(" not in text:
        return []
    found = []
    for statement in ast.parse(text, path).body:
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not isinstance(call, ast.Call):
            continue
        function = call.func
        if (function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)) != _CALL:
            continue
        given = [("name", call.args[0])] if call.args else []
        given += [(keyword.arg, keyword.value) for keyword in call.keywords
                  if keyword.arg in ("name", "own_options", "model", *ROLES)]
        fields: Dict[str, Any] = {}
        for field, node in given:
            try:
                fields[field] = ast.literal_eval(node)
            except ValueError:
                raise ValueError(f"{path}:{node.lineno}: {_CALL}'s {field} must be a literal, so that "
                                 f"the formats are listed without importing {module}") from None
        fields["own_options"] = tuple(fields.get("own_options", ()))
        found.append(Declaration(module=module, **fields))
    return found


def names(role: str, model: str = DLRM) -> Tuple[str, ...]:
    """The formats feeding `model` that can play `role` (one of ROLES), in declaration order."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return tuple(name for name, declaration in _all_declarations().items()
                 if getattr(declaration, role) and declaration.model == model)


def get(name: str, role: str, model: str = DLRM) -> DataFormat:
    """The registered format `name`, importing its module on first use; ValueError naming the
    choices unless it feeds `model` and plays `role`."""
    declaration = _all_declarations().get(name)
    if declaration is None or not getattr(declaration, role) or declaration.model != model:
        what = {"training": "dataset_type", "source": "--src_dataset_type",
                "destination": "--dst_dataset_type"}[role]
        raise ValueError(f"{what} must be one of {list(names(role, model))}, got {name!r}")
    if name not in _registered:
        importlib.import_module(declaration.module)
    return _registered[name]


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """An option another format owns (`own_options`) is refused, naming that format, when given
    (not None) for format `name`."""
    declared = _all_declarations()
    for option, value in options.items():
        owners = [other for other, d in declared.items() if option in d.own_options]
        if value is not None and owners and name not in owners:
            raise ValueError(f"--{option} describes --dataset_type {owners[0]} data, not {name}")


def metadata_keys() -> Tuple[str, ...]:
    """The FeatureSpec.metadata entries of the formats loaded so far that describe their files."""
    return tuple(f.metadata_key for f in _registered.values() if f.metadata_key)

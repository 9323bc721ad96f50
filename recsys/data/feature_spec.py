"""FeatureSpec: the YAML description of a dataset (reference §4.1-4.5, §13.2).

A spec names every feature with its dtype (and cardinality for categoricals), groups the features
into channels (categorical, numerical, label) and says which files of each mapping (train, test)
hold them. Paths in the spec are relative to the directory of the YAML file and, unless the
caller allows external paths, must stay inside it (a stray `../` or absolute path would silently
read or overwrite someone else's files).

The V5 (DLRM_and_DCNv2) spec shape is accepted too: `source_spec: null` (synthetic data, or a
split-TFRecords dataset whose folder layout is fixed), an `int8` label, and categorical features
with `hotness` (ids per sample) and `alpha` (the exponent of V5's power-law synthetic ids). This
project adds an optional per-feature `pooling`, `sum` (default) or `mean`: how a multi-hot
feature's embeddings are combined into one vector per sample.
"""
from __future__ import annotations

import copy
import difflib
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml

from recsys.runtime.safe_io import atomic_file

CATEGORICAL_CHANNEL = "categorical"
NUMERICAL_CHANNEL = "numerical"
LABEL_CHANNEL = "label"
CHANNELS = (CATEGORICAL_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL)

SPLIT_BINARY = "split_binary"
CSV = "csv"
TRAIN_MAPPING = "train"
TEST_MAPPING = "test"
MAPPINGS = (TRAIN_MAPPING, TEST_MAPPING)

DTYPE_SELECTOR = "dtype"
CARDINALITY_SELECTOR = "cardinality"
HOTNESS_SELECTOR = "hotness"
ALPHA_SELECTOR = "alpha"
POOLING_SELECTOR = "pooling"
POOLINGS = ("sum", "mean")  # the first is the default
MULTI_HOT_SELECTORS = (HOTNESS_SELECTOR, ALPHA_SELECTOR, POOLING_SELECTOR)
CATEGORICAL_SELECTORS = (DTYPE_SELECTOR, CARDINALITY_SELECTOR, *MULTI_HOT_SELECTORS)
TYPE_SELECTOR = "type"
FEATURES_SELECTOR = "features"
FILES_SELECTOR = "files"
AUTO_CARDINALITY = "auto"

CATEGORICAL_DTYPES = ("int8", "int16", "int32")
NUMERICAL_DTYPE = "float16"
LABEL_DTYPE = "bool"  # what the split-binary writers store
LABEL_DTYPES = ("bool", "int8")  # one byte, 0 or 1: both read the same
DEFAULT_SPEC_NAME = "feature_spec.yaml"
DEFAULT_ALPHA = 1.45  # V5's power-law exponent, kept in generated specs
# MLPerf Training's DLRM-DCNv2 dataset: ids per sample of its 26 features, and the most rows of a
# table (larger vocabularies are folded into 40M rows when the dataset is built).
MLPERF_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
MLPERF_ROW_CAP = 40_000_000

# Cardinalities of the Criteo 1TB dataset preprocessed with frequency thresholds 15, 3 and 0
# (reference §4.12 and §13.2).
CRITEO_VARIANTS = {
    "criteo_t15_synthetic": [7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469,
                             245828, 11, 2209, 10667, 104, 4, 968, 15, 8165896, 2675940, 7156453,
                             302516, 12022, 97, 35],
    "criteo_t3_synthetic": [45833188, 36747, 1572176, 345139, 11, 2209, 11268, 128, 4, 975, 15,
                            48937457, 17246, 11316796, 40094537, 452104, 12607, 105, 36, 7414, 20244,
                            4, 7115, 1442, 63, 29275261],
    "criteo_t0_synthetic": [227605432, 39061, 3067956, 405283, 11, 2209, 11939, 155, 4, 977, 15,
                            292775614, 17296, 40790948, 187188510, 590152, 12974, 109, 37, 7425,
                            20266, 4, 7123, 1544, 64, 130229467],
}
CRITEO_NUMERICAL_FEATURES = 13


class FeatureSpecError(ValueError):
    """A feature spec or its files are invalid; the message names the file and feature."""


# Two chunks reading one file would read the same bytes as two features, or score training data
# as test data when the mappings share it.
_OWN_FILE_RULE = "every chunk of every mapping needs its own file"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key repeated in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
        first_lines: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = first_lines.get(key)
            except TypeError:  # an unhashable key: the base constructor reports it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first defined at line {first})",
                    key_node.start_mark)
            first_lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_error_line(error: yaml.YAMLError) -> str:
    """One line for a YAML error: the problem and where (PyYAML's own text spans several lines)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        context = f" ({error.context})" if error.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {error.problem}{context}"
    return " ".join(str(error).split())


def file_kind_problem(path: str) -> Optional[str]:
    """None if `path` is a regular file (or a link to one); else why not, as the end of a sentence
    ('not found', 'is a directory, not a regular file', ...), so a FIFO is not opened (it blocks)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "not found"
    except OSError as error:
        return f"is not accessible ({error.strerror})"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return f"is {kind}, not a regular file"


def is_external_path(relative_path: str) -> bool:
    """True if a spec path is absolute or climbs out of the spec's folder (`../x`)."""
    if os.path.isabs(relative_path):
        return True
    normalised = os.path.normpath(relative_path)
    return normalised == os.pardir or normalised.startswith(os.pardir + os.sep)


# The largest cardinality split-binary ids can serve: int32 must hold ids up to it (§4.5).
MAX_CARDINALITY = int(np.iinfo(np.int32).max) - 1


def get_categorical_feature_type(cardinality: int) -> str:
    """Smallest of int8/int16/int32 whose max is strictly greater than the cardinality (§4.5)."""
    for dtype in CATEGORICAL_DTYPES:
        if cardinality < np.iinfo(dtype).max:
            return dtype
    raise FeatureSpecError(f"cardinality {cardinality} does not fit in int32")


@dataclass
class FeatureSpec:
    """The four sections of a feature spec plus the directory its paths are relative to."""

    feature_spec: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    source_spec: Optional[Dict[str, List[Dict[str, Any]]]] = field(default_factory=dict)
    channel_spec: Dict[str, List[str]] = field(default_factory=dict)
    metadata: Dict[str, Any] = field(default_factory=dict)
    base_directory: str = "."
    path: Optional[str] = None

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_yaml(cls, path: str) -> "FeatureSpec":
        """Load a spec; a missing file, bad YAML or a wrong top-level shape raise FeatureSpecError."""
        problem = file_kind_problem(path)
        if problem:
            raise FeatureSpecError(f"{path}: feature spec file {problem}")
        try:
            with open(path) as f:
                raw = yaml.load(f, Loader=_UniqueKeyLoader)
        except yaml.YAMLError as e:
            raise FeatureSpecError(f"{path}: YAML syntax error at {_yaml_error_line(e)}") from None
        except UnicodeDecodeError as e:
            raise FeatureSpecError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if not isinstance(raw, dict):
            raise FeatureSpecError(f"{path}: the top level must be a mapping with feature_spec, "
                                   f"source_spec and channel_spec")
        unknown = set(raw) - {"feature_spec", "source_spec", "channel_spec", "metadata"}
        if unknown:
            raise FeatureSpecError(f"{path}: unknown top-level keys {sorted(unknown)}")
        for section in ("feature_spec", "source_spec", "channel_spec"):
            if section not in raw or not isinstance(raw[section], dict) and (
                    section != "source_spec" or raw[section] is not None):
                raise FeatureSpecError(f"{path}: section '{section}' is missing or not a mapping"
                                       + (" (null: a dataset without files)" if section == "source_spec"
                                          else ""))
        metadata = raw.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise FeatureSpecError(f"{path}: section 'metadata' must be a mapping")
        teacher_auc = metadata.get("teacher_auc")
        if teacher_auc is not None and (isinstance(teacher_auc, bool)
                                        or not isinstance(teacher_auc, (int, float))):
            raise FeatureSpecError(f"{path}: metadata 'teacher_auc' must be a number, got {teacher_auc!r}")
        spec = cls(feature_spec=raw["feature_spec"], source_spec=raw["source_spec"],
                   channel_spec=raw["channel_spec"], metadata=metadata,
                   base_directory=os.path.dirname(os.path.abspath(path)), path=path)
        for name, props in spec.feature_spec.items():
            if not isinstance(name, str):
                raise FeatureSpecError(f"{path}: feature name {name!r} is a {type(name).__name__}, not a "
                                       f"string (YAML reads bare no/yes/on/off and numbers so); quote it")
            if not isinstance(props, dict):
                raise FeatureSpecError(f"{path}: feature '{name}' must map to a dict of properties")
        return spec

    def to_dict(self) -> Dict[str, Any]:
        return {"feature_spec": self.feature_spec, "source_spec": self.source_spec,
                "channel_spec": self.channel_spec, "metadata": self.metadata}

    def to_yaml(self, output_path: Optional[str] = None, overwrite: bool = True) -> str:
        """Write the spec (default: `<base_directory>/feature_spec.yaml`) atomically; return the path.

        An existing file is replaced only if `overwrite` (else `safe_io.OutputPathError`)."""
        output_path = output_path or os.path.join(self.base_directory, DEFAULT_SPEC_NAME)
        os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
        with atomic_file(output_path, replace=overwrite) as f:
            yaml.safe_dump(copy.deepcopy(self.to_dict()), f)
        return output_path

    # ------------------------------------------------------------ defaults
    @classmethod
    def get_default_feature_spec(cls, number_of_numerical_features: int,
                                 categorical_feature_cardinalities: Sequence[int],
                                 base_directory: str = ".",
                                 hotness: Optional[Sequence[int]] = None) -> "FeatureSpec":
        """The Criteo-style spec of §4.3: num_i, cat_i.bin, label; one file per chunk. `hotness`
        (one per categorical feature) marks the multi-hot ones (a feature of hotness 1 gets no key)."""
        numerical_names = [f"num_{i}" for i in range(number_of_numerical_features)]
        categorical_names = [f"cat_{i}.bin" for i in range(len(categorical_feature_cardinalities))]
        features: Dict[str, Dict[str, Any]] = {name: {DTYPE_SELECTOR: NUMERICAL_DTYPE}
                                               for name in numerical_names}
        for name, card in zip(categorical_names, categorical_feature_cardinalities):
            features[name] = {DTYPE_SELECTOR: get_categorical_feature_type(int(card)),
                              CARDINALITY_SELECTOR: int(card)}
        for name, ids_per_sample in zip(categorical_names, hotness or []):
            if ids_per_sample != 1:
                features[name][HOTNESS_SELECTOR] = int(ids_per_sample)
        features["label"] = {DTYPE_SELECTOR: LABEL_DTYPE}
        sources: Dict[str, List[Dict[str, Any]]] = {}
        for mapping in MAPPINGS:
            chunks = []
            if numerical_names:
                chunks.append({TYPE_SELECTOR: SPLIT_BINARY, FEATURES_SELECTOR: list(numerical_names),
                               FILES_SELECTOR: [f"{mapping}/numerical.bin"]})
            chunks.append({TYPE_SELECTOR: SPLIT_BINARY, FEATURES_SELECTOR: ["label"],
                           FILES_SELECTOR: [f"{mapping}/label.bin"]})
            for i, name in enumerate(categorical_names):
                chunks.append({TYPE_SELECTOR: SPLIT_BINARY, FEATURES_SELECTOR: [name],
                               FILES_SELECTOR: [f"{mapping}/cat_{i}.bin"]})
            sources[mapping] = chunks
        channels = {CATEGORICAL_CHANNEL: categorical_names, NUMERICAL_CHANNEL: numerical_names,
                    LABEL_CHANNEL: ["label"]}
        return cls(feature_spec=features, source_spec=sources, channel_spec=channels, metadata={},
                   base_directory=base_directory)

    @classmethod
    def get_fileless_feature_spec(cls, number_of_numerical_features: int,
                                  categorical_feature_cardinalities: Sequence[int],
                                  base_directory: str = ".") -> "FeatureSpec":
        """The V5 spec of §13.2 (`generate_feature_spec`): `cat_<i>` (cardinality, hotness 1,
        alpha 1.45, int32), `num_<i>` (float16), `label` (int8), and no files (`source_spec: null`)."""
        numerical_names = [f"num_{i}" for i in range(number_of_numerical_features)]
        categorical_names = [f"cat_{i}" for i in range(len(categorical_feature_cardinalities))]
        features: Dict[str, Dict[str, Any]] = {
            name: {CARDINALITY_SELECTOR: int(card), HOTNESS_SELECTOR: 1, ALPHA_SELECTOR: DEFAULT_ALPHA,
                   DTYPE_SELECTOR: "int32"}
            for name, card in zip(categorical_names, categorical_feature_cardinalities)}
        features.update({name: {DTYPE_SELECTOR: NUMERICAL_DTYPE} for name in numerical_names})
        features["label"] = {DTYPE_SELECTOR: "int8"}
        channels = {CATEGORICAL_CHANNEL: categorical_names, NUMERICAL_CHANNEL: numerical_names,
                    LABEL_CHANNEL: ["label"]}
        return cls(feature_spec=features, source_spec=None, channel_spec=channels, metadata={},
                   base_directory=base_directory)

    # -------------------------------------------------------------- queries
    @property
    def categorical_names(self) -> List[str]:
        return list(self.channel_spec.get(CATEGORICAL_CHANNEL) or [])

    @property
    def numerical_names(self) -> List[str]:
        return list(self.channel_spec.get(NUMERICAL_CHANNEL) or [])

    @property
    def label_name(self) -> str:
        return self.channel_spec[LABEL_CHANNEL][0]

    @property
    def cardinalities(self) -> List[int]:
        return [int(self.feature_spec[name][CARDINALITY_SELECTOR]) for name in self.categorical_names]

    @property
    def hotness(self) -> List[int]:
        """Ids per sample of each categorical feature (1: one-hot; the most ids for ragged data)."""
        return [int(self.feature_spec[name].get(HOTNESS_SELECTOR, 1)) for name in self.categorical_names]

    @property
    def alphas(self) -> List[float]:
        """The power-law exponent of each categorical feature's synthetic ids (V5's `alpha`)."""
        return [float(self.feature_spec[name].get(ALPHA_SELECTOR, DEFAULT_ALPHA)) for name in self.categorical_names]

    @property
    def poolings(self) -> List[str]:
        """How each categorical feature's embeddings are pooled per sample: 'sum' or 'mean'."""
        return [str(self.feature_spec[name].get(POOLING_SELECTOR, POOLINGS[0])) for name in self.categorical_names]

    def dtype_of(self, feature: str) -> np.dtype:
        return np.dtype(self.feature_spec[feature][DTYPE_SELECTOR])

    def values_per_sample(self, feature: str) -> int:
        """Stored values of `feature` per sample: a categorical feature's hotness, else 1."""
        if feature in self.categorical_names:
            return int(self.feature_spec[feature].get(HOTNESS_SELECTOR, 1))
        return 1

    def take_multi_hot_properties(self, source: "FeatureSpec") -> "FeatureSpec":
        """Copy `hotness`, `alpha` and `pooling` of `source`'s categorical features onto this spec's,
        feature by feature in channel order (a converted dataset keeps them); returns self."""
        for name, source_name in zip(self.categorical_names, source.categorical_names, strict=True):
            for key in MULTI_HOT_SELECTORS:
                if key in source.feature_spec[source_name]:
                    self.feature_spec[name][key] = source.feature_spec[source_name][key]
        return self

    def refuse_multi_hot(self, format_name: str) -> None:
        """FeatureSpecError naming the first multi-hot feature, if any: `format_name` stores one id
        per sample and feature."""
        for name, ids_per_sample in zip(self.categorical_names, self.hotness):
            if ids_per_sample != 1:
                raise FeatureSpecError(f"{self._where()}: categorical feature '{name}' has hotness "
                                       f"{ids_per_sample}, but {format_name} holds one id per sample and "
                                       f"feature; multi-hot data needs split-binary (tf_raw), split_tfrecords "
                                       f"or synthetic data")

    def file_of(self, mapping: str, feature: str) -> str:
        """Absolute path of the file holding `feature` in `mapping`."""
        for chunk in self.source_spec[mapping]:
            if feature in chunk[FEATURES_SELECTOR]:
                return self.resolve(chunk[FILES_SELECTOR][0])
        raise FeatureSpecError(f"{self._where()}: feature '{feature}' has no file in mapping '{mapping}'")

    def resolve(self, relative_path: str) -> str:
        return os.path.join(self.base_directory, relative_path)

    def num_samples(self, mapping: str) -> int:
        """Samples in a mapping, from the label file's size (files were checked to agree)."""
        return os.path.getsize(self.file_of(mapping, self.label_name)) // self.dtype_of(self.label_name).itemsize

    def _where(self) -> str:
        return self.path or os.path.join(self.base_directory, DEFAULT_SPEC_NAME)

    # ----------------------------------------------------------- validation
    def check_feature_spec(self, chunk_type: Optional[str] = SPLIT_BINARY,
                           allow_external_paths: bool = False, allowed_by: Optional[str] = None,
                           numerical_dtype: str = NUMERICAL_DTYPE) -> None:
        """Every rule of §4.2 plus: cardinality fits the dtype, hotness/alpha/pooling well formed (and
        hotness 1 in CSV files), no file serves two chunks of a mapping, and (unless
        `allow_external_paths`) every file lies inside the spec's folder; the error names
        `allowed_by`, the caller's flag that allows it, if it has one. `chunk_type` None checks a
        spec whose files are not its business (synthetic data, a split-TFRecords folder): features,
        channels and dtypes only. `numerical_dtype`: the numericals' one dtype (float16 for DLRM;
        Wide & Deep's split-binary files keep float32). Raises FeatureSpecError."""
        where = self._where()
        self._check_features(where, chunk_type)
        self._check_channels(where)
        for name in self.categorical_names:
            self._check_hotness(where, name)
            card = self.feature_spec[name].get(CARDINALITY_SELECTOR)
            if chunk_type == CSV and card == AUTO_CARDINALITY:
                continue
            if isinstance(card, bool) or not isinstance(card, int) or card <= 0:
                raise FeatureSpecError(f"{where}: categorical feature '{name}' needs a positive integer "
                                       f"cardinality, got {card!r}")
        if chunk_type == CSV:
            self.refuse_multi_hot("a CSV dataset (one column per feature)")
        else:
            self._check_dtypes(where, numerical_dtype)
        if chunk_type is None:
            return
        if self.source_spec is None:
            raise FeatureSpecError(f"{where}: source_spec is null, so the spec names no data files; "
                                   f"a {chunk_type} dataset needs the files of 'train' and 'test'")
        self._check_mappings(where, chunk_type, allow_external_paths, allowed_by)

    def _check_hotness(self, where: str, name: str) -> None:
        """hotness, alpha and pooling well formed; a misspelt key (`hotnes: 3`) would silently
        mean one-hot, so a categorical feature's keys must be known ones."""
        props = self.feature_spec[name]
        unknown = sorted(set(props) - set(CATEGORICAL_SELECTORS), key=str)
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), CATEGORICAL_SELECTORS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise FeatureSpecError(f"{where}: categorical feature '{name}' has unknown key "
                                   f"{unknown[0]!r}{hint}; known are {list(CATEGORICAL_SELECTORS)}")
        hotness = props.get(HOTNESS_SELECTOR, 1)
        if isinstance(hotness, bool) or not isinstance(hotness, int) or hotness < 1:
            raise FeatureSpecError(f"{where}: categorical feature '{name}' has hotness {hotness!r}; it "
                                   f"must be a positive integer (ids per sample)")
        alpha = props.get(ALPHA_SELECTOR, DEFAULT_ALPHA)
        if (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not np.isfinite(alpha)
                or alpha <= 0):
            raise FeatureSpecError(f"{where}: categorical feature '{name}' has alpha {alpha!r}; it must "
                                   f"be a positive number")
        pooling = props.get(POOLING_SELECTOR, POOLINGS[0])
        if pooling not in POOLINGS:
            raise FeatureSpecError(f"{where}: categorical feature '{name}' has pooling {pooling!r}; it "
                                   f"must be one of {list(POOLINGS)}")

    def _check_dtypes(self, where: str, numerical_dtype: str) -> None:
        """Categoricals int8/16/32 wide enough for their cardinality, numericals `numerical_dtype`,
        the label bool or int8."""
        for name in self.categorical_names:
            dtype = str(self.dtype_of(name))
            if dtype not in CATEGORICAL_DTYPES:
                raise FeatureSpecError(f"{where}: categorical feature '{name}' has dtype {dtype}; "
                                       f"supported are {list(CATEGORICAL_DTYPES)}")
            card = self.feature_spec[name].get(CARDINALITY_SELECTOR)
            if card - 1 > np.iinfo(dtype).max:
                raise FeatureSpecError(f"{where}: cardinality {card} of feature '{name}' does not fit "
                                       f"its dtype {dtype}")
        for name in self.numerical_names:
            if str(self.dtype_of(name)) != numerical_dtype:
                raise FeatureSpecError(f"{where}: numerical feature '{name}' must be {numerical_dtype}, "
                                       f"got {self.dtype_of(name)}")
        if str(self.dtype_of(self.label_name)) not in LABEL_DTYPES:
            raise FeatureSpecError(f"{where}: label feature '{self.label_name}' must be "
                                   f"{' or '.join(LABEL_DTYPES)}, got {self.dtype_of(self.label_name)}")

    def _check_features(self, where: str, chunk_type: str) -> None:
        for name, props in self.feature_spec.items():
            if DTYPE_SELECTOR not in props:
                if chunk_type == CSV:
                    continue
                raise FeatureSpecError(f"{where}: feature '{name}' has no dtype")
            dtype = props[DTYPE_SELECTOR]
            try:
                if not isinstance(dtype, str):
                    raise TypeError(dtype)
                np.dtype(dtype)
            except (TypeError, ValueError):
                raise FeatureSpecError(f"{where}: feature '{name}' has unknown dtype {dtype!r}") from None

    def _check_channels(self, where: str) -> None:
        if set(self.channel_spec) != set(CHANNELS):
            missing = sorted(set(CHANNELS) - set(self.channel_spec))
            extra = sorted(set(self.channel_spec) - set(CHANNELS))
            raise FeatureSpecError(f"{where}: channel_spec must have exactly the channels "
                                   f"{list(CHANNELS)} (missing {missing}, unexpected {extra})")
        for channel in CHANNELS:
            names = self.channel_spec[channel] or []
            if not isinstance(names, list):
                raise FeatureSpecError(f"{where}: channel '{channel}' must be a list of feature names")
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise FeatureSpecError(f"{where}: channel '{channel}' lists {duplicates} more than once")
            for name in names:
                if name not in self.feature_spec:
                    raise FeatureSpecError(f"{where}: feature '{name}' of channel '{channel}' is not "
                                           f"defined in feature_spec")
        labels = self.channel_spec[LABEL_CHANNEL] or []
        if len(labels) != 1:
            raise FeatureSpecError(f"{where}: channel 'label' must hold exactly one feature, got {labels}")
        in_channels = [n for c in CHANNELS for n in (self.channel_spec[c] or [])]
        if len(in_channels) != len(set(in_channels)):
            twice = sorted({n for n in in_channels if in_channels.count(n) > 1})
            raise FeatureSpecError(f"{where}: features {twice} appear in more than one channel")
        unused = sorted(set(self.feature_spec) - set(in_channels))
        if unused:
            raise FeatureSpecError(f"{where}: features {unused} are in feature_spec but in no channel")

    def _check_mappings(self, where: str, chunk_type: str, allow_external_paths: bool,
                        allowed_by: Optional[str]) -> None:
        if set(self.source_spec) != set(MAPPINGS):
            raise FeatureSpecError(f"{where}: source_spec must have exactly the mappings {list(MAPPINGS)}, "
                                   f"got {sorted(self.source_spec)}")
        all_features = set(self.feature_spec)
        owners: Dict[str, str] = {}  # normalised file path -> the chunk that reads it
        for mapping, chunks in self.source_spec.items():
            if not isinstance(chunks, list):
                raise FeatureSpecError(f"{where}: mapping '{mapping}' must be a list of chunks")
            seen: List[str] = []
            for chunk in chunks:
                self._check_chunk(where, mapping, chunk, chunk_type, allow_external_paths, allowed_by)
                seen.extend(chunk[FEATURES_SELECTOR])
                owner = f"features {chunk[FEATURES_SELECTOR]} of mapping '{mapping}'"
                relative = os.path.normpath(chunk[FILES_SELECTOR][0])
                if relative in owners:
                    raise FeatureSpecError(f"{where}: file {chunk[FILES_SELECTOR][0]!r} of {owner} is also "
                                           f"the file of {owners[relative]}; {_OWN_FILE_RULE}")
                owners[relative] = owner
            repeated = sorted({n for n in seen if seen.count(n) > 1})
            if repeated:
                raise FeatureSpecError(f"{where}: mapping '{mapping}' lists features {repeated} in more "
                                       f"than one chunk")
            missing = sorted(all_features - set(seen))
            if missing:
                raise FeatureSpecError(f"{where}: mapping '{mapping}' has no file for features {missing}")
            unknown = sorted(set(seen) - all_features)
            if unknown:
                raise FeatureSpecError(f"{where}: mapping '{mapping}' names features {unknown} that are "
                                       f"not defined in feature_spec")

    def _check_chunk(self, where: str, mapping: str, chunk: Any, chunk_type: str,
                     allow_external_paths: bool, allowed_by: Optional[str]) -> None:
        if not isinstance(chunk, dict):
            raise FeatureSpecError(f"{where}: mapping '{mapping}' has a chunk that is not a mapping")
        features = chunk.get(FEATURES_SELECTOR) or []
        label = f"{where}: mapping '{mapping}', chunk {features}"
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise FeatureSpecError(f"{label}: 'features' must be a list of feature names")
        if chunk.get(TYPE_SELECTOR) != chunk_type:
            raise FeatureSpecError(f"{label}: type must be '{chunk_type}', got {chunk.get(TYPE_SELECTOR)!r}")
        if not features:
            raise FeatureSpecError(f"{label}: a chunk needs at least one feature")
        files = chunk.get(FILES_SELECTOR) or []
        if not isinstance(files, list) or len(files) != 1 or not isinstance(files[0], str):
            raise FeatureSpecError(f"{label}: a chunk needs exactly one file, got {files}")
        if not allow_external_paths and is_external_path(files[0]):
            remedy = f"pass {allowed_by} to read it there" if allowed_by else "this command reads only files inside it"
            raise FeatureSpecError(f"{label}: file {files[0]!r} lies outside the dataset folder "
                                   f"{self.base_directory}; {remedy}")
        if chunk_type != SPLIT_BINARY:
            return
        categorical = [f for f in features if f in self.categorical_names]
        numerical = [f for f in features if f in self.numerical_names]
        if categorical:
            if len(features) != 1:
                raise FeatureSpecError(f"{label}: a categorical chunk must hold exactly one feature")
        elif numerical:
            if features != self.numerical_names:
                raise FeatureSpecError(f"{label}: the numerical chunk must hold all numerical features in "
                                       f"channel_spec order {self.numerical_names}")
        elif features != [self.label_name]:
            raise FeatureSpecError(f"{label}: the label chunk must hold only the label feature")

    def check_files(self, mappings: Sequence[str] = MAPPINGS) -> Dict[str, int]:
        """Every file exists, holds whole records and agrees on the sample count; returns the counts."""
        counts: Dict[str, int] = {}
        identities: Dict[Tuple[int, int], str] = {}  # (device, inode) -> path, over all mappings
        for mapping in mappings:
            per_file: Dict[str, int] = {}
            for chunk in self.source_spec[mapping]:
                path = self.resolve(chunk[FILES_SELECTOR][0])
                features = chunk[FEATURES_SELECTOR]
                problem = file_kind_problem(path)
                if problem:
                    raise FeatureSpecError(f"{path}: file of feature(s) {features} (mapping '{mapping}') "
                                           f"{problem}")
                status = os.stat(path)
                twin = identities.setdefault((status.st_dev, status.st_ino), path)
                if twin != path:
                    raise FeatureSpecError(f"{path}: file of feature(s) {features} (mapping '{mapping}') "
                                           f"is the same file on disk as {twin}; {_OWN_FILE_RULE}")
                record = sum(self.dtype_of(f).itemsize * self.values_per_sample(f) for f in features)
                size = os.path.getsize(path)
                if size % record:
                    hotness = self.values_per_sample(features[0])
                    layout = (f" ({hotness} ids per sample of {self.dtype_of(features[0])})"
                              if hotness != 1 else "")
                    raise FeatureSpecError(f"{path}: size {size} B is not a whole number of {record}-byte "
                                           f"records of feature(s) {features}{layout}; the file is truncated")
                per_file[path] = size // record
            if len(set(per_file.values())) > 1:
                listing = ", ".join(f"{os.path.relpath(p, self.base_directory)}={n}"
                                    for p, n in per_file.items())
                raise FeatureSpecError(f"{self._where()}: files of mapping '{mapping}' hold different "
                                       f"numbers of samples: {listing}")
            counts[mapping] = next(iter(per_file.values()), 0)
        return counts


def get_default_feature_spec(number_of_numerical_features: int,
                             categorical_feature_cardinalities: Sequence[int],
                             base_directory: str = ".", hotness: Optional[Sequence[int]] = None) -> FeatureSpec:
    """Module-level spelling of `FeatureSpec.get_default_feature_spec` (the reference's name)."""
    return FeatureSpec.get_default_feature_spec(number_of_numerical_features,
                                                categorical_feature_cardinalities, base_directory, hotness)


def load_folder_spec(dataset_type: str, dataset_path: Optional[str], spec_file_name: str,
                     chunk_type: Optional[str], options: Dict[str, Any], spec_inside: bool = True) -> FeatureSpec:
    """The checked spec `spec_file_name` of the dataset folder `dataset_path` (the formats whose
    spec is a file: split-binary, split-TFRecords, synthetic data shaped by a spec).

    `options`: `allow_external_paths` lets the spec name data files outside the folder (and lie
    outside it itself), `external_paths_flag` names the flag that allows it in errors (default
    --allow_external_data_paths; None: the command has none, and the spec's place is not checked).
    With `spec_inside` (and unless allowed), a spec outside the folder is refused: its files would be
    read relative to another folder."""
    if not dataset_path:
        raise ValueError(f"dataset_path is required for dataset_type {dataset_type!r}")
    allow = bool(options.get("allow_external_paths", False))
    flag = options.get("external_paths_flag", "--allow_external_data_paths")
    spec_path = os.path.join(dataset_path, spec_file_name)
    if spec_inside and flag is not None and not allow:
        _check_spec_inside(spec_path, dataset_path)
    spec = FeatureSpec.from_yaml(spec_path)
    spec.check_feature_spec(chunk_type=chunk_type, allow_external_paths=allow, allowed_by=flag)
    return spec


def _check_spec_inside(spec_path: str, dataset_path: str) -> None:
    """A spec's files are read relative to the spec's own folder, so a spec outside the dataset
    folder (an absolute or ../ --feature_spec) would silently train on another folder's files."""
    spec_dir, data_dir = os.path.realpath(os.path.dirname(spec_path)), os.path.realpath(dataset_path)
    if spec_dir != data_dir and not spec_dir.startswith(data_dir.rstrip(os.sep) + os.sep):
        raise ValueError(f"--feature_spec {spec_path} lies outside --dataset_path {dataset_path}, and its data files "
                         f"would be read relative to {spec_dir}: give --dataset_path {spec_dir}, or pass "
                         f"--allow_external_data_paths to read them there")

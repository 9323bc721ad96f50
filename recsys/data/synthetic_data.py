"""Learnable synthetic data (reference §4.9): a fixed random "teacher" labels the samples.

Labels come from a random teacher DLRM (`SyntheticTeacher`), so a model trained on the data can
learn something and its AUC can be compared with the teacher's. The data is either written as a
split-binary dataset (`write_synthetic_dataset`; `prepare_synthetic_dataset` is the reference's
`prepare_synthetic_dataset.py`, a thin command over it, and chooses the spec from its flags), appended to
any dataset writer (`write_teacher_samples`, what `dataloading.transcribe` does), or drawn in
memory as per-rank tf.data pipelines (`make_synthetic_split`, `synthetic_dataset`, what
`--dataset_type synthetic` uses). It registers the `synthetic` format (`data_formats`): training
pipelines drawn in memory, and a transcribe source whose samples are made by the teacher. The teacher's AUC is the evaluation's own exact AUC
(`metrics.exact_auc`), so the data layer (`datasets`) imports no evaluation code.

Ids follow the FeatureSpec: a one-hot feature's ids are uniform over [0, cardinality) (V4's
synthetic data); a feature of hotness h > 1 gets h ids per sample ([n, h]) drawn from V5's
power law with the feature's exponent `alpha` (`power_law_ids`), and the teacher pools their
values with the feature's `pooling`, as the model's embedding layer does.
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys.data.batch import CATEGORICAL_KEY, NUMERICAL_KEY, TableReads, local_slice
from recsys.data.batch_reader import PREFETCH_BATCHES
from recsys.data.pipelines import DEFAULT_EVAL_BATCHES, DEFAULT_TRAIN_BATCHES, PipelineConfig
from recsys.data.data_formats import InputPipelines, register_format
from recsys.data.split_binary import SplitBinaryWriter
from recsys.data.feature_spec import (CRITEO_NUMERICAL_FEATURES, CRITEO_VARIANTS, DEFAULT_ALPHA, MAX_CARDINALITY, POOLINGS,
                          SPLIT_BINARY, TEST_MAPPING, TRAIN_MAPPING, FeatureSpec, FeatureSpecError, load_folder_spec)
from recsys.runtime.metrics import exact_auc
from recsys.runtime.safe_io import refuse_overlap
from recsys.data.staged_writer import SampleWriter


SYNTHETIC = "synthetic"
OUTPUT_FLAG = "--synthetic_dataset_dir"  # prepare_synthetic_dataset.py's output, named in its errors
DEFAULT_NUM_NUMERICAL = 13  # the default synthetic spec (main.py's flags give the same)
DEFAULT_CARDINALITIES = (1000,) * 26

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a well-mixed uint64 hash of each element (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _MIX_1
    x = (x ^ (x >> np.uint64(27))) * _MIX_2
    return x ^ (x >> np.uint64(31))


def hashed_units(ids: np.ndarray, key: int, count: int) -> np.ndarray:
    """[len(ids), count] float64 values uniform in [0, 1), a pure function of (key, id, column):
    random-looking numbers per id that need no stored table."""
    with np.errstate(over="ignore"):
        base = _mix64(np.asarray(ids, dtype=np.int64).astype(np.uint64) * _GOLDEN + np.uint64(key))
        columns = [_mix64(base + np.uint64(k + 1) * _GOLDEN) for k in range(count)]
    bits = np.stack(columns, axis=1) >> np.uint64(11) if columns else np.zeros((len(base), 0), np.uint64)
    return bits.astype(np.float64) * 2.0 ** -53


def _hashed_uniform(ids: np.ndarray, key: int, dim: int) -> np.ndarray:
    """[len(ids), dim] values, uniform with mean 0 and variance 1, a pure function of (key, id)."""
    return ((2.0 * hashed_units(ids, key, dim) - 1.0) * math.sqrt(3.0)).astype(np.float32)


def power_law_ids(rng: np.random.Generator, cardinality: int, alpha: float, shape: Tuple[int, ...]) -> np.ndarray:
    """Ids in [0, cardinality), id k drawn with probability about proportional to (k + 1)^-alpha
    (V5's synthetic ids): the continuous power law on [1, cardinality + 1) by its inverse CDF,
    floored, less one. Larger alpha, more skew towards small ids."""
    unit = rng.random(shape)
    top = float(cardinality) + 1.0
    if abs(alpha - 1.0) < 1e-9:
        k = np.power(top, unit)
    else:
        gamma = 1.0 - alpha
        k = np.power((top ** gamma - 1.0) * unit + 1.0, 1.0 / gamma)
    return np.clip(np.floor(k).astype(np.int64) - 1, 0, cardinality - 1)


class SyntheticTeacher:
    """A fixed random model that labels synthetic samples, built so a DLRM can represent it.

    logit = LOGIT_SCALE * mean-normalised sum of the components that exist:
      * numerical: w . z, with z the numericals standardised from U[0,1) and |w| = 1;
      * unary:     sum_i u_i[x_i] / sqrt(m), one random scalar per categorical id;
      * pairwise:  sum over the ring of pairs (i, i+1 mod m) of <e_i[x_i], e_j[x_j]> / sqrt(P),
                   with TEACHER_DIM-wide random embeddings (a DLRM's dot interaction).
    A multi-hot feature (`hotness` h > 1, ids [n, h]) pools its ids' values with its `pooling`:
    their sum, or their mean. Each component has unit variance (the pooled values' variance, h for
    a sum and 1/h for a mean of distinct ids, is divided out per component, not per feature, so
    summed features weigh more than averaged ones); the scale puts the teacher's AUC near 0.8.
    Teacher values are hashes of (seed, feature, id), so any cardinality works without storing
    tables.
    """

    TEACHER_DIM = 4
    LOGIT_SCALE = 1.3

    def __init__(self, num_numerical: int, cardinalities: Sequence[int], seed: int,
                 hotness: Optional[Sequence[int]] = None, poolings: Optional[Sequence[str]] = None,
                 alphas: Optional[Sequence[float]] = None):
        self.num_numerical = num_numerical
        self.cardinalities = [int(c) for c in cardinalities]
        self.seed = int(seed)
        m = len(self.cardinalities)
        self.hotness = [int(h) for h in hotness] if hotness is not None else [1] * m
        self.poolings = list(poolings) if poolings is not None else [POOLINGS[0]] * m
        self.alphas = [float(a) for a in alphas] if alphas is not None else [DEFAULT_ALPHA] * m
        if not len(self.hotness) == len(self.poolings) == len(self.alphas) == m:
            raise ValueError(f"the teacher needs one hotness, pooling and alpha per table ({m}), got "
                             f"{len(self.hotness)}, {len(self.poolings)} and {len(self.alphas)}")
        # Variance of a feature's pooled values of distinct ids (unit-variance values per id).
        self._pooled_variance = [float(h) if pooling == "sum" else 1.0 / h
                                 for h, pooling in zip(self.hotness, self.poolings)]
        rng = np.random.default_rng([self.seed, 0x7EAC])
        weights = rng.standard_normal(num_numerical)
        self.numerical_weights = (weights / max(np.linalg.norm(weights), 1e-12)).astype(np.float32)
        self.pairs = [(i, (i + 1) % m) for i in range(m)] if m > 2 else ([(0, 1)] if m == 2 else [])
        self.num_components = (num_numerical > 0) + (m > 0) + (len(self.pairs) > 0)

    @classmethod
    def for_spec(cls, spec: FeatureSpec, seed: int) -> "SyntheticTeacher":
        """The teacher of a spec's features: their cardinalities, hotness, poolings and alphas."""
        return cls(len(spec.numerical_names), spec.cardinalities, seed, spec.hotness, spec.poolings, spec.alphas)

    def feature_values(self, kind: int, feature: int, ids: np.ndarray, dim: int) -> np.ndarray:
        """Teacher values [n, dim] of one feature's ids [n] or [n, h] (pooled with its pooling);
        small tables are built once and gathered."""
        key = (self.seed * 1_000_003 + kind) * 1_000_003 + feature
        cardinality = self.cardinalities[feature]
        ids = np.asarray(ids)
        if cardinality <= ids.size:
            values = _hashed_uniform(np.arange(cardinality), key, dim)[ids.reshape(-1)]
        else:
            values = _hashed_uniform(ids.reshape(-1), key, dim)
        if ids.ndim == 1:
            return values
        per_id = values.reshape(ids.shape + (dim,))
        return per_id.sum(axis=1) if self.poolings[feature] == "sum" else per_id.mean(axis=1)

    def logits(self, numerical: np.ndarray, categoricals: Sequence[np.ndarray]) -> np.ndarray:
        """Teacher logits of samples (numericals as stored, i.e. float16-rounded)."""
        n = len(categoricals[0]) if categoricals else len(numerical)
        total = np.zeros(n, np.float32)
        if self.num_numerical:
            standardised = (np.asarray(numerical, np.float32) - 0.5) * math.sqrt(12.0)
            total += standardised @ self.numerical_weights
        variance = self._pooled_variance
        if categoricals:
            unary = sum(self.feature_values(1, i, ids, 1)[:, 0] for i, ids in enumerate(categoricals))
            total += unary / math.sqrt(sum(variance))
        if self.pairs:
            scale = self.TEACHER_DIM ** -0.5  # entries of variance 1/sqrt(d) give unit-variance dots
            embeddings = {i: self.feature_values(2, i, ids, self.TEACHER_DIM)
                          for i, ids in enumerate(categoricals)}
            pairwise = sum(np.einsum("nd,nd->n", embeddings[i], embeddings[j]) for i, j in self.pairs)
            total += pairwise * scale / math.sqrt(sum(variance[i] * variance[j] for i, j in self.pairs))
        return total * (self.LOGIT_SCALE / math.sqrt(max(self.num_components, 1)))

    def sample(self, num_samples: int, rng: np.random.Generator):
        """Draw samples: (numerical float16 [n, n_num], labels bool [n], ids list, probabilities);
        a one-hot feature's ids [n] uniform, a multi-hot one's [n, h] from its power law."""
        numerical = rng.random((num_samples, self.num_numerical), dtype=np.float32).astype(np.float16)
        categoricals = [rng.integers(0, c, num_samples, dtype=np.int64) if h == 1
                        else power_law_ids(rng, c, alpha, (num_samples, h))
                        for c, h, alpha in zip(self.cardinalities, self.hotness, self.alphas)]
        probabilities = 1.0 / (1.0 + np.exp(-self.logits(numerical, categoricals)))
        labels = rng.random(num_samples, dtype=np.float32) < probabilities
        return numerical, labels, categoricals, probabilities


def write_teacher_samples(writer: SampleWriter, teacher: SyntheticTeacher, rng: np.random.Generator,
                          chunks: Mapping[str, Iterable[int]]) -> float:
    """Append teacher-labelled samples to `writer`, one `append` per entry of `chunks[mapping]` (its
    sample count), drawn one chunk at a time; return the teacher's AUC on the test samples (NaN
    when they hold a single class)."""
    test_labels, test_probabilities = [], []
    for mapping, sizes in chunks.items():
        for size in sizes:
            numerical, labels, ids, probabilities = teacher.sample(size, rng)
            writer.append(mapping, numerical, labels, ids)
            if mapping == TEST_MAPPING:
                test_labels.append(labels)
                test_probabilities.append(probabilities.astype(np.float32))
    labels = np.concatenate(test_labels) if test_labels else np.zeros(0, bool)
    if not 0 < labels.sum() < labels.size:
        return float("nan")
    return exact_auc(labels, np.concatenate(test_probabilities))


def write_synthetic_dataset(spec: FeatureSpec, num_train_samples: int, num_test_samples: int,
                            seed: int, overwrite: bool = False, chunk_samples: int = 1 << 20,
                            output_name: str = "output folder") -> float:
    """Write teacher-labelled split-binary data for `spec` (all or nothing, see SplitBinaryWriter);
    store and return the test teacher AUC."""
    with SplitBinaryWriter(spec, overwrite=overwrite, output_name=output_name) as writer:
        teacher = SyntheticTeacher.for_spec(spec, seed)
        chunks = {mapping: [min(chunk_samples, total - start) for start in range(0, total, chunk_samples)]
                  for mapping, total in ((TRAIN_MAPPING, num_train_samples), (TEST_MAPPING, num_test_samples))}
        teacher_auc = write_teacher_samples(writer, teacher, np.random.default_rng(seed), chunks)
        spec.metadata = dict(spec.metadata, teacher_auc=teacher_auc)
        writer.commit()
    return teacher_auc


@dataclass(frozen=True)
class SyntheticDatasetShape:
    """What `prepare_synthetic_dataset.py`'s flags say of the dataset to write: its samples (rounded
    down to whole batches) and its features, from a spec, a Criteo variant or numbers and sizes."""
    num_entries: int
    num_test_entries: Optional[int]
    batch_size: int
    feature_spec_path: Optional[str] = None
    variant: Optional[str] = None
    num_numerical: int = CRITEO_NUMERICAL_FEATURES
    table_sizes: Sequence[str] = ()


def prepare_synthetic_dataset(output_dir: str, shape: SyntheticDatasetShape, seed: int, overwrite: bool = False
                              ) -> Tuple[FeatureSpec, int, int, float]:
    """Write the teacher-labelled split-binary dataset `shape` describes to `output_dir`; return its
    spec, train and test samples and the teacher's test AUC. Everything main.py needs is checked
    before any sample is drawn (a numerical and a categorical feature, a whole batch of train and of
    test samples, int32-sized tables); errors name prepare_synthetic_dataset.py's flags."""
    if shape.feature_spec_path and shape.variant:
        raise ValueError("--feature_spec and --variant are mutually exclusive")
    num_train, num_test = sample_counts(shape.num_entries, shape.num_test_entries, shape.batch_size)
    refuse_overlap(output_dir, OUTPUT_FLAG, {"--feature_spec": shape.feature_spec_path})
    spec = output_spec(output_dir, shape.feature_spec_path, shape.variant, shape.num_numerical,
                       list(shape.table_sizes))
    teacher_auc = write_synthetic_dataset(spec, num_train, num_test, seed=seed, overwrite=overwrite,
                                          output_name=OUTPUT_FLAG)
    return spec, num_train, num_test, teacher_auc


def parse_cardinalities(values: List[str]) -> List[int]:
    """Cardinalities from --synthetic_dataset_table_sizes: at least one, each in [1, MAX_CARDINALITY]."""
    try:
        cardinalities = [int(v) for v in values]
    except ValueError:
        raise ValueError(f"--synthetic_dataset_table_sizes must be integers, got {values}") from None
    if not cardinalities:
        raise ValueError("--synthetic_dataset_table_sizes is empty; main.py needs at least one "
                         "categorical feature")
    bad = [c for c in cardinalities if not 1 <= c <= MAX_CARDINALITY]
    if bad:
        raise ValueError(f"--synthetic_dataset_table_sizes must lie in [1, {MAX_CARDINALITY}] (ids are "
                         f"int32), got {bad[0]}")
    return cardinalities


def sample_counts(num_entries: int, num_test_entries: Optional[int], batch_size: int) -> Tuple[int, int]:
    """Train and test samples, rounded down to whole batches; at least one batch of each."""
    if batch_size < 1:
        raise ValueError(f"--synthetic_dataset_batch_size must be at least 1, got {batch_size}")
    counts = []
    for flag, entries in (("--synthetic_dataset_num_entries", num_entries),
                          ("--synthetic_dataset_num_test_entries",
                           num_entries if num_test_entries is None else num_test_entries)):
        if entries < batch_size:
            raise ValueError(f"{flag} is {entries}, less than one batch of "
                             f"--synthetic_dataset_batch_size {batch_size}: samples are written in "
                             f"whole batches and training needs train and test samples")
        counts.append(entries // batch_size * batch_size)
    return counts[0], counts[1]


def output_spec(output_dir: str, feature_spec_path: Optional[str], variant: Optional[str],
                num_numerical: int, table_sizes: List[str]) -> FeatureSpec:
    """The spec to write: a given one re-rooted at `output_dir` (one without files, as V5's
    generate_feature_spec writes, gets the default file layout), or a default Criteo-style one.

    Refuses dimensions main.py cannot train: no numerical or no categorical feature.
    """
    if feature_spec_path:
        spec = FeatureSpec.from_yaml(feature_spec_path)
        spec.check_feature_spec(chunk_type=None if spec.source_spec is None else SPLIT_BINARY)
        for channel, names in (("numerical", spec.numerical_names),
                               ("categorical", spec.categorical_names)):
            if not names:
                raise FeatureSpecError(f"--feature_spec {feature_spec_path} has no {channel} features; "
                                       f"main.py needs at least one")
        if spec.source_spec is None:  # a spec without files (V5): the default layout of its dimensions
            return FeatureSpec.get_default_feature_spec(len(spec.numerical_names), spec.cardinalities,
                                                        output_dir).take_multi_hot_properties(spec)
        spec.base_directory, spec.path = os.path.abspath(output_dir), None
        return spec
    if variant:
        return FeatureSpec.get_default_feature_spec(CRITEO_NUMERICAL_FEATURES,
                                                    CRITEO_VARIANTS[variant], output_dir)
    if num_numerical < 1:
        raise ValueError(f"--num_numerical_features must be at least 1 (main.py's bottom MLP needs a "
                         f"numerical feature), got {num_numerical}")
    return FeatureSpec.get_default_feature_spec(num_numerical, parse_cardinalities(table_sizes),
                                                output_dir)


@dataclass
class SyntheticSplit:
    """An in-memory pool of global batches, cycled to the requested number of batches."""
    numerical: np.ndarray          # [pool_batches, b, n_num] float16
    labels: np.ndarray             # [pool_batches, b] bool
    categoricals: List[np.ndarray]  # each [pool_batches, b] int32, [pool_batches, b, h] if multi-hot
    num_batches: int
    teacher_auc: Optional[float]


MAX_SYNTHETIC_POOL_BYTES = 64 << 20  # per split; beyond it the distinct batches cycle


def make_synthetic_split(teacher: SyntheticTeacher, global_batch_size: int, num_batches: int,
                         rng: np.random.Generator,
                         max_pool_bytes: int = MAX_SYNTHETIC_POOL_BYTES) -> SyntheticSplit:
    """Draw as many distinct batches as fit in `max_pool_bytes` (cycled beyond that)."""
    sample_bytes = 2 * teacher.num_numerical + 1 + 4 * sum(teacher.hotness)
    affordable = max(1, max_pool_bytes // (sample_bytes * global_batch_size))
    pool_batches = max(1, min(num_batches, affordable))
    numerical, labels, ids, probabilities = teacher.sample(pool_batches * global_batch_size, rng)
    shape = (pool_batches, global_batch_size)
    uses = np.bincount(np.arange(num_batches) % pool_batches, minlength=pool_batches)
    weights = np.repeat(uses, global_batch_size)
    auc = exact_auc(labels, probabilities, weights) if 0 < labels.sum() < labels.size else None
    return SyntheticSplit(numerical=numerical.reshape(shape + (teacher.num_numerical,)),
                          labels=labels.reshape(shape),
                          categoricals=[i.astype(np.int32).reshape(shape + i.shape[1:]) for i in ids],
                          num_batches=num_batches, teacher_auc=auc)


def synthetic_dataset(split: SyntheticSplit, reads: TableReads, rank: int, world_size: int,
                      numerical_dtype: tf.DType) -> tf.data.Dataset:
    """The split as (features, labels) batches for one rank, same layout as SplitBinaryReader
    (ids [rows] one-hot, [rows, h] multi-hot)."""
    global_batch = split.labels.shape[1]
    lo, hi = local_slice(global_batch, rank, world_size)
    cat_lo, cat_hi = reads.rows(global_batch, rank, world_size)
    pool = {
        NUMERICAL_KEY: tf.cast(split.numerical[:, lo:hi], numerical_dtype),
        CATEGORICAL_KEY: tuple(tf.constant(split.categoricals[i][:, cat_lo:cat_hi]) for i in reads.tables),
    }
    labels = tf.constant(split.labels[:, lo:hi, None].astype(np.float32))
    return (tf.data.Dataset.from_tensor_slices((pool, labels)).repeat()
            .take(split.num_batches).prefetch(PREFETCH_BATCHES))


def load_spec(dataset_path: Optional[str], spec_file_name: str, options: Mapping[str, Any]) -> FeatureSpec:
    """The spec in `dataset_path` with `options["use_feature_spec"]` (its data files are not read),
    else the default spec of num_numerical_features, cardinalities and hotness (one per table)."""
    if options.get("use_feature_spec"):
        if not dataset_path:
            raise ValueError(f"dataset_path is required for dataset_type {SYNTHETIC!r} from a feature spec")
        return load_folder_spec(SYNTHETIC, dataset_path, spec_file_name, None, options, spec_inside=False)
    cardinalities = list(options.get("cardinalities", DEFAULT_CARDINALITIES))
    hotness = options.get("hotness")
    if hotness is not None and len(hotness) != len(cardinalities):
        raise ValueError(f"--synthetic_dataset_hotness gives {len(hotness)} values, but "
                         f"--synthetic_dataset_cardinalities {len(cardinalities)} tables; give one per table")
    return FeatureSpec.get_default_feature_spec(options.get("num_numerical_features", DEFAULT_NUM_NUMERICAL),
                                                cardinalities, hotness=hotness)


def synthetic_pipelines(spec: FeatureSpec, config: PipelineConfig, reads: TableReads) -> InputPipelines:
    """In-memory teacher-labelled data; every rank draws the same global batches from the seed."""
    if config.synthetic_train_batches < 1 or config.synthetic_eval_batches < 1:
        raise ValueError(f"synthetic data needs at least one train and one eval batch, got "
                         f"{config.synthetic_train_batches} and {config.synthetic_eval_batches}")
    teacher = SyntheticTeacher.for_spec(spec, config.seed)
    rng = np.random.default_rng(config.seed)
    splits = [make_synthetic_split(teacher, batch, count, rng)
              for batch, count in ((config.train_batch_size, config.synthetic_train_batches),
                                   (config.eval_batch_size, config.synthetic_eval_batches))]
    train, test = (synthetic_dataset(split, reads, config.rank, config.world_size, config.compute_dtype)
                   for split in splits)
    return InputPipelines(train=train, test=test, feature_spec=spec,
                          train_steps=config.synthetic_train_batches, eval_steps=config.synthetic_eval_batches,
                          teacher_auc=splits[1].teacher_auc)


def generate(writer: SampleWriter, spec: FeatureSpec, limits: Mapping[str, int], batch_size: int,
             seed: int) -> Tuple[Dict[str, int], Dict[str, Any]]:
    """Append teacher-labelled batches of `batch_size` to `writer`, `limits[mapping]` of them (-1:
    DEFAULT_TRAIN_BATCHES / DEFAULT_EVAL_BATCHES); return the batches written per mapping and the
    metadata a destination keeps (the teacher's AUC)."""
    defaults = {TRAIN_MAPPING: DEFAULT_TRAIN_BATCHES, TEST_MAPPING: DEFAULT_EVAL_BATCHES}
    written = {mapping: defaults[mapping] if limit < 0 else limit for mapping, limit in limits.items()}
    chunks = {mapping: itertools.repeat(batch_size, count) for mapping, count in written.items()}
    auc = write_teacher_samples(writer, SyntheticTeacher.for_spec(spec, seed), np.random.default_rng(seed), chunks)
    return written, {"teacher_auc": auc}


register_format("synthetic", training=True, source=True, load_spec=load_spec, pipelines=synthetic_pipelines,
                generate=generate)

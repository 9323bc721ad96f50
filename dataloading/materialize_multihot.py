"""Make the MLPerf DLRM-DCNv2 multi-hot dataset from a one-hot split-binary Criteo dataset.

MLPerf Training's DLRM-DCNv2 benchmark trains on the Criteo 1TB click logs with each of the 26
categorical features made multi-hot: feature i holds h_i ids per sample, the sizes being
3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1 (`MLPERF_HOTNESS`), and every table is
capped at 40M rows (`MLPERF_ROW_CAP`). This script does the same to a one-hot split-binary
dataset (e.g. the output of preproc/ with frequency threshold 0):

  * a feature's id x becomes x mod cap, and its cardinality min(cardinality, cap);
  * the capped id x is expanded to h ids: the first is x itself, the other h - 1 are drawn
    uniformly over the capped table by a fixed function of (seed, feature, x, k), k = 1..h-1, so
    every sample holding x gets the same h ids, as in MLPerf.

MLPerf draws those extra ids once into a stored random table per capped row (40M x up to 100 ids
for the largest features, tens of GB). Here they are a stateless hash (splitmix64 of seed,
feature, x and k, `synthetic_data.hashed_units`) mapped uniformly onto the table, so no such table
is ever built or held in memory and any machine reproduces the same dataset from the seed; the ids
differ from MLPerf's (another random source) but have the same distribution and determinism.

The output is a split-binary dataset whose feature spec gives each feature its `hotness`; a
feature of hotness h stores [samples, h] ids row-major (read as [batch, h] tensors). Numericals
and labels are copied. The source is read in chunks of --chunk_samples (bounded memory, every value
checked as it is read) and the output grows in a hidden sibling folder renamed into place when
complete, so a failure leaves nothing behind; an existing output is refused unless --overwrite.

  python -m dataloading.materialize_multihot --src_dataset_path /data/criteo_t0 \\
      --dst_dataset_path /data/criteo_mlperf_multihot

`--standin` writes a small stand-in for tests instead: a teacher-labelled one-hot synthetic dataset
of `STANDIN_CARDINALITIES` (26 small tables) materialised the same way.
"""
from __future__ import annotations

import os
import tempfile
from typing import List, Optional, Sequence

import numpy as np

from dataloading import ArgumentParser, run_or_fail
from recsys.data.split_binary import SplitBinaryReader, SplitBinaryWriter
from recsys.data.feature_spec import (CRITEO_NUMERICAL_FEATURES, DEFAULT_SPEC_NAME, MAPPINGS, MLPERF_HOTNESS, MLPERF_ROW_CAP,
                          FeatureSpec)
from recsys.runtime.safe_io import refuse_overlap
from recsys.data.synthetic_data import hashed_units, write_synthetic_dataset

DEFAULT_CHUNK_SAMPLES = 1 << 16
# Small tables for the stand-in, with a few ids repeated often (like Criteo's small features).
STANDIN_CARDINALITIES = (1000, 500, 300, 200, 50, 4, 100, 40, 10, 800, 600, 700, 5, 90, 400, 60,
                         3, 30, 8, 900, 950, 990, 120, 70, 20, 6)
DST_FLAG = "--dst_dataset_path"


def expand_ids(ids: np.ndarray, hotness: int, cardinality: int, seed: int, feature: int) -> np.ndarray:
    """One-hot ids [n] (already capped, in [0, cardinality)) as [n, hotness]: the id, then
    hotness - 1 ids uniform over [0, cardinality), a pure function of (seed, feature, id, k)."""
    ids = np.asarray(ids, dtype=np.int64)
    key = (int(seed) * 1_000_003 + int(feature)) & 0xFFFF_FFFF_FFFF_FFFF
    extra = np.floor(hashed_units(ids, key, hotness - 1) * cardinality).astype(np.int64)
    return np.concatenate([ids[:, None], np.minimum(extra, cardinality - 1)], axis=1)


def multihot_spec(source: FeatureSpec, destination: str, hotness: Sequence[int], row_cap: int) -> FeatureSpec:
    """The output's spec: the default layout of the source's dimensions, tables capped at
    `row_cap` rows, each feature's `hotness`, the source's pooling/alpha and metadata kept."""
    where = source.path or source.base_directory
    if len(hotness) != len(source.categorical_names):
        raise ValueError(f"--multihot_hotness gives {len(hotness)} sizes, but {where} has "
                         f"{len(source.categorical_names)} categorical features; give one per feature")
    if min(hotness, default=1) < 1 or row_cap < 1:
        raise ValueError(f"--multihot_hotness needs positive sizes and --row_cap a positive row count, got "
                         f"{list(hotness)} and {row_cap}")
    for name, ids_per_sample in zip(source.categorical_names, source.hotness):
        if ids_per_sample != 1:
            raise ValueError(f"{where}: categorical feature '{name}' has hotness {ids_per_sample}; the source "
                             f"must be one-hot (this script makes the multi-hot ids)")
    spec = FeatureSpec.get_default_feature_spec(
        len(source.numerical_names), [min(card, row_cap) for card in source.cardinalities],
        os.path.abspath(destination)).take_multi_hot_properties(source)
    for name, ids_per_sample in zip(spec.categorical_names, hotness):
        spec.feature_spec[name]["hotness"] = int(ids_per_sample)
    spec.metadata = dict(source.metadata, multihot={"hotness": [int(h) for h in hotness], "row_cap": row_cap})
    return spec


def materialize(src_path: str, dst_path: str, *, hotness: Sequence[int] = MLPERF_HOTNESS,
                row_cap: int = MLPERF_ROW_CAP, seed: int = 0, chunk_samples: int = DEFAULT_CHUNK_SAMPLES,
                overwrite: bool = False, src_feature_spec: str = DEFAULT_SPEC_NAME) -> FeatureSpec:
    """Write the multi-hot dataset of the one-hot split-binary dataset in `src_path` to `dst_path`
    (all or nothing); return its spec. Bad input raises ValueError (FeatureSpecError, DataError,
    OutputPathError) or OSError before anything is written."""
    if chunk_samples < 1:
        raise ValueError(f"--chunk_samples must be positive, got {chunk_samples}")
    source = FeatureSpec.from_yaml(os.path.join(src_path, src_feature_spec))
    source.check_feature_spec()
    refuse_overlap(dst_path, DST_FLAG, {"--src_dataset_path": src_path})
    spec = multihot_spec(source, dst_path, hotness, row_cap)
    counts = source.check_files()
    with SplitBinaryWriter(spec, overwrite, output_name=DST_FLAG) as writer:
        for mapping in MAPPINGS:
            reader = SplitBinaryReader(source, mapping, chunk_samples, drop_remainder=False,
                                       num_samples=counts[mapping])
            for index in range(len(reader)):
                numerical, labels, ids = reader.read_samples(index)
                expanded = [expand_ids(np.asarray(x, np.int64) % cap, h, cap, seed, feature)
                            if h > 1 else np.asarray(x, np.int64) % cap
                            for feature, (x, h, cap) in enumerate(zip(ids, spec.hotness, spec.cardinalities))]
                writer.append(mapping, numerical, labels, expanded)
        spec.path = writer.commit()
    return spec


def write_standin(dst_path: str, num_train: int, num_test: int, *, seed: int = 0,
                  hotness: Sequence[int] = MLPERF_HOTNESS,
                  cardinalities: Sequence[int] = STANDIN_CARDINALITIES, overwrite: bool = False) -> FeatureSpec:
    """A small MLPerf-shaped multi-hot dataset for tests: teacher-labelled one-hot synthetic data
    of `cardinalities` (written to a temporary folder), materialised like Criteo's."""
    SplitBinaryWriter.check_destination(FeatureSpec.get_default_feature_spec(
        CRITEO_NUMERICAL_FEATURES, cardinalities, os.path.abspath(dst_path)), overwrite, output_name=DST_FLAG)
    with tempfile.TemporaryDirectory(prefix="dlrm_standin_") as scratch:
        one_hot = os.path.join(scratch, "one_hot")
        write_synthetic_dataset(FeatureSpec.get_default_feature_spec(CRITEO_NUMERICAL_FEATURES, cardinalities, one_hot),
                                num_train, num_test, seed)
        return materialize(one_hot, dst_path, hotness=hotness, seed=seed, overwrite=overwrite)


def _integers(text: str) -> List[int]:
    """A comma-separated list of integers (argparse reports the ValueError as a usage error)."""
    return [int(value) for value in text.split(",")]


def main(argv: Optional[List[str]] = None) -> None:
    parser = ArgumentParser(prog="python -m dataloading.materialize_multihot", description=__doc__.split("\n")[0])
    parser.add_argument("--src_dataset_path", help="the one-hot split-binary dataset (not with --standin)")
    parser.add_argument("--src_feature_spec", default=DEFAULT_SPEC_NAME, help="spec file name inside the source")
    parser.add_argument("--dst_dataset_path", required=True, help="the folder to write")
    parser.add_argument("--multihot_hotness", type=_integers, default=list(MLPERF_HOTNESS),
                        help="ids per sample of each categorical feature, comma separated (default: MLPerf's)")
    parser.add_argument("--row_cap", type=int, default=MLPERF_ROW_CAP,
                        help="the most rows of a table: ids are taken modulo it (default: MLPerf's 40M)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the id expansion (and of the stand-in)")
    parser.add_argument("--chunk_samples", type=int, default=DEFAULT_CHUNK_SAMPLES,
                        help="samples read, expanded and written at a time (bounds the memory)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous output in --dst_dataset_path (never anything else)")
    parser.add_argument("--standin", action="store_true",
                        help="write a small synthetic stand-in (26 small tables) instead of reading a source")
    parser.add_argument("--standin_samples", type=_integers, default=[4096, 1024],
                        help="the stand-in's train,test sample counts")
    args = parser.parse_args(argv)
    if args.standin == bool(args.src_dataset_path):
        parser.error("give --src_dataset_path, or --standin for the synthetic stand-in (one of them)")
    if args.standin:
        if len(args.standin_samples) != 2:
            parser.error(f"--standin_samples needs two counts, train,test; got {args.standin_samples}")
        spec = run_or_fail(lambda: write_standin(args.dst_dataset_path, *args.standin_samples, seed=args.seed,
                                                 hotness=args.multihot_hotness, overwrite=args.overwrite))
    else:
        spec = run_or_fail(lambda: materialize(
            args.src_dataset_path, args.dst_dataset_path, hotness=args.multihot_hotness, row_cap=args.row_cap,
            seed=args.seed, chunk_samples=args.chunk_samples, overwrite=args.overwrite,
            src_feature_spec=args.src_feature_spec))
    print(f"wrote the multi-hot dataset (hotness {','.join(map(str, spec.hotness))}; cardinalities "
          f"{','.join(map(str, spec.cardinalities))}) to {args.dst_dataset_path}")


if __name__ == "__main__":
    main()

"""Copy a dataset from one format to another, batch by batch (reference §13.2, `transcribe`).

Sources: `tf_raw` (split-binary), `split_tfrecords`, `hugectr_raw` and `sok_split` (HugeCTR's raw
files and the SOK DLRM benchmark's split layout, see `hugectr_data`; --hugectr_cardinalities and
--[no-]hugectr_dense_log describe a HugeCTR raw folder without metadata.json), `torchrec_npy` and
`binary_multihot` (TorchRec's day_<i>_*.npy files, and MLPerf DLRM-DCNv2's multi-hot
day_<i>_sparse_multi_hot.npz ids, which binary_multihot insists on, see `torchrec_data`: days 0 to
N-2 become train, the first half of the last day test; --num_embeddings_per_feature gives the table
sizes, ids taken modulo them, unless the folder's spec gives them), `nvt` and `tfrecords_multihot`
(NVTabular's parquet files and TFRecords of one tf.train.Example per sample under train/ and test/,
columns named by the spec in --src_dataset_path, see `column_data`), `csv` (headerless CSV files
named by the spec, `cardinality: auto` inferred by a first pass over the data, see `csv_data`; what
the reference's `transcode.py` converts), and `synthetic`:
teacher-labelled samples (`synthetic_data.SyntheticTeacher`) shaped by the spec in
--src_dataset_path, e.g. one from `dataloading.generate_feature_spec`. Destinations:
`split_tfrecords` (the default; records of --dst_prebatch_size samples, which must equal
--src_batch_size), `tf_raw` (the default Criteo file layout of the source's cardinalities) and
`hugectr_raw` (train_data.bin, test_data.bin and metadata.json; label and the transformed dense
values as float32) and `sok_split` (train/ and test/ with label.bin, dense.bin, category.bin and
metadata.json, the same values; `split_raw_file` is SOK's split_bin.py for one raw file). Batches of --src_batch_size are copied; --max_batches_train/--max_batches_test
cap them (-1: all; synthetic: 64008 and 1350 batches). Without a cap, a file destination (tf_raw,
hugectr_raw) also receives the last partial batch, so every sample arrives; split_tfrecords
records hold whole batches only.

Multi-hot features (FeatureSpec `hotness` > 1) carry over between tf_raw, split_tfrecords and
synthetic data: a split-binary feature's [samples, h] ids become split-TFRecords ragged rows of
length h; a ragged feature becomes split-binary [samples, h] only when every sample holds exactly
h ids (nothing is padded: a shorter or empty row stops the copy with a DataError naming the
feature). The destination spec keeps each feature's hotness, alpha and pooling. hugectr_raw and
sok_split hold one id per feature and refuse a multi-hot source.

The source is read one batch at a time, every value checked, and the destination is written in a
hidden sibling folder renamed into place when complete. The destination must not overlap the
source; if it holds anything it is refused unless --overwrite, and even then unless it holds only
what a transcribed dataset holds.

Example (HugeCTR raw to split-binary and back):
  python -m dataloading.transcribe --src_dataset_type hugectr_raw --src_dataset_path /data/raw \\
      --hugectr_cardinalities 203931,18598,... --dst_dataset_type tf_raw --dst_dataset_path /data/binary
  python -m dataloading.transcribe --src_dataset_path /data/binary --dst_dataset_type hugectr_raw \\
      --dst_dataset_path /data/raw_again

Example (the V5 quick start, from the repository root):
  python -m dataloading.generate_feature_spec --variant criteo_t15_synthetic --dst feature_spec.yaml
  python -m dataloading.transcribe --src_dataset_type synthetic --src_dataset_path . \\
      --dst_dataset_path /data/preprocessed --max_batches_train 1000 --max_batches_test 100 \\
      --dst_dataset_type tf_raw
"""
from __future__ import annotations

import argparse
import copy
import itertools
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from recsys.data import data_formats
from recsys.data import hugectr_data
from recsys.data.batch import Samples
from recsys.data.data_errors import DataError
from dataloading import ArgumentParser, run_or_fail
from recsys.data.feature_spec import (CARDINALITY_SELECTOR, DEFAULT_SPEC_NAME, FEATURES_SELECTOR, FILES_SELECTOR,
                          TEST_MAPPING, TRAIN_MAPPING, FeatureSpec)
from recsys.runtime.safe_io import refuse_overlap


@dataclass(frozen=True)
class FlagNames:
    """The flags that transcribe's errors name: this command's, or those of a command built on it
    (the reference's `transcode.py`: --input, --feature_spec_in, --output, --chunk_size)."""
    src_path: str = "--src_dataset_path"
    src_spec: str = "--src_feature_spec"
    dst_path: str = "--dst_dataset_path"
    batch_size: str = "--src_batch_size"
    external_paths: Optional[str] = None  # the flag that lets a spec name files outside its folder


def source_types() -> Tuple[str, ...]:
    """The formats transcribe reads (`--src_dataset_type`), from the registry."""
    return data_formats.names("source")


def destination_types() -> Tuple[str, ...]:
    """The formats transcribe writes (`--dst_dataset_type`), from the registry."""
    return data_formats.names("destination")


def _source_batches(source: data_formats.DataFormat, spec: FeatureSpec, mapping: str, batch_size: int,
                    max_batches: int, keep_remainder: bool) -> Iterator[Samples]:
    """Up to `max_batches` (-1: all) whole batches of a file source, read and checked one at a time;
    with `keep_remainder`, every batch and then the last partial one."""
    limit = None if max_batches < 0 else max_batches
    if source.batches is not None:
        return itertools.islice(source.batches(spec, mapping, batch_size, keep_remainder), limit)
    reader = source.reader(spec, mapping, batch_size, drop_remainder=not keep_remainder)
    if max_batches and not len(reader):
        raise DataError(f"{spec.path or spec.base_directory}: mapping '{mapping}' holds no whole batch of "
                        f"--src_batch_size {batch_size} samples")
    return itertools.islice(reader.batches(), limit)


def transcribe(src_type: str, src_path: str, dst_path: str, dst_type: str = "split_tfrecords", *,
               src_feature_spec: str = DEFAULT_SPEC_NAME, dst_feature_spec: str = DEFAULT_SPEC_NAME,
               src_batch_size: int = 65536, dst_prebatch_size: int = 65536, max_batches_train: int = -1,
               max_batches_test: int = -1, train_only: bool = False, overwrite: bool = False,
               seed: int = 12345, names: FlagNames = FlagNames(), **options: Any) -> Dict[str, int]:
    """Write the dataset of `src_path` (or synthetic data shaped by its spec) to `dst_path` as
    `dst_type`; return the batches written per mapping. `options`: allow_external_paths (the spec
    may name files outside its folder), and those the source format owns (hugectr_cardinalities,
    hugectr_dense_log, num_embeddings_per_feature; see `data_formats`); `names`: the flags errors name.
    Everything is checked before any data is read (a source that must `scan` its data first is
    scanned once the destination is checked); bad input raises ValueError (FeatureSpecError,
    DataError, OutputPathError) or OSError."""
    source = data_formats.get(src_type, "source")
    destination = data_formats.get(dst_type, "destination")
    for flag, value, least in ((names.batch_size, src_batch_size, 1), ("--dst_prebatch_size", dst_prebatch_size, 1),
                               ("--max_batches_train", max_batches_train, -1),
                               ("--max_batches_test", max_batches_test, -1)):
        if value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")
    if destination.prebatched and dst_prebatch_size != src_batch_size:
        raise ValueError(f"--dst_prebatch_size {dst_prebatch_size} must equal --src_batch_size "
                         f"{src_batch_size}: every source batch becomes one record")
    data_formats.check_options(src_type, options)
    # A spec file is read as it is, wherever it lies; its data files stay inside its folder
    # unless options allow_external_paths (the flag names.external_paths, if the command has one).
    spec = source.load_spec(src_path, src_feature_spec,
                            dict(options, use_feature_spec=True, external_paths_flag=names.external_paths))
    inputs = {names.src_path: src_path} if source.generate is None else {}
    inputs[names.src_spec] = spec.path
    if source.generate is None:
        inputs.update(_data_files(spec))
    refuse_overlap(dst_path, names.dst_path, inputs)
    if source.scan is not None:
        _check_destination(destination, spec, dst_path, dst_prebatch_size, overwrite, dst_feature_spec,
                           names.dst_path)
        spec = source.scan(spec, src_batch_size)
    limits = {TRAIN_MAPPING: max_batches_train, TEST_MAPPING: 0 if train_only else max_batches_test}
    if source.generate is None:
        sources = {mapping: _source_batches(source, spec, mapping, src_batch_size, limit,
                                            keep_remainder=limit < 0 and not destination.prebatched)
                   for mapping, limit in limits.items()}
    with destination.writer(spec, dst_path, dst_prebatch_size, overwrite, dst_feature_spec, names.dst_path) as writer:
        if source.generate is not None:
            written, metadata = source.generate(writer, spec, limits, src_batch_size, seed)
            if getattr(writer, "spec", None) is not None:  # HugeCTR raw and SOK have no place for it
                writer.spec.metadata = dict(writer.spec.metadata, **metadata)
        else:
            written = {mapping: 0 for mapping in limits}
            for mapping, batches in sources.items():
                for numerical, labels, ids in batches:
                    writer.append(mapping, numerical, labels, ids)
                    written[mapping] += 1
        writer.commit()
    return written


def _data_files(spec: FeatureSpec) -> Dict[str, str]:
    """The data files a source's spec names (they may lie outside its folder), by a name for errors."""
    return {f"the data file of mapping '{mapping}', features {chunk[FEATURES_SELECTOR]},": spec.resolve(chunk[FILES_SELECTOR][0])
            for mapping, chunks in (spec.source_spec or {}).items() for chunk in chunks}


def _check_destination(destination: data_formats.DataFormat, spec: FeatureSpec, dst_path: str, prebatch_size: int,
                       overwrite: bool, spec_file_name: str, dst_flag: str) -> None:
    """Refuse a bad destination before a source's scan reads all its data: a writer of the spec's
    file layout is opened and dropped, leaving nothing (every cardinality 1 meanwhile: the layout
    does not depend on them, and the scan has not found them yet)."""
    layout = copy.deepcopy(spec)
    for name in layout.categorical_names:
        layout.feature_spec[name][CARDINALITY_SELECTOR] = 1
    with destination.writer(layout, dst_path, prebatch_size, overwrite, spec_file_name, dst_flag):
        pass


def split_raw_file(input_path: str, output: str, cardinalities: Optional[List[int]] = None,
                   dense_log: Optional[bool] = None, batch_size: int = 65536, overwrite: bool = False) -> int:
    """SOK's `split_bin.py`: one HugeCTR raw file (`train_data.bin` or `test_data.bin`, which names
    the mapping) to one SOK split folder `output` (label.bin, dense.bin, category.bin, metadata.json),
    read and checked batch by batch as `transcribe` reads a hugectr_raw source; returns the samples."""
    mapping = {name: mapping for mapping, name in hugectr_data.RAW_FILES.items()}.get(os.path.basename(input_path))
    if mapping is None:
        raise ValueError(f"{input_path}: split_bin reads a HugeCTR raw file named "
                         f"{' or '.join(hugectr_data.RAW_FILES.values())} (link another name to one of them)")
    if batch_size < 1:
        raise ValueError(f"--batch_size must be at least 1, got {batch_size}")
    spec = hugectr_data.load_spec(hugectr_data.HUGECTR_RAW, os.path.dirname(os.path.abspath(input_path)),
                                  cardinalities, dense_log)
    refuse_overlap(output, "OUTPUT", {"INPUT": input_path})
    samples = 0
    with hugectr_data.SokSplitWriter(output, spec.cardinalities, overwrite, "OUTPUT", folders={mapping: ""}) as writer:
        raw = data_formats.get(hugectr_data.HUGECTR_RAW, "source")
        for numerical, labels, ids in _source_batches(raw, spec, mapping, batch_size, -1, keep_remainder=True):
            writer.append(mapping, numerical, labels, ids)
            samples += len(labels)
        writer.commit()
    return samples


def _integers(text: str) -> List[int]:
    """A comma-separated list of integers (argparse reports the ValueError as a usage error)."""
    return [int(value) for value in text.split(",")]


def main(argv: Optional[List[str]] = None) -> None:
    parser = ArgumentParser(prog="python -m dataloading.transcribe", description=__doc__.split("\n")[0])
    parser.add_argument("--src_dataset_type", default="tf_raw", choices=source_types())
    parser.add_argument("--src_dataset_path", default="synthetic_dataset",
                        help="the source folder (synthetic: the folder of the spec)")
    parser.add_argument("--src_feature_spec", default=DEFAULT_SPEC_NAME, help="spec file name inside the source")
    parser.add_argument("--src_batch_size", type=int, default=65536, help="samples per batch read")
    parser.add_argument("--src_synthetic_dataset_use_feature_spec", action="store_true",
                        help="(V5) accepted: synthetic data always takes its shape from the spec in "
                             "--src_dataset_path, as V5's does; the flag changes nothing")
    parser.add_argument("--dst_dataset_path", required=True, help="the folder to write")
    parser.add_argument("--dst_dataset_type", default="split_tfrecords", choices=destination_types())
    parser.add_argument("--dst_feature_spec", default=DEFAULT_SPEC_NAME, help="spec file name to write")
    parser.add_argument("--dst_prebatch_size", type=int, default=65536,
                        help="samples per split_tfrecords record (must equal --src_batch_size)")
    parser.add_argument("--max_batches_train", type=int, default=-1, help="train batches to copy (-1: all)")
    parser.add_argument("--max_batches_test", type=int, default=-1, help="test batches to copy (-1: all)")
    parser.add_argument("--train_only", action="store_true", help="copy no test batches (test stays empty)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous output in --dst_dataset_path (never anything else)")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the synthetic teacher and samples")
    parser.add_argument("--hugectr_cardinalities", type=_integers, default=None,
                        help="hugectr_raw source without metadata.json: the cardinalities (slot_size_array), "
                             "comma separated")
    parser.add_argument("--hugectr_dense_log", action=argparse.BooleanOptionalAction, default=None,
                        help="hugectr_raw source without metadata.json: whether the dense values still need the "
                             "log transform (default: yes)")
    parser.add_argument("--num_embeddings_per_feature", type=_integers, default=None,
                        help="torchrec_npy or binary_multihot source: TorchRec's table sizes, comma separated; ids are "
                             "taken modulo them (default: the cardinalities of --src_feature_spec in the folder)")
    args = parser.parse_args(argv)
    written = run_or_fail(lambda: transcribe(
        args.src_dataset_type, args.src_dataset_path, args.dst_dataset_path, args.dst_dataset_type,
        src_feature_spec=args.src_feature_spec, dst_feature_spec=args.dst_feature_spec,
        src_batch_size=args.src_batch_size, dst_prebatch_size=args.dst_prebatch_size,
        max_batches_train=args.max_batches_train, max_batches_test=args.max_batches_test,
        train_only=args.train_only, overwrite=args.overwrite, seed=args.seed,
        hugectr_cardinalities=args.hugectr_cardinalities, hugectr_dense_log=args.hugectr_dense_log,
        num_embeddings_per_feature=args.num_embeddings_per_feature))
    print(f"wrote {written[TRAIN_MAPPING]} train and {written[TEST_MAPPING]} test batches of "
          f"{args.src_batch_size} samples ({args.dst_dataset_type}) to {args.dst_dataset_path}")


if __name__ == "__main__":
    main()

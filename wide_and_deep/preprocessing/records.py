"""From the engines' integer columns to the training records: the floating-point steps of the
preprocessing (done once, here, in numpy, so both engines give the same bits) and the TFRecord
files of the Wide & Deep reader (`wide_and_deep/features.py`).

Feature semantics (reference §9; what a reader can check):
  * label = clicked (0/1); display_id as read.
  * categoricals: the raw integer modulo the feature's buckets (non-negative), missing -> 0.
    doc_event_id = the event's document; ad_id; doc_id = the ad's document; campaign_id;
    ad_advertiser; doc_{ad,event}_source_id / _publisher_id from documents_meta (rows without a
    source_id dropped; a source without publisher gets max(publisher_id) + its rank among such
    sources); event_platform = platform - 1; event_geo_location / event_country_state /
    event_country = the number of kept events with the same geo string / its first 5 / first 2
    characters, or -1 if under 10 (the reference's quirk: places with equal counts collide).
  * pop_* = clicks / views of the train split for the ad, the ad's document, its source, its
    publisher, the advertiser, the campaign; kept if views > 5 (ad, document) or > 10 (others),
    else 0. Eval rows get the train-split values.
  * doc_event_doc_ad_sim_{categories,topics,entities}: cosine of the page document's and the ad
    document's aspect weights, weight = confidence * ln(ln(N / df)) (N documents in the aspect file,
    df those with the aspect), each weight rounded to a multiple of 2**-24; 0 if either document
    has no aspect or one whose weight is undefined (df = N).
  * doc_views / ad_views = train-split rows of the ad's document / the ad (missing: not seen in
    train); doc_{event,ad}_days_since_published = whole days from the document's publish_time to
    the event, kept if 0..3650. Each of the four: log2(1 + x), then min-max scaled with the min and
    max over both splits' present values (0 when they are equal), missing -> 0.
  * every numeric is computed in float64 and stored as float32; NaN -> 0.

Each split's rows are cut into records of PREBATCH_SIZE rows (the last one shorter), the records
spread over min(N, records) files `part-r-00000...` in order, contiguous runs of records per file.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, Iterator, List, Tuple

import numpy as np
import pyarrow as pa

from wide_and_deep import features
from wide_and_deep.outbrain_rules import ASPECTS
from wide_and_deep.preprocessing.sql import COUNTS, CTRS
from wide_and_deep.preprocessing.tfrecord import write_record

METADATA_NAME = "metadata.json"
SUMMARY_NAME = "preproc_summary.json"
FORMAT = "wide_and_deep-tfrecords"
VERSION = 1
SPLITS = ("train", "eval")


def _log_scale(values: np.ndarray, bounds: Tuple[float, float]) -> np.ndarray:
    low, high = np.log2(1.0 + bounds[0]), np.log2(1.0 + bounds[1])
    scaled = np.log2(1.0 + values)
    return (scaled - low) / (high - low) if high > low else np.zeros_like(scaled)


def _nullable(table: pa.Table, name: str) -> np.ndarray:
    """An int64 column as float64, nulls as NaN."""
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def numeric_features(table: pa.Table, bounds: Dict[str, Tuple[float, float]]) -> Dict[str, np.ndarray]:
    """The 13 float32 numerics of a block of engine rows (see the module docstring); `bounds`:
    the raw (min, max) of each count/day column over both splits."""
    out: Dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for feature, _, _ in CTRS:
            out[feature] = _nullable(table, f"{feature}_clicks") / _nullable(table, f"{feature}_views")
        for kind, _ in ASPECTS:
            dot = _nullable(table, f"sim_{kind}_dot")
            norms = np.sqrt(_nullable(table, f"sim_{kind}_event_norm")) * np.sqrt(_nullable(table, f"sim_{kind}_ad_norm"))
            out[f"doc_event_doc_ad_sim_{kind}"] = dot / norms
        for feature, column in COUNTS:
            out[feature] = _log_scale(_nullable(table, column), bounds[column])
    return {name: np.nan_to_num(out[name], nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)
            for name in features.NUMERIC_FEATURES}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _packed_varints(values: np.ndarray) -> bytes:
    """Protobuf varints of non-negative int64 values, concatenated (vectorized)."""
    v = values.astype(np.uint64)
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = (v[:, None] >> shifts[None, :]) & np.uint64(0x7F)
    length = 1 + (v[:, None] >= (np.uint64(1) << shifts[1:])[None, :]).sum(axis=1)
    more = np.arange(10)[None, :] < (length - 1)[:, None]
    encoded = (groups | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
    return encoded[np.arange(10)[None, :] < length[:, None]].tobytes()


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_example(columns: Dict[str, np.ndarray]) -> bytes:
    """A serialized tf.train.Example holding one list per key (keys in sorted order; int64 lists as
    Int64List, float32 as FloatList, both packed): the same bytes for the same values."""
    entries = []
    for key in sorted(columns):
        values = columns[key]
        if values.dtype == np.float32:
            feature = _field(2, _field(1, values.astype("<f4").tobytes()))
        else:
            feature = _field(3, _field(1, _packed_varints(values)))
        entries.append(_field(1, _field(1, key.encode()) + _field(2, feature)))
    return _field(1, b"".join(entries))


def record_columns(table: pa.Table, bounds: Dict[str, Tuple[float, float]]) -> Dict[str, np.ndarray]:
    """All record keys of a block of engine rows, with their record dtypes."""
    columns = {name: table.column(name).to_numpy(zero_copy_only=False).astype(np.int64)
               for name in (features.LABEL_KEY, features.DISPLAY_ID_KEY) + features.CATEGORICAL_NAMES}
    columns.update(numeric_features(table, bounds))
    assert {k: str(v.dtype) for k, v in columns.items()} == features.record_keys()
    return columns


def _record_blocks(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.Table]:
    """Tables of `size` rows from a stream of batches, the last one shorter."""
    pending: List[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        pending.append(batch)
        rows += batch.num_rows
        while rows >= size:
            table = pa.Table.from_batches(pending)
            yield table.slice(0, size)
            rest = table.slice(size)
            pending, rows = rest.to_batches(), rest.num_rows
    if rows:
        yield pa.Table.from_batches(pending)


def file_of_record(num_records: int, num_files: int) -> List[int]:
    """The first record of each file (records spread in contiguous runs, sizes differing by <= 1)."""
    return [f * num_records // num_files for f in range(num_files)]


def write_split(folder: str, batches: Iterable[pa.RecordBatch], num_rows: int, num_files: int,
                bounds: Dict[str, Tuple[float, float]]) -> int:
    """Write one split's rows (in order) as records of PREBATCH_SIZE rows into
    min(num_files, records) files `part-r-NNNNN` of `folder`; returns the number of files."""
    size = features.PREBATCH_SIZE
    num_records = -(-num_rows // size)
    files = min(num_files, num_records)
    starts = set(file_of_record(num_records, files))
    os.makedirs(folder)
    writer = None
    written = 0
    opened: List[int] = []
    try:
        for index, block in enumerate(_record_blocks(batches, size)):
            if index in starts:
                if writer is not None:
                    writer.close()
                writer = open(os.path.join(folder, f"part-r-{len(opened):05d}"), "wb")
                opened.append(index)
            write_record(writer, encode_example(record_columns(block, bounds)))
            written += block.num_rows
    finally:
        if writer is not None:
            writer.close()
    if written != num_rows:
        raise RuntimeError(f"{folder}: wrote {written} rows, expected {num_rows}")
    return files


def write_json(path: str, content: Dict[str, object]) -> None:
    """A JSON file with sorted keys (the same bytes for the same content)."""
    with open(path, "w") as f:
        json.dump(content, f, indent=1, sort_keys=True)
        f.write("\n")


def metadata(train_rows: int, eval_rows: int) -> Dict[str, object]:
    """The dataset's metadata.json (the reader's row counts, the hash buckets its ids lie in)."""
    return {"train_rows": train_rows, "eval_rows": eval_rows, "prebatch_size": features.PREBATCH_SIZE,
            "buckets": dict(features.BUCKETS), "format": FORMAT, "version": VERSION}


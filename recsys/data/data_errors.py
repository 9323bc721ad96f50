"""Bad data: `DataError` and the one contract for stored values every reader applies.

A reader checks each batch where it reads it, at the cost of a few vectorised reductions: label
bytes are 0 or 1, numericals are finite, ids lie in [0, cardinality). The messages name the file,
feature, mapping, sample and value; the error constructors here are the only wording of them, so
the Python checks and the compiled `ReadFileRows` op's reports (`pipeline_errors`) read alike.
TensorFlow-free (numpy only), so the batch contract (`batch.RaggedIds`) can raise them too.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


class DataError(ValueError):
    """The data (not the spec) is unusable: bad stored values, a batch larger than the data, ..."""



def label_error(path: str, feature: str, mapping: str, sample: int, byte: int) -> DataError:
    return DataError(f"{path}: label '{feature}' (mapping '{mapping}') has byte {byte} at "
                     f"sample {sample}; a label must be stored as 0 or 1")


def numerical_error(path: str, feature: str, mapping: str, sample: int, value: np.floating) -> DataError:
    return DataError(f"{path}: numerical feature '{feature}' (mapping '{mapping}') is "
                     f"{value} at sample {sample}; numerical features must be finite")


def id_error(path: str, feature: str, mapping: str, sample: int, value: int, cardinality: int,
             position: int = 0, ids_in_sample: Optional[int] = None) -> DataError:
    """An id outside its table; for a multi-hot sample (`ids_in_sample` given), which of its ids
    (0-based `position`)."""
    which = f" (id {position + 1} of {ids_in_sample})" if ids_in_sample is not None else ""
    return DataError(f"{path}: feature '{feature}' (mapping '{mapping}') has id {value} at sample "
                     f"{sample}{which}, outside [0, {cardinality}) given by its cardinality")


def damaged_record_error(path: str, record: int, reason: str) -> DataError:
    """A TFRecord whose framing or CRC check failed (record: its 0-based number in the file), as
    both models' TFRecord readers report it."""
    return DataError(f"{path}: record {record}: corrupt or truncated TFRecord file ({reason})")


def truncated_error(path: str, byte: int) -> DataError:
    return DataError(f"{path}: unexpected end of file at byte {byte}; the file was truncated while reading")


def check_labels(raw: np.ndarray, path: str, feature: str, mapping: str, first_sample: int) -> None:
    """Label bytes (bool or int8) are 0 or 1; any other byte (TensorFlow reads it as true) is a DataError."""
    raw = raw.reshape(-1).view(np.uint8)
    if raw.size and raw.max() > 1:
        index = int(np.flatnonzero(raw > 1)[0])
        raise label_error(path, feature, mapping, first_sample + index, raw[index])


def label_values(values: np.ndarray, path: str, mapping: str, first_sample: int, check: bool = True) -> np.ndarray:
    """Labels stored as numbers (int32 or float32 formats) as bool; with `check`, a value other
    than 0 or 1 is a DataError naming the file and sample."""
    labels = values == 1
    if check and not (labels | (values == 0)).all():
        row = int(np.flatnonzero(~(labels | (values == 0)))[0])
        raise DataError(f"{path}: label (mapping '{mapping}') is {values[row]} at sample {first_sample + row}; "
                        f"a label must be 0 or 1")
    return labels


_FLOAT16_MAGNITUDE = 0x7FFF
_FLOAT16_INF = 0x7C00  # magnitude bits at or above it: Inf or NaN


def check_numericals(values: np.ndarray, path: str, features: Sequence[str], mapping: str,
                     first_sample: int) -> None:
    """Numericals [samples, features] (float16; float32 in Wide & Deep's files) are finite; NaN or
    Inf is a DataError. float16 is tested on its bits, which is faster than `np.isfinite`."""
    if values.dtype == np.float16:
        bits = values.view(np.uint16)
        bad = bits.size and (bits & _FLOAT16_MAGNITUDE).max() >= _FLOAT16_INF
    else:
        bad = values.size and not np.isfinite(values).all()
    if bad:
        row, column = (int(i) for i in np.argwhere(~np.isfinite(values))[0])
        raise numerical_error(path, features[column], mapping, first_sample + row, values[row, column])


def unsigned_cardinalities(cardinalities: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """Cardinalities in the unsigned type of `dtype`'s width, as `check_ids` compares them."""
    return np.asarray(cardinalities, dtype=f"u{np.dtype(dtype).itemsize}")


def check_ids(block: np.ndarray, cardinalities: np.ndarray, paths: Sequence[str],
              features: Sequence[str], mapping: str, first_sample: int,
              row_lengths: Optional[np.ndarray] = None) -> None:
    """Ids [features, samples] (or [features, samples, hotness]: every id of a multi-hot feature)
    lie in [0, cardinality) of their feature, else a DataError. Ragged ids are one feature's
    values [1, total ids] with their `row_lengths`, which place a bad id's sample.

    Read as unsigned, a negative id is huge, so one maximum per feature checks both bounds.
    """
    if not block.size:
        return
    per_sample = int(np.prod(block.shape[2:], dtype=np.int64))
    flat = block.reshape(len(block), -1)
    unsigned = flat.view(cardinalities.dtype)
    bad_features = np.flatnonzero(unsigned.max(axis=1) >= cardinalities)
    if bad_features.size:
        row = int(bad_features[0])
        index = int(np.flatnonzero(unsigned[row] >= cardinalities[row])[0])
        sample, position = divmod(index, per_sample)
        of = per_sample if per_sample != 1 else None
        if row_lengths is not None:
            ends = np.cumsum(row_lengths)
            sample = int(np.searchsorted(ends, index, side="right"))
            position, of = index - int(ends[sample] - row_lengths[sample]), int(row_lengths[sample])
        raise id_error(paths[row], features[row], mapping, first_sample + sample, flat[row, index],
                       cardinalities[row], position, of)


def check_batch_fits(batch_size: int, num_samples: int, what: str, where: str) -> None:
    """A global batch of `batch_size` needs at least that many samples in mapping `what` of `where`."""
    if batch_size > num_samples:
        raise DataError(f"{where}: the {what} batch size {batch_size} is larger than the "
                        f"{num_samples} samples of the {what} data")

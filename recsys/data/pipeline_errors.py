"""The process-wide registry that carries a DataError out of a TensorFlow graph.

Errors raised inside a tf.data pipeline reach the consumer as a TensorFlow error carrying a
traceback (and TensorFlow logs it). So a reader files its DataError here under a number
(`file_pipeline_error`), makes the pipeline fail with an assertion naming that number
(`pipeline_error_check`), and `surface_data_errors` raises it again where batches are consumed.
The compiled batch-read op (`ReadFileRows`) reports a bad value as numbers under its `error_tag`
(`file_read_tag`); the reader that made the op words the DataError. A SavedModel's input asserts
start with `SERVING_INPUT_ERROR`, which `surface_data_errors` turns into a DataError as well.
"""
from __future__ import annotations

import contextlib
import itertools
import re
import threading
import weakref
from typing import Callable, Dict, Iterator, Optional

import numpy as np
import tensorflow as tf

from recsys.data.data_errors import DataError

_PIPELINE_ERROR_TAG = "DLRM input data error #"
_PIPELINE_ERROR_PATTERN = re.compile(re.escape(_PIPELINE_ERROR_TAG) + r"\] \[(\d+)\]")
SERVING_INPUT_ERROR = "invalid serving input:"
_SERVING_ERROR_PATTERN = re.compile(re.escape(SERVING_INPUT_ERROR) + r"[^\n\]]*")
_pipeline_errors: Dict[int, DataError] = {}
_pipeline_error_numbers = itertools.count(1)
_pipeline_errors_lock = threading.Lock()
# The batch-read op (`ReadFileRows`) reports a bad value as numbers; the reader that made the op
# words the DataError, found by the number in the op's error tag.
_FILE_READ_TAG = "DLRM file read #"
_FILE_READ_PATTERN = re.compile(re.escape(_FILE_READ_TAG)
                                + r"(\d+)\] \[(\d+)\] \[(\w+)\] \[(-?\d+)\] \[(\d+)\] \[(-?\d+)\]")
# (read, what: label|finite|ids|eof, sample, column, value) -> the DataError it stands for
FileReadExplainer = Callable[[int, str, int, int, int], DataError]
_file_read_explainers: Dict[int, "weakref.WeakMethod[FileReadExplainer]"] = {}
_file_read_numbers = itertools.count(1)


def file_pipeline_error(error: Optional[DataError]) -> np.int64:
    """0 for no error, else the number under which `error` waits for `surface_data_errors`."""
    if error is None:
        return np.int64(0)
    with _pipeline_errors_lock:
        number = next(_pipeline_error_numbers)
        _pipeline_errors[number] = error
    return np.int64(number)


def pipeline_error_check(error_number: tf.Tensor) -> tf.Operation:
    """The graph-side half of `file_pipeline_error`: fails the pipeline (for `surface_data_errors`)
    when `error_number` is not 0."""
    return tf.debugging.Assert(tf.equal(error_number, 0), [_PIPELINE_ERROR_TAG, error_number])


def file_read_tag(explain: FileReadExplainer) -> str:
    """The `error_tag` of a `ReadFileRows` op whose failures `explain` (a bound method, held weakly) words."""
    with _pipeline_errors_lock:
        number = next(_file_read_numbers)
        _file_read_explainers[number] = weakref.WeakMethod(explain)
    return f"{_FILE_READ_TAG}{number}"


def _data_error_in(message: str) -> Optional[DataError]:
    """The DataError a TensorFlow error message stands for, if it stands for one."""
    read = _FILE_READ_PATTERN.search(message)
    if read:
        with _pipeline_errors_lock:
            explain = _file_read_explainers.get(int(read.group(1)), lambda: None)()
        if explain is not None:
            number, what, *values = read.groups()[1:]
            return explain(int(number), what, *(int(v) for v in values))
    filed = _PIPELINE_ERROR_PATTERN.search(message)
    if filed:
        with _pipeline_errors_lock:
            error = _pipeline_errors.pop(int(filed.group(1)), None)
        if error is not None:
            return error
    serving = _SERVING_ERROR_PATTERN.search(message)
    return DataError(serving.group(0)) if serving else None


@contextlib.contextmanager
def surface_data_errors() -> Iterator[None]:
    """Inside the block (or the decorated function), bad data found in a TensorFlow graph (the
    reader's value checks, a SavedModel's input asserts) is raised as the DataError it is, one
    line without TensorFlow's dump; other errors pass unchanged."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        data_error = _data_error_in(error.message)
        if data_error is None:
            raise
        raise data_error from None

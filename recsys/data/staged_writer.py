"""What the dataset writers share: the all-or-nothing life of their files, and `append`.

`StagedWriter` owns a hidden temporary sibling of the destination (`safe_io.StagedDirectory`) in
which a format's files grow (the split-binary, HugeCTR raw and SOK writers build on it; the
split-TFRecords writer stages its folder the same way itself). `SampleWriter` is the protocol every
writer meets: the `append` that `dataloading.transcribe` and the synthetic teacher
(`synthetic_data.write_teacher_samples`) call.
"""
from __future__ import annotations

from typing import BinaryIO, Dict, Optional, Protocol, Sequence

import numpy as np

from recsys.data.batch import Ids
from recsys.runtime.safe_io import StagedDirectory


class StagedWriter:
    """The all-or-nothing life of a writer whose files grow in a hidden temporary sibling of
    `destination` (`safe_io.StagedDirectory`): a subclass opens them in `_files` and its `commit`
    ends with `_publish` (rename into place); `abort`, also on leaving the `with` block without
    `commit` (an exception included), deletes the temporary folder."""

    def __init__(self, destination: str, replace: bool):
        self._files: Dict[str, BinaryIO] = {}
        self._staged: Optional[StagedDirectory] = StagedDirectory(destination, replace=replace)
        self._staging = self._staged.path

    def _publish(self) -> None:
        self._close_files()
        staged, self._staged = self._staged, None
        staged.publish()

    def abort(self) -> None:
        """Drop everything written so far (nothing once committed); the destination stays as it was."""
        self._close_files()
        if self._staged is not None:
            staged, self._staged = self._staged, None
            staged.discard()

    def _close_files(self) -> None:
        for handle in self._files.values():
            handle.close()

    def __enter__(self) -> "StagedWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.abort()


class SampleWriter(Protocol):
    """What the dataset writers share (`datasets.SplitBinaryWriter`, `split_tfrecords.SplitTFRecordsWriter`,
    `hugectr_data.HugeCTRRawWriter`, `hugectr_data.SokSplitWriter`): append one batch of
    `batch.Samples` to a mapping."""

    def append(self, mapping: str, numerical: Optional[np.ndarray], labels: np.ndarray,
               categoricals: Sequence[Ids]) -> None:
        ...

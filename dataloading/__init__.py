"""The V5 (DLRM_and_DCNv2) data commands, run as modules from the repository root (reference §13.2):

  python -m dataloading.generate_feature_spec --variant criteo_t15_synthetic --dst feature_spec.yaml
  python -m dataloading.transcribe --src_dataset_type synthetic --src_dataset_path . \\
      --dst_dataset_path /data/preprocessed --max_batches_train 1000 --max_batches_test 100 \\
      --dst_dataset_type tf_raw

The formats and readers live in `recsys.data`, each registered in `data_formats`; this package holds
the entry points and their shared command-line conventions (`recsys.runtime.cli`): bad input is
one `error: ...` line on stderr and exit status 2. The reference's `transcode.py` at the root is a
thin command over `dataloading.transcribe` (the `csv` source, `transcribe.FlagNames` for its flags).
"""
from __future__ import annotations

import sys
from typing import Callable, NoReturn, TypeVar

from recsys.runtime.cli import ArgumentParser, bad_input  # noqa: F401 (ArgumentParser: for the package's commands)

T = TypeVar("T")


def fail(message: str) -> NoReturn:
    """Print one `error: ...` line and exit with status 2 (cli.BAD_INPUT)."""
    sys.exit(bad_input(message))


def run_or_fail(action: Callable[[], T]) -> T:
    """`action()`'s result; bad input (ValueError, including the project's spec, data and output-path
    errors, or OSError) becomes one error line and exit status 2."""
    try:
        return action()
    except (ValueError, OSError) as error:
        fail(str(error))


"""The path checks of the preprocessing scripts, run before they write anything.

  check_paths.py spark INPUT_PATH OUTPUT_PATH
      run_spark_cpu.sh / run_spark_gpu.sh: OUTPUT_PATH is replaced whole by the Spark jobs' output,
      so it must not overlap the raw input and may only hold a previous Spark output.
  check_paths.py dataset DOWNLOAD_DIR SPARK_OUTPUT_PATH CONVERSION_INTERMEDIATE_DIR FINAL_OUTPUT_DIR
      prepare_dataset.sh: no two of the four folders overlap (each output is replaced or cleaned,
      which would delete the other), and FINAL_OUTPUT_DIR may only hold a previous dataset.

Prints one error line naming the environment variable (or argument) and exits 1 on a problem.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from recsys.runtime.cli import bad_input  # noqa: E402
from recsys.runtime.safe_io import OutputPathError, check_output_dir, check_replaceable, refuse_overlap  # noqa: E402
from split_dataset import output_entries  # noqa: E402

# What run_criteo_spark_jobs (common.sh) puts in the Spark output folder.
SPARK_OUTPUT_ENTRIES = ("models", "train", "test", "validation", "summary", "model_size.json", "_PARAMS")


def check_spark(input_path: str, output_path: str) -> None:
    """The Spark output folder may replace OUTPUT_PATH without touching the input or anything else."""
    refuse_overlap(output_path, "OUTPUT_PATH", {"INPUT_PATH": input_path})
    check_replaceable(output_path, "OUTPUT_PATH", SPARK_OUTPUT_ENTRIES, replace=True)


def check_dataset(download_dir: str, spark_output_path: str, intermediate_dir: str, final_output_dir: str) -> None:
    """prepare_dataset.sh's folders are disjoint and its outputs usable."""
    outputs: Dict[str, str] = {"spark_output_path": spark_output_path,
                               "conversion_intermediate_dir": intermediate_dir,
                               "final_output_dir": final_output_dir}
    for name, path in outputs.items():
        others: Dict[str, Optional[str]] = {"download_dir": download_dir}
        others.update({other: p for other, p in outputs.items() if other != name})
        refuse_overlap(path, name, others)
        check_output_dir(path, name)
    check_replaceable(final_output_dir, "final_output_dir", output_entries(with_summary=True), replace=True)


def main(argv: Sequence[str]) -> int:
    checks = {"spark": (check_spark, 2), "dataset": (check_dataset, 4)}
    if len(argv) < 1 or argv[0] not in checks or len(argv) - 1 != checks[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    check, _ = checks[argv[0]]
    try:
        check(*argv[1:])
    except OutputPathError as error:
        return bad_input(error)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Turn packed `<split>_data.bin` files into the split-binary layout (reference §5.5, §4.3-4.4).

Input folder: `train_data.bin`, `test_data.bin`, `validation_data.bin` (40 int32 per row, from
parquet_to_binary.py) and `model_size.json` ({column: largest id}). Output folder:
`feature_spec.yaml` and `train/`, `test/`, `validation/` each holding `label.bin` (bool),
`numerical.bin` (float16, 13 per row, row-major) and `cat_0.bin`..`cat_25.bin` (the smallest
integer dtype that holds the column's cardinality). With a Spark summary folder, it also writes
`preprocessing_summary.json` and checks that rows + rejected lines == input lines per split.

Every value is checked on the way (labels 0/1, numericals finite in float16, ids below their
cardinality), since a narrowing cast would otherwise change it silently. The output folder is
checked first (never an input; existing output only with --overwrite), built beside itself and
renamed into place, so a failure leaves nothing half-written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from recsys.runtime.cli import bad_input  # noqa: E402
from recsys.data.feature_spec import DEFAULT_SPEC_NAME, FeatureSpec, get_categorical_feature_type  # noqa: E402
from recsys.runtime.safe_io import atomic_directory, check_replaceable, refuse_overlap  # noqa: E402

SPLITS = ("train", "test", "validation")
NUM_FIELDS = 40
RECORD_BYTES = 4 * NUM_FIELDS
SUMMARY_NAME = "preprocessing_summary.json"


def output_entries(with_summary: bool) -> List[str]:
    """The top-level names of the output folder."""
    return [*SPLITS, DEFAULT_SPEC_NAME] + ([SUMMARY_NAME] if with_summary else [])


def read_cardinalities(model_size_file: str, num_categorical: int) -> List[int]:
    """Cardinalities (largest id + 1) in column order from `model_size.json`."""
    try:
        with open(model_size_file) as f:
            sizes = json.load(f)
        first = NUM_FIELDS - num_categorical
        return [int(sizes[f"_c{first + i}"]) + 1 for i in range(num_categorical)]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{model_size_file}: not a {{column: largest id}} map of the categorical "
                         f"columns ({type(error).__name__}: {error})") from None


def packed_rows(packed_file: str) -> int:
    """Rows of a packed file; a size that is not a whole number of records is an error."""
    size = os.path.getsize(packed_file)
    if size % RECORD_BYTES:
        raise ValueError(f"{packed_file}: size {size} B is not a whole number of {RECORD_BYTES}-byte records")
    return size // RECORD_BYTES


def _refuse_bad(bad: np.ndarray, packed_file: str, first_row: int, problem: Callable[[int], str]) -> None:
    """ValueError naming the record and column of the first True in `bad` [rows, columns], if any."""
    if bad.any():
        row, column = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(f"{packed_file}: record {first_row + row}: {problem(column)}")


def check_records(chunk: np.ndarray, packed_file: str, first_row: int, num_numerical: int,
                  cardinalities: Sequence[int]) -> np.ndarray:
    """Validate a [rows, 40] int32 chunk; return its numericals as float16."""
    first_categorical = 1 + num_numerical
    _refuse_bad((chunk[:, :1] != 0) & (chunk[:, :1] != 1), packed_file, first_row,
                lambda _: "label is not 0 or 1")
    with np.errstate(over="ignore"):
        numerical = np.ascontiguousarray(chunk[:, 1:first_categorical]).view("<f4").astype("<f2")
    _refuse_bad(~np.isfinite(numerical), packed_file, first_row,
                lambda c: f"numerical column _c{1 + c} is not finite in float16 (NaN, inf or beyond 65504)")
    ids = chunk[:, first_categorical:]
    _refuse_bad((ids < 0) | (ids >= np.asarray(cardinalities)), packed_file, first_row,
                lambda c: f"id of column _c{first_categorical + c} lies outside [0, {cardinalities[c]}) "
                          f"given by model_size.json")
    return numerical


def packed_chunks(packed_file: str, chunk_rows: int) -> Iterator[np.ndarray]:
    """[rows, 40] int32 chunks of a packed file, in order."""
    packed_rows(packed_file)
    with open(packed_file, "rb") as packed:
        while True:
            chunk = np.fromfile(packed, dtype="<i4", count=chunk_rows * NUM_FIELDS).reshape(-1, NUM_FIELDS)
            if not len(chunk):
                return
            yield chunk


def write_split(chunks: Iterable[np.ndarray], output_dir: str, source: str, num_numerical: int,
                cardinalities: Sequence[int]) -> int:
    """Write one split's label/numerical/categorical files from [rows, 40] int32 chunks (numericals as
    float32 bits), checking every value; `source` names the input in errors. Returns the row count."""
    os.makedirs(output_dir, exist_ok=True)
    first_categorical = 1 + num_numerical
    dtypes = [np.dtype(get_categorical_feature_type(c)).newbyteorder("<") for c in cardinalities]
    rows = 0
    with ExitStack() as stack:
        label = stack.enter_context(open(os.path.join(output_dir, "label.bin"), "wb"))
        numerical = stack.enter_context(open(os.path.join(output_dir, "numerical.bin"), "wb"))
        categorical = [stack.enter_context(open(os.path.join(output_dir, f"cat_{i}.bin"), "wb"))
                       for i in range(len(cardinalities))]
        for chunk in chunks:
            numerical.write(check_records(chunk, source, rows, num_numerical, cardinalities).tobytes())
            rows += len(chunk)
            label.write(chunk[:, 0].astype(np.bool_).tobytes())
            for i, (out, dtype) in enumerate(zip(categorical, dtypes)):
                out.write(chunk[:, first_categorical + i].astype(dtype).tobytes())
    return rows


def split_packed_file(packed_file: str, output_dir: str, num_numerical: int, cardinalities: Sequence[int],
                      chunk_rows: int) -> int:
    """Write one split's label/numerical/categorical files from a packed file; returns the row count."""
    return write_split(packed_chunks(packed_file, chunk_rows), output_dir, packed_file, num_numerical, cardinalities)


def merge_summaries(spark_summary_dir: str, rows: Dict[str, int], cardinalities: Sequence[int]) -> Dict[str, object]:
    """One summary of the whole run; raises if rows + rejected lines differ from input lines."""
    try:
        return _merge_summaries(spark_summary_dir, rows, cardinalities)
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{spark_summary_dir}: incomplete Spark summary "
                         f"({type(error).__name__}: {error})") from None


def _merge_summaries(spark_summary_dir: str, rows: Dict[str, int], cardinalities: Sequence[int]) -> Dict[str, object]:
    splits = {}
    for split in SPLITS:
        with open(os.path.join(spark_summary_dir, f"{split}.json")) as f:
            splits[split] = json.load(f)
    with open(os.path.join(spark_summary_dir, "dictionary.json")) as f:
        dictionary = json.load(f)
    return build_summary(splits, dictionary, rows, cardinalities)


def build_summary(split_summaries: Dict[str, Dict[str, object]], dictionary: Dict[str, object],
                  rows: Dict[str, int], cardinalities: Sequence[int]) -> Dict[str, object]:
    """The preprocessing summary from each split's line counts (input_lines, rejected_lines,
    rejected_by_reason, by_day, input_folder) and the dictionary job's (frequency_limit, days,
    engine); raises ValueError if rows + rejected lines differ from input lines."""
    splits = {}
    for split in SPLITS:
        counts = split_summaries[split]
        if rows[split] + counts["rejected_lines"] != counts["input_lines"]:
            raise ValueError(f"{split}: {rows[split]} rows + {counts['rejected_lines']} rejected lines != "
                             f"{counts['input_lines']} input lines; the output is inconsistent")
        splits[split] = {"rows": rows[split], "input_lines": counts["input_lines"],
                         "rejected_lines": counts["rejected_lines"], "rejected_by_reason": counts["rejected_by_reason"],
                         "by_day": counts["by_day"], "input_folder": counts["input_folder"]}
    return {"engine": dictionary.get("engine", "spark"), "frequency_limit": dictionary["frequency_limit"],
            "dictionary_days": dictionary["days"], "cardinalities": list(cardinalities), "splits": splits,
            "total": {key: sum(s[key] for s in splits.values()) for key in ("rows", "input_lines", "rejected_lines")}}


def split_dataset(dataset_dir: str, output_dir: str, num_numerical: int = 13, chunk_rows: int = 32768,
                  spark_summary_dir: Optional[str] = None, overwrite: bool = False) -> Dict[str, int]:
    """Write the whole split-binary dataset and its feature spec, all or nothing; returns rows per split."""
    if not 0 <= num_numerical <= NUM_FIELDS - 1:
        raise ValueError(f"--numerical_features must lie in [0, {NUM_FIELDS - 1}], got {num_numerical}")
    if chunk_rows < 1:
        raise ValueError(f"--batch_size must be at least 1, got {chunk_rows}")
    refuse_overlap(output_dir, "--output", {"--dataset": dataset_dir, "--spark_summary_dir": spark_summary_dir})
    replace = check_replaceable(output_dir, "--output", output_entries(bool(spark_summary_dir)), overwrite)
    cardinalities = read_cardinalities(os.path.join(dataset_dir, "model_size.json"), NUM_FIELDS - 1 - num_numerical)
    packed = {split: os.path.join(dataset_dir, f"{split}_data.bin") for split in SPLITS}
    for path in packed.values():
        packed_rows(path)
    with atomic_directory(output_dir, replace) as staging:
        rows = {split: split_packed_file(packed[split], os.path.join(staging, split), num_numerical, cardinalities,
                                         chunk_rows)
                for split in SPLITS}
        FeatureSpec.get_default_feature_spec(num_numerical, cardinalities, staging).to_yaml()
        if spark_summary_dir:
            with open(os.path.join(staging, SUMMARY_NAME), "w") as f:
                json.dump(merge_summaries(spark_summary_dir, rows, cardinalities), f, indent=2)
                f.write("\n")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="folder with <split>_data.bin and model_size.json")
    parser.add_argument("--output", required=True, help="folder for feature_spec.yaml and the split folders")
    parser.add_argument("--batch_size", type=int, default=32768, help="rows read per chunk")
    parser.add_argument("--numerical_features", type=int, default=13)
    parser.add_argument("--spark_summary_dir", help="folder with the Spark jobs' summaries (<split>.json)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --output (refused while it holds other files)")
    args = parser.parse_args(argv)
    try:
        rows = split_dataset(args.dataset, args.output, args.numerical_features, args.batch_size,
                             args.spark_summary_dir, args.overwrite)
    except (ValueError, OSError) as error:  # OutputPathError, FeatureSpecError, bad records, unreadable input
        return bad_input(error)
    print(", ".join(f"{split}: {n} rows" for split, n in rows.items()) + f" -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

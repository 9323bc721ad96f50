"""Turn packed `<split>_data.bin` files into the split-binary layout (reference §5.5, §4.3-4.4).

Input folder: `train_data.bin`, `test_data.bin`, `validation_data.bin` (40 int32 per row, from
parquet_to_binary.py) and `model_size.json` ({column: largest id}). Output folder:
`feature_spec.yaml` and `train/`, `test/`, `validation/` each holding `label.bin` (bool),
`numerical.bin` (float16, 13 per row, row-major) and `cat_0.bin`..`cat_25.bin` (the smallest
integer dtype that holds the column's cardinality). With a Spark summary folder, it also writes
`preprocessing_summary.json` and checks that rows + rejected lines == input lines per split.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack
from typing import Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from feature_spec import FeatureSpec, get_categorical_feature_type  # noqa: E402

SPLITS = ("train", "test", "validation")
NUM_FIELDS = 40
SUMMARY_NAME = "preprocessing_summary.json"


def read_cardinalities(model_size_file: str, num_categorical: int) -> List[int]:
    """Cardinalities (largest id + 1) in column order from `model_size.json`."""
    with open(model_size_file) as f:
        sizes = json.load(f)
    first = NUM_FIELDS - num_categorical
    return [int(sizes[f"_c{first + i}"]) + 1 for i in range(num_categorical)]


def split_packed_file(packed_file: str, output_dir: str, num_numerical: int, cardinalities: Sequence[int],
                      chunk_rows: int) -> int:
    """Write one split's label/numerical/categorical files from a packed file; returns the row count."""
    size = os.path.getsize(packed_file)
    record_bytes = 4 * NUM_FIELDS
    if size % record_bytes:
        raise ValueError(f"{packed_file}: size {size} B is not a whole number of {record_bytes}-byte records")
    os.makedirs(output_dir, exist_ok=True)
    first_categorical = 1 + num_numerical
    dtypes = [np.dtype(get_categorical_feature_type(c)) for c in cardinalities]
    rows = 0
    with ExitStack() as stack:
        packed = stack.enter_context(open(packed_file, "rb"))
        label = stack.enter_context(open(os.path.join(output_dir, "label.bin"), "wb"))
        numerical = stack.enter_context(open(os.path.join(output_dir, "numerical.bin"), "wb"))
        categorical = [stack.enter_context(open(os.path.join(output_dir, f"cat_{i}.bin"), "wb"))
                       for i in range(len(cardinalities))]
        while True:
            chunk = np.fromfile(packed, dtype="<i4", count=chunk_rows * NUM_FIELDS).reshape(-1, NUM_FIELDS)
            if not len(chunk):
                break
            rows += len(chunk)
            label.write(chunk[:, 0].astype(np.bool_).tobytes())
            numerical.write(np.ascontiguousarray(chunk[:, 1:first_categorical]).view("<f4").astype("<f2").tobytes())
            for i, (out, dtype) in enumerate(zip(categorical, dtypes)):
                out.write(chunk[:, first_categorical + i].astype(dtype.newbyteorder("<")).tobytes())
    return rows


def merge_summaries(spark_summary_dir: str, rows: Dict[str, int], cardinalities: Sequence[int]) -> Dict[str, object]:
    """One summary of the whole run; raises if rows + rejected lines differ from input lines."""
    splits = {}
    for split in SPLITS:
        with open(os.path.join(spark_summary_dir, f"{split}.json")) as f:
            spark = json.load(f)
        if rows[split] + spark["rejected_lines"] != spark["input_lines"]:
            raise RuntimeError(f"{split}: {rows[split]} rows + {spark['rejected_lines']} rejected lines != "
                               f"{spark['input_lines']} input lines; the output is inconsistent")
        splits[split] = {"rows": rows[split], "input_lines": spark["input_lines"],
                         "rejected_lines": spark["rejected_lines"], "rejected_by_reason": spark["rejected_by_reason"],
                         "by_day": spark["by_day"], "input_folder": spark["input_folder"]}
    with open(os.path.join(spark_summary_dir, "dictionary.json")) as f:
        dictionary = json.load(f)
    return {"frequency_limit": dictionary["frequency_limit"], "dictionary_days": dictionary["days"],
            "cardinalities": list(cardinalities), "splits": splits,
            "total": {key: sum(s[key] for s in splits.values()) for key in ("rows", "input_lines", "rejected_lines")}}


def split_dataset(dataset_dir: str, output_dir: str, num_numerical: int = 13, chunk_rows: int = 32768,
                  spark_summary_dir: Optional[str] = None) -> Dict[str, int]:
    """Write the whole split-binary dataset and its feature spec; returns rows per split."""
    num_categorical = NUM_FIELDS - 1 - num_numerical
    cardinalities = read_cardinalities(os.path.join(dataset_dir, "model_size.json"), num_categorical)
    rows = {split: split_packed_file(os.path.join(dataset_dir, f"{split}_data.bin"), os.path.join(output_dir, split),
                                     num_numerical, cardinalities, chunk_rows)
            for split in SPLITS}
    FeatureSpec.get_default_feature_spec(num_numerical, cardinalities, output_dir).to_yaml()
    if spark_summary_dir:
        summary = merge_summaries(spark_summary_dir, rows, cardinalities)
        with open(os.path.join(output_dir, SUMMARY_NAME), "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="folder with <split>_data.bin and model_size.json")
    parser.add_argument("--output", required=True, help="folder for feature_spec.yaml and the split folders")
    parser.add_argument("--batch_size", type=int, default=32768, help="rows read per chunk")
    parser.add_argument("--numerical_features", type=int, default=13)
    parser.add_argument("--spark_summary_dir", help="folder with the Spark jobs' summaries (<split>.json)")
    args = parser.parse_args(argv)
    rows = split_dataset(args.dataset, args.output, args.numerical_features, args.batch_size, args.spark_summary_dir)
    print(", ".join(f"{split}: {n} rows" for split, n in rows.items()) + f" -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

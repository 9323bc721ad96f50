"""The SOK DLRM benchmark's `split_bin.py` under its name and argument order:

  python -m dataloading.split_bin /data/dlrm_raw/train_data.bin /data/splited_dataset/train \\
      --slot_size_array "[203931, 18598, ...]"
  python -m dataloading.split_bin /data/dlrm_raw/test_data.bin /data/splited_dataset/test --slot_size_array ...

One HugeCTR raw file (its name, train_data.bin or test_data.bin, says which mapping it is) becomes one
SOK split folder: label.bin, dense.bin, category.bin and metadata.json, which `--dataset_type
sok_split` (and SOK's own reader) read. A `metadata.json` beside the input may give the vocab sizes
instead of --slot_size_array (they must then agree). Every value is checked as it is read; the
label and the transformed dense values are written as float32 with `dense_log: false`
(`hugectr_data.SokSplitWriter`), so the folder serves the batches the raw file serves. For both
mappings at once: `python -m dataloading.transcribe --src_dataset_type hugectr_raw ...
--dst_dataset_type sok_split`.
"""
from __future__ import annotations

from typing import List, Optional

from dataloading import ArgumentParser, run_or_fail
from dataloading.transcribe import split_raw_file


def slot_sizes(text: str) -> List[int]:
    """SOK's --slot_size_array: a Python-style list "[a, b, ...]" or a plain comma list."""
    return [int(value) for value in text.strip().strip("[]").split(",")]


def main(argv: Optional[List[str]] = None) -> None:
    parser = ArgumentParser(prog="python -m dataloading.split_bin", description=__doc__.split("\n")[0])
    parser.add_argument("input", help="HugeCTR raw file: train_data.bin or test_data.bin")
    parser.add_argument("output", help="the SOK split folder to write, e.g. DATA/train")
    parser.add_argument("--slot_size_array", type=slot_sizes, default=None,
                        help="the vocab sizes (HugeCTR's slot_size_array), unless a metadata.json beside the input "
                             "gives them")
    parser.add_argument("--dense_log", choices=("True", "False"), default=None,
                        help="whether the raw dense values still need the log (default True, or metadata.json's)")
    parser.add_argument("--batch_size", type=int, default=65536, help="records read at a time")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier split folder in OUTPUT (never anything else)")
    args = parser.parse_args(argv)
    dense_log = None if args.dense_log is None else args.dense_log == "True"
    samples = run_or_fail(lambda: split_raw_file(args.input, args.output, args.slot_size_array, dense_log,
                                                 args.batch_size, args.overwrite))
    print(f"wrote {samples} samples to {args.output}")


if __name__ == "__main__":
    main()

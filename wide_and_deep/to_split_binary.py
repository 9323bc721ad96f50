"""Wide & Deep TFRecords to split-binary files described by a feature spec (wide_and_deep/wd_split_binary.py):

    python -m wide_and_deep.to_split_binary --transformed_metadata_path /outbrain/tfrecords --output_path /outbrain/binary

then train with `python main.py --dataset_type split_binary --transformed_metadata_path /outbrain/binary`.
The output folder is written whole or not at all; an existing one is refused. Exit codes: cli.py.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from recsys.runtime.cli import ArgumentParser, bad_input


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The converter's command line; exit 2 with one `error:` line on bad input (cli.py)."""
    from recsys.data.data_errors import DataError
    from recsys.data.feature_spec import FeatureSpecError
    from recsys.runtime.safe_io import OutputPathError
    from wide_and_deep import wd_split_binary
    from wide_and_deep.wd_data import surface_record_errors

    parser = ArgumentParser(description="Wide & Deep TFRecords to split-binary files with a feature spec")
    parser.add_argument("--transformed_metadata_path", required=True, help="Folder of the TFRecords' metadata.json")
    parser.add_argument("--train_data_pattern", nargs="+", help="Glob(s) of the training TFRecords "
                        "(default: <--transformed_metadata_path>/train/part*)")
    parser.add_argument("--eval_data_pattern", nargs="+", help="Glob(s) of the evaluation TFRecords "
                        "(default: <--transformed_metadata_path>/eval/part*)")
    parser.add_argument("--output_path", required=True, help="The new dataset folder (must not exist)")
    args = parser.parse_args(argv)
    source = args.transformed_metadata_path
    try:
        with surface_record_errors():
            rows = wd_split_binary.convert(source, args.output_path,
                                           args.train_data_pattern or [os.path.join(source, "train", "part*")],
                                           args.eval_data_pattern or [os.path.join(source, "eval", "part*")])
    except (DataError, OutputPathError, FeatureSpecError) as error:
        return bad_input(error)
    print(f"wrote {args.output_path}: {rows['train']} train and {rows['eval']} eval rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())

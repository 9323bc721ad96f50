"""Entry point: `python -m wide_and_deep.preprocessing --input DIR --output DIR [--engine duckdb|spark]`.

Reads the Outbrain CSVs of --input (clicks_train, events, promoted_content, documents_meta,
documents_{categories,topics,entities}) and writes the TFRecords of the Wide & Deep reader into the
new folder --output (see pipeline.py). Bad input: one line "error: ..." naming the file, exit 2,
nothing written. SIGINT, SIGTERM or SIGUSR1: one line saying so, exit 128 + N, nothing written
(recsys/runtime/cli.py's convention, as DLRM's entry points).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from recsys.runtime.safe_io import OutputPathError
from recsys.runtime.stop_signals import run_stopping_at_once
from wide_and_deep.preprocessing.pipeline import InputError, make_engine, preprocess


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wide_and_deep.preprocessing",
                                     description="Outbrain CSVs to Wide & Deep TFRecords (train/ and eval/).")
    parser.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb")
    parser.add_argument("--input", default="/outbrain/orig", help="folder of the Outbrain CSVs")
    parser.add_argument("--output", default="/outbrain/tfrecords", help="new folder for the records")
    parser.add_argument("--num_train_files", type=int, default=40, help="files of train records (at most)")
    parser.add_argument("--num_eval_files", type=int, default=40, help="files of eval records (at most)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/eval split and the train order")
    parser.add_argument("--threads", type=int, default=None, help="engine threads (default: all cores)")
    parser.add_argument("--strict", action="store_true", help="refuse malformed lines instead of counting them")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.num_train_files < 1 or args.num_eval_files < 1:
        print("error: --num_train_files and --num_eval_files must be at least 1", file=sys.stderr)
        return 2
    try:
        engine = make_engine(args.engine, args.threads)
        try:
            summary = preprocess(engine, args.input, args.output, args.seed, args.num_train_files,
                                 args.num_eval_files, args.strict)
        finally:
            engine.close()
    except (InputError, OutputPathError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for stem, counts in summary["files"].items():
        dropped = ", ".join(f"{k}: {v}" for k, v in counts.items()
                            if v and k not in ("lines", "used", "header", "train", "eval"))
        print(f"{stem}: {counts['lines']} lines" + (f" ({dropped})" if dropped else ""))
    for split, counts in summary["displays"].items():
        if counts["without_click"]:
            print(f"{split}: {counts['without_click']} of {counts['displays']} displays have no clicked ad; "
                  f"MAP@12 leaves them out")
    print(f"wrote {summary['rows']['train']} train and {summary['rows']['eval']} eval rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_stopping_at_once(main))

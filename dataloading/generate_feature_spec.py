"""Write the V5 feature spec of a Criteo-shaped synthetic dataset (reference §13.2).

The spec has 13 numerical features `num_<i>` (float16), 26 categorical features `cat_<i>` with the
variant's cardinalities (hotness 1, alpha 1.45, int32), the label `label` (int8) and
`source_spec: null`; `dataloading.transcribe --src_dataset_type synthetic` draws data shaped by it.
An existing --dst is kept unless --overwrite; the file is written beside it and renamed into place.

Example:
  python -m dataloading.generate_feature_spec --variant criteo_t15_synthetic --dst feature_spec.yaml
"""
from __future__ import annotations

import os
from typing import List, Optional

from dataloading import ArgumentParser, run_or_fail
from recsys.data.feature_spec import CRITEO_NUMERICAL_FEATURES, CRITEO_VARIANTS, FeatureSpec
from recsys.runtime.safe_io import check_output_file


def generate_feature_spec(variant: str, destination: str, overwrite: bool = False) -> FeatureSpec:
    """Write the spec of `variant` to `destination` (refused if it exists, unless `overwrite`)."""
    if variant not in CRITEO_VARIANTS:
        raise ValueError(f"--variant must be one of {sorted(CRITEO_VARIANTS)}, got {variant!r}")
    check_output_file(destination, "--dst")
    if os.path.lexists(destination) and not overwrite:
        raise ValueError(f"--dst {destination} already exists; refusing to overwrite it "
                         f"(pass --overwrite to replace it)")
    spec = FeatureSpec.get_fileless_feature_spec(CRITEO_NUMERICAL_FEATURES, CRITEO_VARIANTS[variant],
                                                 os.path.dirname(os.path.abspath(destination)))
    spec.path = spec.to_yaml(destination, overwrite=overwrite)
    return spec


def main(argv: Optional[List[str]] = None) -> None:
    parser = ArgumentParser(prog="python -m dataloading.generate_feature_spec", description=__doc__.split("\n")[0])
    parser.add_argument("--variant", required=True, choices=sorted(CRITEO_VARIANTS),
                        help="the Criteo preprocessing whose cardinalities to use")
    parser.add_argument("--dst", default="feature_spec.yaml", help="the spec file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --dst")
    args = parser.parse_args(argv)
    spec = run_or_fail(lambda: generate_feature_spec(args.variant, args.dst, args.overwrite))
    print(f"wrote {spec.path}: {len(spec.numerical_names)} numerical and {len(spec.categorical_names)} "
          f"categorical features ({args.variant})")


if __name__ == "__main__":
    main()

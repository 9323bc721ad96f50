"""The project's compiled op package (`tensorflow-dot-based-interact/`): the dot interaction and
the fused sparse embedding updates, the split-binary batch read and Wide & Deep's fused
bias + ReLU + dropout. Importing it never fails for a missing library; the library
loads on first use (`is_built()` says whether it can)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

OP_PACKAGE_DIR = Path(__file__).resolve().parent / "tensorflow-dot-based-interact"


def import_op_package() -> ModuleType:
    """The op's Python package: an installed wheel first, else the in-repo source tree."""
    try:
        return importlib.import_module("tensorflow_dot_based_interact")
    except ImportError:
        sys.path.insert(0, str(OP_PACKAGE_DIR))
        return importlib.import_module("tensorflow_dot_based_interact")


op_package = import_op_package()

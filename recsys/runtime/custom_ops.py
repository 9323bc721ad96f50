"""The project's compiled op package (`tensorflow-dot-based-interact/`): the dot interaction and
the fused sparse embedding updates, the split-binary batch read and Wide & Deep's fused
bias + ReLU + dropout. Importing it never fails for a missing library; the library
loads on first use (`is_built()` says whether it can)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

OP_PACKAGE_DIR = Path(__file__).resolve().parents[2] / "tensorflow-dot-based-interact"
OP_PACKAGE = "tensorflow_dot_based_interact"


def import_op_package() -> ModuleType:
    """The op's Python package: an installed wheel first, else the in-repo source tree, loaded from
    its folder under the package's own name (sys.path stays as it is)."""
    try:
        return importlib.import_module(OP_PACKAGE)
    except ImportError:
        folder = OP_PACKAGE_DIR / OP_PACKAGE
        spec = importlib.util.spec_from_file_location(OP_PACKAGE, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[OP_PACKAGE] = package
        spec.loader.exec_module(package)
        return package


op_package = import_op_package()

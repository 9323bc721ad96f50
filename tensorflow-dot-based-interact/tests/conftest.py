"""Makes the package importable from the source tree, wherever pytest is started."""
import sys
from pathlib import Path

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
if PACKAGE_ROOT not in sys.path:
    sys.path.insert(0, PACKAGE_ROOT)

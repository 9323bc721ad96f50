"""Shared pytest setup: the repo root is importable and TF runs deterministically and quietly."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_DETERMINISTIC_OPS", "1")
# The allocator-statistics tests read TensorFlow's CPU allocator peaks, which exist only for its BFC
# allocator: the default on AVX-512 CPUs (oneDNN on), not on AVX2-only ones. Chosen explicitly, every
# CPU kind runs them the same way.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

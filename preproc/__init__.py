"""Criteo 1TB preprocessing (see README.md). A package so that `preproc.criteo_rules` imports the same
way from any entry point, even where another module named `preproc` (bench/preproc.py) is on sys.path."""

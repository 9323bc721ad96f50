"""The module maps of README.md (Layout) and docs/architecture.md name every top-level module, and
name no module that does not exist, so the docs move with the code."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else None]


def _named_modules(text: str) -> set:
    """The top-level modules a map's rows name in their first column (the file column)."""
    first_cells = [line.split("|")[1] for line in text.splitlines() if line.startswith("|")]
    return {name for cell in first_cells for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*\.py)`", cell)}


@pytest.mark.parametrize("document, heading", [("README.md", "## Layout"),
                                               ("docs/architecture.md", "## Module map")])
def test_module_map_matches_the_code(document, heading):
    named = _named_modules(_section((REPO / document).read_text(), heading))
    modules = {path.name for path in REPO.glob("*.py")}
    assert modules - named == set(), f"{document} does not describe these modules"
    assert named - modules == set(), f"{document} names modules that do not exist"


def test_the_architecture_describes_every_package_module():
    """Every module of recsys/, wide_and_deep/ and deployment/ has a row of docs/architecture.md's module map,
    written as its path, and every path a row names exists."""
    section = _section((REPO / "docs/architecture.md").read_text(), "## Module map")
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("|")]
    named = {path for cell in first_cells for path in re.findall(r"`((?:recsys|wide_and_deep|deployment)/[\w/]+\.py)`", cell)}
    modules = {path.relative_to(REPO).as_posix() for package in ("recsys", "wide_and_deep", "deployment")
               for path in (REPO / package).rglob("*.py")
               if path.name != "__init__.py" and "preprocessing" not in path.parts}
    assert modules - named == set(), "docs/architecture.md does not describe these modules"
    assert named - modules == set(), "docs/architecture.md names modules that do not exist"


def test_docstrings_point_at_the_architecture_the_repo_has():
    for path in REPO.glob("*.py"):
        assert "ARCHITECTURE.md" not in path.read_text(), f"{path.name} cites a file the repo does not have"

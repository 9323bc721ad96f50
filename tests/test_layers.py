"""The layering of docs/architecture.md (Layers), kept true: a package imports only from the layers
below it, no module imports the root's modules but the root's and the commands, and no import cycle.
Also the import path the venv gives every other program: the project's packages, never its root."""
import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent

# Lowest first: a module of one layer may import its own layer and the ones before it.
LAYERS = ("recsys.runtime", "recsys.data", "recsys.sparse", "recsys.training", "wide_and_deep")
ROOT_LAYER = len(LAYERS)  # the root modules, dataloading/, preproc/, scripts/: they may import every layer
SKIPPED = {".venv", ".venv-serving", ".git", "tests", "bench", "tensorflow-dot-based-interact", "build"}


def module_name(path: Path, repo: Path) -> str:
    relative = path.relative_to(repo).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def project_modules(repo: Path) -> Dict[str, Path]:
    """Every project module outside tests and benchmarks, by dotted name."""
    found = {}
    for path in repo.rglob("*.py"):
        if not SKIPPED & set(path.relative_to(repo).parts):
            found[module_name(path, repo)] = path
    return found


def layer_of(module: str) -> int:
    for index, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return index
    return ROOT_LAYER


def imports_of(path: Path, module: str, known: Set[str]) -> Iterable[Tuple[str, int]]:
    """(imported project module, line) for every import in `path`, wherever it stands (a function's
    lazy import counts like a top-level one)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1] if package else []
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                yield name, node.lineno


def import_graph(repo: Path) -> Dict[str, Set[str]]:
    modules = project_modules(repo)
    known = set(modules)
    return {module: {target for target, _ in imports_of(path, module, known) if target != module}
            for module, path in modules.items()}


def upward_imports(repo: Path) -> List[str]:
    """Every import of a higher layer (or of a root module) by a lower one, as 'file:line: a imports b'."""
    modules = project_modules(repo)
    known = set(modules)
    found = []
    for module, path in sorted(modules.items()):
        for target, line in imports_of(path, module, known):
            if layer_of(target) > layer_of(module):
                found.append(f"{path.relative_to(repo)}:{line}: {module} imports {target}")
    return found


def import_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One cycle of the graph, as the modules along it, or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_no_package_imports_a_higher_layer_or_the_root():
    assert upward_imports(REPO) == []


def test_there_is_no_import_cycle():
    # Packages' __init__ modules import nothing of the project, so a package and its modules form no cycle.
    assert import_cycle(import_graph(REPO)) is None


# The serving side runs in .venv-serving, without TensorFlow (docs/serving.md): these modules import
# only the standard library, these packages and each other.
SERVING_MODULES = ("deployment/contract.py", "deployment/requests.py", "deployment/runtime.py",
                   "deployment/repository.py", "deployment/serve.py", "deployment/triton_model.py",
                   "deployment/client.py", "deployment/score.py", "bench/serving.py")
# project modules outside deployment/ a serving module may import: TensorFlow-free (TENSORFLOW_FREE)
SERVING_PROJECT_MODULES = {"recsys.runtime.metrics", "recsys.runtime.cpu_settings"}
SERVING_PACKAGES = {"numpy", "onnx", "onnxruntime", "tritonclient", "pytriton", "google",
                    "triton_python_backend_utils"}


def serving_imports(path: Path) -> List[str]:
    """Every import in `path` outside the standard library, SERVING_PACKAGES and the serving modules."""
    allowed = SERVING_PACKAGES | SERVING_PROJECT_MODULES | {name.removesuffix(".py").replace("/", ".")
                                                            for name in SERVING_MODULES}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if name not in allowed and top not in allowed - {"deployment", "bench"} and top not in sys.stdlib_module_names:
                found.append(f"{path.name}:{node.lineno}: {name}")
    return found


def test_the_serving_modules_import_no_tensorflow_nor_the_training_code():
    assert [hit for name in SERVING_MODULES for hit in serving_imports(REPO / name)] == []


def test_at_most_sixteen_python_files_at_the_root():
    assert len(list(REPO.glob("*.py"))) <= 16


def _write(root: Path, files: Dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checks_fail_on_an_upward_import_and_on_a_cycle(tmp_path):
    """The same checks on a small tree that breaks each rule: they name the offending line."""
    _write(tmp_path, {
        "recsys/__init__.py": "", "recsys/runtime/__init__.py": "", "recsys/data/__init__.py": "",
        "recsys/runtime/cli.py": "def f():\n    from recsys.data import batch\n",
        "recsys/data/batch.py": "import model\n",
        "recsys/data/reader.py": "from . import writer\n", "recsys/data/writer.py": "from recsys.data import reader\n",
        "model.py": "import os\n",
    })
    assert upward_imports(tmp_path) == ["recsys/data/batch.py:1: recsys.data.batch imports model",
                                        "recsys/runtime/cli.py:2: recsys.runtime.cli imports recsys.data.batch"]
    assert import_cycle(import_graph(tmp_path)) == ["recsys.data.reader", "recsys.data.writer", "recsys.data.reader"]


def _venv_python() -> str:
    python = REPO / ".venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv (scripts/setup.sh makes it): the venv's import path is what this checks")
    return str(python)


def _clean_environment() -> Dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}


def test_the_venv_puts_the_packages_but_not_the_root_on_other_programs_path(tmp_path):
    """From another folder, the venv's python imports `recsys` and `wide_and_deep` from this checkout,
    and none of the root modules (`datasets` here would shadow the PyPI package of that name)."""
    script = ("import importlib.util, recsys, wide_and_deep; "
              "print(recsys.__file__); print(wide_and_deep.__file__); "
              "print([m for m in ('datasets', 'utils', 'model', 'main', 'embedding', 'dataloader') "
              "if (s := importlib.util.find_spec(m)) and s.origin and s.origin.startswith(" + repr(str(REPO)) + ")])")
    result = subprocess.run([_venv_python(), "-c", script], cwd=tmp_path, env=_clean_environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    recsys_file, wd_file, root_modules = result.stdout.splitlines()
    assert Path(recsys_file).resolve() == REPO / "recsys" / "__init__.py"
    assert Path(wd_file).resolve() == REPO / "wide_and_deep" / "__init__.py"
    assert root_modules == "[]"
    site = subprocess.run([_venv_python(), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    naming_the_root = [p.name for p in Path(site).glob("*.pth") if str(REPO) in p.read_text()]
    assert naming_the_root == []


def test_wide_and_deep_main_runs_from_its_folder_with_the_venv_alone():
    """The reference's `cd wide_and_deep && python main.py`: no PYTHONPATH, no .pth; --help is enough
    to import its whole command line."""
    result = subprocess.run([_venv_python(), "main.py", "--help"], cwd=REPO / "wide_and_deep",
                            env=_clean_environment(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--train_data_pattern" in result.stdout


# deployment/: the modules a serving environment without TensorFlow may import (the ONNX graph and the
# 8-bit tables; deployment/export.py, which restores checkpoints, imports TensorFlow and the root).
TENSORFLOW_FREE = ("deployment.onnx_graph", "deployment.quantize", "recsys.runtime.metrics", "recsys.runtime.cpu_settings")


def test_the_serving_side_modules_load_without_tensorflow():
    """Imported in a fresh interpreter, the modules of TENSORFLOW_FREE bring in neither TensorFlow nor
    Horovod nor a root module (which would import them)."""
    script = ("import sys; " + "; ".join(f"import {module}" for module in TENSORFLOW_FREE) + "; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('tensorflow', 'keras', 'horovod', 'model', 'saved_model', 'factory', 'datasets')))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=_clean_environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"

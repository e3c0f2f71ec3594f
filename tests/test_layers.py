"""The house stays as built: imports run one way, from the renderers down to the model, and no
modules import each other in a circle.

The layers and the independence of sibling capabilities are import-linter contracts in
pyproject.toml (``[tool.importlinter]``), run here through its ``lint-imports`` command; a
broken one fails with import-linter's own account of which import breaks it. Cycles are
checked on the import graph (grimp, the library import-linter builds it with) module by
module, package ``__init__`` modules included, which sibling contracts do not cover. Lazy
imports inside functions count as imports: a lazy upward import is still an upward one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")  # (comes with import-linter, the test extra's)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _lint_imports(src: Path, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_contracts_are_kept(tmp_path):
    r = _lint_imports(SRC, tmp_path)
    assert r.returncode == 0, f"an import-linter contract is broken:\n{r.stdout}\n{r.stderr}"
    assert "0 broken" in r.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    """The contract can fail: a copy of the package whose model imports the CLI, lazily."""
    copy = tmp_path / "src"
    shutil.copytree(SRC / "proflab", copy / "proflab", ignore=shutil.ignore_patterns("__pycache__", "*.so", "demo", "assets"))
    model = copy / "proflab" / "model" / "findings.py"
    model.write_text(model.read_text() + "\n\ndef _up():\n    from proflab.cli import main\n\n    return main\n")
    r = _lint_imports(copy, tmp_path)
    assert r.returncode != 0
    assert "proflab.model.findings -> proflab.cli" in r.stdout and "BROKEN" in r.stdout


def test_no_modules_import_each_other_in_a_circle():
    graph = grimp.build_graph("proflab")
    assert len(graph.modules) > 100, "the graph is not proflab's"
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in cycles)
    # and the check finds one where there is one: a helper taking a name back from its user
    graph.add_import(importer="proflab.render._text", imported="proflab.render.markdown")
    assert any({"proflab.render._text", "proflab.render.markdown"} <= set(c) for c in _cycles(graph))


def test_constants_kept_apart_by_the_layers_agree():
    """Where a lower layer cannot import a value (it would load polars, or the runtime of the
    profiled process imports nothing of proflab), it holds its own copy: the copies agree."""
    from proflab import readers
    from proflab.collect import _child
    from proflab.readers import budget, rundir

    assert readers._DEFAULT_BUDGET == budget.DEFAULT_BUDGET
    assert rundir.MIN_BARE_STEPS == _child.MIN_BARE_STEPS

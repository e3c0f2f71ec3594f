"""Declared minimum versions are tested ones: pyproject.toml's floors are exactly the pins of
.ci/floors.txt (which CI installs and runs the whole suite on), and under CI every one of
those packages is installed and imports, so no test of a dependency skips its way to green."""

from __future__ import annotations

import importlib
import os
import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ROOT / ".ci" / "floors.txt"
PYPROJECT = ROOT / "pyproject.toml"
CI_RUN = ROOT / ".ci" / "run"
README = ROOT / "README.md"

# distribution -> the module its users import (the DB-API of the ADBC drivers: what proflab uses)
IMPORTS = {
    "adbc-driver-sqlite": "adbc_driver_sqlite.dbapi",
    "adbc-driver-manager": "adbc_driver_manager.dbapi",
    "nvidia-ml-py": "pynvml",
    "import-linter": "importlinter",
    "mkdocs-material": "material",
}
_REQ = re.compile(r'^\s*"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(>=|==)\s*([0-9][0-9A-Za-z.+]*)\s*(?:;[^"]*)?"')  # (markers after ;)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> dict[str, str]:
    """Every requirement with a version in pyproject.toml (dependencies and extras): name -> floor."""
    out: dict[str, str] = {}
    for line in PYPROJECT.read_text(encoding="utf-8").splitlines():
        for item in re.findall(r'"[^"]+"', line):
            m = _REQ.match(item)
            if m and not line.lstrip().startswith(("requires", "#")):
                out[_norm(m.group(1))] = m.group(3)
    return out


def _pins() -> dict[str, str]:
    out = {}
    for line in FLOORS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[_norm(name)] = version.strip()
    return out


def _release(v: str) -> tuple[int, ...]:
    """(1, 24) for "1.24", "1.24.0" and "1.24.0+cpu": comparable release numbers."""
    parts = [int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4]]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def test_every_declared_floor_is_a_pinned_one():
    declared, pins = _declared(), _pins()
    assert declared, "no requirement found in pyproject.toml"
    assert set(declared) == set(pins), f"only in pyproject: {set(declared) - set(pins)}; only pinned: {set(pins) - set(declared)}"
    for name, floor in declared.items():
        assert _release(floor) == _release(pins[name]), f"{name}: pyproject says >={floor}, CI installs {pins[name]}"


def test_ci_runs_exactly_the_readme_commands_and_the_floors_job():
    readme = README.read_text(encoding="utf-8")
    block = readme.split("# 2. ", 1)[1].split("```", 1)[0]
    commands = [ln for ln in block.splitlines() if ln.startswith("python3 -m venv")]
    ci = [ln for ln in CI_RUN.read_text(encoding="utf-8").splitlines() if ln.startswith("python3 -m venv")]
    assert commands == ci, "the README's test commands and .ci/run differ"
    assert any("-c .ci/floors.txt" in c and c.endswith("-m pytest -q") for c in ci), "no floors job runs the suite"


@pytest.mark.parametrize("name", sorted(_pins()))
def test_installed_versions_are_allowed(name):
    """Installed at or above its floor; under CI (both of its environments install every
    extra), installed and importable, whatever a test's own skip conditions say."""
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed, yet CI installs every extra")
        pytest.skip(f"{name} is not installed here (an extra)")
    assert _release(version) >= _release(_pins()[name]), f"{name} {version} is below the floor {_pins()[name]}"
    if os.environ.get("CI") == "true":
        importlib.import_module(IMPORTS.get(name, name.replace("-", "_")))

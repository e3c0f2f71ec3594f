"""Shared fixtures: where the recorded traces live, and reports built from them once per session.

Recorded traces are real torch.profiler output under ``tests/data/kineto/``. A test that needs
one that is absent is skipped with the name of the missing file, never silently passed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
DATA_DIR = TESTS_DIR / "data"
KINETO_DIR = DATA_DIR / "kineto"

# CPU-only traces (activities=[CPU]): no kernel, memcpy or memset events at all.
CPU_TRACE_NAMES = ("cpu_only_train", "cpu_tiny")
_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json.xz", ".pt.trace.json", ".json.gz", ".json.xz", ".json")


def kineto_traces() -> list[Path]:
    """Every recorded Kineto trace file, sorted by name."""
    if not KINETO_DIR.is_dir():
        return []
    return sorted(p for p in KINETO_DIR.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz", ".json.xz")))


def trace_name(path: Path) -> str:
    name = path.name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _find_trace(name: str) -> Path:
    """The recorded trace called ``name`` (any of the usual suffixes); skips when absent."""
    for suffix in _SUFFIXES:
        p = KINETO_DIR / f"{name}{suffix}"
        if p.is_file():
            return p
    pytest.skip(f"recorded trace {name!r} is not in tests/data/kineto/ (see tests/data/record/record_kineto.py)")


def _first_cpu_trace() -> Path | None:
    for name in CPU_TRACE_NAMES:
        for suffix in _SUFFIXES:
            p = KINETO_DIR / f"{name}{suffix}"
            if p.is_file():
                return p
    return None


def _gpu_candidates() -> list[Path]:
    """Recorded traces that are not CPU-only, smallest first (keeps the suite fast)."""
    gpu = [p for p in kineto_traces() if not trace_name(p).startswith("cpu_")]
    return sorted(gpu, key=lambda p: (p.stat().st_size, p.name))


def _copy_trace(src: Path, dst_dir: Path, name: str | None = None) -> Path:
    """A private copy of a recorded trace, so a test can never modify the committed one."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / (name or src.name)
    shutil.copyfile(src, dst)
    return dst


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA_DIR


@pytest.fixture(scope="session")
def find_trace():
    """``find_trace(name) -> Path``: a recorded trace by name; skips the test when absent."""
    return _find_trace


@pytest.fixture(scope="session")
def copy_trace():
    """``copy_trace(src, dst_dir, name=None) -> Path``: a private, writable copy of a trace."""
    return _copy_trace


@pytest.fixture(scope="session")
def cpu_trace() -> Path:
    """A real CPU-only torch.profiler trace (no GPU events)."""
    p = _first_cpu_trace()
    if p is None:
        pytest.skip(f"no CPU-only trace ({' or '.join(CPU_TRACE_NAMES)}) in tests/data/kineto/")
    return p


@pytest.fixture(scope="session")
def gpu_trace() -> Path:
    """The smallest real trace with GPU activity."""
    import proflab

    for p in _gpu_candidates():
        if proflab.load(p).has_gpu:
            return p
    pytest.skip("no recorded GPU trace in tests/data/kineto/ yet")


@pytest.fixture(scope="session", params=["cpu", "gpu"], ids=["cpu-trace", "gpu-trace"])
def real_trace(request) -> Path:
    """Each kind of real trace: CPU-only and (when recorded) GPU."""
    return request.getfixturevalue(f"{request.param}_trace")


@pytest.fixture(scope="session")
def cpu_report(cpu_trace):
    import proflab

    return proflab.analyze(cpu_trace)


@pytest.fixture(scope="session")
def gpu_report(gpu_trace):
    import proflab

    return proflab.analyze(gpu_trace)


@pytest.fixture(scope="session", params=["cpu", "gpu"], ids=["cpu-trace", "gpu-trace"])
def real_report(request):
    return request.getfixturevalue(f"{request.param}_report")


@pytest.fixture(scope="session")
def report_schema() -> dict:
    """The published JSON Schema of ``proflab.report/1`` (shipped as package data)."""
    import json
    from importlib import resources

    try:
        text = resources.files("proflab").joinpath("schema/report.schema.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        pytest.skip("proflab ships no schema/report.schema.json")
    return json.loads(text)


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable

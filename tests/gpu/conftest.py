"""GPU tests: run only where torch sees a CUDA device (the GPU machine); skipped elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

RECORDER = Path(__file__).resolve().parents[1] / "data" / "record" / "record_kineto.py"


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def recorder():
    """The workload recorder that produced tests/data/kineto, imported from its file."""
    spec = importlib.util.spec_from_file_location("record_kineto", RECORDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _busy_gpu(seconds: float) -> None:
    """Keep GPU 0 busy with bf16 matmuls for about ``seconds`` (synchronised every 10)."""
    import time

    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


@pytest.fixture
def busy_gpu():
    """The matmul load the monitor and energy tests measure (see ``_busy_gpu``)."""
    return _busy_gpu

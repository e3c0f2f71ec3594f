"""``proflab run`` never hangs and never loses a run, on a GPU: every ending of the matrix
(``tests/collect/endings.py``) with CUDA work inside the window.

The first rows hung for ever before (H200, PyTorch 2.11, CUDA 13): a program that ends while
a time window (or a torch.profiler session of its own, stopped just before the end) records
left Kineto's CUPTI teardown thread waiting for a CUDA call, and glibc's
``pthread_cond_destroy`` waited for that thread at exit (benchmarks/probe_exit_hang.py).
Each test is bounded in wall time: a hang fails it instead of stalling the suite.

    python -m pytest -q tests/gpu/test_run_endings_gpu.py     # on the GPU machine
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collect"))
from endings import ENDINGS_MATRIX, check_ending, hang_library, run_ddp_ending, run_ending  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", list(ENDINGS_MATRIX))
def test_every_ending_returns_with_its_status_and_gpu_trace(tmp_path, mode):
    extra = []
    if mode == "hang_native":
        lib = hang_library(tmp_path)
        if lib is None:
            pytest.skip("no C compiler here to build the library whose destructor never returns")
        extra = [str(lib)]
    o = run_ending(tmp_path, mode, "cuda", extra)
    check_ending(o, mode, gpu=True)
    if mode not in ("hang_thread", "hang_native", "sigint", "sigterm"):
        # no hang and no exit clock: the run ends within seconds of the program's own end
        assert o.wall_s < 60, o.wall_s


@pytest.mark.parametrize("mode", ["fail", "early"])
def test_torchrun_with_a_rank_that_fails_or_leaves_early_returns(tmp_path, mode):
    o = run_ddp_ending(tmp_path, mode, "cuda")
    assert o.returncode != 0, o.err[-2000:]
    assert o.meta["exit_status"] == o.returncode
    assert sorted(t.name[:5] for t in o.traces()) == ["rank0", "rank1"], (o.meta.get("notes"), o.err[-3000:])

"""``proflab run`` never hangs and never loses a run, on the CPU: every ending of the matrix
(``endings.py``) returns within its bound with the program's exit status and its trace; the
endings that need a GPU to go wrong (Kineto's CUPTI teardown at exit) are also in
``tests/gpu/test_run_endings_gpu.py``. Real subprocesses, real torch.profiler traces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from endings import ENDINGS_MATRIX, check_ending, hang_library, run_ddp_ending, run_ending  # noqa: E402

pytest.importorskip("torch")


@pytest.mark.parametrize("mode", [m for m in ENDINGS_MATRIX if m != "hang_native"])
def test_every_ending_returns_with_its_status_and_trace(tmp_path, mode):
    o = run_ending(tmp_path, mode, "cpu")
    check_ending(o, mode)


def test_a_native_hang_after_exit_is_ended_and_says_so(tmp_path):
    lib = hang_library(tmp_path)
    if lib is None:
        pytest.skip("no C compiler here to build the library whose destructor never returns")
    o = run_ending(tmp_path, "hang_native", "cpu", [str(lib)])
    check_ending(o, "hang_native")
    # the trace was saved before the hang, so proflab ended it at once (no SIGTERM grace)
    assert o.meta["hung_at_exit"][0]["saved"] is True


def test_a_hang_is_ended_within_the_exit_timeout_and_its_grace(tmp_path):
    o = run_ending(tmp_path, "hang_thread", "cpu")
    check_ending(o, "hang_thread")
    h = o.meta["hung_at_exit"][0]
    assert h["saved"] is False and 3 <= h["waited_s"] < 15
    assert "proflab ended it (SIGTERM, then SIGKILL)" in " ".join(o.meta["notes"])


@pytest.mark.parametrize("mode", ["fail", "early"])
def test_torchrun_with_a_rank_that_fails_or_leaves_early_returns(tmp_path, mode):
    o = run_ddp_ending(tmp_path, mode, "cpu")
    assert o.returncode != 0, o.err[-2000:]  # rank 0's collective fails without its peer
    assert o.meta["status"] == "finished" and o.meta["exit_status"] == o.returncode
    names = sorted(t.name[:5] for t in o.traces())
    assert names == ["rank0", "rank1"], (o.meta.get("notes"), o.err[-3000:])


def test_exit_timeout_zero_never_fires(tmp_path):
    from proflab.collect.exitwatch import ExitWatch

    (tmp_path / "processes").mkdir()
    (tmp_path / "processes" / "1.exit").write_text('{"pid": 1, "main_finished_s": 0}')
    assert ExitWatch(tmp_path, 0).check() == []
    # pid 1 is alive but not a process of this run: never signalled
    assert ExitWatch(tmp_path, 5).check() == []

"""``proflab run --capture cuda-profiler-api`` on the CPU: the option's plumbing and refusals,
and what a program meets on a build without CUDA.

The interception itself (the CUDA runtime module's cudaProfilerStart/Stop, wrapped) needs a
CUDA build whose calls succeed: tests/gpu/test_capture_live.py runs it on the GPU machine.
Here the runtime's range is opened by the calls the wrapper makes (``capture_start(source=
"cuda-profiler-api")``), from a program thread, so the window's own part is tested for real.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proflab.cli import main
from proflab.collect import launcher

PROFLAB = [sys.executable, "-m", "proflab", "run", "--no-analyze", "--no-monitor"]


def test_the_option_reaches_the_child_as_its_window(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(launcher, "run", lambda cmd, opts, **kw: seen.append(opts) or 0)
    assert main(["run", "--capture", "cuda-profiler-api", "--", "true"]) == 0
    assert seen[0].capture == "cuda-profiler-api" and seen[0].window == "auto"
    cfg = launcher._child_config(seen[0], tmp_path)
    assert cfg["window"] == "cuda-profiler-api"
    assert cfg["delay_s"] is None  # no time window stands in for the range
    assert launcher._child_config(launcher.RunOptions(), tmp_path)["window"] == "auto"


@pytest.mark.parametrize("other", [["--window", "steps"], ["--window", "time"], ["--capture-range"]])
def test_a_second_way_to_set_the_window_is_refused(other, tmp_path, capsys):
    assert main(["run", "--capture", "cuda-profiler-api", *other, "-o", str(tmp_path), "--", "true"]) == 2
    assert "--capture cuda-profiler-api sets the window itself" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before a run directory was made


def test_an_unknown_capture_is_refused():
    with pytest.raises(Exception, match="unknown capture"):
        launcher.RunOptions(capture="nvtx").check()


def test_with_nsys_it_is_the_cuda_profiler_api_capture_range(tmp_path, stand_in_nsys):
    """A stand-in nsys (none can run here) records the command line it was given."""
    assert main(["run", "--no-monitor", "--backend", "nsys", "--capture", "cuda-profiler-api",
                 "-o", str(tmp_path / "runs"), "--", "true"]) == 0  # fmt: skip
    argv = stand_in_nsys.read_text().split("\n")
    assert "--capture-range=cudaProfilerApi" in argv and "--capture-range-end=stop" in argv


# A CPU build of torch has no CUDA runtime module: torch.cuda.profiler.start() fails inside
# torch.cuda.cudart() before any cudaProfilerStart. The program must meet exactly that error.
CALLS_START = """
import torch
try:
    torch.cuda.profiler.start()
except Exception as e:
    print("ERR", type(e).__name__, e)
x = torch.randn(64, 64)
for _ in range(3):
    x = x @ x
print("done")
"""


def test_on_a_cpu_build_the_program_meets_its_own_error_and_no_trace_is_claimed(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA build: tests/gpu/test_capture_live.py")
    prog = tmp_path / "prog.py"
    prog.write_text(CALLS_START)
    bare = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, timeout=120)
    run = subprocess.run([*PROFLAB, "--capture", "cuda-profiler-api", "-o", str(tmp_path / "runs"), "--",
                          sys.executable, str(prog)], capture_output=True, text=True, timeout=180)  # fmt: skip
    assert run.returncode == bare.returncode == 0, run.stderr
    err = [ln for ln in bare.stdout.splitlines() if ln.startswith("ERR")]
    assert err and err == [ln for ln in run.stdout.splitlines() if ln.startswith("ERR")]
    (rd,) = (tmp_path / "runs").iterdir()
    assert not list((rd / "traces").glob("*.json*"))
    (proc,) = [json.loads(p.read_text()) for p in (rd / "processes").glob("*.json")]
    assert "no CUDA" in proc["why_no_trace"] and "cudaProfilerStart" in proc["why_no_trace"]


# The calls the wrapper makes after a successful cudaProfilerStart/Stop, made by the program from
# a worker thread (an engine's executor thread), twice: only the first range is recorded, and it
# holds that thread's operators, not the main thread's before or after it.
RANGES = """
import threading, sys
import torch
rt = sys.modules["_proflab_run"].RUNTIME

def outside(n):
    with torch.profiler.record_function(f"outside{n}"):
        torch.randn(32, 32) @ torch.randn(32, 32)

def worker():
    rt.capture_start(source="cuda-profiler-api")
    with torch.profiler.record_function("inside_range"):
        for _ in range(4):
            torch.randn(48, 48) @ torch.randn(48, 48)
    rt.capture_stop(source="cuda-profiler-api")

outside(0)
t = threading.Thread(target=worker, name="executor")
t.start(); t.join()
rt.capture_start(source="capture")  # proflab.capture()'s kind of range: not this window's
outside(1)
rt.capture_stop(source="capture")
rt.capture_start(source="cuda-profiler-api")  # a second range: not recorded
outside(2)
rt.capture_stop(source="cuda-profiler-api")
print("done")
"""


def test_the_window_is_the_first_range_on_the_thread_that_opened_it(tmp_path):
    pytest.importorskip("torch")
    prog = tmp_path / "prog.py"
    prog.write_text(RANGES)
    run = subprocess.run([*PROFLAB, "--capture", "cuda-profiler-api", "-o", str(tmp_path / "runs"), "--",
                          sys.executable, str(prog)], capture_output=True, text=True, timeout=180)  # fmt: skip
    assert run.returncode == 0, run.stderr
    (rd,) = (tmp_path / "runs").iterdir()
    (trace,) = (rd / "traces").glob("*_capture.pt.trace.json.gz")
    import gzip

    names = {e.get("name") for e in json.load(gzip.open(trace))["traceEvents"]}
    assert "inside_range" in names
    assert not {"outside0", "outside1", "outside2"} & names
    (proc,) = [json.loads(p.read_text()) for p in (rd / "processes").glob("*.json")]
    assert any("first cudaProfilerStart/Stop range (thread executor)" in n for n in proc["notes"])
    assert any("more than one cudaProfilerStart/Stop range" in n for n in proc["notes"])

"""``proflab run --capture cuda-profiler-api`` on a GPU: the window is the program's own
cudaProfilerStart/Stop range, however the program calls them from Python.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_capture_live.py``.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

PROFLAB = [sys.executable, "-m", "proflab", "run", "--no-analyze", "--no-monitor", "--capture", "cuda-profiler-api"]

# TensorRT-LLM's PyTorch executor way: torch.cuda.cudart().cudaProfilerStart() from its executor
# thread around the iterations TLLM_PROFILE_START_STOP names; then a second range through
# torch.cuda.profiler.profile() on the main thread, which is not recorded.
PROGRAM = """
import threading
import torch

def work(name, n, size):
    with torch.profiler.record_function(name):
        x = torch.randn(size, size, device="cuda")
        for _ in range(n):
            x = torch.tanh(x @ x)
    return x

work("before", 20, 512)
torch.cuda.synchronize()

def executor():
    for it in range(6):
        if it == 2:
            torch.cuda.cudart().cudaProfilerStart()
        work(f"iteration{it}", 5, 384)
        if it == 3:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()

t = threading.Thread(target=executor, name="executor")
t.start(); t.join()
with torch.cuda.profiler.profile():
    work("second_range", 5, 256)
work("after", 20, 512)
torch.cuda.synchronize()
print("done", flush=True)
"""

# torch.cuda.profiler.start()/stop() on the main thread, the usual PyTorch way.
MAIN_THREAD = """
import torch
x = torch.randn(256, 256, device="cuda")
for i in range(10):
    if i == 4:
        torch.cuda.profiler.start()
    with torch.profiler.record_function(f"step{i}"):
        x = torch.tanh(x @ x)
    if i == 6:
        torch.cuda.profiler.stop()
torch.cuda.synchronize()
"""


def _run(tmp_path, program: str) -> tuple[set, dict, list]:
    prog = tmp_path / "prog.py"
    prog.write_text(program)
    r = subprocess.run([*PROFLAB, "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (rd,) = (tmp_path / "runs").iterdir()
    (trace,) = (rd / "traces").glob("*_capture.pt.trace.json.gz")
    events = json.load(gzip.open(trace))["traceEvents"]
    (proc,) = [json.loads(p.read_text()) for p in (rd / "processes").glob("*.json")]
    return {e.get("name") for e in events}, proc, events


def test_the_executor_threads_range_is_the_window(tmp_path):
    names, proc, events = _run(tmp_path, PROGRAM)
    assert {"iteration2", "iteration3"} <= names
    assert not {"before", "iteration0", "iteration1", "iteration4", "iteration5", "second_range", "after"} & names
    assert any(e.get("cat") == "kernel" for e in events)  # the range's GPU work is in it
    assert any("range (thread executor)" in n for n in proc["notes"])
    assert any("more than one cudaProfilerStart/Stop range" in n for n in proc["notes"])


def test_torch_cuda_profiler_start_stop_on_the_main_thread(tmp_path):
    names, proc, events = _run(tmp_path, MAIN_THREAD)
    assert {"step4", "step5", "step6"} <= names
    assert not {"step3", "step7"} & names
    assert sum(e.get("cat") == "kernel" and "gemm" in e.get("name", "").lower() for e in events) >= 3

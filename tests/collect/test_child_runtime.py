"""The in-process runtime (``_child.py``) driven directly, without a subprocess: the parts
that must hold whatever the profiled program does."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from proflab.collect import _child


def _runtime(tmp_path: Path, pid: int, **cfg) -> _child.Runtime:
    (tmp_path / "traces").mkdir(exist_ok=True)
    rt = _child.Runtime({"run_dir": str(tmp_path), **cfg})
    rt.pid = pid
    return rt


class _FakeProfile:
    """Stands in for torch.profiler.profile: export_chrome_trace writes a small gzip file,
    after running ``during`` (what another process does meanwhile)."""

    def __init__(self, during=None) -> None:
        self.during = during

    def export_chrome_trace(self, path: str) -> None:
        if self.during is not None:
            self.during()
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt") as f:
            json.dump({"traceEvents": []}, f)


def test_two_processes_exporting_at_once_both_keep_their_trace(tmp_path):
    # torchrun ranks close their step windows together: while rank 0 writes its trace
    # (Kineto's export takes seconds), rank 1 finishes its own and tidies up.
    r0, r1 = _runtime(tmp_path, 100), _runtime(tmp_path, 101)
    r0._export(_FakeProfile(during=lambda: r1._export(_FakeProfile())))
    assert r0.notes == [] and r1.notes == []
    names = sorted(p.name for p in (tmp_path / "traces").iterdir() if p.is_file())
    assert len(names) == 2 and all(n.endswith(".pt.trace.json.gz") for n in names)
    assert [p.name for p in (tmp_path / "traces").iterdir() if p.name.startswith(".")] == []


def _failing_profiler(*args, **kwargs):
    raise RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")


def test_a_profiler_that_fails_never_breaks_the_program(tmp_path, monkeypatch):
    # Each of these runs inside a call the program makes (a capture block, a step, the
    # SIGALRM handler that interrupts whatever it is doing): proflab's failure stays a note.
    rt = _runtime(tmp_path, 100, window="capture")
    rt.torch = object()  # torch "imported"; the profiler itself is what fails
    monkeypatch.setattr(rt, "_profiler", _failing_profiler)
    rt.capture_start()
    rt.capture_stop()
    assert rt.done and rt.prof is None
    assert any("proflab.capture()" in n and "INSUFFICIENT_PRIVILEGES" in n for n in rt.notes)

    rt = _runtime(tmp_path, 101, window="time", duration_s=10.0)
    rt.torch = object()
    monkeypatch.setattr(rt, "_profiler", _failing_profiler)
    rt._alarm_phase = "start"
    rt._on_alarm(14, None)
    assert rt.done and rt._alarm_phase is None
    assert any("time window failed" in n for n in rt.notes)

    # steps arriving after the time-window fallback restart the step profiler
    rt = _runtime(tmp_path, 102, window="auto")
    rt.torch = object()
    monkeypatch.setattr(rt, "_profiler", _failing_profiler)
    rt._provisional = True
    rt.step("optimizer")
    rt.step("optimizer")
    assert rt.done and rt.steps == 2
    assert [n for n in rt.notes if "step failed" in n] and not [n for n in rt.notes if "its own" in n]


def test_a_forked_child_does_not_flush_the_parents_profiler(tmp_path, monkeypatch):
    # A multiprocessing pool forked from the program inherits the runtime, its atexit and
    # SIGTERM handlers included (Pool.terminate() sends SIGTERM to every worker).
    stopped = []

    class Running(_FakeProfile):
        def stop(self):
            stopped.append(True)

    parent = os.getpid()
    rt = _runtime(tmp_path, parent, window="time")
    rt.torch, rt.prof, rt.prof_kind = object(), Running(), "time"
    monkeypatch.setattr(_child.os, "getpid", lambda: parent + 1)  # now "in the child"
    rt.finish()
    rt.record({"name": "from the worker"})
    monkeypatch.undo()
    assert stopped == [] and rt.prof is not None, "the child stopped the parent's profiler"
    assert not (tmp_path / "processes").exists() and list((tmp_path / "traces").iterdir()) == []
    assert json.loads((tmp_path / "events.jsonl").read_text())["pid"] == parent + 1

    rt.finish()  # the parent itself still flushes
    assert stopped == [True] and (tmp_path / "processes" / f"{parent}.json").exists()


def test_following_the_programs_profiler_never_breaks_it(tmp_path, monkeypatch):
    """The program's own torch.profiler, with proflab's copy failing at every point (a failure
    injected: on a healthy machine the copy does not fail): the program's start, step, stop and
    trace handler all still run."""
    torch = __import__("pytest").importorskip("torch")
    rt = _runtime(tmp_path, os.getpid())
    rt.torch = torch
    monkeypatch.setattr(torch.profiler.profile, "start", torch.profiler.profile.start)
    monkeypatch.setattr(torch.profiler.profile, "step", torch.profiler.profile.step)
    monkeypatch.setattr(torch.profiler.profile, "stop", torch.profiler.profile.stop)
    monkeypatch.setattr(torch.profiler.profile, "_proflab_followed", False, raising=False)
    rt._follow_program_profilers(torch)

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(rt, "_keep_program_trace", broken)
    monkeypatch.setattr(rt, "step", broken)
    seen = []
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=lambda p: seen.append(len(p.key_averages()))) as prof:  # fmt: skip
        for _ in range(3):
            torch.randn(8, 8).relu()
            prof.step()
    assert seen and seen[0] > 0  # the program's handler ran, with its events
    assert any("planted" in n for n in rt.notes)


def test_an_import_in_another_thread_is_no_safe_point(tmp_path):
    # A real import, held open in a thread: the time window must not start meanwhile.
    import sys
    import threading

    (tmp_path / "held_import_mod.py").write_text("import threading\nEVENT.wait(30)\n")
    rt = _runtime(tmp_path, os.getpid())
    assert rt._not_a_safe_point() is None
    gate = threading.Event()
    import builtins

    builtins.EVENT = gate  # what the module waits on while it is being imported
    sys.path.insert(0, str(tmp_path))
    t = threading.Thread(target=__import__, args=("held_import_mod",))
    try:
        t.start()
        deadline = 0
        while "held_import_mod" not in sys.modules and deadline < 3000:
            threading.Event().wait(0.01)
            deadline += 1
        assert rt._not_a_safe_point() == "an import was in progress on another thread"
    finally:
        gate.set()
        t.join(60)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("held_import_mod", None)
        del builtins.EVENT
    assert rt._not_a_safe_point() is None


def test_proflab_busy_is_no_safe_point(tmp_path):
    rt = _runtime(tmp_path, os.getpid())
    with rt._lock:
        assert rt._not_a_safe_point() == "proflab itself was busy"
    assert rt._not_a_safe_point() is None


# A SIGTERM sent from inside one of proflab's sections, as torchrun's lands on a rank whose
# time window is opening (the rank's first profiler start imports for seconds on a loaded
# machine) or whose trace is being saved at exit. Real torch.profiler, real signal; only the
# moment is the test's: the section calls `where`, which sends it.
_SIGTERM_INSIDE = """
import os, signal, sys
import torch
from proflab.collect import _child

where = sys.argv[2]
rt = _child.Runtime({"run_dir": sys.argv[1], "window": "capture", "record_shapes": False})
rt.install()
real = getattr(rt, where)

def signalled(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)

setattr(rt, where, signalled)
rt.capture_start()
torch.ones(64, 64) @ torch.ones(64, 64)
if where == "_export":
    rt.capture_stop()
print("the program went on after SIGTERM", flush=True)
"""


@pytest.mark.parametrize("where", ["_wait_settled", "_export"])
def test_a_sigterm_inside_proflabs_own_section_ends_the_process_after_it(tmp_path, where):
    pytest.importorskip("torch")
    import signal
    import subprocess
    import sys

    (tmp_path / "traces").mkdir()
    prog = tmp_path / "prog.py"
    prog.write_text(_SIGTERM_INSIDE)
    p = subprocess.run([sys.executable, str(prog), str(tmp_path), where], capture_output=True, text=True, timeout=240)
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stderr[-3000:])
    assert "went on" not in p.stdout  # the signal was acted on, as the section ended
    (info,) = (tmp_path / "processes").glob("*.json")
    notes = json.loads(info.read_text())["notes"]
    assert not any("failed" in n for n in notes), notes  # never stopped half started
    (trace,) = (tmp_path / "traces").glob("*.pt.trace.json.gz")
    assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]  # saved whole


def test_without_steps_the_time_window_starts_soon_after_the_first_cuda_work(tmp_path, monkeypatch):
    """Window auto: a program that never steps gets its time window _CUDA_GRACE_S after its CUDA
    context first exists (a 3 s inference benchmark is recorded), not delay_s after the torch
    import; before the context exists the timer only polls. A step in the grace claims the window."""
    import signal
    import types

    clock = [100.0]
    monkeypatch.setattr(_child.time, "perf_counter", lambda: clock[0])
    timers: list[float] = []
    monkeypatch.setattr(_child.signal, "setitimer", lambda which, s: timers.append(s))
    monkeypatch.setattr(_child.signal, "signal", lambda *a: None)
    monkeypatch.setattr(_child.signal, "getsignal", lambda *a: signal.SIG_DFL)
    cuda = types.SimpleNamespace(initialized=False, is_available=lambda: True,
                                 is_initialized=lambda: cuda.initialized, is_current_stream_capturing=lambda: False)
    rt = _runtime(tmp_path, 100, window="auto", delay_s=5.0, duration_s=10.0)
    rt.torch = types.SimpleNamespace(cuda=cuda)
    started: list[float] = []
    monkeypatch.setattr(rt, "_alarm", lambda: started.append(clock[0]))
    rt._arm_time_window()
    assert timers == [_child._RETRY_S]  # polls, rather than waiting the 5 s out
    clock[0] += 0.5
    rt._on_alarm(14, None)
    assert not started and timers[-1] == _child._RETRY_S
    cuda.initialized = True  # the program's first CUDA work
    clock[0] += 0.1
    rt._on_alarm(14, None)
    assert not started and rt._cuda_since == clock[0]
    clock[0] += _child._CUDA_GRACE_S
    rt._on_alarm(14, None)
    assert started == [clock[0]] and clock[0] - 100.0 < 5.0

    # a step within the grace: the step window records, no time window
    rt = _runtime(tmp_path, 101, window="auto", delay_s=5.0, duration_s=10.0)
    rt.torch = types.SimpleNamespace(cuda=cuda)
    started.clear()
    monkeypatch.setattr(rt, "_alarm", lambda: started.append(clock[0]))
    rt._arm_time_window()
    rt._on_alarm(14, None)
    rt.steps = 1
    clock[0] += 2 * _child._CUDA_GRACE_S
    rt._on_alarm(14, None)
    assert not started and rt._alarm_phase is None

    # no CUDA at all (a CPU build): the window waits delay_s as before
    timers.clear()
    rt = _runtime(tmp_path, 102, window="auto", delay_s=5.0, duration_s=10.0)
    rt.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    rt._arm_time_window()
    assert timers == [5.0]

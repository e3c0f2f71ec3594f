"""The instrumentation API, the monitor's pure parts and the nsys command line, on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.collect import monitor, nsys
from proflab.errors import BackendUnavailable, CollectError, UsageError


def test_public_names():
    for name in ("annotate", "capture", "step", "record", "profile", "GPUMonitor", "auto_profile",
                 "DetailedProfiler", "ProfCallback"):  # fmt: skip
        assert name in proflab.__all__ and getattr(proflab, name) is not None


def test_import_stays_light():
    code = ("import sys, proflab; proflab.annotate; proflab.step(); "
            "print(sorted(m for m in ('torch', 'polars', 'pynvml') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_without_torch_annotate_step_capture_are_noops(tmp_path):
    # torch hidden from the interpreter: the API must not need it
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import proflab\n"
        "@proflab.annotate\n"
        "def f(x): return x + 1\n"
        "with proflab.annotate('r'): y = f(1)\n"
        "proflab.step()\n"
        "with proflab.capture(): pass\n"
        "ev = proflab.record('e', k=1)\n"
        "print(y, ev['name'], ev['k'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "e", "1"]


def test_annotate_looks_for_nvtx_once():
    # no nvtx package (a finder that says so and counts the searches), no torch: the first
    # annotate looks for nvtx, the others must not search the import path again
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "tries = []\n"
        "class NoNvtx:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'nvtx':\n"
        "            tries.append(name)\n"
        "            raise ModuleNotFoundError(\"No module named 'nvtx'\", name=name)\n"
        "sys.meta_path.insert(0, NoNvtx())\n"
        "import proflab\n"
        "for _ in range(5):\n"
        "    with proflab.annotate('r'): pass\n"
        "print(len(tries))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_auto_profile_without_cuda_uses_perf_counter(capsys):
    calls = []

    @proflab.auto_profile(warmup=2, iterations=7, work_per_call=100, unit="items")
    def work(n):
        calls.append(n)
        return sum(range(n))

    assert work(20000) == sum(range(20000))
    assert len(calls) == 9
    t = work.timing
    assert t.clock == "perf_counter" and t.iterations == 7 and t.warmup == 2
    assert 0 < t.min_ms <= t.median_ms <= t.p95_ms <= t.max_ms
    assert t.min_ms <= t.mean_ms <= t.max_ms
    assert t.throughput_per_s == pytest.approx(100 / (t.mean_ms / 1e3))
    assert "perf_counter" in capsys.readouterr().err
    with pytest.raises(UsageError):
        proflab.auto_profile(iterations=0)(lambda: None)()


def test_p95_interpolates():
    from proflab.collect.timing import _p95

    assert _p95([float(i) for i in range(1, 101)]) == pytest.approx(95.05)
    assert _p95([3.0]) == 3.0


def test_profile_block_writes_an_analysed_run(tmp_path):
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    log = proflab.DetailedProfiler()
    with proflab.profile("blk", root=tmp_path, wait=1, warmup=1, active=3) as run:
        for i in range(7):
            with proflab.annotate("forward"):
                loss = m(torch.randn(8, 32)).sum()
            loss.backward()
            opt.step()
            log.record("after_step", i=i)
            proflab.step()
    assert run.path.parent == tmp_path and len(run.traces) == 1
    assert run.report.summary["step_count"] == 3
    trace = proflab.load(run.traces[0])
    names = set(trace.cpu["name"].to_list())
    assert "forward" in names and "proflab.event:after_step" in names
    events = [json.loads(x) for x in (run.path / "events.jsonl").read_text().splitlines()]
    assert [e["i"] for e in events] == list(range(7)) and len(log) == 7
    meta = json.loads((run.path / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["events"] == 7
    assert json.loads((run.path / "analysis.json").read_text())["summary"]["step_count"] == 3


def test_detailed_profiler_keeps_fields_named_like_its_own_keys():
    log = proflab.DetailedProfiler(sync=False)
    ev = log.record("layer", name="fc1", elapsed_s=-1.0, time_ns=0, gpu_memory_bytes=7, k=1)
    assert ev["name"] == "layer" and ev["elapsed_s"] >= 0 and ev["time_ns"] > 0 and ev["k"] == 1
    assert ev["field_name"] == "fc1" and ev["field_elapsed_s"] == -1.0 and ev["field_time_ns"] == 0
    assert ev["field_gpu_memory_bytes"] == 7  # renamed on every machine, not only where CUDA fills the key
    ev = log.record("layer", name="fc2", field_name="mine")
    assert ev["name"] == "layer" and ev["field_name"] == "mine" and ev["field_field_name"] == "fc2"
    assert len(log) == 2


def test_record_keeps_fields_named_like_its_own_keys():
    ev = proflab.record("epoch", name="mine", time_ns=0, loss=0.5)
    assert ev["name"] == "epoch" and ev["time_ns"] > 0 and ev["loss"] == 0.5
    assert ev["field_name"] == "mine" and ev["field_time_ns"] == 0


def test_profile_capture_window(tmp_path):
    torch = pytest.importorskip("torch")
    with proflab.profile("cap", root=tmp_path, window="capture") as run:
        torch.randn(16, 16) @ torch.randn(16, 16)  # outside: not recorded
        with proflab.capture():
            torch.randn(16, 16).relu()
    trace = proflab.load(run.traces[0])
    names = set(trace.cpu["name"].to_list())
    assert "aten::relu" in names and "aten::mm" not in names


def test_profile_that_cannot_start_stops_what_it_started(tmp_path, monkeypatch):
    """torch.profiler failing to start, with the GPU monitor already sampling, must stop the
    monitor and the half-started profiler. Neither happens for real on CPU: the monitor and the
    profiler's failure are injected with monkeypatch."""
    torch = pytest.importorskip("torch")
    from proflab.collect import api, launcher

    stopped = []

    class Monitor:
        def stop(self):
            stopped.append("monitor")
            return self

    class Profiler:
        def __init__(self, **kwargs):
            pass

        def start(self):
            raise RuntimeError("profiler already enabled")

        def stop(self):
            stopped.append("profiler")

    monkeypatch.setattr(launcher, "_start_monitor", lambda opts, meta: Monitor())
    monkeypatch.setattr(torch.profiler, "profile", Profiler)
    p = proflab.profile("fail", root=tmp_path)
    with pytest.raises(RuntimeError, match="already enabled"):
        p.__enter__()
    assert stopped == ["profiler", "monitor"]
    assert p not in api._ACTIVE and p._prof is None
    meta = json.loads((p.run.path / "meta.json").read_text())
    assert meta["status"] == "failed to start"
    assert any("profiler already enabled" in n for n in meta["notes"])


def test_profcallback_core_writes_the_seed_artifacts(tmp_path):
    torch = pytest.importorskip("torch")
    from proflab.collect.callbacks import ProfilingCore

    m = torch.nn.Linear(16, 16)
    core = ProfilingCore(tmp_path, wait=1, warmup=1, active=2, with_stack=True, profile_memory=True)
    core.start()
    for _ in range(5):
        m(torch.randn(4, 16)).sum().backward()
        core.step()
    core.stop()
    table = (tmp_path / "key_averages.txt").read_text()
    assert "aten::addmm" in table and "Self CPU" in table
    assert proflab.load(tmp_path / "trace.pt.trace.json.gz").steps.height == 2
    # stacks by the time that matters where it ran: CUDA self time when a GPU is present
    assert (tmp_path / ("stacks_cuda.txt" if torch.cuda.is_available() else "stacks_cpu.txt")).exists()
    assert not list(tmp_path.glob(".partial-*"))


def test_profcallback_artifact_that_fails_leaves_no_half_file(tmp_path):
    from proflab.collect.callbacks import ProfilingCore

    def torn(path):
        with open(path, "w") as f:
            f.write("half a table")
        raise OSError("disk full")

    core = ProfilingCore(tmp_path)
    with pytest.warns(UserWarning, match="key_averages.txt not written: OSError: disk full"):
        core._artifact("key_averages.txt", torn)
    assert list(tmp_path.iterdir()) == [] and core.written == []

    core._artifact("key_averages.txt", lambda p: Path(p).write_text("the table"))
    assert [p.name for p in tmp_path.iterdir()] == ["key_averages.txt"]
    assert (tmp_path / "key_averages.txt").read_text() == "the table"
    assert core.written == [tmp_path / "key_averages.txt"]


def test_profcallback_needs_a_framework():
    if "lightning" in sys.modules or "transformers" in sys.modules or "pytorch_lightning" in sys.modules:
        pytest.skip("a framework is imported in this session")
    with pytest.raises(UsageError, match="import lightning"):
        proflab.ProfCallback("out")
    with pytest.raises(UsageError, match="framework must be"):
        proflab.ProfCallback("out", framework="keras")


# -- the GPU monitor without a GPU ----------------------------------------------------------


def test_monitor_availability_says_why(capsys):
    a = monitor.available()
    if a.ok:
        pytest.skip("this machine has a GPU: the GPU tests cover it")
    assert not a and a.reason
    assert "NVML" in a.reason or "nvidia-ml-py" in a.reason
    with pytest.raises(BackendUnavailable):
        monitor.GPUMonitor().start()
    info = monitor.device_info()
    assert info == {"available": False, "reason": a.reason}


def test_monitor_stop_without_start_is_harmless():
    m = monitor.GPUMonitor(0.05)
    m.stop()
    m.stop()
    assert m.samples.height == 0 and m.samples.columns[: len(monitor.COLUMNS)] == list(monitor.COLUMNS)
    assert m.summary().samples == 0 and m.summary().energy_j is None
    with pytest.raises(UsageError):
        monitor.GPUMonitor(0)


def _frame(rows: list[dict]) -> pl.DataFrame:
    cols = {c: [r.get(c) for r in rows] for c in monitor.COLUMNS}
    return pl.DataFrame(cols, schema=monitor._schema()).with_columns(monitor._throttle_expr())


def test_summary_golden():
    # two devices, three ticks 0.1 s apart; device 1 has no energy counter and no GPM
    rows = []
    for k, t in enumerate((0.0, 0.1, 0.2)):
        rows.append({"device": 0, "time_ns": k, "elapsed_s": t, "power_w": 100.0 + 100 * k, "energy_j": 20.0 * k,
                     "util_gpu_pct": 50.0, "sm_clock_mhz": 1980.0, "temp_c": 40.0 + k, "mem_used_bytes": 2**30 * k,
                     "throttle_mask": 0x4 if k == 2 else 0x1, "gpm_sm_active_pct": 10.0 * k})  # fmt: skip
        rows.append({"device": 1, "time_ns": k, "elapsed_s": t, "power_w": 50.0, "util_gpu_pct": 0.0,
                     "throttle_mask": None})  # fmt: skip
    s = monitor.summarize(_frame(rows), duration_s=0.2, period_s=0.1)
    d0, d1 = s.devices
    assert d0.mean_power_w == 200.0 and d0.max_power_w == 300.0
    assert d0.energy_j == 40.0 and d0.energy_source == "counter"
    assert d0.energy_integrated_j == pytest.approx(0.1 * (100 + 200) / 2 + 0.1 * (200 + 300) / 2)  # 40 J
    assert d0.throttle == ("sw_power_cap",) and d0.max_temp_c == 42.0 and d0.max_mem_used_bytes == 2 * 2**30
    assert d0.gpm["gpm_sm_active_pct"] == 10.0 and d0.gpm["gpm_dram_bw_util_pct"] is None
    assert d1.energy_source == "integrated power" and d1.energy_j == pytest.approx(10.0)
    assert d1.throttle == ()
    assert s.energy_j == pytest.approx(50.0) and s.mean_power_w == 250.0
    assert s.max_power_w == 350.0  # the highest per-tick sum of both devices
    assert s.mean_util_gpu_pct == 25.0 and s.gpm["gpm_sm_active_pct"] == 10.0 and s.samples == 6


def test_throttle_names():
    assert monitor.throttle_names(0) == []
    assert monitor.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert monitor.throttle_names(None) is None


# -- nsys --------------------------------------------------------------------------------


def test_nsys_profile_argv_golden():
    argv = nsys.profile_argv("/x/nsys", "/runs/a b/traces/report", ["python", "train.py", "--lr", "0.1"],
                             capture_range=True, python_backtrace=True)  # fmt: skip
    assert argv == [
        "/x/nsys", "profile", "--trace=cuda,nvtx,osrt", "--cuda-memory-usage=true",
        "--output=/runs/a b/traces/report", "--force-overwrite=true",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "--python-backtrace=cuda", "--python-sampling=true",
        "python", "train.py", "--lr", "0.1",
    ]  # fmt: skip
    plain = nsys.profile_argv("nsys", "r", ["./app"])
    assert "--capture-range=cudaProfilerApi" not in plain and plain[-1] == "./app"
    assert nsys.export_argv("nsys", "r.nsys-rep", "r.sqlite") == [
        "nsys", "export", "--type=sqlite", "--output=r.sqlite", "--force-overwrite=true", "r.nsys-rep"
    ]


def test_exit_status_mapping():
    from proflab.collect.launcher import _run_name, exit_status

    assert exit_status(0) == 0 and exit_status(3) == 3 and exit_status(-2) == 130 and exit_status(-15) == 143
    assert _run_name(["python3", "-u", "train.py"]) == "train"
    assert _run_name(["python", "-m", "pkg.main"]) == "main"
    assert _run_name(["./a.out"]) == "a.out"


class _NVMLError(Exception):
    pass


def _fake_nvml(**overrides):
    """A pynvml stand-in: one GPU, every call answering, except those in ``overrides``."""
    import types

    m = types.SimpleNamespace(
        NVMLError=_NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlSystemGetDriverVersion=lambda: "550.1",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetHandleByIndex=lambda i: object(),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 << 30),
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
        nvmlDeviceGetName=lambda h: "NVIDIA H100",
        nvmlDeviceGetUUID=lambda h: "GPU-0",
        nvmlGpmQueryDeviceSupport=lambda h: types.SimpleNamespace(isSupportedDevice=1),
    )
    for k, v in overrides.items():
        setattr(m, k, v)
    return m


def test_device_info_never_raises(monkeypatch):
    def denied(i):
        raise _NVMLError("Insufficient Permissions")

    monkeypatch.setattr(monitor, "_nvml", lambda: _fake_nvml(nvmlDeviceGetHandleByIndex=denied))
    info = monitor.device_info()
    assert info["available"] is True and info["driver_version"] == "550.1"
    assert info["gpus"] == [{"index": 0, "error": "NVML nvmlDeviceGetHandleByIndex failed: Insufficient Permissions"}]

    monkeypatch.setattr(monitor, "_nvml", lambda: _fake_nvml())
    gpu = monitor.device_info()["gpus"][0]
    assert gpu["name"] == "NVIDIA H100" and gpu["power_limit_w"] == 700.0 and gpu["gpm_supported"] is True


def test_auto_profile_passes_the_functions_own_keywords():
    @proflab.auto_profile(warmup=1, iterations=2, report=False)
    def tag(x, name="default", warmup="w", unit="u"):
        return (x, name, warmup, unit)

    assert tag(1, name="mine", warmup="mine too", unit="kg") == (1, "mine", "mine too", "kg")
    assert tag.timing.name.endswith("tag") and tag.timing.iterations == 2 and tag.timing.unit is None


def _fake_nsys(tmp_path, monkeypatch, exit_status: int):
    """A stand-in for nsys (there is none here): it writes part of a file at --output, as an
    export does while it runs, and exits with ``exit_status``. Only the failure path is faked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in --output=*) printf "SQLite format 3" > "${a#--output=}";; esac; done\n'
        f"exit {exit_status}\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_nsys_export_that_fails_leaves_no_half_written_sqlite(tmp_path, monkeypatch):
    _fake_nsys(tmp_path, monkeypatch, exit_status=1)
    rep = tmp_path / "traces" / "report.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"")
    with pytest.raises(CollectError, match="nsys export exited 1"):
        nsys.export_sqlite(rep)
    assert sorted(p.name for p in rep.parent.iterdir()) == ["report.nsys-rep"]


def test_nsys_export_lands_under_its_final_name(tmp_path, monkeypatch):
    _fake_nsys(tmp_path, monkeypatch, exit_status=0)
    rep = tmp_path / "traces" / "report.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"")
    assert nsys.export_sqlite(rep) == rep.with_suffix(".sqlite")
    assert sorted(p.name for p in rep.parent.iterdir()) == ["report.nsys-rep", "report.sqlite"]

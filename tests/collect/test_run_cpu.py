"""``proflab run`` end to end on CPU: real subprocesses, real torch.profiler traces.

Needs torch (skipped where it is not installed, as in CI); the no-torch test runs everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import proflab
from proflab.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from scripts import NO_TORCH, TRAIN  # noqa: E402

PROFLAB = [sys.executable, "-m", "proflab"]


def _proflab_run(tmp_path: Path, *args: str, script: str = TRAIN, timeout: int = 120) -> subprocess.CompletedProcess:
    prog = tmp_path / "prog.py"
    prog.write_text(script)
    return subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog), *args],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )  # fmt: skip


def _only_run(tmp_path: Path) -> Path:
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _meta(run: Path) -> dict:
    return json.loads((run / "meta.json").read_text())


@pytest.fixture
def torch_required():
    pytest.importorskip("torch")


def test_training_script_run_directory(tmp_path, torch_required):
    done = _proflab_run(tmp_path, "14")
    assert done.returncode == 0, done.stderr
    run = _only_run(tmp_path)
    assert run.name.endswith("-prog")
    meta = _meta(run)
    assert meta["status"] == "finished" and meta["exit_status"] == 0
    assert meta["command"][-2:] == [str(tmp_path / "prog.py"), "14"]
    assert meta["versions"]["proflab"] == proflab.__version__
    import torch

    assert meta["versions"]["torch"] == torch.__version__
    assert meta["duration_s"] > 0
    if meta["gpu"]["available"]:  # a GPU machine: the monitor ran and said which GPUs
        assert meta["gpu"]["gpus"] and meta["monitor"]["samples"] > 0
    else:
        assert meta["gpu"]["reason"]
    assert "git" in meta  # None outside a git work tree: tmp_path is not in one
    assert meta["git"] is None
    proc = meta["processes"][0]
    assert proc["step_source"] == "optimizer" and proc["steps"] == 14
    # the trace: 5 active steps after 3 skipped and 1 warm-up, readable by proflab.load
    assert len(meta["traces"]) == 1
    trace = proflab.load(run / meta["traces"][0])
    assert trace.steps.height == 5
    assert not trace.has_gpu
    # the analysis: valid report JSON that says the GPU parts were skipped
    doc = json.loads((run / "analysis.json").read_text())
    assert doc["schema"] == "proflab.report/1"
    assert doc["summary"]["step_count"] == 5
    assert any(m["signal"] == "GPU activity" and "hot kernels" in m["skipped"] for m in doc["missing"])
    # the terminal summary: printed and kept
    assert "proflab run:" in done.stdout and "5 steps" in done.stdout and "missing: GPU activity" in done.stdout
    assert (run / "summary.txt").read_text() in done.stdout
    assert ("GPU monitor off" in done.stdout) is not bool(meta["gpu"]["available"])
    assert not list((run / "traces").glob(".partial*"))


def test_script_that_raises_keeps_the_trace(tmp_path, torch_required):
    done = _proflab_run(tmp_path, "40", "raise")
    assert done.returncode == 1
    assert "planted failure at step 10" in done.stderr
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert meta["exit_status"] == 1 and meta["status"] == "finished"
    # 11 steps taken: 3 skipped, 1 warm-up, 5 active, the window closed before the raise
    assert proflab.load(run / meta["traces"][0]).steps.height == 5
    assert json.loads((run / "analysis.json").read_text())["schema"] == "proflab.report/1"


def test_partial_window_is_flushed_at_exit(tmp_path, torch_required):
    # 6 steps: 3 skipped, 1 warm-up, then 2 whole active steps and the open third one (the
    # program's tail up to exit) when the program ends; exit must flush them
    done = _proflab_run(tmp_path, "6")
    assert done.returncode == 0, done.stderr
    meta = _meta(_only_run(tmp_path))
    assert proflab.load(_only_run(tmp_path) / meta["traces"][0]).steps.height == 3


def test_exit_status_3_is_propagated(tmp_path, torch_required):
    done = _proflab_run(tmp_path, "12", "exit3")
    assert done.returncode == 3
    meta = _meta(_only_run(tmp_path))
    assert meta["exit_status"] == 3 and meta["traces"]


# Starts the command with SIGINT ignored, as a script's background job (``cmd &``) is started.
_SIGINT_IGNORED = ["-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"]


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_to_proflab_flushes_and_exits_130(tmp_path, torch_required, inherited):
    """Also when proflab was started with SIGINT ignored (a CI job or batch script that ran it in
    the background): the program must still hear the SIGINT proflab forwards (it waited on a
    program that could not, for ever)."""
    prog = tmp_path / "prog.py"
    prog.write_text(TRAIN)
    wrap = [sys.executable, *_SIGINT_IGNORED] if inherited == "ignored" else []
    p = subprocess.Popen(
        [*wrap, *PROFLAB, "run", "-o", str(tmp_path / "runs"), "--active", "3", "--", sys.executable, str(prog), "100", "sleep"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        start_new_session=True,  # not the test runner's terminal group: proflab must forward SIGINT
    )  # fmt: skip
    deadline = time.monotonic() + 90
    line = ""
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if "READY" in line or not line:
            break
    assert "READY" in line, p.stderr.read()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=90)
    if p.returncode == 1 and "KeyboardInterrupt" in err:
        import torch

        if torch.cuda.is_available():
            # Measured on an H200 with torch 2.11, without proflab: a program that stops a CUDA
            # torch.profiler in an atexit handler after an unhandled KeyboardInterrupt exits 1,
            # not by SIGINT (a profiler left running segfaults instead). proflab reports the
            # status the program really had.
            pytest.xfail("torch with CUDA profiling exits 1, not 130, after Ctrl-C (torch's behaviour)")
    assert p.returncode == 130, err
    assert "KeyboardInterrupt" in err
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert meta["status"] == "interrupted" and meta["exit_status"] == 130 and meta["signals"] == ["SIGINT"]
    # steps 4..6 were recorded before the sleep; the trace is whole and readable
    assert proflab.load(run / meta["traces"][0]).steps.height == 3
    assert json.loads((run / "analysis.json").read_text())["summary"]["step_count"] == 3


def test_time_window_without_optimizer(tmp_path, torch_required):
    script = (
        "import time, torch\n"
        "t = time.time()\n"
        "while time.time() - t < 8.0:\n"
        "    torch.randn(64, 64) @ torch.randn(64, 64)\n"
    )
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--delay", "0.2", "--duration", "1", "--",
         sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert any("time window" in n for n in meta["notes"]), meta["notes"]
    trace = proflab.load(run / meta["traces"][0])
    mm = trace.cpu.filter(trace.cpu["name"] == "aten::mm")
    assert mm.height > 10
    # the window lasted about --duration (1 s), not the whole 8 s program (long enough for a
    # slow profiler start: CUPTI's on a GPU machine, a busy 2-core one, where the 0.5 s window
    # this test had caught fewer than 10 ops)
    span_s = ((mm["start_ns"] + mm["dur_ns"]).max() - mm["start_ns"].min()) / 1e9
    assert 0.2 < span_s < 2.5, span_s  # the alarm that stops it waits for the GIL on a busy machine


def test_steps_after_the_time_fallback_win(tmp_path, torch_required):
    # slow "loading" after the torch import, then training: the step window replaces the
    # provisional time window
    script = TRAIN.replace("torch.manual_seed(0)", "time.sleep(1.0)\ntorch.manual_seed(0)")
    prog = tmp_path / "prog.py"
    prog.write_text(script)
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--delay", "0.2", "--duration", "0.3", "--",
         sys.executable, str(prog), "12"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert len(meta["traces"]) == 1, meta
    assert any("recorded the step window instead" in n for n in meta["notes"]), meta["notes"]
    assert proflab.load(run / meta["traces"][0]).steps.height == 5
    # the fallback window was saved (a session stopped and never saved slows every later
    # kernel launch on a GPU), kept aside where analysis does not look
    (proc,) = [p for p in meta["processes"] if p["profiled"]]
    assert [Path(t).parent.name for t in proc["startup_traces"]] == ["startup"], proc
    assert (run / proc["startup_traces"][0]).stat().st_size > 0


SLOW_IMPORT = """
import time
t = time.monotonic()
while time.monotonic() - t < 2.5:  # a long import: module-level work, then more imports
    sum(i * i for i in range(10000))
import json.decoder
"""


def test_the_time_window_waits_for_an_import_in_progress(tmp_path, torch_required):
    # The timer comes due 0.3 s after the torch import, inside a 2.5 s import: starting
    # torch.profiler there once failed with a circular ImportError and lost the run. It must
    # wait for the import's end; the steps after it still get their step window.
    (tmp_path / "slowmod.py").write_text(SLOW_IMPORT)
    script = TRAIN.replace("torch.manual_seed(0)", "import slowmod\ntorch.manual_seed(0)")
    prog = tmp_path / "prog.py"
    prog.write_text(script)
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--delay", "0.3", "--duration", "5", "--",
         sys.executable, str(prog), "12"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    meta = _meta(_only_run(tmp_path))
    (proc,) = [p for p in meta["processes"] if p["profiled"]]
    assert proc["time_window_waited_s"] > 0.5, proc
    assert "an import was in progress" in proc["time_window_waited_for"], proc
    assert meta["recorded"] and proflab.load(_only_run(tmp_path) / meta["traces"][0]).steps.height == 5


def test_a_time_window_due_inside_an_import_starts_after_it(tmp_path, torch_required):
    (tmp_path / "slowmod.py").write_text(SLOW_IMPORT)
    script = (
        "import time, torch\n"
        "import slowmod\n"
        "t = time.time()\n"
        "while time.time() - t < 8.0:\n"
        "    torch.randn(64, 64) @ torch.randn(64, 64)\n"
    )
    (tmp_path / "prog.py").write_text(script)
    # a 2 s window inside an 8 s loop: on a loaded machine starting the profiler alone can
    # take most of a second, and the window must still hold the loop
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--window", "time", "--delay", "0.3", "--duration", "2",
         "--", sys.executable, "prog.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = _only_run(tmp_path)
    meta = _meta(run)
    (proc,) = [p for p in meta["processes"] if p["profiled"]]
    assert proc["time_window_waited_s"] > 0.5, proc
    assert meta["recorded"], meta["why_no_trace"]
    trace = proflab.load(run / meta["traces"][0])
    assert trace.cpu.filter(trace.cpu["name"] == "aten::mm").height > 10  # the loop after the import


def test_a_run_that_recorded_nothing_says_so_first(tmp_path, torch_required):
    # 2 steps, then the program ends long before the time window (30 s) would come
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--delay", "30", "--", sys.executable, "-c",
         TRAIN, "2"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = done.stdout[done.stdout.index("proflab run:"):]  # after the program's own output
    first = summary.splitlines()[0]
    assert first.startswith("proflab run: NO TRACE RECORDED: the program made 2 step(s)"), done.stdout[:500]
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert meta["recorded"] is False and meta["why_no_trace"] in first, meta
    assert (run / "summary.txt").read_text().splitlines()[0] == first


HF_TRAINER = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        ids = torch.randint(0, 200, (32,))
        return {"input_ids": ids, "labels": ids}

model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=200, n_positions=32))
args = TrainingArguments(output_dir="hf_out", max_steps=12, per_device_train_batch_size=4, report_to=[],
                         logging_steps=1000, save_strategy="no", disable_tqdm=True, use_cpu=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
print("done", flush=True)
"""


def test_hf_trainer_under_proflab_run_records_its_window(tmp_path, torch_required):
    pytest.importorskip("transformers")
    done = _proflab_run(tmp_path, script=HF_TRAINER, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert meta["recorded"], meta["why_no_trace"]
    assert proflab.load(run / meta["traces"][0]).steps.height == 5


DDP_GLOO = """
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
for _ in range(12):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""


def test_torchrun_two_processes_each_record_their_window(tmp_path, torch_required):
    (tmp_path / "prog.py").write_text(DDP_GLOO)
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--", sys.executable, "-m", "torch.distributed.run",
         "--standalone", "--nproc_per_node", "2", "prog.py"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert sorted(Path(t).name[:5] for t in meta["traces"]) == ["rank0", "rank1"], meta
    for t in meta["traces"]:
        assert proflab.load(run / t).steps.height == 5


def test_program_without_torch_runs_unaffected(tmp_path):
    done = _proflab_run(tmp_path, script=NO_TORCH)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch imported: False" in done.stdout
    meta = _meta(_only_run(tmp_path))
    assert meta["traces"] == [] and meta["analysis"]["note"] == "no trace was recorded"
    assert any("never imported torch" in n for n in meta["notes"]), meta["notes"]


def test_the_program_gets_the_users_environment(tmp_path, monkeypatch):
    """proflab tunes polars' allocator (and, for its analysis commands, numpy's BLAS threads)
    for itself through the environment: a program it runs sees the environment the user gave
    it, not that tuning."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:3")  # the user's own, kept as given
    script = "import os\nprint('env:', os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('_RJEM_MALLOC_CONF'))\n"
    done = _proflab_run(tmp_path, script=script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "env: None narenas:3" in done.stdout
    monkeypatch.delenv("_RJEM_MALLOC_CONF")
    (tmp_path / "again").mkdir()
    done = _proflab_run(tmp_path / "again", script=script)
    assert "env: None None" in done.stdout, done.stdout + done.stderr


def test_analysis_runs_with_one_blas_thread(tmp_path, monkeypatch):
    """The analysis commands set it (unless the user did) before numpy is imported."""
    from proflab.cli import _process

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delitem(sys.modules, "numpy", raising=False)  # as in a fresh `proflab analyze` process
    _process.one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    _process.one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "8"


def test_other_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'yes'\n")
    prog = tmp_path / "prog.py"
    prog.write_text("import os, sys\nsys.exit(0 if os.environ.get('OTHER_SITE') == 'yes' else 7)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(other), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog)],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_runs_lists_past_runs(tmp_path, capsys, torch_required):
    assert _proflab_run(tmp_path, "12").returncode == 0
    assert _proflab_run(tmp_path, "12", "exit3").returncode == 3
    rc = main(["runs", str(tmp_path / "runs"), "--width", "200"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [line for line in out.splitlines() if "prog" in line]
    assert len(lines) == 2, out
    assert any(" 3 " in line for line in lines) and any(" 0 " in line for line in lines)
    assert "healthy" in out or "none" in out or "null" in out


def test_runs_on_empty_folder(tmp_path, capsys):
    assert main(["runs", str(tmp_path / "nothing")]) == 0
    assert "no runs" in capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["run", "-o", str(tmp_path), "--"]) == 2
    assert "give the command" in capsys.readouterr().err
    assert main(["run", "-o", str(tmp_path), "--", "no-such-program-xyz"]) == 2
    assert "command not found" in capsys.readouterr().err
    assert main(["run", "-o", str(tmp_path), "--active", "0", "--", sys.executable, "-c", "pass"]) == 2
    assert main(["run", "-o", str(tmp_path), "--top", "-1", "--", sys.executable, "-c", "pass"]) == 2
    assert "--top" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "no run directory for a run that never started"


def test_nsys_missing_says_how_to_install(tmp_path, capsys, monkeypatch):
    # A machine with nsys on the PATH would run it; an empty PATH (plus the interpreter by
    # absolute path) makes "no nsys" real here.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["run", "--backend", "nsys", "-o", str(tmp_path / "r"), "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nsys" in err and "CUDA Toolkit" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind", ["schedule", "plain"])
def test_program_with_its_own_profiler_is_followed(tmp_path, torch_required, kind):
    """proflab steps aside for the program's torch.profiler, counts its prof.step() calls,
    and keeps a copy of what it recorded; the program's own output is untouched."""
    from scripts import OWN_PROFILER

    done = _proflab_run(tmp_path, kind, script=OWN_PROFILER)
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert [Path(t).name for t in meta["traces"]] == [Path(meta["traces"][0]).name]
    assert "_own1" in meta["traces"][0]
    assert any("its own torch.profiler" in n for n in meta["notes"]), meta["notes"]
    trace = proflab.load(run / meta["traces"][0])
    assert trace.cpu.filter(trace.cpu["name"] == "aten::addmm").height > 0
    (proc,) = [json.loads(p.read_text()) for p in (run / "processes").glob("*.json")]
    if kind == "schedule":
        assert proc["step_source"] == "profiler" and proc["steps"] == 8
        assert trace.steps.height == 3  # the program's active window: its ProfilerStep ranges
        assert len(list((tmp_path / "own_logs").glob("*.pt.trace.json"))) == 1  # its handler still ran
    else:
        assert proc["step_source"] == "optimizer"
        assert "Self CPU time total" in done.stdout
    assert (run / "analysis.json").exists()


def test_run_into_an_unusable_folder_is_one_line(tmp_path, capsys):
    not_a_dir = tmp_path / "afile"
    not_a_dir.write_text("x")
    assert main(["run", "-o", str(not_a_dir), "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(not_a_dir) in err and "Traceback" not in err


def test_runs_survives_a_foreign_meta_json(tmp_path, capsys):
    root = tmp_path / "runs"
    for name, text in [
        ("20240101-000000-list", "[]"),
        ("20240101-000001-types", '{"exit_status": "3", "duration_s": "slow", "command": 5, "analysis": []}'),
        ("20240101-000002-good", '{"name": "good", "exit_status": 0, "duration_s": 1.5, "command": ["python", "t.py"]}'),
    ]:
        (root / name).mkdir(parents=True)
        (root / name / "meta.json").write_text(text)
    assert main(["runs", str(root), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "good" in out and "types" in out and "list" not in out


def test_a_program_that_ends_as_its_window_closes_keeps_the_trace(tmp_path, torch_required):
    # The window closes in step 9 (wait 3, warm-up 1, active 5) and the program exits at once,
    # while the trace is still being compressed in the background: the exit must wait for it
    # (and once deadlocked doing so: the runtime held its lock while the compression thread
    # needed it).
    script = (
        "import sys, torch\n"
        "from torch import nn\n"
        "model = nn.Linear(8, 8)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "x = torch.randn(4, 8)\n"
        "for i in range(9):\n"
        "    loss = model(x).sum()\n"
        "    for _ in range(3000):  # many small ops: a trace of about 1 MiB, slow enough to compress\n"
        "        x = x * 1.0\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
    )
    done = _proflab_run(tmp_path, script=script, timeout=300)
    assert done.returncode == 0, done.stderr
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert meta["recorded"], meta["why_no_trace"]
    assert proflab.load(run / meta["traces"][0]).steps.height == 5


COMPILED = """
import torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
cm = torch.compile(m)
x = torch.randn(8, 32)
for i in range(12):
    loss = cm(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", flush=True)
"""


def test_torch_compile_records_one_step_window(tmp_path, torch_required):
    # torch.compile starts helper processes that import torch (compile workers, spawned
    # pools): none of them may record a window of its own
    # --delay 0.5 and a cold compile cache: the time window comes due during compilation
    # and the first backward pass, where it must wait (started inside the backward pass, it
    # once crashed the program at the window's end)
    (tmp_path / "prog.py").write_text(COMPILED)
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp_path / "runs"), "--delay", "0.5", "--", sys.executable, "prog.py"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )  # fmt: skip
    if done.returncode != 0 and "CppCompileError" in done.stderr + done.stdout:
        pytest.skip("torch.compile on CPU needs a working C++ compiler here")
    assert done.returncode == 0, done.stderr[-3000:]
    run = _only_run(tmp_path)
    meta = _meta(run)
    assert len(meta["traces"]) == 1, meta["traces"]
    assert proflab.load(run / meta["traces"][0]).steps.height == 5


def test_step_time_is_measured_outside_the_window(tmp_path, torch_required):
    """Steps before the window (its wait steps) and after it are timed without a profiler
    recording; the analysis judges the trace against that time, and the summary says what
    the profiler cost. (No timing is asserted: the machine may be busy.)"""
    from proflab.collect.rundir import unprofiled_step_ms

    done = _proflab_run(tmp_path, "22")
    assert done.returncode == 0, done.stderr
    run = _only_run(tmp_path)
    meta = _meta(run)
    st = meta["processes"][0]["step_times"]
    # 22 steps: the first 3 are not timed (warm-up), the window (1 warm-up + 5 active) and
    # the step that saved its trace are "profiled" or left out, the rest are bare
    assert st["bare_n"] >= 8 and st["profiled_n"] >= 4
    assert st["bare_ms"] > 0 and st["profiled_ms"] > 0
    assert st["clock"] == "host"  # no CUDA here: the GPU-side clock is tests/gpu/test_run_live.py's
    assert unprofiled_step_ms(run / meta["traces"][0]) == st["bare_ms"]
    assert f"host-side): {st['bare_ms']:.2f} ms without the profiler" in done.stdout
    # a trace outside a run directory has no measured step time
    assert unprofiled_step_ms(tmp_path / "prog.py") is None


def test_cupti_is_torn_down_after_the_window_unless_the_program_says_otherwise(tmp_path, monkeypatch):
    # Kineto leaves CUPTI initialised after a profiler stops unless TEARDOWN_CUPTI=1, and the
    # program's later kernel launches pay for it (measured on the GPU machine: the after-window
    # test of tests/gpu/test_run_live.py); the program's own setting is kept.
    script = "import os; print('TEARDOWN_CUPTI=' + str(os.environ.get('TEARDOWN_CUPTI')))\n"
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    done = _proflab_run(tmp_path, script=script)
    assert done.returncode == 0, done.stderr
    assert "TEARDOWN_CUPTI=1" in done.stdout
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    done = _proflab_run(tmp_path, script=script)
    assert "TEARDOWN_CUPTI=0" in done.stdout


def test_compare_of_two_runs_uses_their_measured_step_times(tmp_path, torch_required, capsys):
    """Two run directories: compare's step-time verdict rests on the step times measured
    outside the windows (each run keeps them in processes/<pid>.json)."""
    from proflab.collect.rundir import unprofiled_steps_ms

    for _ in range(2):
        assert _proflab_run(tmp_path, "22").returncode == 0
        time.sleep(1.1)  # run directories are named by the second
    runs = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert len(runs) == 2
    steps = [unprofiled_steps_ms(r) for r in runs]
    assert all(s is not None and len(s) >= 8 for s in steps)
    assert main(["compare", str(runs[0]), str(runs[1]), "-f", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step_time_ms"]["side"] == "unprofiled"


def test_scaling_command_takes_each_gpu_count():
    from proflab.cli.scaling import _scaling_command
    from proflab.errors import UsageError

    assert _scaling_command(["torchrun", "--nproc_per_node", "8", "t.py"], 2) == ["torchrun", "--nproc_per_node", "2", "t.py"]
    assert _scaling_command(["torchrun", "--nproc-per-node=8", "t.py"], 4) == ["torchrun", "--nproc-per-node=4", "t.py"]
    assert _scaling_command(["mpirun", "-n", "{gpus}", "python", "t.py", "--tag", "g{gpus}"], 2) == [
        "mpirun", "-n", "2", "python", "t.py", "--tag", "g2"]  # fmt: skip
    with pytest.raises(UsageError, match="placeholder"):
        _scaling_command(["python", "t.py"], 2)


def test_scaling_launches_one_run_per_gpu_count(tmp_path, torch_required):
    """`proflab scaling --gpus 1,2 -- torchrun ...` runs the program under proflab run at each
    count (CPU ranks over gloo here) and reports both efficiencies: from the profiled steps,
    and from the steps proflab run timed outside its window."""
    (tmp_path / "prog.py").write_text(DDP_GLOO.replace("range(12)", "range(40)"))
    for attempt in range(2):
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)
        done = subprocess.run(
            [*PROFLAB, "scaling", "--mode", "weak", "--gpus", "2,1", "--runs-dir", str(tmp_path / "runs"), "-f", "json",
             "--wait", "5", "--active", "3", "--no-monitor", "--",
             sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", "prog.py"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path,
        )  # fmt: skip
        # The CPU build of torch 2.13 now and then aborts a gloo rank as it exits, after its
        # profiled window and destroy_process_group() ("terminate called without an active
        # exception", SIGABRT: 2 of about 12 full suite runs on 2026-11-26): the program's
        # crash, which proflab reports as such (exit 2); one more run, never more.
        if done.returncode == 0 or "terminate called without an active exception" not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-3000:]
    points = json.loads(done.stdout)["points"]
    assert [p["gpus"] for p in points] == [1, 2]
    (batch,) = (tmp_path / "runs").iterdir()
    made = sorted(p.name.split("-")[-1] for p in batch.iterdir())
    assert made == ["1gpu", "2gpu"]
    for run in batch.iterdir():  # each run recorded as the options said, like `proflab run`
        meta = _meta(run)
        assert (meta["options"]["wait"], meta["options"]["active"], meta["options"]["monitor"]) == (5, 3, False)
        assert all(proflab.load(run / t).steps.height == 3 for t in meta["traces"])
    # runs recorded already: what is recorded cannot be set for them
    assert main(["scaling", "--mode", "weak", *map(str, batch.iterdir()), "--active", "3"]) == 2
    for p in points:
        assert p["step_ms"] > 0 and p["bare_step_ms"] > 0
    assert points[0]["efficiency_pct"] == 100.0 and points[1]["bare_efficiency_pct"] is not None

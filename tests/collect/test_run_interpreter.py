"""``proflab run -- python prog.py`` where that ``python`` has no torch (the PATH's, not the
environment's): the run says which interpreter ran the program and names one that has torch,
instead of only "the program never imported torch"."""

from __future__ import annotations

import importlib.util
import json
import sys
import venv
from pathlib import Path

import pytest

from proflab.cli import main
from proflab.collect import launcher


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A fresh environment without torch (no pip: nothing is installed into it)."""
    env = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    return env / "bin" / "python"


def test_run_names_the_interpreter_without_torch_and_one_with_it(tmp_path, capsys, bare_python):
    runs = tmp_path / "runs"
    rc = main(["run", "--no-monitor", "--no-analyze", "-o", str(runs), "--", str(bare_python), "-c", "import torch"])
    assert rc == 1  # the program's own exit status: its import failed
    (run_dir,) = runs.iterdir()
    meta = json.loads((run_dir / "meta.json").read_text())
    (note,) = [n for n in meta["notes"] if "never imported torch" in n]
    assert f"it ran in {bare_python} (`{bare_python}`), which has no torch" in note
    if importlib.util.find_spec("torch") is not None:  # proflab's own interpreter has it: named, with the command
        assert f"proflab's own interpreter has torch: proflab run -- {sys.executable} -c 'import torch'" in note
    else:
        assert f"{bare_python} -m pip install torch==2.13.0" in note
    assert meta["why_no_trace"] == note  # the summary's first line: NO TRACE RECORDED and why


def test_no_note_when_the_interpreter_has_torch():
    """A program that simply does not import torch, in an interpreter that has it: the note
    stays as it was (nothing to suggest)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed in this interpreter")
    assert launcher.interpreter_note([sys.executable, "-c", "pass"]) is None


def test_the_interpreter_of_a_script(tmp_path, bare_python):
    """torchrun and friends are scripts: their #! line names the interpreter."""
    script = tmp_path / "torchrun"
    script.write_text(f"#!{bare_python}\nprint('hi')\n")
    script.chmod(0o755)
    assert launcher.program_interpreter([str(script)]) == str(bare_python)
    env_line = tmp_path / "tool"
    env_line.write_text("#!/usr/bin/env python3\n")
    env_line.chmod(0o755)
    assert Path(launcher.program_interpreter([str(env_line)])).name.startswith("python3")
    not_python = tmp_path / "run.sh"
    not_python.write_text("#!/bin/sh\necho hi\n")
    not_python.chmod(0o755)
    assert launcher.program_interpreter([str(not_python)]) is None
    assert launcher.interpreter_note([str(not_python)]) is None


def test_a_cuda_torch_without_a_gpu_is_explained(tmp_path, monkeypatch):
    """A CUDA build of torch on a machine with no GPU: CUDA's own warnings at every run are
    explained in the run's notes (finalize, with what the program's process recorded)."""
    from proflab.collect import monitor

    (tmp_path / "processes").mkdir()
    (tmp_path / "processes" / "7.json").write_text(json.dumps({"pid": 7, "torch": "2.13.0+cu130", "torch_cuda": "13.0"}))
    monkeypatch.setattr(monitor, "device_info", lambda: {"available": False, "reason": "no driver"})
    meta = {"notes": [], "options": {"backend": "torch"}, "cwd": str(tmp_path), "command": ["python", "t.py"]}
    launcher.finalize(tmp_path, meta)
    (note,) = [n for n in meta["notes"] if "CUDA build" in n]
    assert "2.13.0+cu130" in note and "gpuGetDeviceCount failed with code 35" in note and "install selector gives for the CPU" in note
    # a CPU build: nothing to explain
    (tmp_path / "processes" / "7.json").write_text(json.dumps({"pid": 7, "torch": "2.13.0+cpu", "torch_cuda": None}))
    meta = {"notes": [], "options": {"backend": "torch"}, "cwd": str(tmp_path), "command": ["python", "t.py"]}
    launcher.finalize(tmp_path, meta)
    assert not [n for n in meta["notes"] if "CUDA build" in n]

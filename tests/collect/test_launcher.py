"""The launcher's own parts, without a profiled program: the summary header, finalize, and a
program that cannot start."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from proflab.cli import main
from proflab.collect import launcher


def test_header_says_missing_for_what_the_gpu_did_not_report():
    mon = {"samples": 12, "period_s": 0.1, "energy_j": None, "mean_power_w": 61.5, "max_power_w": None,
           "mean_util_gpu_pct": None, "gpm": {}}  # fmt: skip
    head = launcher._run_header(Path("r"), {"command": ["python", "t.py"], "monitor": mon})
    line = next(x for x in head.splitlines() if "GPU monitor" in x)
    assert "None" not in line
    assert "energy missing" in line and "power mean 61.5 W / max missing" in line and "GPU util missing" in line


@pytest.mark.filterwarnings("error")
def test_finalize_closes_events_jsonl(tmp_path):
    (tmp_path / "events.jsonl").write_text('{"name": "a"}\n{"name": "b"}\n')
    meta = {"notes": [], "options": {"backend": "nsys"}, "cwd": str(tmp_path)}
    launcher.finalize(tmp_path, meta)
    gc.collect()  # an unclosed file warns here, and the warning fails the test
    assert meta["events"] == 2


def test_program_that_cannot_start_keeps_the_notes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launcher, "_start_monitor", lambda opts, meta: meta["notes"].append("GPU monitor off: test"))
    prog = tmp_path / "not-a-program"
    prog.write_text("no interpreter line\n")
    prog.chmod(0o755)  # executable, so it is found, but exec() refuses it
    assert main(["run", "-o", str(tmp_path / "runs"), "--", str(prog)]) == 2
    assert "cannot start" in capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "failed to start"
    assert "GPU monitor off: test" in meta["notes"]
    assert any(str(prog) in n for n in meta["notes"])


def test_ctrl_c_while_finishing_keeps_the_outcome(tmp_path, capsys, monkeypatch):
    """Ctrl-C after the program ended, during proflab's own finishing work. The moment cannot
    be hit reliably with a real signal, so finalize raises the KeyboardInterrupt a Ctrl-C would."""

    def interrupted(run_dir, meta, *, monitor=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "finalize", interrupted)
    prog = tmp_path / "prog.py"
    prog.write_text("import sys; sys.exit(3)\n")
    import sys

    assert main(["run", "--no-monitor", "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog)]) == 130
    (meta_path,) = (tmp_path / "runs").glob("*/meta.json")
    meta = json.loads(meta_path.read_text())
    assert meta["exit_status"] == 3 and meta["status"] == "finished"
    assert any("Ctrl-C while proflab was finishing" in n for n in meta["notes"])
    assert "interrupted while finishing" in capsys.readouterr().err


def test_nsys_window_capture_is_the_capture_range(tmp_path, stand_in_nsys, capsys):
    """`--window capture` and `--capture-range` mean the same with nsys too. A stand-in nsys
    (none can run here) records the command line it was given and writes no report."""
    assert main(["run", "--no-monitor", "--backend", "nsys", "--window", "capture", "-o", str(tmp_path / "runs"),
                 "--", "true"]) == 0  # fmt: skip
    argv = stand_in_nsys.read_text().split("\n")
    assert "--capture-range=cudaProfilerApi" in argv and "--capture-range-end=stop" in argv
    (meta_path,) = (tmp_path / "runs").glob("*/meta.json")
    assert any("nsys wrote no report" in n for n in json.loads(meta_path.read_text())["notes"])


def test_cli_defaults_of_what_is_recorded_come_from_run_options(monkeypatch):
    # One place decides the defaults (RunOptions); the CLI only flips them.
    from proflab.cli import main
    from proflab.collect import launcher

    seen = []
    monkeypatch.setattr(launcher, "run", lambda cmd, opts, **kw: seen.append(opts) or 0)
    default = launcher.RunOptions()
    flip = "--no-record-shapes" if default.record_shapes else "--record-shapes"
    assert main(["run", "--", "true"]) == 0
    assert main(["run", flip, "--with-stack", "--", "true"]) == 0
    assert (seen[0].record_shapes, seen[0].with_stack) == (default.record_shapes, default.with_stack)
    assert (seen[1].record_shapes, seen[1].with_stack) == (not default.record_shapes, True)

"""The ``proflab`` command, through ``main(argv)`` and as a real subprocess, on real traces."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import proflab
from proflab.cli import main
from proflab.report import SCHEMA_ID


def _validate(doc: dict, schema: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, schema)


def _strict_json(text: str):
    """json.loads that refuses NaN/Infinity, which are not JSON."""

    def bad(const):
        raise ValueError(f"non-standard JSON constant {const}")

    return json.loads(text, parse_constant=bad)


# -- main(argv) --------------------------------------------------------------------------------


def test_analyze_prints_terminal_summary(real_trace, capsys):
    rc = main(["analyze", str(real_trace)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    assert lines, "no output"
    assert real_trace.name in lines[0]
    assert re.search(r"\d+ steps", out)
    assert "Findings" in out
    assert not out.lstrip().startswith("{"), "terminal output must not be JSON"
    assert "\x1b[" not in out, "no colour codes when stdout is not a terminal"
    assert max(len(line) for line in lines) <= 80


def test_analyze_json_parses_and_follows_the_schema(real_trace, report_schema, capsys):
    rc = main(["analyze", str(real_trace), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = _strict_json(out)
    assert doc["schema"] == SCHEMA_ID == "proflab.report/1"
    assert doc["source"]["inputs"][0]["path"] == str(real_trace)
    assert doc["source"]["tool"] == {"name": "proflab", "version": proflab.__version__}
    _validate(doc, report_schema)


def test_json_matches_the_api(real_trace, capsys):
    """The CLI adds nothing and loses nothing on the way from analyze() to JSON."""
    rc = main(["analyze", str(real_trace), "-f", "json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    api = json.loads(json.dumps(proflab.analyze(real_trace).to_dict()))
    assert json.loads(out) == api


def test_top_limits_the_kernel_table(gpu_trace, capsys):
    assert main(["analyze", str(gpu_trace), "-f", "json", "--top", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert 1 <= len(doc["kernels"]) <= 2
    totals = [k["total_ms"] for k in doc["kernels"]]
    assert totals == sorted(totals, reverse=True)


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("report.json", lambda t: _strict_json(t)["schema"] == SCHEMA_ID),
        ("report.md", lambda t: t.startswith("# proflab report")),
        ("report.markdown", lambda t: t.startswith("# proflab report")),
        ("report.txt", lambda t: t.startswith("proflab ") and not t.startswith("#")),
    ],
)
def test_output_format_from_suffix_written_atomically(name, check, tmp_path, cpu_trace, capsys):
    out_dir = tmp_path / "out"
    target = out_dir / name
    rc = main(["analyze", str(cpu_trace), "-o", str(target)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out == "", "with -o nothing goes to stdout"
    assert check(target.read_text(encoding="utf-8"))
    assert sorted(p.name for p in out_dir.iterdir()) == [name], "temporary files left behind"


def test_explicit_format_beats_the_suffix(tmp_path, cpu_trace, capsys):
    target = tmp_path / "report.md"
    assert main(["analyze", str(cpu_trace), "-f", "json", "-o", str(target)]) == 0
    assert _strict_json(target.read_text())["schema"] == SCHEMA_ID


def test_output_replaces_an_existing_report(tmp_path, cpu_trace, capsys):
    target = tmp_path / "report.json"
    target.write_text("old contents\n")
    assert main(["analyze", str(cpu_trace), "-o", str(target)]) == 0
    assert _strict_json(target.read_text())["schema"] == SCHEMA_ID
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_failed_run_leaves_the_old_report_alone(tmp_path, capsys):
    target = tmp_path / "report.json"
    target.write_text("old contents\n")
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    assert main(["analyze", str(bad), "-o", str(target)]) == 2
    assert target.read_text() == "old contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "report.json"]


def test_several_inputs_give_a_json_array(tmp_path, cpu_trace, report_schema, capsys, copy_trace):
    other = copy_trace(cpu_trace, tmp_path, "second.pt.trace.json.gz")
    rc = main(["analyze", str(cpu_trace), str(other), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    docs = _strict_json(out)
    assert isinstance(docs, list) and len(docs) == 2
    assert [d["source"]["inputs"][0]["path"] for d in docs] == [str(cpu_trace), str(other)]
    for d in docs:
        _validate(d, report_schema)
    # same bytes, same analysis
    assert docs[0]["summary"] == docs[1]["summary"]


def test_several_inputs_in_terminal_and_markdown(tmp_path, cpu_trace, capsys, copy_trace):
    other = copy_trace(cpu_trace, tmp_path, "second.pt.trace.json.gz")
    assert main(["analyze", str(cpu_trace), str(other)]) == 0
    term = capsys.readouterr().out
    assert cpu_trace.name in term and "second.pt.trace.json.gz" in term
    assert main(["analyze", str(cpu_trace), str(other), "-f", "md"]) == 0
    md = capsys.readouterr().out
    assert md.count("# proflab report") == 2


def test_tensorboard_trace_handler_folder(tmp_path, cpu_trace, capsys, copy_trace):
    # tensorboard_trace_handler writes <worker>.<timestamp_ms>.pt.trace.json[.gz] into a folder
    folder = tmp_path / "tb_logs"
    a = copy_trace(cpu_trace, folder, "host_123.1790857026000.pt.trace.json.gz")
    b = copy_trace(cpu_trace, folder, "host_123.1790857027000.pt.trace.json.gz")
    (folder / "events.out.tfevents.1790857026").write_bytes(b"\x00\x01not a trace")
    (folder / "plugins").mkdir()
    rc = main(["analyze", str(folder), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    docs = _strict_json(out)
    assert [d["source"]["inputs"][0]["path"] for d in docs] == [str(a), str(b)]


def test_folder_with_one_trace_gives_one_report(tmp_path, cpu_trace, capsys, copy_trace):
    folder = tmp_path / "tb_logs"
    copy_trace(cpu_trace, folder, "host_1.1790857026000.pt.trace.json.gz")
    assert main(["analyze", str(folder), "-f", "json"]) == 0
    assert isinstance(_strict_json(capsys.readouterr().out), dict)


def test_width_option(cpu_trace, capsys):
    assert main(["analyze", str(cpu_trace), "--width", "60"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 60


def test_color_always_adds_ansi_codes(cpu_trace, capsys):
    assert main(["analyze", str(cpu_trace), "--color", "always"]) == 0
    assert "\x1b[" in capsys.readouterr().out
    assert main(["analyze", str(cpu_trace), "--color", "never"]) == 0
    assert "\x1b[" not in capsys.readouterr().out


def test_negative_top_is_a_usage_error(cpu_trace, capsys):
    assert main(["analyze", str(cpu_trace), "--top", "-1"]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "--top" in err


@pytest.mark.parametrize("argv", [["--help"], ["analyze", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: proflab")
    assert "analyze" in out


def test_help_and_analysis_leave_the_launcher_unloaded(cpu_trace, tmp_path):
    """Building the command line reads what ``run`` records by default without importing the
    launcher (its subprocess and run-directory machinery): ``--help`` and an analysis pay
    nothing for it. Its options' defaults still come from the one place RunOptions reads."""
    code = ("import sys; from proflab.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "print(rc, 'proflab.collect.launcher' in sys.modules)")  # fmt: skip
    for argv in (["--help"], ["run", "--help"], ["analyze", str(cpu_trace), "-f", "json", "-o", str(tmp_path / "r.json")]):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
        assert r.stdout.split()[-2:] == ["0", "False"], (argv, r.stdout[-300:], r.stderr)
    from proflab.collect import defaults, launcher

    assert (launcher.RunOptions().record_shapes, launcher.RunOptions().with_stack) == (defaults.RECORD_SHAPES, defaults.WITH_STACK)


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "analyze" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"proflab {proflab.__version__}"


def test_unknown_format_is_rejected_by_argparse(cpu_trace, capsys):
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(cpu_trace), "-f", "xml"])
    assert e.value.code == 2
    assert "xml" in capsys.readouterr().err


# -- as a real process ---------------------------------------------------------------------------


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_python_dash_m(tmp_path, cpu_trace):
    r = _run([sys.executable, "-m", "proflab", "analyze", str(cpu_trace), "-f", "json"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert _strict_json(r.stdout)["schema"] == SCHEMA_ID


def test_python_dash_m_terminal_and_version(tmp_path, cpu_trace):
    r = _run([sys.executable, "-m", "proflab", "analyze", str(cpu_trace)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert cpu_trace.name in r.stdout.splitlines()[0]
    r = _run([sys.executable, "-m", "proflab", "--version"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"proflab {proflab.__version__}"


def test_python_dash_m_writes_output_file(tmp_path, cpu_trace):
    r = _run([sys.executable, "-m", "proflab", "analyze", str(cpu_trace), "-o", "out/r.md"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert (tmp_path / "out" / "r.md").read_text().startswith("# proflab report")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["r.md"]


def test_console_script(tmp_path, cpu_trace):
    exe = shutil.which("proflab", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the proflab console script is not installed next to this interpreter")
    r = _run([exe, "analyze", str(cpu_trace), "-f", "json"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert _strict_json(r.stdout)["schema"] == SCHEMA_ID
    r = _run([exe, "--help"], tmp_path)
    assert r.returncode == 0 and "analyze" in r.stdout


def _ending(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """A process that does ``body`` (``P``: a path in ``tmp_path``), then ends as the command does."""
    code = f"import atexit, sys, threading, time\nfrom proflab.cli._process import end\nP = {str(tmp_path / 'mark')!r}\n{body}"
    return _run([sys.executable, "-c", code], tmp_path)


def test_end_runs_atexit_functions_and_flushes_output(tmp_path):
    r = _ending(tmp_path, "atexit.register(lambda: open(P, 'w').write('ran'))\n"
                          "sys.stdout.write('x' * 100_000 + ' no newline'); sys.stderr.write('err, no newline')\nend(3)")
    assert r.returncode == 3
    assert r.stdout == "x" * 100_000 + " no newline" and r.stderr == "err, no newline"
    assert (tmp_path / "mark").read_text() == "ran"


def test_end_waits_for_a_thread_that_is_not_a_daemon(tmp_path):
    # a thread still working: the usual exit, which waits for it (and then its status)
    r = _ending(tmp_path, "def late():\n    time.sleep(0.5)\n    open(P, 'w').write('done')\n"
                          "threading.Thread(target=late).start()\nend(None)")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mark").read_text() == "done"


def test_end_with_the_reader_gone(tmp_path, cpu_trace):
    # `proflab sql T ... | head -c 1`: the pipe closes before the output (megabytes) is written
    proc = subprocess.Popen([sys.executable, "-m", "proflab", "sql", str(cpu_trace), "SELECT range AS n FROM range(300000)",
                             "-f", "csv"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1) == b"n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 1) and "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.parametrize(
    "inherited, expected",
    [
        (None, "dirty_decay_ms:0,muzzy_decay_ms:0"),
        # what polars 1.37 / earlier 1.x wrote in a parent process that had imported it
        ("dirty_decay_ms:500,muzzy_decay_ms:1000", "dirty_decay_ms:0,muzzy_decay_ms:0"),
        ("dirty_decay_ms:500,muzzy_decay_ms:-1", "dirty_decay_ms:0,muzzy_decay_ms:0"),
        # polars' default followed by the parent's own setting: the setting is kept
        ("dirty_decay_ms:500,muzzy_decay_ms:1000,narenas:2", "narenas:2"),
        ("narenas:2", "narenas:2"),  # the user's own: never replaced
    ],
)
def test_the_allocator_returns_freed_pages_unless_the_user_said_otherwise(inherited, expected):
    # a fresh interpreter: the setting only matters before polars loads, and importing the
    # CLI must not load it
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if inherited is not None:
        env["_RJEM_MALLOC_CONF"] = inherited
    code = "import os, sys; from proflab.cli import _process; assert 'polars' not in sys.modules; _process.return_freed_memory(); print(os.environ['_RJEM_MALLOC_CONF'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_proflab_own_environment_is_undone_for_the_programs_it_runs(monkeypatch):
    """What proflab sets for itself is not what a program it runs gets; a variable changed
    by someone else after proflab set it is theirs."""
    from proflab import _env

    monkeypatch.setattr(_env, "_ORIGINAL", {})
    monkeypatch.setattr(_env, "_SET", {})
    monkeypatch.setenv("PROFLAB_TEST_A", "users")
    monkeypatch.delenv("PROFLAB_TEST_B", raising=False)
    _env.set_own("PROFLAB_TEST_A", "ours")
    _env.set_own("PROFLAB_TEST_B", "ours")
    assert os.environ["PROFLAB_TEST_A"] == os.environ["PROFLAB_TEST_B"] == "ours"
    env = _env.user_environ()
    assert env["PROFLAB_TEST_A"] == "users" and "PROFLAB_TEST_B" not in env
    monkeypatch.setenv("PROFLAB_TEST_B", "changed later")
    assert _env.user_environ()["PROFLAB_TEST_B"] == "changed later"
    _env.set_own("PROFLAB_TEST_B", "ours again")  # the new original is the value found
    assert _env.user_environ()["PROFLAB_TEST_B"] == "changed later"

"""Every command that writes a file says where, on stderr (stdout stays the output's): a
newcomer who ran ``analyze -o report.html`` used to get a 933 KB page and not a word."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from proflab.cli import main

DATA = Path(__file__).parent / "data"
TRAIN = DATA / "kineto" / "train_loop.pt.trace.json.gz"
MEMORY = DATA / "memory" / "fragmenting.pt.trace.json.gz"


def _said(err: str, path: Path) -> str:
    """The one line of ``err`` that says ``path`` was written, with its size."""
    lines = [ln for ln in err.splitlines() if ln.startswith("proflab: wrote ") and str(path) in ln]
    assert len(lines) == 1, f"expected one line saying {path} was written; stderr was:\n{err}"
    size = re.search(r"\(([\d,.]+ (?:bytes|KB|MB|GB))\)$", lines[0])
    assert size, lines[0]
    return lines[0]


@pytest.mark.parametrize("name", ["r.json", "r.md", "r.txt", "page.html"])
def test_analyze_output_says_where(tmp_path, capsys, name):
    out = tmp_path / name
    assert main(["analyze", str(TRAIN), "-o", str(out), "--no-cache"]) == 0
    cap = capsys.readouterr()
    assert out.stat().st_size > 0
    assert cap.out == ""
    line = _said(cap.err, out)
    kb = out.stat().st_size / 1e3
    if kb >= 1:  # the size said is the file's
        assert f"{kb:,.1f} KB" in line or f"{kb / 1e3:,.1f} MB" in line, line


def test_analyze_roofline_and_perfetto_say_where(tmp_path, capsys):
    page, svg, marked = tmp_path / "p.html", tmp_path / "roof.svg", tmp_path / "marked.json.gz"
    assert main(["analyze", str(TRAIN), "-o", str(page), "--roofline", str(svg), "--perfetto", str(marked)]) == 0
    err = capsys.readouterr().err
    _said(err, page)
    _said(err, svg)
    assert str(marked) in err  # the marked trace has its own line (it says how to open it)


def test_report_says_where_once(tmp_path, capsys):
    page = tmp_path / "r.html"
    assert main(["report", str(TRAIN), "-o", str(page)]) == 0
    err = capsys.readouterr().err
    _said(err, page)
    assert err.count(str(page)) == 1, err


def test_sql_memory_and_plots_say_where(tmp_path, capsys):
    pq, csv, png = tmp_path / "k.parquet", tmp_path / "k.csv", tmp_path / "m.png"
    assert main(["sql", str(TRAIN), "SELECT name FROM kernels LIMIT 3", "-o", str(pq)]) == 0
    _said(capsys.readouterr().err, pq)
    assert main(["sql", str(TRAIN), "SELECT name FROM kernels LIMIT 3", "-o", str(csv)]) == 0
    _said(capsys.readouterr().err, csv)
    assert main(["memory", str(MEMORY), "-o", str(png)]) == 0
    _said(capsys.readouterr().err, png)


def test_doctor_json_says_where(tmp_path, capsys):
    out = tmp_path / "doctor.json"
    main(["doctor", "-f", "json", "-o", str(out)])
    _said(capsys.readouterr().err, out)


def test_stdout_output_says_nothing(capsys):
    """Without -o the output is stdout itself: no line about a file."""
    assert main(["analyze", str(TRAIN), "-f", "json", "--no-cache"]) == 0
    assert "proflab: wrote" not in capsys.readouterr().err


def test_as_a_process(tmp_path):
    """What a newcomer sees in a shell: the line on stderr, nothing on stdout."""
    out = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "proflab", "analyze", str(TRAIN), "-o", str(out)],
                       capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    _said(r.stderr, out)

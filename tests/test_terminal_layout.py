"""The terminal report as a newcomer reads it, top-down, at 80 and 100 columns: a summary
screen first (verdict, GPU busy, each finding on one line with its saving, fix and `proflab
try` line), then the details; evidence in words with units; no number wrapped away from its
unit; kernel names cut in the middle so that they stay distinct; FLOPs that scale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len

import proflab
from proflab.render import render
from proflab.render._text import evidence_label, evidence_lines, glue_units, shorten_middle

KINETO = Path(__file__).parent / "data" / "kineto"
TRACES = ["train_loop", "sync_every_step", "starved_input", "tiny_kernels", "pageable_h2d", "fp32_matmul_no_tf32",
          "healthy_bf16_gemm", "cpu_only_train"]
UNIT_FIRST = re.compile(r"^\s*(ms|us|ns|%|GB/s|MiB|KiB|GiB|B|TFLOP|GFLOP|MFLOP|TFLOPS)(\s|$|[,;.)])")
RAW_KEY = re.compile(r"\b[a-z]+(?:_[a-z]+)*_(?:ms|us|pct|bytes|gbps)\b\s*[:=]")


@pytest.fixture(scope="module")
def reports():
    return {name: proflab.analyze(str(KINETO / f"{name}.pt.trace.json.gz")) for name in TRACES}


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("name", TRACES)
def test_width_and_wrapping(reports, name, width):
    out = render([reports[name]], "term", width=width)
    lines = out.splitlines()
    wide = [ln for ln in lines if cell_len(ln) > width]
    assert not wide, f"{len(wide)} lines wider than {width}: {wide[:2]}"
    split = [(a, b) for a, b in zip(lines, lines[1:]) if UNIT_FIRST.match(b) and re.search(r"\d$", a)]
    assert not split, f"a number wrapped away from its unit: {split[:2]}"
    assert "\ue000" not in out and "\xa0" not in out  # the glue is gone once wrapped
    assert not RAW_KEY.search(out), RAW_KEY.search(out).group(0)
    assert not re.search(r"^\s*·\s+- ", out, flags=re.M), "evidence rows printed as raw key=value lists"


@pytest.mark.parametrize("name", ["starved_input", "sync_every_step", "pageable_h2d"])
def test_the_summary_screen_comes_first(reports, name):
    r = reports[name]
    lines = render([r], "term", width=80).splitlines()
    details = lines.index("Details")
    summary = lines[:details]
    assert details <= 24, f"the summary screen is {details} lines"
    assert summary[1].startswith("Verdict: ")
    assert any(ln.startswith("GPU busy ") for ln in summary)
    for i, f in enumerate(r.findings, 1):
        row = next(ln for ln in summary if re.match(rf"\s*{i} {f.severity.upper()}\s", ln))
        assert f.id.split(":")[0] in row or f.category in row, row
        if f.est_gain_ms and f.category != "healthy":
            assert re.search(r"\d ms \(\d", row), row  # its predicted saving, in ms and %
        knob = f.evidence.get("proflab_try")
        if knob:  # its try line under it, before the details
            assert knob.split(" -- ")[0] in " ".join(summary), knob
    # the details follow: each finding's title and evidence after the summary
    rest = "\n".join(lines[details:])
    assert "Findings, largest predicted gain first" in rest


def test_finding_titles_wrap_under_themselves(reports):
    lines = render([reports["sync_every_step"]], "term", width=80).splitlines()
    head = next(i for i, ln in enumerate(lines) if re.match(r"\s*1 CRITICAL\s+Host synchronisation", ln))
    assert lines[head + 1].startswith(" " * 12), lines[head:head + 2]


def test_evidence_reads_as_words_with_units(reports):
    out = render([reports["sync_every_step"]], "term", width=100)
    assert "· sync idle: 27.817 ms" in out
    assert "idle: 22.2% of the window" in out
    assert "cudaStreamSynchronize, op aten::_local_scalar_dense, count 798" in out
    assert evidence_lines({"launch_idle_ms_range": [44.944, 44.944]}) == ["launch idle range: 44.944 ms"]
    assert evidence_lines({"profiler_cost_per_step_ms": [8.254, 50.806], "empty": [], "none": None}) == [
        "profiler cost per step: 8.254-50.806 ms"]
    assert evidence_label("gpu_busy_pct_by_device") == ("gpu busy by device", "%")


def test_kernel_names_are_cut_in_the_middle_and_stay_distinct(reports):
    r = reports["train_loop"]
    from proflab.render._text import kernel_label

    for width in (80, 100):
        lines = render([r], "term", width=width).splitlines()
        head = next(i for i, ln in enumerate(lines) if re.match(r"\s*#\s+hot kernel\s", ln))
        rows = lines[head + 1: head + 11]
        shown = [re.split(r"\s{2,}", ln.strip(), maxsplit=2)[1] for ln in rows]
        full = [kernel_label(k["name"]) for k in r.kernels[:10]]
        assert len(set(full)) == 10
        assert len(set(shown)) == 10, shown  # three nvjet GEMMs once printed alike
    assert shorten_middle("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 30).endswith("coopA_NNT")
    assert len(shorten_middle("x" * 100, 30)) == 30


def test_flops_scale_on_a_cpu_run(reports):
    out = render([reports["cpu_only_train"]], "term", width=80)
    section = out[out.index("Where the FLOPs go"):]
    assert "0 TFLOP" not in section and re.search(r"\d MFLOP a step", section)
    assert re.search(r"gemm\s+96\s+1\.634 GFLOP", section), section[:600]


def test_every_column_is_explained_once(reports):
    out = " ".join(render([reports["train_loop"]], "term", width=80).split())
    assert out.count("TC: runs on the tensor cores") == 1 and out.count("saves: the bare step time") == 1


def test_glue_keeps_numbers_on_their_units():
    assert glue_units("median 34.925 ms; 2 of 3 steps") == "median 34.925\ue000ms; 2 of 3 steps"


def test_markdown_and_html_show_evidence_as_tables(reports):
    r = reports["train_loop"]
    md = render([r], "md")
    assert "-&gt;" not in md and "-> " in md
    assert "| evidence | value |" in md and "| sync idle | 3.066 ms |" in md
    assert "| call | op | count | idle ms |" in md
    assert not re.search(r"^-\s+- ", md, flags=re.M), "nested lists of raw rows"
    from proflab.render.html import render_html

    page = render_html([r])
    assert '<table class="evidence">' in page and "<th>sync idle</th><td>3.066 ms</td>" in page


def test_a_comparison_wraps_with_its_units_and_no_glue_is_left(capsys):
    """The comparison's terminal view shares the line helper: the glue must be gone there too."""
    from proflab.cli import main

    before, after = (str(KINETO / f"{n}.pt.trace.json.gz") for n in ("sync_every_step", "healthy_bf16_gemm"))
    assert main(["compare", before, after, "--width", "80", "--no-cache"]) in (0, 1)
    out = capsys.readouterr().out
    assert "proflab compare:" in out and "\ue000" not in out
    lines = out.splitlines()
    assert all(cell_len(ln) <= 80 for ln in lines if not ln.startswith(("Kernels", "Where")))

"""The HTML report in a real browser: headless Chromium (Debian's ``chromium`` package,
installed by this module's set-up when missing) opens each page over the DevTools protocol
(tests/browser.py). A page fails on any console error, uncaught exception, failed request,
request for anything but the page itself, or JavaScript dialog; its findings and every chart
must be drawn (a canvas with pixels per chart), and a screenshot of each page is kept under
tests/artifacts/ (git-ignored). Skipped, with the reason, where Chromium cannot be installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import install_chromium, open_page
from proflab.cli import main

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
REALISTIC = ROOT / "tests" / "data" / "realistic"
RUNS = ROOT / "tests" / "data" / "runs"

READY = "/ drawn of /.test(document.body.getAttribute('data-charts') || '')"
PROBES = {
    "drawn": "document.body.getAttribute('data-charts')",
    "charts": "document.querySelectorAll('div.chart').length",
    # a chart is drawn when its canvas has a size and some non-white pixel
    "painted": """Array.from(document.querySelectorAll('div.chart')).filter(function(d){
        var c = d.querySelector('canvas'); if (!c || !c.width || !c.height) return false;
        var px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (var i = 0; i < px.length; i += 4) { if (px[i + 3] && (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250)) return true; }
        return false; }).length""",
    "findings": "document.querySelectorAll('article.finding').length",
    "verdict": "(document.querySelector('.verdict') || {}).innerText",
    "tables": "document.querySelectorAll('table.sortable').length",
    "text": "document.body.innerText",
    "scripts": "document.scripts.length",
    # elements no renderer writes: what an injected name would add
    "foreign": """Array.from(document.querySelectorAll('*')).filter(function(e){
        return /^(img|svg|iframe|object|embed|link|meta)$/i.test(e.tagName) && !e.matches('head > meta, svg[data-proflab]') ||
               Array.from(e.attributes).some(function(a){ return /^on/i.test(a.name); }); }).length""",
    "pwned": "window.__pwned === undefined ? null : String(window.__pwned)",
    # click the hot-kernel table's "calls" heading twice: its column, in order, after each click
    "sorted": """(function(){
        var th = Array.from(document.querySelectorAll('table.sortable th')).find(function(h){ return h.innerText.trim() === 'calls'; });
        if (!th) return null;
        var col = function(){ return Array.from(th.closest('table').tBodies[0].rows).map(function(r){ return +r.cells[th.cellIndex].getAttribute('data-v'); }); };
        var before = col(); th.click(); var first = col(); th.click(); return [before, first, col()]; })()""",
}


@pytest.fixture(scope="module")
def chromium() -> str:
    path, why = install_chromium()
    if path is None:
        pytest.skip(f"headless Chromium is not available here: {why}")
    return path


def _open(chromium: str, page: Path, name: str):
    res = open_page(chromium, page, ready_js=READY, probes=PROBES, screenshot=ARTIFACTS / f"{name}.png")
    assert res.values["ready"], f"the page never marked its charts drawn: {res.values.get('drawn')}; errors {res.errors}"
    assert not res.errors, res.errors
    assert not res.failed_requests, res.failed_requests
    assert not res.outside_requests, res.outside_requests
    assert not res.dialogs, res.dialogs
    v = res.values
    assert v["drawn"] == f"{v['charts']} drawn of {v['charts']}"
    assert v["painted"] == v["charts"] > 0, f"{v['painted']} of {v['charts']} charts have pixels"
    assert res.screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and res.screenshot.stat().st_size > 20_000
    return v


def _report(tmp_path: Path, *argv: str, command: str = "report") -> Path:
    out = tmp_path / "page.html"
    assert main([command, *argv, "-o", str(out)]) == 0
    return out


def test_trace_report_renders_findings_and_charts(chromium, tmp_path):
    v = _open(chromium, _report(tmp_path, str(REALISTIC / "mlp_foreach.light.pt.trace.json.gz")), "report_mlp_foreach")
    assert v["findings"] >= 1 and v["verdict"].startswith("Verdict: launch_bound")
    assert v["charts"] == 3 and v["tables"] >= 4
    assert v["pwned"] is None and v["foreign"] == 0 and v["scripts"] == 3
    before, first, second = v["sorted"]
    assert first == sorted(before, reverse=True) and second == sorted(before) and first != before


def test_run_directory_report_renders_the_gpu_monitor(chromium, tmp_path):
    v = _open(chromium, _report(tmp_path, str(RUNS / "20261122-074634-h100_cuda_train")), "report_run_h100")
    assert "GPU monitor (NVML)" in v["text"] and "Energy" in v["text"]
    assert v["charts"] >= 6


def test_memory_report_renders(chromium, tmp_path):
    """A trace recorded with profile_memory (tests/data/memory): the GPU memory section and its
    allocated/reserved chart draw."""
    v = _open(chromium, _report(tmp_path, str(ROOT / "tests" / "data" / "memory" / "activation_heavy.pt.trace.json.gz")),
              "report_memory_activation_heavy")
    assert "GPU memory" in v["text"] and "largest allocations live at the peak" in v["text"]
    assert v["charts"] == 3 and v["tables"] >= 5  # the breakdown, the timeline and the memory chart


def test_job_report_renders(chromium, tmp_path):
    v = _open(chromium, _report(tmp_path, str(RUNS / "20261122-082928-h200x2_ddp")), "report_job_h200x2")
    assert "Ranks" in v["text"] and "Collectives" in v["text"]


def test_compare_report_renders(chromium, tmp_path):
    page = _report(tmp_path, str(REALISTIC / "lm_fp32.light.pt.trace.json.xz"), str(REALISTIC / "lm_bf16.light.pt.trace.json.xz"),
                   command="compare")
    v = _open(chromium, page, "compare_fp32_bf16")
    assert v["verdict"].startswith("Verdict: improved")


def test_deep_dive_roofline_renders(chromium, tmp_path, data_dir):
    import proflab
    from proflab.report.deepdive import deep_dive
    from proflab.readers.ncu import load as load_ncu
    from proflab.render.html import render_html

    ncu = data_dir / "ncu"
    rep = deep_dive(load_ncu([ncu / "train_step_raw.csv.gz", ncu / "train_step_details.csv.gz"]),
                    proflab.load(ncu / "train_step.pt.trace.json.gz"))
    page = tmp_path / "deep.html"
    page.write_text(render_html([rep]), encoding="utf-8")
    v = _open(chromium, page, "deep_dive_roofline")
    assert "Roofline" in v["text"] and "Kernel deep dive" in v["text"]


def test_hostile_names_render_as_text(chromium, tmp_path):
    """Kernel, operator and range names made of markup, quotes, bidi overrides and control
    characters (a real trace, renamed): shown as text, nothing injected, nothing run."""
    from hostile import HOSTILE, RANGES, hostile_trace
    from proflab.render._text import kernel_label, printable

    trace = hostile_trace(tmp_path / "hostile.pt.trace.json.gz")
    v = _open(chromium, _report(tmp_path, str(trace)), "report_hostile_names")
    assert v["pwned"] is None, f"injected script ran: {v['pwned']}"
    assert v["foreign"] == 0 and v["scripts"] == 3
    text = v["text"]
    for name in HOSTILE:
        assert printable(kernel_label(name)) in text, f"{name!r} is not shown as text"
    assert RANGES[0] in text  # the host-bound finding names the range
    assert "<iframe srcdoc='x'>aten::copy_</iframe>" in text
    assert v["findings"] >= 1

"""The single-file HTML report without a browser: what the page holds, its escaping, its size
budget, the vendored chart library, and the `report`, `analyze -o x.html`, `compare -o
x.html` and `demo` commands (through ``main(argv)`` and as a subprocess).
The same pages are opened in a real browser by tests/test_html_browser.py."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import proflab
from proflab.cli import main
from proflab.render.html import SIZE_BUDGET_BYTES, VENDORED, render_html, safe_json
from shared_fixtures import NSYS

ROOT = Path(__file__).resolve().parent.parent
REALISTIC = ROOT / "tests" / "data" / "realistic"
RUN_H100 = ROOT / "tests" / "data" / "runs" / "20261122-074634-h100_cuda_train"
RUN_DDP = ROOT / "tests" / "data" / "runs" / "20261122-082928-h200x2_ddp"
MEMORY = ROOT / "tests" / "data" / "memory"


def _page_parts(page: str) -> tuple[str, str]:
    """(the page less the vendored library, the library): checks on what proflab wrote."""
    start = page.index('<script nonce="')
    end = page.index("</script>", start)
    return page[:start] + page[end:], page[start:end]


def _chart_specs(page: str) -> list[dict]:
    m = re.search(r'<script type="application/json" id="proflab-charts">(.*?)</script>', page, re.S)
    assert m, "no chart data in the page"
    return json.loads(m.group(1))


# -- the vendored library ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "package", "version", "sha256"), VENDORED, ids=[v[0] for v in VENDORED])
def test_vendored_library_matches_its_published_checksum(name, package, version, sha256):
    data = resources.files("proflab.render").joinpath("assets", name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256
    assert f'version="{version}"'.encode() in data or f'"{version}"'.encode() in data  # the build names its version
    notes = resources.files("proflab.render").joinpath("assets", "VENDORED.md").read_text()
    assert f"| {name} | {package} | {version} | BSD-3-Clause | {sha256} |" in notes
    assert "Redistribution and use" in resources.files("proflab.render").joinpath("assets", "LICENSE-vega.txt").read_text()


# -- JSON inside <script> ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["</script><script>alert(1)</script>", "<!-- x", "a & b > c", "\u2028\u2029", "</SCRIPT >"])
def test_safe_json_cannot_end_the_script_element(text):
    out = safe_json({"name": text, "n": [1.5, float("nan"), float("inf")]})
    assert not re.search(r"[<>&\u2028\u2029]", out)
    assert json.loads(out) == {"name": text, "n": [1.5, None, None]}


# -- the page ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def realistic_page(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("html") / "r.html"
    assert main(["report", str(REALISTIC / "mlp_foreach.light.pt.trace.json.gz"), "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_page_is_self_contained_and_fetches_nothing(realistic_page):
    own, lib = _page_parts(realistic_page)
    assert len(lib) > 500_000  # the chart library is inline
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", own, re.I), "the page names a URL"
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\bsrc=", own, re.I)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', own).group(1)
    assert "default-src 'none'" in csp and "script-src 'nonce-" in csp and "unsafe-inline" not in csp.split("style-src")[0]
    nonce = re.search(r"'nonce-([^']+)'", csp).group(1)
    assert realistic_page.count(f'<script nonce="{nonce}">') == 2 and realistic_page.count("<script") == 3
    assert "sourceMappingURL" not in realistic_page


def test_page_holds_the_diagnosis_tables_and_charts(realistic_page):
    report = proflab.analyze(REALISTIC / "mlp_foreach.light.pt.trace.json.gz")
    assert "Verdict: launch_bound" in realistic_page
    assert realistic_page.count('<article class="finding"') == len(report.findings) > 0
    for section in ("Where the window", "Steps", "Timeline", "Hot kernels", "Operators (host time)", "Memory copies"):
        assert f"<h2>{section}" in realistic_page
    assert realistic_page.count('<table class="sortable">') >= 4
    specs = _chart_specs(realistic_page)
    assert realistic_page.count('<div class="chart"') == len(specs) == 3
    timeline = specs[2]
    kinds = {row["kind"] for row in timeline["data"]["values"]}
    assert {"compute", "step", "range"} <= kinds and any(k.startswith("idle: ") for k in kinds)
    # the per-step chart is GPU-side: its steps are the report's own
    steps = {row["step"] for row in specs[1]["layer"][0]["data"]["values"]}
    assert steps == {str(s["step"]) for s in report.steps}


def test_hostile_names_are_escaped_everywhere(tmp_path):
    from hostile import HOSTILE, hostile_trace

    page_path = tmp_path / "h.html"
    trace = hostile_trace(tmp_path / "hostile.pt.trace.json.gz")
    assert main(["report", str(trace), "-o", str(page_path)]) == 0
    page = page_path.read_text(encoding="utf-8")
    own, _ = _page_parts(page)
    for bad in ("<script>window", "<img", "<iframe", "<b ", "onerror=\"", "</script><!--", "\u202e", "\x1b", "\x07", "\x00",
                "\u2028"):
        assert bad not in own, f"{bad!r} reached the page unescaped"
    # the only SVG is proflab's own roofline of the operators (its names escaped inside)
    assert own.count("<svg") == own.count('<svg xmlns="http://www.w3.org/2000/svg" data-proflab="roofline"') == 1
    assert page.count("<script") == 3
    assert "&lt;script&gt;window.__pwned=&#x27;script&#x27;&lt;/script&gt;kernel_a" in own
    assert "rtl_\\u202ekernel_e" in own  # the override is shown, not obeyed
    names = {row.get("what") for spec in _chart_specs(page) for row in spec.get("data", {}).get("values", [])}
    assert HOSTILE[0] in names  # the chart data keeps the name itself (as JSON text, drawn as canvas text)


def test_memory_section_from_a_recorded_trace(tmp_path):
    """A trace recorded with profile_memory on an H100 (tests/data/memory): the page shows the
    peak per device (the allocator's own max_memory_allocated / max_memory_reserved, in MiB),
    when in the step it comes, what is live at it, and the allocated/reserved chart with the
    peak and the steps marked."""
    trace = MEMORY / "activation_heavy.pt.trace.json.gz"
    gt = json.loads((MEMORY / "ground_truth.json").read_text())["activation_heavy"]
    out = tmp_path / "m.html"
    assert main(["report", str(trace), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert len(page.encode()) < SIZE_BUDGET_BYTES
    d = proflab.analyze(trace).memory["devices"][0]
    assert d["peak_allocated_mib"] == pytest.approx(gt["max_memory_allocated_mib"], rel=0.02)
    own, _ = _page_parts(page)
    section = own[own.index("<h2>GPU memory</h2>"):]
    cells = re.findall(r'<td[^>]*data-v="([^"]*)"', section)
    for v in (d["peak_allocated_mib"], d["peak_reserved_mib"], d["peak_at_ms"], d["peak_step"], d["device_memory_mib"]):
        assert str(v) in cells, f"{v} is not in the memory tables"
    assert d["peak_phase"] == "backward" and '<td data-v="backward">backward</td>' in section
    assert "<h3>GPU 0: live at the peak, by category</h3>" in section
    assert all(str(v) in cells for v in d["by_category_mib"].values())
    assert "<h3>GPU 0: largest allocations live at the peak</h3>" in section
    for r in d["top_allocations"]:
        assert str(r["mib"]) in cells and f'<td class="name" data-v="{r["op"]}">{r["op"]}</td>' in section
    # the chart: allocated and reserved over the window, the peak point, one rule per step
    chart = next(s for s in _chart_specs(page)
                 if s.get("layer") and any(r.get("kind") == "allocated" for r in s["layer"][0]["data"]["values"]))
    series, steps, peak = chart["layer"]
    mb = {k: [r["mib"] for r in series["data"]["values"] if r["kind"] == k] for k in ("allocated", "reserved")}
    assert len(mb["allocated"]) == len(mb["reserved"]) == d["series"]["points"] <= 2000
    assert max(mb["allocated"]) == d["peak_allocated_mib"] and max(mb["reserved"]) == d["peak_reserved_mib"]
    assert series["mark"]["interpolate"] == "step-after"
    assert [r["what"] for r in steps["data"]["values"]] == [f"step {i} starts" for i in range(gt["active_steps"])]
    assert peak["data"]["values"][0]["t"] == d["peak_at_ms"] and peak["data"]["values"][0]["mib"] == d["peak_allocated_mib"]


def test_memory_names_are_escaped(tmp_path):
    """Operator, module and source names in the memory tables are trace text: a real report's
    top allocations renamed to markup (a trace with such names and [memory] events was not
    recorded) reach the page only escaped."""
    rep = proflab.analyze(MEMORY / "graph_leak.pt.trace.json.gz")
    top = rep.memory["devices"][0]["top_allocations"][0]
    top.update(op="<img src=x onerror=alert(1)>", module="</script><!--", source="\u202eevil.py(1): f")
    rep.memory["devices"][0]["peak_op"] = "<b>op</b>"
    own, _ = _page_parts(render_html([rep]))
    for bad in ("<img", "</script><!--", "\u202e", "<b>op"):
        assert bad not in own
    assert "&lt;img src=x onerror=alert(1)&gt;" in own and "&lt;b&gt;op&lt;/b&gt;" in own


def test_minimal_and_cpu_only_reports_render(cpu_report):
    from proflab.report import Report

    empty = Report(source={"inputs": [{"path": "minimal.pt.trace.json.gz"}]}, device={"name": None},
                   summary={"wall_ms": 0.0}, findings=(), kernels=())
    for rep in (empty, cpu_report):
        page = render_html([rep])
        assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
        assert "Verdict" in page
    assert "missing" in render_html([cpu_report]).lower()


def test_size_budget_holds_for_a_100_mb_trace(tmp_path):
    """The page's size is bounded whatever the trace's size: at most 3 MiB for a trace of
    more than 100 MB (gen_realistic.py: deep model, NCCL stream, 100k+ gaps)."""
    big = tmp_path / "big.pt.trace.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_realistic.py"), str(big), "--size-mb", "100"],
                   check=True, capture_output=True, timeout=600)
    assert big.stat().st_size > 100 * 10**6
    out = tmp_path / "big.html"
    assert main(["report", str(big), "-o", str(out), "--no-cache"]) == 0
    size = out.stat().st_size
    assert size <= SIZE_BUDGET_BYTES, f"{size} bytes"
    specs = _chart_specs(out.read_text(encoding="utf-8"))
    timeline = next(s for s in specs if any("lane" in r for r in s.get("data", {}).get("values", [])))
    lanes = {r["lane"] for r in timeline["data"]["values"]}
    assert any("stream 20" in lane for lane in lanes)  # the NCCL stream is drawn


# -- run directories, jobs, deep dives, comparisons ---------------------------------------------


def test_run_directory_page_has_monitor_and_energy(tmp_path):
    out = tmp_path / "run.html"
    assert main(["report", str(RUN_H100), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<h2>GPU monitor (NVML)" in page and "<h2>Energy" in page
    titles = {s.get("title") for s in _chart_specs(page)}
    assert {"power (W)", "SM clock (MHz)", "GPU utilisation (%)"} <= titles


def test_job_page_has_the_rank_view_and_each_rank(tmp_path):
    out = tmp_path / "job.html"
    assert main(["report", str(RUN_DDP), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "proflab job report" in page and "<h2>Ranks" in page and "<h2>Collectives" in page
    assert "Rank 0:" in page and "Rank 1:" in page


def test_deep_dive_page_has_verdicts_and_roofline(data_dir):
    from proflab.report.deepdive import deep_dive
    from proflab.readers.ncu import load as load_ncu

    ncu = data_dir / "ncu"
    rep = deep_dive(load_ncu([ncu / "train_step_raw.csv.gz", ncu / "train_step_details.csv.gz"]),
                    proflab.load(ncu / "train_step.pt.trace.json.gz"))
    page = render_html([rep])
    assert "Kernel deep dive (Nsight Compute)" in page
    plotted = [v for v in rep.verdicts if (v.get("roofline") or {}).get("achieved_gflops")]
    assert plotted  # the recorded capture has kernels with FLOPs
    roof = next(s for s in _chart_specs(page) if s.get("height") == 360)
    points = roof["layer"][1]["data"]["values"]
    assert {p["gflops"] for p in points} == {v["roofline"]["achieved_gflops"] for v in plotted}


def test_compare_writes_html(tmp_path):
    out = tmp_path / "cmp.html"
    rc = main(["compare", str(REALISTIC / "lm_fp32.light.pt.trace.json.xz"), str(REALISTIC / "lm_bf16.light.pt.trace.json.xz"),
               "-o", str(out)])
    assert rc == 0
    page = out.read_text(encoding="utf-8")
    assert "proflab compare" in page and "Verdict: improved" in page and "<h2>Kernels" in page


def test_analyze_writes_html(tmp_path):
    out = tmp_path / "a.html"
    assert main(["analyze", str(REALISTIC / "d2h_copies.light.pt.trace.json.gz"), "-o", str(out)]) == 0
    assert "pageable_memcpy" in out.read_text(encoding="utf-8")


# -- the command line -----------------------------------------------------------------------------


def test_report_never_overwrites_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proflab-report.html").write_text("mine")
    trace = REALISTIC / "d2h_copies.light.pt.trace.json.gz"
    assert main(["report", str(trace)]) == 0
    assert (tmp_path / "proflab-report.html").read_text() == "mine"
    assert "<!DOCTYPE html>" in (tmp_path / "proflab-report-2.html").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "{trace}", "-o", "{tmp}/x.txt"], "name it .html"),
        (["report", "{tmp}/missing.json"], "missing.json"),
        (["report", "{bad}", "-o", "{tmp}/x.html"], "bad.pt.trace.json"),
    ],
    ids=["not-html", "missing", "not-a-trace"],
)
def test_report_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text("{ not json")
    fill = {"trace": str(REALISTIC / "d2h_copies.light.pt.trace.json.gz"), "tmp": str(tmp_path), "bad": str(bad)}
    assert main([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("proflab: error:") and "\n" not in err and message in err
    assert not list(tmp_path.glob("*.html"))


def test_report_refuses_to_overwrite_its_input(tmp_path, capsys):
    trace = tmp_path / "t.html"  # a trace named .html is still a trace
    trace.write_bytes((REALISTIC / "d2h_copies.light.pt.trace.json.gz").read_bytes())
    before = trace.read_bytes()
    assert main(["report", str(trace), "-o", str(trace)]) == 2
    assert trace.read_bytes() == before


def test_demo_runs_as_a_command_and_ends_with_the_report_path(tmp_path):
    env_cwd = tmp_path / "cwd"
    env_cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "proflab", "demo", "-o", str(tmp_path / "out")], cwd=env_cwd,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert "launch_bound" in r.stdout and "Launch-bound" in r.stdout
    assert lines[-1].startswith("HTML report: ")
    page = Path(lines[-1].removeprefix("HTML report: "))
    assert page.is_file() and page.parent == (tmp_path / "out").resolve()
    assert "Verdict: launch_bound" in page.read_text(encoding="utf-8")
    assert not list(env_cwd.iterdir())  # nothing left in the working folder
    # a second demo into the same folder keeps the first report
    again = subprocess.run([sys.executable, "-m", "proflab", "demo", "-o", str(tmp_path / "out")], cwd=env_cwd,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and len(list((tmp_path / "out").glob("*.html"))) == 2


def test_demo_trace_is_the_recorded_one():
    shipped = resources.files("proflab").joinpath("demo", "mlp_foreach.light.pt.trace.json.gz").read_bytes()
    assert shipped == (REALISTIC / "mlp_foreach.light.pt.trace.json.gz").read_bytes()
    truth = json.loads(resources.files("proflab").joinpath("demo", "ground_truth.json").read_text())
    recorded = json.loads((REALISTIC / "ground_truth.json").read_text())
    assert truth["bare_step_ms"] == recorded["loops"]["mlp_foreach"]["bare"]["median_ms"]


def test_several_unrelated_traces_get_a_section_each(tmp_path):
    out = tmp_path / "two.html"
    a, b = REALISTIC / "d2h_copies.light.pt.trace.json.gz", REALISTIC / "mlp_graphed.light.pt.trace.json.gz"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "2 traces, each in its own section" in page
    assert page.count("<details open><summary><h2") == 2 and a.name in page and b.name in page
    assert page.count("<h2>Timeline") == 2


def test_nsys_export_of_a_job_gets_the_job_view(tmp_path):
    export = NSYS / "mfu_2gpu_before.sqlite"
    if not export.is_file():
        pytest.skip(f"{export.name}: the Nsight Systems fixtures are not beside this checkout")
    out = tmp_path / "nsys.html"
    assert main(["report", str(export), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "proflab job report" in page and "<h2>Ranks" in page


def test_demo_into_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("mine")
    assert main(["demo", "-o", str(taken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("proflab: error:") and "taken" in err and "\n" not in err
    assert taken.read_text() == "mine"


def test_a_report_and_a_job_show_themselves_in_jupyter():
    """``proflab.analyze(...)`` as a cell's last line shows its HTML report (a Comparison
    did; a Report showed a wall of dataclass text): the page in a frame of its own, whose
    findings are the report's; a JobReport the same with its job view; both repr in a line."""
    import html as _html

    import proflab
    from proflab.report import JobReport, Report
    from proflab.report.job import analyze_job

    report = proflab.analyze(ROOT / "tests" / "data" / "gains" / "cnn_loader.base.pt.trace.json.gz")
    assert isinstance(report, Report)
    shown = report._repr_html_()
    assert shown.startswith('<iframe srcdoc="') and shown.endswith("</iframe>")
    page = _html.unescape(shown.split('srcdoc="', 1)[1].split('" style=', 1)[0])
    assert page.startswith("<!DOCTYPE html>") and _html.escape(report.findings[0].title) in page
    assert repr(report).startswith("<Report cnn_loader.base.pt.trace.json.gz: ") and "host_bound" in repr(report)
    job = analyze_job(sorted((ROOT / "tests" / "data" / "kineto" / "ddp").glob("*.pt.trace.json.gz")), in_process=True)
    assert isinstance(job, JobReport)
    page = _html.unescape(job._repr_html_().split('srcdoc="', 1)[1])
    assert "proflab job report" in page and "Rank 1" in page
    assert repr(job).startswith("<JobReport 2 ranks: ")

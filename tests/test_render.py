"""Every renderer on one shared Report from a real trace, on a minimal Report, and on a Report
full of hostile names (markup, HTML, table pipes, backticks, newlines)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest
from rich.cells import cell_len

from proflab.errors import UsageError
from proflab.render._text import fmt_num
from proflab.render import FORMATS, format_for_path, render
from proflab.report import SCHEMA_ID, Finding, Missing, Report

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# -- report builders ---------------------------------------------------------------------------


def _source(path: str = "runs/minimal.pt.trace.json.gz") -> dict:
    return {"inputs": [{"path": path, "format": "kineto"}], "tool": {"name": "proflab", "version": "0.0.0"}}


MIN_SUMMARY = {"wall_ms": 0.0, "gpu_busy_pct": None, "breakdown_ms": None, "step_count": 0, "median_step_ms": None}


def minimal_report(**changes) -> Report:
    """The least a Report can hold: the fields the JSON schema requires, nothing measured."""
    r = Report(source=_source(), device={"name": None}, summary=dict(MIN_SUMMARY), findings=(), kernels=())
    return replace(r, **changes) if changes else r


def _finding(severity: str, title: str, **kw) -> Finding:
    base = dict(
        id=f"t-{severity}",
        category="host_bound",
        severity=severity,
        title=title,
        evidence={"idle_ms": 1.5},
        est_gain_ms=1.5,
        est_gain_pct=10.0,
        fix="Do less on the host.",
    )
    return Finding(**{**base, **kw})


MARKUP = "[bold red]x[/]"
SCRIPT = "<script>alert(1)</script>"
INJECT = "INJECTED_LINE"
HOSTILE = f"{MARKUP} {SCRIPT} a|b `tick` end\n{INJECT}"


def hostile_report() -> Report:
    def h(prefix: str) -> str:
        return f"{prefix} {HOSTILE}"

    f = Finding(
        id=h("id"),
        category="launch_bound",
        severity="critical",
        title=h("title"),
        evidence={h("key"): h("value"), "rows": [{"name": h("row"), "ms": 1.0}], "names": [h("list")]},
        est_gain_ms=3.0,
        est_gain_pct=30.0,
        fix=h("fix"),
        where={"kernels": [h("where")], "ops": [h("op")]},
        assumption=h("assumption"),
    )
    kernel = {
        "name": h("kernel"), "count": 3, "total_ms": 1.25, "share_pct": 100.0,
        "tensor_cores": h("tc"), "op": h("kop"), "source": h("src"),
    }  # fmt: skip
    summary = {
        **MIN_SUMMARY, "wall_ms": 10.0, "gpu_busy_pct": 50.0, "step_count": 2, "median_step_ms": 5.0,
        "step_spread_ms": {"min": 4.0, "p10": 4.1, "p90": 5.9, "max": 6.0},
        "breakdown_ms": {"compute": 5.0, "communication": 0.0, "memcpy": 0.0, "memset": 0.0, "idle": 5.0},
    }  # fmt: skip
    return Report(
        source=_source(f"runs/{MARKUP}{SCRIPT}|`x`.json"),
        device={"name": h("device"), "sm_count": 132},
        summary=summary,
        findings=(f,),
        kernels=(kernel,),
        host_ops=({"name": h("hostop"), "count": 1, "total_ms": 1.0},),
        missing=(Missing(h("signal"), h("reason"), (h("skipped"),)),),
        notes=(h("note"),),
    )


# -- helpers --------------------------------------------------------------------------------


def term(report, width=80, color=False) -> str:
    return render([report], "term", width=width, color=color)


def flat(text: str) -> str:
    return " ".join(text.split())


class _Html(HTMLParser):
    """Visible text, tags used, and table rows (cell texts) of rendered Markdown."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.text: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def md_html(md: str) -> _Html:
    markdown_it = pytest.importorskip("markdown_it")
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    p = _Html()
    p.feed(html)
    return p


def check_md_tables(md: str) -> _Html:
    """Every Markdown table row has as many cells as its header: no row was split by a name."""
    h = md_html(md)
    pipe_lines = [line for line in md.splitlines() if line.startswith("|")]
    rows_in_source = len(pipe_lines) - sum(1 for line in pipe_lines if re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line))
    assert sum(len(t) for t in h.tables) == rows_in_source, "a table line did not parse as a table row"
    for table in h.tables:
        width = len(table[0])
        assert all(len(row) == width for row in table), table
    return h


def check_width(text: str, width: int) -> None:
    long = [line for line in ANSI.sub("", text).splitlines() if cell_len(line) > width]
    assert not long, f"{len(long)} lines wider than {width}: {long[:3]}"


# -- the shared real report, every renderer -----------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_renderer_renders_the_real_report(real_report, fmt):
    text = render([real_report], fmt, width=80)
    assert text.strip() and text.endswith("\n")
    path = real_report.source["inputs"][0]["path"]
    if fmt == "json":
        assert json.loads(text)["source"]["inputs"][0]["path"] == path
    else:
        assert path.rsplit("/", 1)[-1].replace("_", "\\_" if fmt == "md" else "_") in text


@pytest.mark.parametrize("color", [False, True])
def test_terminal_fits_80_columns(real_report, color):
    out = term(real_report, 80, color)
    assert ("\x1b[" in out) == color
    check_width(out, 80)


def test_terminal_shows_findings_and_hot_kernels(real_report):
    out = flat(term(real_report, 80))
    for f in real_report.findings:
        assert flat(f.title) in out
        assert f.severity.upper() in out
    table = term(real_report, 80).splitlines()
    for rank, k in enumerate(real_report.kernels[:10], 1):
        # one table row per hot kernel, in rank order, with its time and launch count
        row = [line for line in table if re.match(rf"\s*{rank}\s", line) and fmt_num(k["total_ms"]) in line]
        assert row and fmt_num(k["count"]) in row[0], (rank, k["name"])
    if not real_report.kernels:
        for o in real_report.host_ops[:10]:
            assert o["name"][:20] in out
    for m in real_report.missing:
        assert flat(m.signal) in out


def test_json_round_trips_the_report(real_report, report_schema):
    jsonschema = pytest.importorskip("jsonschema")
    text = render([real_report], "json")
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert doc == json.loads(json.dumps(real_report.to_dict()))
    assert doc["schema"] == SCHEMA_ID
    jsonschema.validate(doc, report_schema)


def test_markdown_structure(real_report):
    md = render([real_report], "md")
    assert md.startswith("# proflab report: ")
    h = check_md_tables(md)
    assert "script" not in h.tags
    text = flat("".join(h.text))
    for f in real_report.findings:
        assert flat(f.title) in text
    kernel_tables = [t for t in h.tables if "kernel" in t[0]]
    assert len(kernel_tables) == (1 if real_report.kernels else 0)
    if real_report.kernels:
        assert len(kernel_tables[0]) - 1 == len(real_report.kernels)
    assert md.count("\n### ") == len(real_report.findings)


def test_several_reports(real_report):
    other = replace(real_report, source=_source("runs/second_run.json"))
    docs = json.loads(render([real_report, other], "json"))
    assert isinstance(docs, list) and [d["source"]["inputs"][0]["path"] for d in docs][1] == "runs/second_run.json"
    assert render([real_report, other], "md").count("# proflab report: ") == 2
    out = render([real_report, other], "term", width=80)
    assert out.count("second_run.json") == 1
    check_width(out, 80)


def test_gpu_report_has_the_gpu_sections(gpu_report):
    out = term(gpu_report, 80)
    assert "GPU busy" in out
    assert "hot kernel" in out
    md = render([gpu_report], "md")
    assert "## Hot kernels" in md and "| compute ms |" in md


# -- minimal report ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [{"name": None}, {}], ids=["device-name-null", "device-empty"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_minimal_report_renders(fmt, device):
    text = render([minimal_report(device=device)], fmt, width=80)
    assert text.strip()
    if fmt == "term":
        assert "minimal.pt.trace.json.gz" in text and "none" in text
        check_width(text, 80)
    elif fmt == "md":
        assert "No findings." in text and "|" not in text
    else:
        assert json.loads(text)["findings"] == []


def test_minimal_report_follows_the_schema(report_schema):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(render([minimal_report()], "json")), report_schema)


@pytest.mark.parametrize("spread", ["null", "absent"])
@pytest.mark.parametrize(
    "fmt",
    [
        "term",
        "md",
        "json",
    ],
)
def test_report_with_steps_but_no_spread(fmt, spread, report_schema):
    summary = {**MIN_SUMMARY, "step_count": 3, "median_step_ms": 2.5}
    if spread == "null":
        summary["step_spread_ms"] = None
    r = minimal_report(summary=summary)
    pytest.importorskip("jsonschema").validate(json.loads(render([r], "json")), report_schema)
    text = render([r], fmt, width=80)
    assert "2.5" in text


def test_non_finite_numbers_become_null():
    r = minimal_report(summary={**MIN_SUMMARY, "wall_ms": float("nan"), "median_step_ms": float("inf")})
    doc = json.loads(render([r], "json"), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert doc["summary"]["wall_ms"] is None and doc["summary"]["median_step_ms"] is None
    assert math.isnan(r.summary["wall_ms"])  # the report itself is not modified


def test_unknown_format_is_a_usage_error():
    with pytest.raises(UsageError):
        render([minimal_report()], "html-ish")


@pytest.mark.parametrize(("path", "fmt"), [("a.json", "json"), ("a.md", "md"), ("a.markdown", "md"), ("a.txt", "term"), ("a.pdf", None)])
def test_format_for_path(path, fmt):
    assert format_for_path(path) == fmt


@pytest.mark.parametrize("severity", ["critical", "warning", "info"])
def test_severity_label_is_separated_from_the_title(severity):
    r = minimal_report(findings=(_finding(severity, "Plainly titled problem"),))
    out = term(r, 80)
    assert re.search(rf"\b{severity.upper()}\s+Plainly titled problem", out), out


def test_long_text_wraps_within_80_columns():
    long_word = "k" * 200
    f = _finding("warning", "A very long title " * 12, fix=f"{long_word} then words " * 3,
                 evidence={"long_list": list(range(100)), "long_text": "x" * 300}, where={"kernels": [long_word] * 5})
    k = {"name": "void " + "templated_kernel<float, 128>" * 10, "count": 10**7, "total_ms": 123456.789,
         "share_pct": 100.0, "tensor_cores": "yes (by name)", "op": None}  # fmt: skip
    r = minimal_report(
        source=_source("/very/long/" + "directory/" * 30 + "trace_" + "n" * 150 + ".pt.trace.json.gz"),
        device={"name": "NVIDIA " + "Super " * 20 + "GPU", "sm_count": 132},
        findings=(f,),
        kernels=(k,),
        missing=(Missing("signal " * 20, "reason " * 40, ("analysis " * 10,)),),
        notes=("note " * 60,),
    )
    check_width(term(r, 80), 80)
    check_width(term(r, 80, color=True), 80)
    check_md_tables(render([r], "md"))


# -- hostile names ------------------------------------------------------------------------------


@pytest.mark.parametrize("color", [False, True])
def test_terminal_prints_hostile_text_literally(color):
    out = ANSI.sub("", term(hostile_report(), 80, color))
    # markup is not interpreted: the brackets survive in every place a name is shown
    shown = flat(out)
    for prefix in ("title", "fix", "key", "device", "signal", "reason", "note", "where"):
        assert f"{prefix} {MARKUP} {SCRIPT}" in shown, prefix
    assert SCRIPT in out
    assert "a|b `tick` end" in out
    check_width(out, 80)
    if color:
        raw = term(hostile_report(), 80, color)
        assert "\x1b[1;31mx" not in raw, "rich markup inside a name was interpreted"


def test_terminal_keeps_a_name_with_newline_on_its_line():
    out = term(hostile_report(), 200)
    starts = [line.lstrip() for line in out.splitlines() if line.lstrip().startswith(INJECT)]
    assert not starts, f"{len(starts)} output lines start with text injected after a newline"


def test_markdown_escapes_hostile_text():
    md = render([hostile_report()], "md")
    # no raw HTML outside code spans (inside a code span `<script>` is inert text)
    outside_code = re.sub(r"`[^`\n]*`", "", md)
    assert "<script" not in outside_code.lower(), outside_code
    # no line that a name broke in two: every source line of a hostile value is whole
    assert not any(line.startswith(INJECT) for line in md.splitlines())
    h = check_md_tables(md)
    assert "script" not in h.tags
    # what a reader sees is the name itself, not markup made from it
    text = "".join(h.text)
    assert f"title {MARKUP} {SCRIPT} a|b `tick` end {INJECT}" in text
    (kernel_table,) = [t for t in h.tables if "kernel" in t[0]]
    assert kernel_table[1][1] == f"kernel {MARKUP} {SCRIPT} a|b `tick` end {INJECT}"


def test_json_keeps_hostile_text_exact():
    doc = json.loads(render([hostile_report()], "json"))
    assert doc["findings"][0]["title"] == f"title {HOSTILE}"
    assert doc["kernels"][0]["name"] == f"kernel {HOSTILE}"
    assert doc["notes"] == [f"note {HOSTILE}"]


# -- wording shared between rules and renderers -------------------------------------------------


def test_assumptions_read_after_the_renderers_prefix(find_trace):
    import proflab

    report = proflab.analyze(find_trace("starved_input"))
    assert any(f.assumption for f in report.findings)
    assert not re.search(r"\bif if\b", flat(term(report, 100)))
    assert "assuming if " not in flat(render([report], "md"))


# -- the hot-kernel table shows its numbers and verdicts whole -----------------------------------


def _kernel_rows(out: str, n: int) -> list[str]:
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if re.match(r"\s*#\s+hot kernel\s", line))
    return lines[head + 1 : head + 1 + n]


def test_tensor_core_verdict_is_printed_whole(find_trace):
    import proflab

    report = proflab.analyze(find_trace("healthy_bf16_gemm"))
    assert any(k["tensor_cores"] == "yes" for k in report.kernels)
    rows = _kernel_rows(term(report, 80), min(len(report.kernels), 10))
    for row, k in zip(rows, report.kernels):
        assert row.split()[-1] == (k["tensor_cores"] or "-"), row


@pytest.mark.parametrize("count", [100_000, 1_234_567])
def test_large_launch_counts_are_printed_whole(count):
    k = {"name": "vectorized_elementwise_kernel<4, FillFunctor<float>>", "count": count, "total_ms": 1234.5,
         "share_pct": 100.0, "tensor_cores": None, "op": None}  # fmt: skip
    out = term(minimal_report(kernels=(k,)), 80)
    (row,) = _kernel_rows(out, 1)
    assert fmt_num(count) in row, row


def test_a_gain_says_what_its_share_is_of():
    """A replayed gain is a share of the bare step; a gain from idle time (no replay) is the
    share of the profiled window it was idle in, and says so (it once said "of the bare step",
    for 0.93 ms idle of a 66.8 ms window: 1.39 %, where the bare step was 8.8 ms)."""
    from proflab.render._text import gain_text

    replayed = _finding("warning", "sync", prediction={"model": "replay", "per": "step"}).to_dict()
    idle = _finding("info", "idle", prediction={"model": "idle time", "per": "step"}).to_dict()
    assert "(10% of the bare step)" in gain_text(replayed, "step")
    assert "(10% of the window)" in gain_text(idle, "step") and "from idle time" in gain_text(idle, "step")
    assert "(10% of the window)" in gain_text(replayed, "window")


def test_the_page_says_a_windows_gain_over_the_window_and_the_combined_prediction():
    """A trace with no steps gains over the window: the HTML page says so, as the terminal
    and Markdown do (it said "a step ... of the bare step"); and the page gives all fixes'
    combined prediction where the report has one."""
    f = _finding("warning", "host", prediction={"model": "idle time", "per": "window"})
    summary = {**MIN_SUMMARY, "wall_ms": 20.0, "gain_per": "window",
               "predicted": {"findings": ["a", "b"], "bare_step_ms": 10.0, "predicted_step_ms": 7.0, "predicted_gain_ms": 3.0,
                             "predicted_gain_pct": 30.0, "bare_step_source": "measured", "sum_of_findings_ms": 4.0,
                             "gpu_work_after_ms": 6.0}}  # fmt: skip
    from proflab.render.html import render_html

    page = render_html([minimal_report(summary=summary, findings=(f,))])
    assert "saves 1.5 ms over the window" in page and "(10% of the window)" in page
    assert "a step (10" not in page and "of the bare step" not in page
    assert "All 2 fixes together: predicted 10 -&gt; 7 ms a step" in page


def test_the_roofline_shows_control_characters_in_names_as_escapes():
    """Operator names come from traces: an ESC or a bidirectional override in one reaches the
    SVG (inline in the page, or the --roofline file) as an escape, and the file stays XML."""
    import xml.etree.ElementTree as ET

    from proflab.render.perf import roofline_svg

    op = {"signature": "aten::mm\x1b[31m\u202eevil", "class": "gemm", "intensity_flop_per_byte": 100.0, "achieved_tflops": 50.0,
          "time_ms": 1.0}
    p = {"classes": [{**op, "signature": None}], "top_ops": [op], "peaks": {"bf16": 989.0, "hbm_gbps": 4800.0}}
    svg = roofline_svg(p)
    assert "\x1b" not in svg and "\u202e" not in svg and "\\x1b" in svg
    ET.fromstring(svg)

"""The single-file HTML report: one page a person opens in any browser, with no network.

Everything is inline: the styles, the chart library (Vega, Vega-Lite and vega-embed, vendored
under ``render/assets``; see ``assets/VENDORED.md`` for versions, licence and checksums), the
charts' data and a few lines of script that draw the charts and sort the tables. A Content
Security Policy in the page forbids every fetch (``default-src 'none'``) and runs only the
page's own scripts (a per-page nonce), so an injected ``<script>`` or ``onerror=`` would not
run even if escaping failed.

Every name from a trace (kernel, operator, NVTX range, file) is attacker-controlled text: it
goes through :func:`proflab.render._text.printable` (control and bidi-override characters
shown as escapes) and ``html.escape`` into the page, and through :func:`safe_json` into the
script data (``<``, ``>``, ``&``, U+2028/2029 escaped, so ``</script>`` or ``<!--`` in a name
cannot end the script element). Charts draw names as canvas text, never as markup.

Size: the charts get at most a bounded number of marks (see ``analysis.overview``), so the
page stays within :data:`SIZE_BUDGET_BYTES` (3 MiB) whatever the trace's size; about 0.85 MB
of it is the chart library.
"""

from __future__ import annotations

import html
import json
import math
import re
import secrets
from collections.abc import Sequence
from importlib import resources
from typing import Any

from proflab.render._text import combined_text, evidence_items, evidence_table_rows, gain_text, kernel_label, printable

__all__ = ["render_html", "safe_json", "SIZE_BUDGET_BYTES", "VENDORED"]

SIZE_BUDGET_BYTES = 3 * 2**20

# The vendored chart library: file, package and version, sha256 of the file as published.
VENDORED = (
    ("vega.min.js", "vega", "6.4.0", "8f6a3587cf8d4f42c7e08120e3eb05d067e746d554e39d2dcf52acc0bd5ba28f"),
    ("vega-lite.min.js", "vega-lite", "6.5.0", "83e215e84e308ee8688fa6503ba0f1cf8a3c05c0d61df2841a0b92bf86809e00"),
    ("vega-embed.min.js", "vega-embed", "7.3.0", "b1455caba2fb1a72fb46025ba0ba1316e2dbc7f0dd40a3f6040172bf9c08ba91"),
)

_SOURCE_MAP = re.compile(r"^//# sourceMappingURL=.*$", re.M)
_JSON_UNSAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}

# One colour per kind of time, shared by every chart (Tableau 10 and greys).
_KINDS = ["compute", "communication", "memcpy", "memset", "idle", "idle: host", "idle: sync", "idle: launch",
          "idle: dependency", "idle: unknown", "wait for peers", "step", "range"]
_COLORS = ["#4e79a7", "#b07aa1", "#f28e2b", "#edc948", "#c9c9c9", "#e15759", "#ff9da7", "#9c755f", "#bab0ac",
           "#e4e4e4", "#d37295", "#59a14f", "#76b7b2"]


def _color(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The colour channel of the kinds present in ``rows``, each in its shared colour."""
    present = {r.get("kind") for r in rows}
    keep = [(k, c) for k, c in zip(_KINDS, _COLORS) if k in present]
    return {"field": "kind", "type": "nominal", "title": None,
            "scale": {"domain": [k for k, _ in keep], "range": [c for _, c in keep]}}


def safe_json(obj: Any) -> str:
    """JSON text safe inside ``<script>``: ``<``, ``>``, ``&`` and U+2028/2029 as ``\\u``
    escapes, non-finite numbers as null (JSON has no NaN)."""
    return json.dumps(_finite(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":")).translate(_JSON_UNSAFE)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _e(text: Any) -> str:
    """Text from anywhere (a trace, a file name) as HTML text."""
    return html.escape(str(printable(str(text))), quote=True)


def render_html(subject: Any, *, overviews: Sequence[dict[str, Any] | None] = (), monitor: Any = None,
                energy: dict[str, Any] | None = None, title: str | None = None) -> str:
    """The page for ``subject``: a list of :class:`Report` (one section each), a
    :class:`JobReport` (the job's view, then each rank's report) or a ``Comparison``.
    ``overviews``: ``analysis.overview`` of each report's window, in order (None: no
    timeline); ``monitor``: a run directory's GPU monitor samples (polars DataFrame);
    ``energy``: ``EnergyAnalysis.to_dict()`` of the run."""
    from proflab.report import JobReport

    page = _Page()
    if isinstance(subject, JobReport):
        heading = "proflab job report"
        _job(page, subject)
        for i, rep in enumerate(subject.reports):
            ov = overviews[i] if i < len(overviews) else None
            _report(page, rep, ov, heading=f"Rank {i}: {_input_name(rep)}", level=2)
    elif hasattr(subject, "verdict"):
        heading = "proflab compare"
        _comparison(page, subject)
    else:
        reports = list(subject)
        heading = "proflab report"
        if len(reports) > 1:
            page.add(f"<h1>proflab report</h1><p class=\"muted\">{len(reports)} traces, each in its own section</p>")
        for i, rep in enumerate(reports):
            ov = overviews[i] if i < len(overviews) else None
            _report(page, rep, ov, heading=_input_name(rep) if len(reports) > 1 else None, level=2 if len(reports) > 1 else 1)
    if monitor is not None:
        _monitor(page, monitor, (energy or {}).get("windows") or ())
    if energy:
        _energy(page, energy)
    return page.document(title or heading)


# -- the page ------------------------------------------------------------------------------


class _Page:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.charts: list[dict[str, Any]] = []

    def add(self, text: str) -> None:
        self.parts.append(text)

    def chart(self, spec: dict[str, Any], label: str) -> None:
        """A Vega-Lite chart drawn into a placeholder by the page's script."""
        spec = {"config": _CONFIG, **spec}  # no $schema: the page names no URL at all
        self.parts.append(f'<div class="chart" id="chart-{len(self.charts)}" role="img" aria-label="{_e(label)}"></div>')
        self.charts.append(spec)

    def document(self, title: str) -> str:
        nonce = secrets.token_urlsafe(16)
        csp = (f"default-src 'none'; script-src 'nonce-{nonce}' 'unsafe-eval'; style-src 'unsafe-inline'; "
               "img-src data: blob:; font-src data:")
        # 'unsafe-eval': Vega compiles its expressions with Function(); no fetch is allowed
        lib = "\n".join(_asset(name) for name, *_ in VENDORED)
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n<main>\n"
            + "\n".join(self.parts)
            + "\n</main>\n<footer>proflab HTML report; charts: "
            + ", ".join(f"{p} {v}" for _, p, v, _ in VENDORED)
            + " (BSD-3-Clause)</footer>\n"
            f'<script type="application/json" id="proflab-charts">{safe_json(self.charts)}</script>\n'
            f'<script nonce="{nonce}">{lib}</script>\n<script nonce="{nonce}">{_JS}</script>\n</body></html>\n'
        )


def _asset(name: str) -> str:
    text = resources.files("proflab.render").joinpath("assets", name).read_text(encoding="utf-8")
    # the source maps are not shipped: a browser's developer tools would try to fetch them
    return _SOURCE_MAP.sub("", text)


_CONFIG = {"view": {"stroke": None}, "font": "system-ui, sans-serif", "axis": {"labelLimit": 260}}

_CSS = """
:root{--fg:#1d1d1f;--muted:#666;--line:#ddd;--crit:#c0392b;--warn:#b9770e;--info:#2e6da4;--ok:#2e7d32}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);margin:0;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 40px;background:#fff}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:18px 0 6px}.muted{color:var(--muted)}
.verdict{font-size:17px;padding:10px 14px;border-left:5px solid var(--info);background:#f3f6fa;margin:10px 0}
.verdict.critical{border-color:var(--crit)}.verdict.warning{border-color:var(--warn)}.verdict.healthy{border-color:var(--ok)}
.finding{border:1px solid var(--line);border-radius:6px;padding:8px 12px;margin:8px 0}
.finding h3{margin:0 0 4px}.sev{display:inline-block;font-size:11px;font-weight:600;text-transform:uppercase;
padding:1px 6px;border-radius:3px;color:#fff;margin-right:6px;vertical-align:2px}
.sev.critical{background:var(--crit)}.sev.warning{background:var(--warn)}.sev.info{background:var(--info)}
.gain{font-weight:600}.fix{background:#f6fbf6;border-left:3px solid var(--ok);padding:4px 8px;margin:6px 0}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px;width:100%}
th,td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th{background:#f4f4f4;cursor:pointer;user-select:none;white-space:nowrap}th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}
.name{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all;unicode-bidi:isolate}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}dl.kv dt{color:var(--muted)}dl.kv dd{margin:0}
.chart{width:100%;min-height:40px;margin:6px 0 14px}details>summary{cursor:pointer;font-weight:600;margin:10px 0}
footer{max-width:1200px;margin:0 auto;padding:10px 24px;color:var(--muted);font-size:12px}
ul.evidence{margin:4px 0;padding-left:20px}table.evidence{margin:4px 0}table.evidence th{text-align:left;font-weight:normal;color:var(--muted,#666)}.scroll{overflow-x:auto;max-width:100%}.chart-error{color:var(--crit)}
"""

# Draw every chart (errors go to the console and onto the page), sort tables on a click, and
# mark the page drawn (body data-charts="N drawn") for tests and for people who print it.
_JS = r"""
(function(){
  var specs = JSON.parse(document.getElementById('proflab-charts').textContent);
  var jobs = specs.map(function(spec, i){
    var el = document.getElementById('chart-' + i);
    return vegaEmbed(el, spec, {mode: 'vega-lite', actions: false, renderer: 'canvas'}).then(function(){ return 1; }, function(err){
      console.error('proflab: chart ' + i + ' failed: ' + err);
      var p = document.createElement('p'); p.className = 'chart-error';
      p.textContent = 'chart failed to draw: ' + err; el.appendChild(p); return 0;
    });
  });
  Promise.all(jobs).then(function(ok){
    document.body.setAttribute('data-charts', ok.reduce(function(a, b){ return a + b; }, 0) + ' drawn of ' + specs.length);
  });
  document.querySelectorAll('table.sortable th').forEach(function(th){
    th.addEventListener('click', function(){
      var table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
      var dir = th.getAttribute('aria-sort') === 'descending' ? 1 : -1;
      table.querySelectorAll('th').forEach(function(h){ h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', dir < 0 ? 'descending' : 'ascending');
      var num = th.classList.contains('num');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function(a, b){
        var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
        if (num) { x = x === '' ? -Infinity : +x; y = y === '' ? -Infinity : +y; return (x - y) * dir; }
        return x.localeCompare(y) * dir;
      });
      rows.forEach(function(r){ body.appendChild(r); });
    });
  });
})();
"""


# -- pieces --------------------------------------------------------------------------------


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        return f"{v:,.{digits}f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x, digits) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x, digits)}" for k, x in v.items())
    return str(v)


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]], *, names: Sequence[str] = (),
           caption: str | None = None, titles: dict[str, str] | None = None) -> str:
    """A sortable table: ``cols`` are (key, heading); numbers sort as numbers; keys in
    ``names`` are names from a trace (monospace, isolated direction); ``titles`` maps a
    column to the row key whose text shows on hover (a kernel's full name behind its label)."""
    if not rows:
        return ""
    numeric = {k for k, _ in cols if all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                                        for r in rows if r.get(k) is not None)
               and any(r.get(k) is not None for r in rows)}
    out = ['<div class="scroll"><table class="sortable">']
    if caption:
        out.append(f"<caption class=\"muted\">{_e(caption)}</caption>")
    out.append("<thead><tr>" + "".join(f'<th scope="col"{" class=num" if k in numeric else ""}>{_e(h)}</th>' for k, h in cols)
               + "</tr></thead><tbody>")
    for r in rows:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            if k in numeric:
                cells.append(f'<td class="num" data-v="{"" if v is None else _e(v)}">{_e(_fmt(v))}</td>')
            else:
                cls = ' class="name"' if k in names else ""
                if titles and k in titles and r.get(titles[k]):
                    cls += f' title="{_e(" ".join(str(r[titles[k]]).split()))}"'
                text = "-" if v is None else _fmt(v)
                cells.append(f'<td{cls} data-v="{_e(text)}">{_e(text)}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _kv(items: Sequence[tuple[str, Any]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(_fmt(v))}</dd>" for k, v in items if v is not None) + "</dl>"


def _input_name(rep: Any) -> str:
    inputs = rep.source.get("inputs") or [{}]
    return str(inputs[0].get("path") or "trace")


def _verdict(findings: Sequence[dict[str, Any]], per: str | None = "step") -> str:
    if not findings:
        return '<div class="verdict">Verdict: no finding (see the missing signals below)</div>'
    if findings[-1]["category"] == "healthy" and not any(f["severity"] in ("critical", "warning") for f in findings):
        return ('<div class="verdict healthy"><b>Verdict: healthy</b> — no cause of lost GPU time reaches 5% of the '
                "window</div>")
    top = findings[0]
    kind = str(top.get("id", "")).split(":", 1)[0]
    extra = f" ({kind})" if kind != top["category"] and re.fullmatch(r"[a-z][a-z0-9_]*", kind) else ""
    if (top.get("prediction") or {}).get("model") == "none":
        return (f'<div class="verdict {_e(top["severity"])}"><b>Verdict: {_e(top["category"])}{_e(extra)}</b> — '
                f"{_e(top['title'])}; no gain predicted: make the fix and measure it (proflab compare)</div>")
    return (f'<div class="verdict {_e(top["severity"])}"><b>Verdict: {_e(top["category"])}{_e(extra)}</b> — '
            f"{_e(top['title'])}; fixing it saves {_e(_fmt(top['est_gain_ms']))} ms {'a step' if per == 'step' else 'over the window'} "
            f"({_e(_fmt(top['est_gain_pct'], 1))}%, predicted)</div>")


def _evidence_html(evidence: dict[str, Any]) -> str:
    """A finding's evidence as a table of labelled values with their units, and each table of
    rows in it as a table of its own (every name escaped)."""
    items = [(k, v) for k, v in evidence_items(evidence) if k != "proflab try"]  # (the fix says it)
    if not items:
        return ""
    out = ['<table class="evidence"><tbody>']
    out += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items if not isinstance(v, list)]
    out.append("</tbody></table>")
    for label, rows in ((k, v) for k, v in items if isinstance(v, list)):
        heads, cells = evidence_table_rows(rows[:10])
        out.append(f'<div class="muted">{_e(label)}</div><div class="scroll"><table class="evidence"><thead><tr>'
                   + "".join(f"<th>{_e(h)}</th>" for h in heads) + "</tr></thead><tbody>"
                   + "".join("<tr>" + "".join(f"<td class=name>{_e(c)}</td>" for c in row) + "</tr>" for row in cells)
                   + "</tbody></table></div>")
    return "".join(out)


def _findings(page: _Page, findings: Sequence[dict[str, Any]], per: str | None = "step") -> None:
    page.add('<section class="findings"><h2>Findings, largest predicted gain first</h2>')
    if not findings:
        page.add('<p class="muted">No finding on this input.</p>')
    for i, f in enumerate(findings, 1):
        ev = _evidence_html(f.get("evidence") or {})
        where = "".join(f"<li><span class=muted>{_e(k)}</span>: <span class=name>{_e(_fmt(v))}</span></li>"
                        for k, v in (f.get("where") or {}).items() if v)
        page.add(
            f'<article class="finding" data-category="{_e(f["category"])}"><h3><span class="sev {_e(f["severity"])}">'
            f"{_e(f['severity'])}</span>{i}. {_e(f['title'])}</h3>"
            f'<div><span class="muted">{_e(f["category"])}</span> · <span class="gain">{_e(gain_text(f, per))}</span>'
            + (f' <span class="muted">— {_e(f["assumption"])}</span>' if f.get("assumption") else "") + "</div>"
            f'<div class="fix"><b>Fix:</b> {_e(f["fix"])}</div>'
            + (f'<details><summary>Evidence</summary>{ev}</details>' if ev else "")
            + (f'<details><summary>Where</summary><ul class="evidence">{where}</ul></details>' if where else "")
            + "</article>"
        )
    page.add("</section>")


def _report(page: _Page, rep: Any, ov: dict[str, Any] | None, *, heading: str | None, level: int) -> None:
    d = rep.to_dict()
    s, dev = d["summary"], d["device"]
    if level == 1:
        page.add(f"<h1>proflab report</h1><p class=\"muted name\">{_e(_input_name(rep))}</p>")
    else:
        # open: a chart sized to its container draws nothing inside a closed one
        page.add(f"<details open><summary><h2 style=\"display:inline\">{_e(heading)}</h2></summary>")
    page.add(_verdict(d["findings"], s.get("gain_per")))
    if together := combined_text(s):
        page.add(f"<p>{_e(together)}</p>")
    page.add(_kv([
        ("device", dev.get("name") or "unknown"),
        ("window", f"{_fmt(s.get('wall_ms'))} ms"),
        ("GPU busy", None if s.get("gpu_busy_pct") is None else f"{_fmt(s['gpu_busy_pct'], 1)} %"),
        ("steps", s.get("step_count")),
        ("median step (GPU-side)" if s.get("step_side") == "gpu" else "median step",
         None if s.get("median_step_ms") is None else f"{_fmt(s['median_step_ms'])} ms"),
        ("median step (host ranges)", None if s.get("median_cpu_step_ms") is None else f"{_fmt(s['median_cpu_step_ms'])} ms"),
    ]))
    for n in d["notes"]:
        page.add(f'<p class="muted">note: {_e(n)}</p>')
    _findings(page, d["findings"], s.get("gain_per"))
    _breakdown(page, d)
    _steps(page, d["steps"])
    if ov:
        _timeline(page, ov)
    if d.get("memory"):
        _memory(page, d["memory"])
    if d["kernels"]:
        page.add("<h2>Hot kernels</h2>")
        rows = [dict(k, label=kernel_label(k["name"])) for k in d["kernels"]]
        page.add(_table(rows, [("label", "kernel"), ("count", "calls"), ("total_ms", "total ms"), ("share_pct", "% of GPU time"),
                               ("mean_us", "mean µs"), ("median_us", "median µs"), ("max_us", "max µs"),
                               ("tensor_cores", "tensor cores"), ("op", "operator"), ("source", "source line")],
                        names=("label", "op", "source"), titles={"label": "name"}))
    if d["host_ops"]:
        page.add("<h2>Operators (host time)</h2>")
        page.add(_table(d["host_ops"], [("name", "operator"), ("count", "calls"), ("total_ms", "total ms")], names=("name",)))
    if d["ranges"]:
        page.add("<h2>Ranges (NVTX / record_function)</h2>")
        page.add(_table(d["ranges"], [("name", "range"), ("device", "device"), ("ranges", "count"), ("host_ms", "host ms"),
                                      ("gpu_ms", "GPU ms launched"), ("launches", "launches")], names=("name",)))
    if d["memcpy"]:
        page.add("<h2>Memory copies</h2>")
        page.add(_table(d["memcpy"], [("direction", "direction"), ("memory", "memory"), ("pageable", "pageable"),
                                      ("count", "copies"), ("bytes", "bytes"), ("time_ms", "time ms"),
                                      ("achieved_gbps", "achieved GB/s")]))
    if d.get("perf") and (d["perf"]["classes"] or d["perf"]["per_step"].get("model_flops")):
        _perf(page, d["perf"], d["kernel_verdicts"])
    if d["kernel_verdicts"]:
        _verdicts(page, d["kernel_verdicts"])
    if d["launch"]:
        page.add("<h2>Launches</h2>" + _kv(list(d["launch"].items())))
    if d["missing"]:
        page.add("<h2>Missing signals</h2><ul>" + "".join(
            f"<li><b>{_e(m['signal'])}</b>: {_e(m['reason'])}"
            + (f" <span class=muted>(not analysed: {_e(', '.join(m['skipped']))})</span>" if m["skipped"] else "") + "</li>"
            for m in d["missing"]) + "</ul>")
    if level != 1:
        page.add("</details>")


def _breakdown(page: _Page, d: dict[str, Any]) -> None:
    s = d["summary"]
    rows = []
    for dev in s.get("devices") or []:
        for part, v in dev["breakdown_ms"].items():
            if part != "idle":
                rows.append({"device": f"GPU {dev['device']}", "kind": part, "ms": v})
    for cause, v in ((d.get("idle") or {}).get("by_cause_ms") or {}).items():
        rows.append({"device": "all GPUs (idle by cause, mean per GPU)" if len(s.get("devices") or []) > 1 else
                     f"GPU {s['devices'][0]['device']}", "kind": f"idle: {cause}", "ms": v})
    if not rows:
        return
    page.add("<h2>Where the window's time goes</h2>")
    page.chart({
        "data": {"values": rows}, "mark": {"type": "bar", "tooltip": True}, "height": {"step": 28}, "width": "container",
        "encoding": {
            "y": {"field": "device", "type": "nominal", "title": None},
            "x": {"field": "ms", "type": "quantitative", "stack": "zero", "title": "ms"},
            "color": _color(rows), "order": {"field": "korder", "type": "quantitative"},
            "tooltip": [{"field": "kind"}, {"field": "ms", "format": ",.3f", "title": "ms"}],
        },
        "transform": [{"calculate": safe_expr_index(_KINDS, "datum.kind"), "as": "korder"}],
    }, "breakdown of the window's time per GPU")


def safe_expr_index(domain: Sequence[str], field: str) -> str:
    """A Vega expression: the index of ``field`` in a fixed list of our own names."""
    return f"indexof({json.dumps(list(domain))}, {field})"


def _steps(page: _Page, steps: Sequence[dict[str, Any]]) -> None:
    if not steps:
        return
    gpu = [s for s in steps if s.get("side") != "host" and s.get("compute_ms") is not None]
    page.add("<h2>Steps</h2>")
    if gpu:
        page.add('<p class="muted">Each step\'s GPU-side window (first work launched in the step to the next '
                 "step's first work), split by what the GPU did; the dot is the host's ProfilerStep range.</p>")
        rows, host = [], []
        for s in gpu:
            label = f"{s['step']}" + (f" (GPU {s['device']})" if len({x['device'] for x in gpu}) > 1 else "")
            for part in ("compute", "communication", "memcpy", "memset"):
                rows.append({"step": label, "kind": part, "ms": s[f"{part}_ms"]})
            rows.append({"step": label, "kind": "idle", "ms": s["idle_ms"]})
            host.append({"step": label, "host_ms": s.get("cpu_dur_ms")})
        page.chart({
            "width": "container", "height": 220,
            "layer": [
                {"data": {"values": rows}, "mark": {"type": "bar", "tooltip": True},
                 "transform": [{"calculate": safe_expr_index(_KINDS, "datum.kind"), "as": "korder"}],
                 "encoding": {"x": {"field": "step", "type": "ordinal", "sort": None, "title": "step"},
                              "y": {"field": "ms", "type": "quantitative", "stack": "zero", "title": "ms (GPU-side)"},
                              "color": _color(rows), "order": {"field": "korder", "type": "quantitative"},
                              "tooltip": [{"field": "step"}, {"field": "kind"}, {"field": "ms", "format": ",.3f"}]}},
                {"data": {"values": host}, "mark": {"type": "point", "filled": True, "color": "#333", "tooltip": True},
                 "encoding": {"x": {"field": "step", "type": "ordinal", "sort": None},
                              "y": {"field": "host_ms", "type": "quantitative"},
                              "tooltip": [{"field": "step"}, {"field": "host_ms", "title": "host range ms", "format": ",.3f"}]}},
            ],
        }, "per-step GPU-side time")
    page.add(_table(list(steps), [("step", "step"), ("device", "GPU"), ("side", "side"), ("dur_ms", "step ms"),
                                  ("cpu_dur_ms", "host range ms"), ("gpu_busy_pct", "busy %"), ("compute_ms", "compute ms"),
                                  ("communication_ms", "comm ms"), ("memcpy_ms", "memcpy ms"), ("idle_ms", "idle ms")]))


def _timeline(page: _Page, ov: dict[str, Any]) -> None:
    rows: list[dict[str, Any]] = []
    for s in ov["segments"]:
        rows.append({"lane": s["lane"], "kind": s["kind"], "start": s["start"], "end": s["end"],
                     "what": s["name"], "events": s["n"], "busy_ms": s["busy_ms"]})
    for g in ov["gaps"]:
        rows.append({"lane": g["lane"], "kind": f"idle: {g['cause']}", "start": g["start"], "end": g["end"],
                     "what": g.get("name") or f"idle ({g['cause']})", "busy_ms": 0})
    for s in ov["steps"]:
        rows.append({"lane": s["lane"], "kind": "step", "start": s["start"], "end": s["end"], "what": s["name"]})
    for r in ov["ranges"]:
        rows.append({"lane": r["lane"], "kind": "range", "start": r["start"], "end": r["end"], "what": r["name"]})
    if not rows:
        return
    for r in rows:
        r["dur_ms"] = round(r["end"] - r["start"], 4)
    page.add("<h2>Timeline</h2>")
    left = ", ".join(f"{v:,} shorter {k}" for k, v in ov.get("left_out", {}).items() if v)
    page.add(f'<p class="muted">The analysed window ({_e(_fmt(ov["window_ms"]))} ms) per GPU stream; work closer than '
             f"{_e(_fmt(ov['resolution_us']))} µs is drawn as one segment (hover for its event count and longest event). "
             f"Idle gaps are coloured by cause. Drag to pan, scroll to zoom.{_e(' Not drawn: ' + left + '.') if left else ''}</p>")
    page.chart({
        "data": {"values": printable(rows)}, "width": "container", "height": {"step": 22},
        "params": [{"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"}],
        "mark": {"type": "bar", "tooltip": True, "opacity": 0.9},
        "encoding": {
            "y": {"field": "lane", "type": "nominal", "sort": ov["lanes"], "title": None},
            "x": {"field": "start", "type": "quantitative", "title": "ms from the window's start",
                  "scale": {"domain": [0, ov["window_ms"]]}},
            "x2": {"field": "end"}, "color": _color(rows),
            "tooltip": [{"field": "kind"}, {"field": "what", "title": "name"}, {"field": "start", "format": ",.4f", "title": "start ms"},
                        {"field": "dur_ms", "format": ",.4f", "title": "ms"}, {"field": "events"},
                        {"field": "busy_ms", "format": ",.4f", "title": "busy ms"}],
        },
    }, "timeline of the analysed window")


def _perf(page: _Page, p: dict[str, Any], verdicts: Sequence[dict[str, Any]]) -> None:
    """Where the FLOPs go: MFU, the classes and the top operators against their roofs, and
    the roofline as inline SVG (its names escaped by ``render.perf``)."""
    from proflab.render.perf import perf_headline, roofline_svg

    page.add("<h2>Where the FLOPs go</h2>")
    page.add("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in perf_headline(p)) + "</ul>")
    cols = [("achieved_tflops", "TFLOPS"), ("achieved_gbps", "GB/s"), ("intensity_flop_per_byte", "FLOP/byte"),
            ("bound", "bound"), ("roof", "roof"), ("ideal_ms", "ideal ms"), ("lost_ms", "lost ms"), ("pct_of_roof", "% of roof")]
    page.add(_table(p["classes"], [("class", "class"), ("count", "calls"), ("time_ms", "ms"), ("share_pct", "% of kernels"),
                                   ("flops", "FLOPs"), ("bytes", "bytes"), *cols]))
    tops = [o for o in p["top_ops"] if o.get("lost_ms")]
    if tops:
        page.add("<h3>Where a better kernel pays</h3>")
        page.add(_table(tops, [("signature", "operator"), ("count", "calls"), ("time_ms", "ms"), *cols], names=("signature",)))
    if p["unmodelled"]:
        page.add('<p class="muted">unmodelled: ' + "; ".join(
            f"{_e(u['op'])} {_e(_fmt(u['time_ms']))} ms ({_e(_fmt(u['share_pct']))} %, {_e(u['reason'])})" for u in p["unmodelled"][:8]) + "</p>")
    for m in p.get("missing") or []:
        page.add(f'<p class="muted">missing: {_e(m)}</p>')
    if any(c.get("achieved_tflops") for c in p["classes"]):
        page.add('<div class="scroll">' + roofline_svg(p, list(verdicts)) + "</div>")


def _verdicts(page: _Page, verdicts: Sequence[dict[str, Any]]) -> None:
    page.add("<h2>Kernel deep dive (Nsight Compute)</h2>")
    rows = []
    for v in verdicts:
        m, roof = v.get("metrics") or {}, v.get("roofline") or {}
        rows.append({"kernel": kernel_label(v["name"]), "verdict": v.get("headline"), "dram_pct": m.get("dram_pct"),
                     "l2_pct": m.get("l2_pct"), "tensor_pct": m.get("tensor_pipe_pct"), "roof_pct": roof.get("percent_of_roof"),
                     "stall": (v.get("stalls") or [{}])[0].get("reason")})
    page.add(_table(rows, [("kernel", "kernel"), ("verdict", "verdict"), ("dram_pct", "DRAM %"), ("l2_pct", "L2 %"),
                           ("tensor_pct", "tensor pipe %"), ("roof_pct", "% of roof"), ("stall", "top stall")], names=("kernel",)))
    points, roofs = [], []
    top_flops = 0.0
    for v in verdicts:
        r = v.get("roofline") or {}
        for prec, pk in (r.get("peak_gflops") or {}).items():
            roofs.append({"roof": f"{prec} peak", "kind": "compute", "gflops": pk})
            top_flops = max(top_flops, pk)
        ach = r.get("achieved_gflops")
        for lvl, ai in (r.get("intensity_flop_per_byte") or {}).items():
            if ach and ai:
                points.append({"kernel": kernel_label(v["name"])[:80], "level": lvl.upper(), "ai": ai, "gflops": ach})
    if not points:
        page.add('<p class="muted">Roofline: not drawn (no kernel has FLOPs, bytes and a duration).</p>')
        return
    lines = []
    xs = [p["ai"] for p in points]
    lo, hi = min(min(xs) / 10, 0.01), max(max(xs) * 10, 1e4)
    bws: dict[str, float] = {}
    for v in verdicts:
        for lvl, bw in ((v.get("roofline") or {}).get("peak_bandwidth_gbps") or {}).items():
            bws[lvl] = max(bws.get(lvl, 0.0), bw)
    for lvl, bw in bws.items():
        for i in range(41):
            x = lo * (hi / lo) ** (i / 40)
            y = x * bw
            lines.append({"roof": f"{lvl.upper()} {bw / 1e3:.1f} TB/s", "ai": x, "gflops": min(y, top_flops) if top_flops else y})
    for r in {r["roof"]: r for r in roofs}.values():
        lines += [{"roof": r["roof"], "ai": lo, "gflops": r["gflops"]}, {"roof": r["roof"], "ai": hi, "gflops": r["gflops"]}]
    page.add("<h3>Roofline</h3>")
    page.chart({
        "width": "container", "height": 360,
        "layer": [
            {"data": {"values": printable(lines)}, "mark": {"type": "line", "strokeDash": [4, 3], "clip": True},
             "encoding": {"x": {"field": "ai", "type": "quantitative", "scale": {"type": "log"}, "title": "arithmetic intensity (FLOP/byte)"},
                          "y": {"field": "gflops", "type": "quantitative", "scale": {"type": "log"}, "title": "GFLOP/s"},
                          "color": {"field": "roof", "type": "nominal", "title": "roofs", "scale": {"scheme": "greys"}},
                          "detail": {"field": "roof"}}},
            {"data": {"values": printable(points)}, "mark": {"type": "point", "filled": True, "size": 70, "tooltip": True},
             "encoding": {"x": {"field": "ai", "type": "quantitative"}, "y": {"field": "gflops", "type": "quantitative"},
                          "shape": {"field": "level", "type": "nominal", "title": "memory level"},
                          "fill": {"field": "kernel", "type": "nominal", "title": "kernel", "scale": {"scheme": "tableau10"}},
                          "tooltip": [{"field": "kernel"}, {"field": "level"}, {"field": "ai", "format": ".3g", "title": "FLOP/byte"},
                                      {"field": "gflops", "format": ",.1f", "title": "GFLOP/s"}]}},
        ],
        "resolve": {"scale": {"color": "independent"}},
    }, "hierarchical roofline of the profiled kernels")


def _memory(page: _Page, m: dict[str, Any]) -> None:
    """GPU memory (``report["memory"]``, from the allocator's events): the peak per device and
    when in the step it comes, what is live at it (by category, and the largest allocations by
    who made them), and allocated/reserved over the window with the peak and the steps marked."""
    from proflab.render.memory import _sources

    page.add("<h2>GPU memory</h2>")
    page.add(f'<p class="muted">{_e(_sources(m))}; sizes in MiB (2<sup>20</sup> bytes).</p>')
    devs = m.get("devices") or []
    page.add(_table([{
        "gpu": d["device"], "alloc": d["peak_allocated_mib"], "res": d["peak_reserved_mib"], "dev": d.get("device_memory_mib"),
        "pct": d.get("peak_reserved_pct_of_device"), "at": d.get("peak_at_ms"), "step": d.get("peak_step"),
        "phase": d["peak_phase"], "op": d.get("peak_op"), "dominant": (d.get("dominant_category") or "").replace("_", " ") or None,
    } for d in devs], [("gpu", "GPU"), ("alloc", "peak allocated MiB"), ("res", "peak reserved MiB"), ("dev", "device MiB"),
                       ("pct", "reserved % of device"), ("at", "peak at ms"), ("step", "peak step"), ("phase", "peak phase"),
                       ("op", "operator at the peak"), ("dominant", "largest category")], names=("op",)))
    for d in devs:
        gpu = f"GPU {d['device']}"
        page.add(f"<h3>{_e(gpu)}: allocated and reserved over the window</h3>")
        _memory_chart(page, d, gpu)
        cats = d.get("by_category_mib") or {}
        if cats:
            peak = d["peak_allocated_mib"] or None
            page.add(f"<h3>{_e(gpu)}: live at the peak, by category</h3>")
            page.add(_table([{"cat": k.replace("_", " "), "mib": v, "pct": None if not peak else round(100 * v / peak, 1)}
                             for k, v in cats.items()],
                            [("cat", "category"), ("mib", "MiB"), ("pct", "% of peak allocated")]))
            split = d.get("persistent_split")
            if split:
                page.add(f'<p class="muted">parameters and optimizer state are estimated: {_e(split.get("assumption"))}</p>')
        top = d.get("top_allocations") or []
        if top:
            page.add(f"<h3>{_e(gpu)}: largest allocations live at the peak</h3>")
            page.add(_table(top,
                            [("mib", "MiB"), ("category", "category"), ("op", "operator"), ("within", "within"), ("module", "module"),
                             ("source", "source line"), ("phase", "phase"), ("count", "allocations")],
                            names=("op", "within", "module", "source")))
    for n in m.get("nvml") or []:
        page.add(f'<p class="muted">NVML GPU {_e(n.get("device"))}: up to {_e(_fmt(n.get("max_used_mib")))} MiB used of '
                 f'{_e(_fmt(n.get("total_mib")))} MiB (every process and the CUDA context)</p>')
    for n in m.get("notes") or []:
        page.add(f'<p class="muted">note: {_e(n)}</p>')


def _memory_chart(page: _Page, d: dict[str, Any], gpu: str) -> None:
    s = d.get("series")
    if not s or not s.get("t_ms"):
        page.add('<p class="muted">No series to draw (this report was made without one).</p>')
        return
    rows = [{"t": t, "kind": k, "mib": v} for k, key in (("reserved", "reserved_mib"), ("allocated", "allocated_mib"))
            for t, v in zip(s["t_ms"], s[key])]
    thinned = f" ({s['points']:,} of {s['events']:,} events drawn: each run keeps its highest and lowest)" if s["points"] < s["events"] else ""
    page.add(f'<p class="muted">ms from the first allocation event; steps start at the dotted lines, the red point is the '
             f"peak{_e(thinned)}. Drag to pan, scroll to zoom.</p>")
    steps = [{"t": x["t_ms"], "what": f"step {x['step']} starts"} for x in s.get("step_starts_ms") or []]
    peak = [{"t": d["peak_at_ms"], "mib": d["peak_allocated_mib"],
             "what": f"peak {_fmt(d['peak_allocated_mib'])} MiB allocated, step {_fmt(d.get('peak_step'))}, {d['peak_phase']}"}]
    x = {"field": "t", "type": "quantitative", "title": "ms from the first allocation event"}
    layers: list[dict[str, Any]] = [{
        "data": {"values": rows}, "mark": {"type": "line", "interpolate": "step-after", "tooltip": True},
        "params": [{"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"}],
        "encoding": {"x": x, "y": {"field": "mib", "type": "quantitative", "title": "MiB"},
                     "color": {"field": "kind", "type": "nominal", "title": None,
                               "scale": {"domain": ["allocated", "reserved"], "range": ["#4e79a7", "#bab0ac"]}},
                     "tooltip": [{"field": "kind"}, {"field": "t", "format": ",.3f", "title": "ms"}, {"field": "mib", "format": ",.1f", "title": "MiB"}]},
    }]
    if steps:
        layers.append({"data": {"values": steps}, "mark": {"type": "rule", "strokeDash": [2, 3], "color": "#999", "tooltip": True},
                       "encoding": {"x": {"field": "t", "type": "quantitative"}, "tooltip": [{"field": "what"}]}})
    layers.append({"data": {"values": printable(peak)}, "mark": {"type": "point", "filled": True, "size": 80, "color": "#e15759", "tooltip": True},
                   "encoding": {"x": {"field": "t", "type": "quantitative"}, "y": {"field": "mib", "type": "quantitative"},
                                "tooltip": [{"field": "what"}]}})
    page.chart({"width": "container", "height": 220, "layer": layers}, f"{gpu} memory over the window")


_MONITOR_METRICS = (
    ("power_w", "power (W)"), ("sm_clock_mhz", "SM clock (MHz)"), ("mem_clock_mhz", "memory clock (MHz)"),
    ("util_gpu_pct", "GPU utilisation (%)"), ("util_mem_pct", "memory utilisation (%)"), ("temp_c", "temperature (°C)"),
    ("gpm_sm_active_pct", "GPM SM active (%)"), ("gpm_tensor_active_pct", "GPM tensor active (%)"),
    ("gpm_dram_bw_util_pct", "GPM DRAM bandwidth (%)"),
)


def _monitor(page: _Page, mon: Any, windows: Sequence[dict[str, Any]] = (), max_points: int = 1500) -> None:
    """The GPU monitor's samples over time, one small chart per signal it has (at most
    ``max_points`` samples per GPU: evenly thinned, the figures stay measured ones), with the
    profiled windows that the energy analysis placed on the monitor's clock shaded."""
    import polars as pl

    if mon is None or mon.height == 0 or "elapsed_s" not in mon.columns:
        return
    cols = [(c, t) for c, t in _MONITOR_METRICS if c in mon.columns and mon[c].drop_nulls().len() > 0]
    if not cols:
        return
    parts = []
    for (dev,), g in mon.sort("elapsed_s").group_by("device", maintain_order=True):
        step = max(g.height // max_points, 1)
        parts.append(g.gather_every(step))
    m = pl.concat(parts)
    page.add("<h2>GPU monitor (NVML)</h2>")
    page.add(f'<p class="muted">{m.height:,} of {mon.height:,} samples drawn; time in s since the monitor started.</p>')
    first = {d: t for (d,), t in ((k, g["elapsed_s"].min()) for k, g in mon.group_by("device"))}
    bands = []
    for w in windows:  # window_offset_s counts from the device's first sample
        if w.get("aligned") and w.get("window_offset_s") is not None and w.get("device") in first:
            t0 = first[w["device"]] + w["window_offset_s"]
            bands.append({"t0": t0, "t1": t0 + (w.get("window_s") or 0), "what": f"profiled window {w.get('trace') or ''}"})
    if bands:
        page.add('<p class="muted">The green band (a line where it is narrower than a pixel) is the profiled window, placed on the monitor\'s clock by the trace\'s base time.</p>')
    for c, title in cols:
        rows = [{"t": t, "gpu": f"GPU {d}", "v": v} for t, d, v in zip(m["elapsed_s"], m["device"], m[c]) if v is not None]
        line = {"data": {"values": rows}, "mark": {"type": "line", "interpolate": "step-after", "tooltip": True},
                "encoding": {"x": {"field": "t", "type": "quantitative", "title": "s"},
                             "y": {"field": "v", "type": "quantitative", "title": None},
                             "color": {"field": "gpu", "type": "nominal", "title": None}}}
        layers = [line]
        if bands:
            # a window of a few ms is narrower than a pixel: a rule marks where it starts
            layers[:0] = [{"data": {"values": printable(bands)}, "mark": {"type": mark, "color": "#59a14f", "opacity": op, "tooltip": True},
                           "encoding": {"x": {"field": "t0", "type": "quantitative"}, **({"x2": {"field": "t1"}} if mark == "rect" else {}),
                                        "tooltip": [{"field": "what"}]}} for mark, op in (("rect", 0.25), ("rule", 0.8))]
        page.chart({"width": "container", "height": 90, "title": title, "layer": layers}, f"GPU monitor: {title}")


def _energy(page: _Page, e: dict[str, Any]) -> None:
    """The run's energy (``proflab.energy/1``): its total, per GPU, per profiled window."""
    page.add("<h2>Energy</h2>")
    if e.get("energy_j") is not None:
        page.add(_kv([("energy of the run (all GPUs)", f"{_fmt(e['energy_j'])} J")]))
    for key, title in (("devices", "per GPU"), ("windows", "per profiled window")):
        rows = e.get(key)
        if isinstance(rows, list) and rows and isinstance(rows[0], dict):
            flat = [{k: (v if not isinstance(v, (dict, list)) else _fmt(v)) for k, v in r.items()} for r in rows]
            # one row reads better as a list of its fields than as a table of 25 columns
            body = _kv(list(flat[0].items())) if len(flat) == 1 else _table(flat, [(c, c) for c in flat[0]], names=("trace",))
            page.add(f"<h3>{_e(title)}</h3>" + body)
    for f in e.get("findings") or []:
        page.add(f'<p><span class="sev {_e(f["severity"])}">{_e(f["severity"])}</span>{_e(f["title"])}</p>')
    for m in e.get("missing") or []:
        if isinstance(m, dict):
            page.add(f"<p><b>missing {_e(m.get('signal'))}</b>: {_e(m.get('reason'))}</p>")


# -- a job and a comparison ----------------------------------------------------------------


def _job(page: _Page, job: Any) -> None:
    d = job.to_dict()
    s = d["summary"]
    page.add("<h1>proflab job report</h1>")
    per = s.get("gain_per", "step")
    page.add(_verdict(d["findings"], per))
    page.add(_kv(list(s.items())))
    _findings(page, d["findings"], per)
    if d["ranks"]:
        page.add("<h2>Ranks</h2>")
        rows = []
        for r in d["ranks"]:
            for part, key, label in (("compute", "compute_ms", "compute"), ("communication", "exposed_transfer_ms", "exposed transfer"),
                                     ("wait for peers", "exposed_wait_ms", "exposed wait (late peers)"), ("idle", "idle_ms", "idle")):
                if r.get(key) is not None:
                    rows.append({"rank": f"rank {r['rank']}", "kind": part, "ms": r[key], "label": label})
        page.chart({
            "data": {"values": rows}, "mark": {"type": "bar", "tooltip": True}, "width": "container", "height": {"step": 26},
            "encoding": {"y": {"field": "rank", "type": "nominal", "title": None},
                         "x": {"field": "ms", "type": "quantitative", "title": "ms over the window"},
                         "color": _color(rows), "tooltip": [{"field": "rank"}, {"field": "label", "title": "part"},
                                                      {"field": "ms", "format": ",.3f"}]},
        }, "per-rank time")
        cols = list(d["ranks"][0])
        page.add(_table(d["ranks"], [(c, c) for c in cols], names=("device_name",)))
    if d["collectives"]:
        page.add("<h2>Collectives</h2>")
        page.add(_table(d["collectives"], [(c, c) for c in d["collectives"][0]]))
    if d.get("link"):
        page.add(_kv(list(d["link"].items())))
    for m in d["missing"]:
        page.add(f"<p><b>missing {_e(m['signal'])}</b>: {_e(m['reason'])}</p>")
    for n in d["notes"]:
        page.add(f'<p class="muted">note: {_e(n)}</p>')


def _comparison(page: _Page, comparison: Any) -> None:
    d = comparison.to_dict()
    page.add("<h1>proflab compare</h1>")
    cls = {"regressed": "critical", "improved": "healthy"}.get(d["verdict"], "")
    page.add(f'<div class="verdict {cls}"><b>Verdict: {_e(d["verdict"].replace("_", " "))}</b> — {_e(d["verdict_reason"])}</div>')
    floor = [] if "noise floor" in d["verdict_reason"] else [("noise floor", f"{_fmt(d['noise_floor_pct'])} % ({d['noise_floor_source']})")]
    page.add(_kv([("before", _side_label(d.get("before"))), ("after", _side_label(d.get("after"))), *floor, ("per", d["per"])]))
    st = comparison.steps
    if st.height and "dur_ms" in st.columns:
        rows = [{"side": r["side"], "i": i, "ms": r["dur_ms"]}
                for i, r in enumerate(st.select("side", "dur_ms").iter_rows(named=True))]
        page.add("<h2>Step times</h2>")
        page.chart({
            "data": {"values": rows}, "width": "container", "height": 160,
            "mark": {"type": "tick", "thickness": 2, "tooltip": True},
            "encoding": {"x": {"field": "ms", "type": "quantitative", "title": "step ms (GPU-side)"},
                         "y": {"field": "side", "type": "nominal", "sort": ["before", "after"], "title": None},
                         "color": {"field": "side", "type": "nominal", "legend": None}},
        }, "step times before and after")
    if d.get("breakdown_ms"):
        page.add("<h2>Where the time moved (ms per step)</h2>")
        rows = [{"side": side, "kind": r["part"].replace("idle:", "idle: "), "ms": r[f"{side}_ms"]}
                for r in d["breakdown_ms"] for side in ("before", "after") if r.get(f"{side}_ms") is not None]
        page.chart({
            "data": {"values": rows}, "mark": {"type": "bar", "tooltip": True}, "width": "container", "height": {"step": 28},
            "transform": [{"calculate": safe_expr_index(_KINDS, "datum.kind"), "as": "korder"}],
            "encoding": {"y": {"field": "side", "type": "nominal", "sort": ["before", "after"], "title": None},
                         "x": {"field": "ms", "type": "quantitative", "stack": "zero", "title": "ms per step"},
                         "color": _color(rows), "order": {"field": "korder", "type": "quantitative"},
                         "tooltip": [{"field": "side"}, {"field": "kind"}, {"field": "ms", "format": ",.3f"}]},
        }, "breakdown before and after")
        page.add(_table(d["breakdown_ms"], [(c, c) for c in d["breakdown_ms"][0]]))
    pf = d.get("perf")
    if pf and pf["classes"]:
        page.add("<h2>Where the FLOPs go: achieved TFLOPS by operator class</h2>")
        page.add(_kv([("MFU before", pf["mfu_pct"]["before"]), ("MFU after", pf["mfu_pct"]["after"])]))
        page.add(_table(pf["classes"], [(c, c) for c in pf["classes"][0]], names=("class",)))
    for key, title, names in (("kernels", "Kernels", ("name", "example")), ("ops", "Operators", ("name",)),
                              ("ranges", "Ranges", ("name",)), ("findings", "Findings", ("title", "fix"))):
        rows = d.get(key)
        if rows and isinstance(rows, list) and isinstance(rows[0], dict):
            flat = [{k: (v if not isinstance(v, (dict, list)) else _fmt(v)) for k, v in r.items()} for r in rows]
            page.add(f"<h2>{_e(title)}</h2>" + _table(flat, [(c, c) for c in flat[0]], names=names))
    for c in d.get("caveats") or []:
        page.add(f'<p class="muted">caveat: {_e(c)}</p>')


def _side_label(side: Any) -> str:
    if isinstance(side, dict):
        return str(side.get("label") or side.get("path") or _fmt(side))
    return _fmt(side)

"""The doctor's report (``proflab.doctor/1``) as terminal lines or JSON: one line a check."""

from __future__ import annotations

import json
from typing import Any

from proflab.render._text import printable

__all__ = ["render_doctor"]

_MARK = {"ok": "ok", "missing": "MISSING", "warning": "WARNING"}


def render_doctor(report: dict[str, Any], fmt: str = "term") -> str:
    """``report`` is ``DoctorReport.to_dict()``; ``fmt`` "term" or "json"."""
    if fmt == "json":
        return json.dumps(report, indent=2) + "\n"
    checks = report["checks"]
    w = max((len(c["name"]) for c in checks), default=0)
    lines = []
    for c in checks:
        line = f"{_MARK[c['status']]:<8} {c['name']:<{w}}  {printable(c['detail'])}"
        if c["status"] != "ok" and c["fix"]:
            line += f" -- fix: {printable(c['fix'])}"
        lines.append(line)
    blocking = [c["name"] for c in checks if c["required"] and c["status"] != "ok"]
    if report["can_profile"]:
        lines.append("\ntorch.profiler can profile GPU programs here (exit 0).")
    else:
        lines.append(f"\ntorch.profiler cannot profile GPU programs here: {', '.join(blocking)} (exit 1).")
    return "\n".join(lines) + "\n"

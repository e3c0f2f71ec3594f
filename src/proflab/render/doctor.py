"""The doctor's report (``proflab.doctor/1``) as terminal lines or JSON: one line a check."""

from __future__ import annotations

import json
from typing import Any

from proflab.render._text import printable

__all__ = ["render_doctor"]

_MARK = {"ok": "ok", "missing": "MISSING", "warning": "WARNING"}


def render_doctor(report: dict[str, Any], fmt: str = "term", *, need: str | None = None, status: int | None = None) -> str:
    """``report`` is ``DoctorReport.to_dict()``; ``fmt`` "term" or "json"; ``need`` and
    ``status``: what ``--need`` asked and the exit status it gives (said on the last line)."""
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
    works = report.get("works") or []
    if works:
        lines.append("\nWhat works here")
        nw = max(len(x["name"]) for x in works)
        for x in works:
            line = f"  {'yes' if x['works'] else 'no':<4}{x['name']:<{nw}}  ({x['commands']}) {printable(x['detail'])}"
            if not x["works"] and x["fix"]:
                line += f" -- to add it: {printable(x['fix'])}"
            lines.append(line)
    lines.append("")
    broken = report.get("broken") or []
    if broken:
        lines.append("Not working as it should: " + "; ".join(printable(b) for b in broken) + f" (exit {status if status is not None else 1}).")
    elif report["can_profile"]:
        lines.append(f"torch.profiler can profile GPU programs here (exit {status if status is not None else 0}).")
    else:
        main = ("trace analysis", "profiling CPU programs", "profiling GPU programs")  # (the rest: the lines above)
        can = [x["name"] for x in works if x["works"] and x["name"] in main]
        cannot = [x["name"] for x in works if not x["works"] and x["name"] == "profiling GPU programs"]
        tail = f" (exit {status})" if status is not None else ""
        lines.append(f"proflab works here for {_and(can) or 'nothing'}"
                     + (f"; not for {_and(cannot)}" if cannot else "") + (f": --need {need} is not met" if need and status else "")
                     + f"{tail}.")
    return "\n".join(lines) + "\n"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1] if names else ""

"""Small text helpers shared by the terminal and Markdown renderers."""

from __future__ import annotations

from typing import Any

__all__ = ["shorten", "fmt_num", "evidence_lines"]


def shorten(name: str | None, width: int) -> str:
    if name is None:
        return "-"
    name = " ".join(str(name).split())
    return name if len(name) <= width else name[: max(width - 1, 1)] + "…"


def fmt_num(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def evidence_lines(evidence: dict[str, Any], width: int = 76) -> list[str]:
    """Flat ``key: value`` lines for scalar evidence; lists of rows as indented sub-lines."""
    out: list[str] = []
    for key, value in evidence.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            out.append(f"{key}:")
            for row in value[:5]:
                out.append("  - " + shorten(", ".join(f"{k}={fmt_num(v)}" for k, v in row.items()), width - 4))
        elif isinstance(value, dict):
            out.append(shorten(f"{key}: " + ", ".join(f"{k}={fmt_num(v)}" for k, v in value.items()), width))
        elif isinstance(value, list):
            out.append(shorten(f"{key}: " + ", ".join(fmt_num(v) for v in value), width))
        else:
            out.append(f"{key}: {fmt_num(value)}")
    return out

"""Renderers: each turns one Report into one output format. Chosen by name or file suffix."""

from __future__ import annotations

from proflab.errors import UsageError

__all__ = ["render", "FORMATS", "format_for_path"]

FORMATS = ("term", "json", "md")
_SUFFIX = {".json": "json", ".md": "md", ".markdown": "md", ".txt": "term"}


def format_for_path(path: str) -> str | None:
    for suffix, fmt in _SUFFIX.items():
        if path.endswith(suffix):
            return fmt
    return None


def render(reports, fmt: str, *, width: int | None = None, color: bool = False) -> str:
    """Text of one or several reports in ``fmt`` ("term", "json" or "md"); a ``JobReport``
    renders as the job's tables and findings, then each rank's report; a ``Comparison`` with
    its own layout by the same renderers."""
    from proflab.report import JobReport

    if isinstance(reports, JobReport):
        return _render_job(reports, fmt, width=width, color=color)
    if hasattr(reports, "verdict"):  # a Comparison
        return _render_comparison(reports, fmt, width=width, color=color)
    if fmt == "json":
        from proflab.render.json import render_json

        return render_json(reports)
    if fmt == "md":
        from proflab.render.markdown import render_markdown

        return "\n\n".join(render_markdown(r) for r in reports)
    if fmt == "term":
        from proflab.render.terminal import render_terminal

        return "\n".join(render_terminal(r, width=width, color=color) for r in reports)
    raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _render_comparison(comparison, fmt: str, *, width: int | None, color: bool) -> str:
    return _render_special(comparison, fmt, "markdown:render_compare_markdown", "terminal:render_compare_terminal", width, color)


def _render_job(job, fmt: str, *, width: int | None, color: bool) -> str:
    return _render_special(job, fmt, "job:render_job_markdown", "job:render_job_terminal", width, color)


def _render_special(obj, fmt: str, md: str, term: str, width: int | None, color: bool) -> str:
    """A comparison or a job: JSON through the one JSON renderer, Markdown and terminal
    through their own functions (``module:function`` under proflab.render)."""
    from importlib import import_module

    if fmt == "json":
        from proflab.render.json import render_json

        return render_json([obj])
    if fmt in ("md", "term"):
        module, name = (md if fmt == "md" else term).split(":")
        fn = getattr(import_module(f"proflab.render.{module}"), name)
        return fn(obj) if fmt == "md" else fn(obj, width=width, color=color)
    raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")

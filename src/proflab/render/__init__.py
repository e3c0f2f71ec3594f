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
    if fmt == "json":
        from proflab.render.json import render_json

        return render_json([comparison])
    if fmt == "md":
        from proflab.render.markdown import render_compare_markdown

        return render_compare_markdown(comparison)
    if fmt == "term":
        from proflab.render.terminal import render_compare_terminal

        return render_compare_terminal(comparison, width=width, color=color)
def _render_job(job, fmt: str, *, width: int | None, color: bool) -> str:
    if fmt == "json":
        from proflab.render.json import render_json

        return render_json([job])
    if fmt == "md":
        from proflab.render.job import render_job_markdown

        return render_job_markdown(job)
    if fmt == "term":
        from proflab.render.job import render_job_terminal

        return render_job_terminal(job, width=width, color=color)
    raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")

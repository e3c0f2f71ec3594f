"""Computations over the trace model. Pure functions of a Trace; no printing, no plotting.

:class:`Context` caches them for the rules so every table is computed once. It is imported
on first use: ``proflab.analysis.labels`` (what the renderers need) loads without polars.
"""

__all__ = ["Context"]


def __getattr__(name: str):
    if name == "Context":
        from proflab.analysis.context import Context

        return Context
    raise AttributeError(f"module 'proflab.analysis' has no attribute {name!r}")

"""Computations over the trace model. Pure functions of a Trace; no printing, no plotting.

:class:`Context` caches them for the rules so every table is computed once.
"""

from proflab.analysis.context import Context

__all__ = ["Context"]

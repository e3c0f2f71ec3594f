"""The normalized, columnar trace model (no I/O here).

Every reader produces a :class:`Trace`; every analysis consumes one. What a diagnosis says
(``findings``: a Finding, a Missing signal) lives here too, below the analyses and rules that
share it. The tables need polars, so they load on first use: ``proflab.model.findings`` (and
the report that carries findings) loads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from proflab.model.trace import COMM_SCHEMA, CPU_SCHEMA, DEVICE_SCHEMA, GPU_SCHEMA, STEP_SCHEMA, Trace, TraceMeta

__all__ = ["COMM_SCHEMA", "Trace", "TraceMeta", "GPU_SCHEMA", "CPU_SCHEMA", "STEP_SCHEMA", "DEVICE_SCHEMA"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from proflab.model import trace

        return getattr(trace, name)
    raise AttributeError(f"module 'proflab.model' has no attribute {name!r}")

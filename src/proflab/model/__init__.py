"""The normalized, columnar trace model (no I/O here).

Every reader produces a :class:`Trace`; every analysis consumes one.
"""

from proflab.model.trace import (
    COMM_SCHEMA,
    CPU_SCHEMA,
    DEVICE_SCHEMA,
    GPU_SCHEMA,
    STEP_SCHEMA,
    Trace,
    TraceMeta,
)

__all__ = ["COMM_SCHEMA", "Trace", "TraceMeta", "GPU_SCHEMA", "CPU_SCHEMA", "STEP_SCHEMA", "DEVICE_SCHEMA"]

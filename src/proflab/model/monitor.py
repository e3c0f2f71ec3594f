"""The GPU monitor's samples (``monitor.parquet``): what the bits of their ``throttle_mask``
column mean. ``collect.monitor`` writes the column and ``analysis.energy`` reads it; both take
the names from here (no polars, no NVML).
"""

from __future__ import annotations

__all__ = ["THROTTLE_BITS", "throttle_names"]

# NVML's clock-event ("throttle") reason bits; stable across driver versions.
THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_names(mask: int | None) -> list[str] | None:
    """NVML's clock-event bitmask as names (``sw_power_cap``, ``hw_thermal_slowdown``...)."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_BITS if mask & bit]

"""Device identity and datasheet peaks.

Peaks come from NVIDIA's datasheets (dense, no sparsity) and are labelled as such in reports;
they are ceilings to compare against, never measurements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DevicePeaks", "datasheet_peaks"]


@dataclass(frozen=True)
class DevicePeaks:
    model: str
    hbm_gbps: float
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None


# (substring to match in the device name, lowercased; peaks). First match wins.
_TABLE: list[tuple[tuple[str, ...], DevicePeaks]] = [
    (("h200",), DevicePeaks("H200 SXM", 4800, 67, 495, 989)),
    (("h100", "pcie"), DevicePeaks("H100 PCIe", 2000, 51, 378, 756)),
    (("h100", "nvl"), DevicePeaks("H100 NVL", 3900, 60, 418, 835)),
    (("h100",), DevicePeaks("H100 SXM", 3350, 67, 495, 989)),
    (("gh200",), DevicePeaks("GH200", 4000, 67, 495, 989)),
    (("a100", "80gb"), DevicePeaks("A100 80GB", 2039, 19.5, 156, 312)),
    (("a100",), DevicePeaks("A100 40GB", 1555, 19.5, 156, 312)),
    (("l40s",), DevicePeaks("L40S", 864, 91.6, 183, 362)),
    (("l4",), DevicePeaks("L4", 300, 30.3, 60, 121)),
    (("a10",), DevicePeaks("A10", 600, 31.2, 62.5, 125)),
    (("t4",), DevicePeaks("T4", 320, 8.1, None, 65)),
    (("v100",), DevicePeaks("V100", 900, 15.7, None, 125)),
]


def datasheet_peaks(name: str | None) -> DevicePeaks | None:
    """Peaks for a device name; every key must be a whole word of it ("L4" is not "L40S")."""
    if not name:
        return None
    words = set(re.findall(r"[a-z0-9]+", name.lower()))
    for keys, peaks in _TABLE:
        if all(k in words for k in keys):
            return peaks
    return None

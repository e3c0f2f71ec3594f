"""Device identity and datasheet peaks.

Peaks come from NVIDIA's and AMD's datasheets (dense, no sparsity) and are labelled as such in
reports; they are ceilings to compare against, never measurements. AMD's figures hold for the
whole device only: a trace whose device lists fewer compute units than the datasheet's (a CPX
partition of an MI300X, one die of an MI250X) gets none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DevicePeaks", "datasheet_peaks", "peaks_missing_reason", "default_power_limit_w"]


@dataclass(frozen=True)
class DevicePeaks:
    """Dense datasheet peaks: ``hbm_gbps`` (GB/s, 10^9 bytes), ``fp32_tflops`` (the CUDA
    cores' / vector units'), the matrix (tensor-core) peaks ``tf32_tflops``, ``bf16_tflops``,
    ``fp16_tflops``, ``fp8_tflops`` and ``fp64_tflops``; None where the datasheet gives none."""

    model: str
    hbm_gbps: float
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None
    units: int | None = None  # compute units the figures are for (AMD); None: not checked
    fp16_tflops: float | None = None
    fp8_tflops: float | None = None
    fp64_tflops: float | None = None  # FP64 on the tensor cores (matrix units) where they have it

    def matrix_tflops(self, dtype: str | None) -> float | None:
        """The dense matrix peak for a compute dtype ("bf16", "fp16", "fp8", "tf32", "fp32",
        "fp64"); "fp32" is the CUDA cores' (no TF32)."""
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp8": self.fp8_tflops, "tf32": self.tf32_tflops,
                "fp32": self.fp32_tflops, "fp64": self.fp64_tflops}.get(dtype or "")


# (substring to match in the device name, lowercased; peaks). First match wins.
_TABLE: list[tuple[tuple[str, ...], DevicePeaks]] = [
    # NVIDIA (datasheets; FP16 as BF16, FP8 where the generation has it; FP64: the tensor cores')
    (("h200",), DevicePeaks("H200 SXM", 4800, 67, 495, 989, fp16_tflops=989, fp8_tflops=1979, fp64_tflops=67)),
    (("h100", "pcie"), DevicePeaks("H100 PCIe", 2000, 51, 378, 756, fp16_tflops=756, fp8_tflops=1513, fp64_tflops=51)),
    (("h100", "nvl"), DevicePeaks("H100 NVL", 3900, 60, 418, 835, fp16_tflops=835, fp8_tflops=1671, fp64_tflops=60)),
    (("h100",), DevicePeaks("H100 SXM", 3350, 67, 495, 989, fp16_tflops=989, fp8_tflops=1979, fp64_tflops=67)),
    (("gh200",), DevicePeaks("GH200", 4000, 67, 495, 989, fp16_tflops=989, fp8_tflops=1979, fp64_tflops=67)),
    (("a100", "80gb"), DevicePeaks("A100 80GB", 2039, 19.5, 156, 312, fp16_tflops=312, fp64_tflops=19.5)),
    (("a100",), DevicePeaks("A100 40GB", 1555, 19.5, 156, 312, fp16_tflops=312, fp64_tflops=19.5)),
    (("l40s",), DevicePeaks("L40S", 864, 91.6, 183, 362, fp16_tflops=362, fp8_tflops=733)),
    (("l4",), DevicePeaks("L4", 300, 30.3, 60, 121, fp16_tflops=121, fp8_tflops=242.5)),
    (("a10",), DevicePeaks("A10", 600, 31.2, 62.5, 125, fp16_tflops=125)),
    (("t4",), DevicePeaks("T4", 320, 8.1, None, 65, fp16_tflops=65)),
    (("v100",), DevicePeaks("V100", 900, 15.7, None, 125, fp16_tflops=125)),
    # AMD Instinct (datasheets: peak FP32 vector, TF32, BF16, FP16, FP8 and FP64 matrix, dense).
    # Torch shows an MI250/MI250X as two devices named "AMD Instinct MI250X / MI250", one per
    # die: no entry.
    (("mi325x",), DevicePeaks("MI325X", 6000, 163.4, 653.7, 1307.4, units=304, fp16_tflops=1307.4, fp8_tflops=2614.9, fp64_tflops=163.4)),
    (("mi300x",), DevicePeaks("MI300X", 5300, 163.4, 653.7, 1307.4, units=304, fp16_tflops=1307.4, fp8_tflops=2614.9, fp64_tflops=163.4)),
    (("mi300a",), DevicePeaks("MI300A", 5300, 122.6, 490.3, 980.6, units=228, fp16_tflops=980.6, fp8_tflops=1961.2, fp64_tflops=122.6)),
    (("mi210",), DevicePeaks("MI210", 1638.4, 22.6, None, 181.0, units=104, fp16_tflops=181.0, fp64_tflops=45.3)),
]


# The boards' default power limits (W: the datasheet's maximum TDP, which the driver enforces
# unless someone lowered it), for recordings that did not read NVML's own default. Whole-word
# keys, first match wins; a board whose makers set it differently (GH200) has none.
_DEFAULT_POWER_W: list[tuple[tuple[str, ...], float]] = [
    (("h200", "nvl"), 600.0), (("h200",), 700.0),
    (("h100", "pcie"), 350.0), (("h100", "nvl"), 400.0), (("h100",), 700.0),
    (("a100", "pcie", "80gb"), 300.0), (("a100", "pcie"), 250.0), (("a100",), 400.0),
    (("l40s",), 350.0), (("l4",), 72.0), (("a10",), 150.0), (("t4",), 70.0),
    (("v100", "pcie"), 250.0), (("v100",), 300.0),
    (("mi325x",), 1000.0), (("mi300x",), 750.0), (("mi210",), 300.0),
]


def default_power_limit_w(name: str | None) -> float | None:
    """The board's default power limit (W) from its datasheet, or None where not known."""
    if not name:
        return None
    words = set(re.findall(r"[a-z0-9]+", name.lower()))
    return next((w for keys, w in _DEFAULT_POWER_W if all(k in words for k in keys)), None)


def _lookup(name: str | None) -> DevicePeaks | None:
    if not name:
        return None
    words = set(re.findall(r"[a-z0-9]+", name.lower()))
    for keys, peaks in _TABLE:
        if all(k in words for k in keys):
            return peaks
    return None


def datasheet_peaks(name: str | None, sm_count: int | None = None) -> DevicePeaks | None:
    """Peaks for a device name; every key must be a whole word of it ("L4" is not "L40S").
    With the trace's SM/CU count, a device smaller than the datasheet's gets none."""
    peaks = _lookup(name)
    if peaks is not None and peaks.units is not None and sm_count is not None and sm_count != peaks.units:
        return None
    return peaks


def peaks_missing_reason(name: str, sm_count: int | None = None) -> str:
    """Why ``datasheet_peaks`` gave nothing for this device, in words for a report."""
    peaks = _lookup(name)
    if peaks is not None and peaks.units is not None and sm_count is not None and sm_count != peaks.units:
        return (
            f"{name} lists {sm_count} compute units, not the {peaks.units} its datasheet figures are for "
            "(a partition of the device)"
        )
    return f"no datasheet figures are known for {name}"

"""Hierarchical roofline of one profiled kernel launch, from Nsight Compute metrics.

FLOPs are counted per precision from executed SASS instructions, as ncu's own roofline
sections do: an add or a multiply is one operation, a fused multiply-add two, and the packed
half-precision FMA (HFMA2) four. Tensor-core operations come from ``sm__ops_path_tensor_*``,
which ncu already counts in operations. Bytes are taken at three levels: L1 (global and local
loads and stores through the LSU pipe), L2 (every L2 sector) and DRAM.

Ceilings come from the same report where ncu states them (peak instructions or bytes per
cycle, times the clock measured during the kernel). The tensor-core ceiling is the datasheet's
dense peak, labelled as such, because ncu's per-path peaks count differently across
generations. Anything missing is left out and named in ``missing``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proflab.analysis.devices import datasheet_peaks
from proflab.model.ncu import NcuProfile

__all__ = ["Roofline", "roofline"]

_SECTOR_BYTES = 32
# (precision, [(instruction, FLOPs per thread instruction)], peak instruction, FLOPs per peak instruction)
_SIMT = (
    ("fp64", (("dadd", 1), ("dmul", 1), ("dfma", 2)), "dfma", 2),
    ("fp32", (("fadd", 1), ("fmul", 1), ("ffma", 2)), "ffma", 2),
    ("fp16", (("hadd", 2), ("hmul", 2), ("hfma", 4)), "hfma", 4),
)
_TENSOR_SRC = ("bf16_dst_fp32", "fp16", "tf32_dst_fp32", "fp64", "fp8_sparsity_off", "fp8_sparsity_on", "int8", "int1")


@dataclass(frozen=True)
class Roofline:
    """Units: ``flop`` in operations, ``bytes`` in bytes, rates per second, ``duration_ns`` in
    ns. ``percent_of_roof`` is achieved FLOP/s over the lower of the compute ceiling of the
    kernel's main precision and DRAM bandwidth × its DRAM arithmetic intensity."""

    duration_ns: float
    flop: dict[str, float]  # by precision: fp64, fp32, fp16, tensor
    bytes: dict[str, float]  # by level: l1, l2, dram
    peak_flops: dict[str, float]  # FLOP/s by precision
    peak_bandwidth: dict[str, float]  # byte/s by level
    peak_source: dict[str, str]
    missing: tuple[str, ...] = field(default=())

    @property
    def total_flop(self) -> float:
        return sum(self.flop.values())

    @property
    def main_precision(self) -> str | None:
        if not self.flop or self.total_flop <= 0:
            return None
        return max(self.flop, key=lambda k: self.flop[k])

    @property
    def achieved_flops(self) -> float | None:
        if self.duration_ns <= 0:
            return None
        return self.total_flop / (self.duration_ns * 1e-9)

    def intensity(self, level: str) -> float | None:
        b = self.bytes.get(level)
        if not b or self.total_flop <= 0:
            return None
        return self.total_flop / b

    @property
    def bound_by(self) -> str | None:
        """``memory`` when the DRAM roof is below the compute roof at this intensity."""
        ai, bw, peak = self.intensity("dram"), self.peak_bandwidth.get("dram"), self._main_peak()
        if ai is None or bw is None or peak is None:
            return None
        return "memory" if ai * bw < peak else "compute"

    def _main_peak(self) -> float | None:
        p = self.main_precision
        return None if p is None else self.peak_flops.get(p)

    @property
    def percent_of_roof(self) -> float | None:
        ach, ai, bw, peak = self.achieved_flops, self.intensity("dram"), self.peak_bandwidth.get("dram"), self._main_peak()
        if ach is None or peak is None:
            return None
        roof = peak if ai is None or bw is None else min(peak, ai * bw)
        return 100.0 * ach / roof if roof > 0 else None

    def to_dict(self) -> dict[str, Any]:
        ach = self.achieved_flops
        return {
            "duration_us": round(self.duration_ns / 1e3, 3),
            "flop": {k: v for k, v in self.flop.items()},
            "bytes": {k: v for k, v in self.bytes.items()},
            "achieved_gflops": None if ach is None else round(ach / 1e9, 3),
            "main_precision": self.main_precision,
            "intensity_flop_per_byte": {lvl: _r(self.intensity(lvl)) for lvl in self.bytes},
            "peak_gflops": {k: round(v / 1e9, 1) for k, v in self.peak_flops.items()},
            "peak_bandwidth_gbps": {k: round(v / 1e9, 1) for k, v in self.peak_bandwidth.items()},
            "peak_source": dict(self.peak_source),
            "bound_by": self.bound_by,
            "percent_of_roof": _r(self.percent_of_roof, 1),
            "missing": list(self.missing),
        }


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def roofline(prof: NcuProfile, lid: int, device_name: str | None = None) -> Roofline | None:
    """The roofline of launch ``lid``, or None when the report lacks the duration."""
    v = prof.value
    dur = v(lid, "gpu__time_duration.sum", "gpu__time_duration.avg")
    if dur is None:
        return None
    missing: list[str] = []
    # the roofline sections give SM-clock rates; gpc cycles run on the same clock
    sm_hz = v(lid, "smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second", "gpc__cycles_elapsed.avg.per_second")
    cycles = v(lid, "smsp__cycles_elapsed.avg", "sm__cycles_elapsed.avg", "gpc__cycles_elapsed.avg")
    flop: dict[str, float] = {}
    peaks: dict[str, float] = {}
    source: dict[str, str] = {}
    for prec, instrs, peak_instr, per_peak in _SIMT:
        total, seen = 0.0, False
        for ins, ops in instrs:
            count = v(lid, f"smsp__sass_thread_inst_executed_op_{ins}_pred_on.sum")
            if count is None:
                rate = v(lid, f"smsp__sass_thread_inst_executed_op_{ins}_pred_on.sum.per_cycle_elapsed")
                count = None if rate is None or cycles is None else rate * cycles
            if count is not None:
                seen = True
                total += ops * count
        if seen:
            flop[prec] = total
        else:
            missing.append(f"{prec} instruction counts")
        pk = v(lid, f"sm__sass_thread_inst_executed_op_{peak_instr}_pred_on.sum.peak_sustained")
        pk_flop = None if pk is None else pk * per_peak
        if pk_flop is None:  # the roofline sections' own name: FLOP per cycle already
            pk_flop = v(lid, f"derived__sm__sass_thread_inst_executed_op_{peak_instr}_pred_on_x{per_peak}")
        if pk_flop is not None and sm_hz:
            peaks[prec] = pk_flop * sm_hz
            source[prec] = "ncu peak_sustained x SM clock"
    tensor = [v(lid, f"sm__ops_path_tensor_src_{s}.sum") for s in _TENSOR_SRC]
    if any(t is not None for t in tensor):
        flop["tensor"] = sum(t for t in tensor if t is not None)
        sheet = datasheet_peaks(device_name or prof.text(lid, "device__attribute_display_name"))
        if sheet is not None and sheet.bf16_tflops:
            peaks["tensor"] = sheet.bf16_tflops * 1e12
            source["tensor"] = f"datasheet dense BF16/FP16 peak of the {sheet.model}"
        else:
            missing.append("tensor-core ceiling (device not in the datasheet table)")
    else:
        missing.append("tensor-core operation counts")

    nbytes: dict[str, float] = {}
    bw: dict[str, float] = {}
    dram = v(lid, "dram__bytes.sum")
    if dram is None:
        rd, wr = v(lid, "dram__bytes_read.sum"), v(lid, "dram__bytes_write.sum")
        if rd is not None and wr is not None:
            dram = rd + wr
    if dram is None:
        rd, wr = v(lid, "dram__sectors_read.sum"), v(lid, "dram__sectors_write.sum")
        if rd is not None and wr is not None:
            dram = (rd + wr) * _SECTOR_BYTES
    if dram is not None:
        nbytes["dram"] = dram
    dram_pk, dram_hz = v(lid, "dram__bytes.sum.peak_sustained"), v(lid, "dram__cycles_elapsed.avg.per_second")
    if dram_pk is not None and dram_hz:
        bw["dram"] = dram_pk * dram_hz
        source["dram"] = "ncu peak_sustained x DRAM clock"
    l2 = v(lid, "lts__t_bytes.sum")
    if l2 is None:
        sec = v(lid, "lts__t_sectors.sum")
        l2 = None if sec is None else sec * _SECTOR_BYTES
    if l2 is not None:
        nbytes["l2"] = l2
    l2_pk = v(lid, "lts__t_bytes.sum.peak_sustained", "derived__lts__lts2xbar_bytes.sum.peak_sustained")
    if l2_pk is None:
        per_slice, total, avg = v(lid, "lts__t_sectors.avg.peak_sustained"), v(lid, "lts__t_sectors.sum"), v(lid, "lts__t_sectors.avg")
        if per_slice is not None and total and avg:
            l2_pk = per_slice * (total / avg) * _SECTOR_BYTES  # slices = sum / avg
    l2_hz = v(lid, "lts__cycles_elapsed.avg.per_second")
    if l2_pk is not None and l2_hz:
        bw["l2"] = l2_pk * l2_hz
        source["l2"] = "ncu peak_sustained x L2 clock"
    l1 = v(lid, "l1tex__t_bytes.sum")
    if l1 is None:
        parts = [
            v(lid, f"l1tex__t_sectors_pipe_lsu_mem_{space}_op_{op}.sum")
            for space in ("global", "local")
            for op in ("ld", "st", "atom", "red")
        ]
        if any(p is not None for p in parts):
            l1 = _SECTOR_BYTES * sum(p for p in parts if p is not None)
    if l1 is not None:
        nbytes["l1"] = l1
    l1_pk = v(lid, "l1tex__t_bytes.sum.peak_sustained", "derived__l1tex__lsu_writeback_bytes_mem_lgds.sum.peak_sustained")
    l1_hz = v(lid, "l1tex__cycles_elapsed.avg.per_second")
    if l1_pk is not None and l1_hz:
        bw["l1"] = l1_pk * l1_hz
        source["l1"] = "ncu peak_sustained x L1 clock"
    for lvl in ("l1", "l2", "dram"):
        if lvl not in nbytes:
            missing.append(f"{lvl} bytes")
        elif lvl not in bw:
            missing.append(f"{lvl} bandwidth ceiling")
    return Roofline(dur, flop, nbytes, peaks, bw, source, tuple(missing))

"""Nsight Compute results: ``--csv --page raw``, ``--csv --page details`` and ``.ncu-rep``.

CSV is what ``ncu --csv`` prints, as users save it: ``==PROF==``/``==WARNING==`` lines and the
profiled program's own output may come before the table, numbers carry thousands separators
(``4,963,609,951.19``) and units with SI prefixes (``msecond``, ``Gbyte/s``, ``Khz``). Every
value is converted to a base unit here (ns, byte, byte/s, Hz), so nothing downstream sees a
prefix.

A ``.ncu-rep`` is read by asking ``ncu --import`` for its raw and details pages; without ncu
the error says how to export CSV on a machine that has it.
"""

from __future__ import annotations

import csv
import io
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterable

import polars as pl

from proflab.errors import CorruptInput, EmptyTrace, InputNotFound, SchemaError, UnsupportedFormat, UsageError
from proflab.model.ncu import LAUNCH_SCHEMA, METRIC_SCHEMA, RULE_SCHEMA, NcuProfile

__all__ = ["read", "load", "parse_csv_text", "parse_value", "base_unit", "merge", "export_pages"]

_ID_COLS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name")
_LAUNCH_COLS = {
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
    "Block Size", "Grid Size", "Device", "CC", "Kernel Time", "Kernel Timestamp", "Correlation ID",
}
_DETAILS_COLS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][-+]?\d+)?$")

# --page details names metrics by their display name. The ones proflab's verdicts use map to
# the ncu metric names of the raw page, so that both inputs feed the same code. A display
# name that ncu uses twice with different units is told apart by its unit.
_DETAILS_TO_METRIC: dict[str, str | dict[str, str]] = {
    "Duration": "gpu__time_duration.sum",
    "Elapsed Cycles": "gpc__cycles_elapsed.max",
    "SM Frequency": "sm__cycles_elapsed.avg.per_second",
    "DRAM Frequency": "dram__cycles_elapsed.avg.per_second",
    "Compute (SM) Throughput": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "Compute (SM) [%]": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "SM [%]": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "Memory Throughput": {"%": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                          "byte/s": "dram__bytes.sum.per_second"},
    "Memory [%]": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "DRAM Throughput": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "L1/TEX Cache Throughput": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "L2 Cache Throughput": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "L1/TEX Hit Rate": "l1tex__t_sector_hit_rate.pct",
    "L2 Hit Rate": "lts__t_sector_hit_rate.pct",
    "Theoretical Occupancy": "sm__maximum_warps_per_active_cycle_pct",
    "Achieved Occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "Theoretical Active Warps per SM": "sm__maximum_warps_avg_per_active_cycle",
    "Achieved Active Warps Per SM": "sm__warps_active.avg.per_cycle_active",
    "Block Limit Registers": "launch__occupancy_limit_registers",
    "Block Limit Shared Mem": "launch__occupancy_limit_shared_mem",
    "Block Limit Warps": "launch__occupancy_limit_warps",
    "Block Limit SM": "launch__occupancy_limit_blocks",
    "Block Limit Barriers": "launch__occupancy_limit_barriers",
    "Registers Per Thread": "launch__registers_per_thread",
    "Block Size": "launch__block_size",
    "Grid Size": "launch__grid_size",
    "Threads": "launch__thread_count",
    "Waves Per SM": "launch__waves_per_multiprocessor",
    "# SMs": "launch__sm_count",
    "Static Shared Memory Per Block": "launch__shared_mem_per_block_static",
    "Dynamic Shared Memory Per Block": "launch__shared_mem_per_block_dynamic",
    "Warp Cycles Per Issued Instruction": "smsp__average_warp_latency_per_inst_issued.ratio",
    "Avg. Active Threads Per Warp": "smsp__thread_inst_executed_per_inst_executed.ratio",
    "Avg. Not Predicated Off Threads Per Warp": "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio",
    "Branch Efficiency": "smsp__sass_average_branch_targets_threads_uniform.pct",
    "Avg. Divergent Branches": "smsp__sass_branch_targets_threads_divergent.avg",
    "Executed Ipc Active": "sm__inst_executed.avg.per_cycle_active",
    "Issue Slots Busy": "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "Local Memory Spilling Requests": "derived__local_spilling_requests",
    "Local Memory Spilling Request Overhead": "derived__local_spilling_requests_pct",
    "Stack Size": "launch__stack_size",
}

# SI prefixes of ncu units, and the time units it spells out (msecond) or abbreviates (ms).
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
_BASE_WORDS = ("byte", "hz", "cycle", "inst", "sector", "warp", "thread", "request", "wavefront", "sample", "block", "pass")


def base_unit(unit: str) -> tuple[str, float]:
    """``(base unit, factor)`` such that ``value * factor`` is in the base unit.

    Time becomes ns; ``Kbyte`` becomes byte (ncu's prefixes are decimal); a rate over a time
    (``sector/ns``, ``Gbyte/s``) becomes per second; unknown units pass through unchanged."""
    u = unit.strip()
    if not u:
        return "", 1.0
    num, _, den = u.partition("/")
    if num in _TIME_NS and not den:
        return "ns", _TIME_NS[num]
    factor = 1.0
    base_num = num
    for word in _BASE_WORDS:
        if num.lower().endswith(word) and num[: -len(word)] in _PREFIX:
            factor = _PREFIX[num[: -len(word)]]
            base_num = word
            break
    if not den:
        return base_num, factor
    if den in _TIME_NS:
        # x per (k ns) = x / (k * 1e-9 s) per second
        return f"{base_num}/s", factor * 1e9 / _TIME_NS[den]
    return f"{base_num}/{den}", factor


def parse_value(text: str) -> float | None:
    """A number as ncu prints it (``1,024``, ``61.84``, ``1.2e+03``), or None for text."""
    t = text.strip()
    if not t or not _NUMBER.match(t):
        return None
    v = float(t.replace(",", ""))
    return v if math.isfinite(v) else None  # "1e999": no counter reads infinite


def read(path: str | Path) -> NcuProfile:
    """Read one Nsight Compute result file (CSV page or ``.ncu-rep``)."""
    p = Path(path)
    if not p.exists():
        raise InputNotFound(p, "no such file or directory")
    if p.suffix == ".ncu-rep":
        return _read_rep(p)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputNotFound(p, f"cannot read: {e.strerror}") from e
    if data[:2] == b"\x1f\x8b":
        import gzip
        import zlib

        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:
            raise CorruptInput(p, f"gzip data is damaged or truncated ({e})") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptInput(p, f"not UTF-8 text at byte {e.start}") from e
    return parse_csv_text(text, str(p))


def load(paths: Iterable[str | Path]) -> NcuProfile:
    """Read ncu results given together: one file (CSV page or ``.ncu-rep``), or a raw-page
    CSV and a details-page CSV of the same run, merged (metrics from the raw page, rule
    results and the details page's own fields from the details page)."""
    profs = [read(p) for p in paths]
    if not profs:
        raise UsageError("no Nsight Compute result given")
    if len(profs) == 1:
        return profs[0]
    raw = [p for p in profs if p.kind in ("raw", "ncu-rep")]
    details = [p for p in profs if p.kind == "details"]
    if len(raw) == 1 and len(details) == 1:
        return merge(raw[0], details[0])
    raise UsageError("pass one ncu result, or one raw-page and one details-page CSV of the same run")


def parse_csv_text(text: str, source: str) -> NcuProfile:
    """Parse ``ncu --csv`` output (raw or details page), tolerating non-CSV lines before it."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"')), None)
    if start is None:
        if any("ERR_NVGPUCTRPERM" in line for line in lines):
            raise UnsupportedFormat(source, "ncu was refused access to the GPU performance counters (ERR_NVGPUCTRPERM); it holds no results")
        raise UnsupportedFormat(
            source, 'not Nsight Compute CSV (expected a header starting "ID","Process ID"; export with ncu --csv --page raw or --page details)'
        )
    version = _version_from_text(lines[:start])
    body = [line for line in lines[start:] if not line.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    header = rows[0]
    if all(c in header for c in _DETAILS_COLS):
        return _from_details(header, rows[1:], source, version)
    return _from_raw(header, rows[1:], source, version)


def _version_from_text(lines: Iterable[str]) -> str | None:
    for line in lines:
        m = re.search(r"Version (\d{4}\.\d+\.\d+(\.\d+)?)", line)
        if m:
            return m.group(1)
    return None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1024  # (the largest float64 below 2**63)


def _launch_row(rec: dict[str, str], source: str, line: int) -> dict[str, Any]:
    try:
        lid = int(rec["ID"])
        if not _INT64_MIN <= lid <= _INT64_MAX:
            raise ValueError(lid)
    except (KeyError, ValueError, TypeError) as e:
        raise SchemaError(source, f"row {line}: ID is {str(rec.get('ID'))[:40]!r}, expected an integer launch id") from e

    def as_int(k: str) -> int | None:
        v = parse_value(rec.get(k) or "")
        # a pid, device or stream past 64 bits is no pid, device or stream: unknown
        return int(v) if v is not None and _INT64_MIN <= v <= _INT64_MAX else None

    return {
        "launch_id": lid,
        "name": rec.get("Kernel Name", ""),
        "pid": as_int("Process ID"),
        "device": as_int("Device"),
        "cc": rec.get("CC") or None,
        "stream": as_int("Stream"),
        "grid": rec.get("Grid Size") or None,
        "block": rec.get("Block Size") or None,
    }


def _metric(lid: int, name: str, unit: str, text: str) -> tuple[int, str, float | None, str, str]:
    value = parse_value(text)
    if value is not None and value < 0:
        value = None  # ncu's counters, rates and shares are never negative: a damaged cell
    base, factor = base_unit(unit)
    return (lid, name, None if value is None else value * factor, base, text)


def _from_raw(header: list[str], rows: list[list[str]], source: str, version: str | None) -> NcuProfile:
    missing = [c for c in _ID_COLS if c not in header]
    if missing:
        raise SchemaError(source, f"raw page lacks column(s) {', '.join(missing)}")
    # The raw page's second row holds units; older versions omit it.
    units = [""] * len(header)
    if rows and rows[0] and rows[0][0] == "":
        units = rows[0] + [""] * (len(header) - len(rows[0]))
        rows = rows[1:]
    rows = [r for r in rows if r]
    if not rows:
        raise EmptyTrace(source, "Nsight Compute CSV with a header but no profiled kernels")
    launches, metrics = [], []
    metric_cols = [(i, h) for i, h in enumerate(header) if h not in _LAUNCH_COLS]
    for n, r in enumerate(rows, start=3):
        if len(r) != len(header):
            raise SchemaError(source, f"row {n} has {len(r)} fields, the header {len(header)} (truncated file?)")
        rec = dict(zip(header, r))
        lrow = _launch_row(rec, source, n)
        launches.append(lrow)
        lid = lrow["launch_id"]
        for i, h in metric_cols:
            if r[i] != "":
                metrics.append(_metric(lid, h, units[i], r[i]))
    return _profile(source, "raw", launches, metrics, [], version)


def _from_details(header: list[str], rows: list[list[str]], source: str, version: str | None) -> NcuProfile:
    idx = {h: i for i, h in enumerate(header)}
    width = len(header)
    launches: dict[int, dict[str, Any]] = {}
    metrics: list[tuple] = []
    rules: list[dict[str, Any]] = []
    for n, r in enumerate(rows, start=2):
        if not r:
            continue
        if len(r) < idx["Metric Value"] + 1 and len(r) < idx.get("Rule Name", width):
            raise SchemaError(source, f"row {n} has {len(r)} fields, expected {width} (truncated file?)")
        r = r + [""] * (width - len(r))
        rec = dict(zip(header, r))
        lrow = _launch_row(rec, source, n)
        lid = lrow["launch_id"]
        launches.setdefault(lid, lrow)
        if rec.get("Rule Name"):
            speed = parse_value(rec.get("Estimated Speedup", ""))
            if speed is not None and not 0 <= speed <= 100:  # a share of the kernel's time: else damaged
                speed = None
            rules.append({
                "launch_id": lid,
                "section": rec["Section Name"],
                "rule": rec["Rule Name"],
                "type": rec.get("Rule Type", ""),
                "description": rec.get("Rule Description", ""),
                "speedup_type": rec.get("Estimated Speedup Type") or None,
                "est_speedup_pct": speed,
            })
            continue
        name = rec["Metric Name"]
        if not name:
            continue
        lid_, _, value, base, text = _metric(lid, name, rec["Metric Unit"], rec["Metric Value"])
        mapped = _DETAILS_TO_METRIC.get(name)
        if isinstance(mapped, dict):
            mapped = mapped.get(base)
        key = mapped or f"{rec['Section Name']}: {name}"
        metrics.append((lid, key, value, base, text))
    if not launches:
        raise EmptyTrace(source, "Nsight Compute CSV with a header but no profiled kernels")
    return _profile(source, "details", list(launches.values()), metrics, rules, version)


def _profile(source: str, kind: str, launches: list[dict], metrics: list[tuple], rules: list[dict],
             version: str | None, notes: tuple[str, ...] = ()) -> NcuProfile:
    return NcuProfile(
        path=source,
        kind=kind,
        launches=pl.DataFrame(launches, schema=LAUNCH_SCHEMA, orient="row") if launches else pl.DataFrame(schema=LAUNCH_SCHEMA),
        metrics=pl.DataFrame(metrics, schema=METRIC_SCHEMA, orient="row") if metrics else pl.DataFrame(schema=METRIC_SCHEMA),
        rules=pl.DataFrame(rules, schema=RULE_SCHEMA) if rules else pl.DataFrame(schema=RULE_SCHEMA),
        ncu_version=version,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# .ncu-rep


def _read_rep(p: Path) -> NcuProfile:
    with open(p, "rb") as f:
        head = f.read(16)
    if not head:
        raise EmptyTrace(p, "empty file")
    # The ncu command gives both the raw metrics and the rule results (details page).
    # NVIDIA's ncu_report module is not used: in Nsight Compute 2025.3.1 it brought the
    # interpreter down (a fatal error inside _ncu_report) while reading a report that
    # ncu --import reads cleanly, and a reader must not crash its caller.
    exe = shutil.which("ncu")
    if exe is not None:
        return _read_rep_cli(p, exe)
    raise UnsupportedFormat(
        p,
        "reading .ncu-rep needs the ncu command (Nsight Compute); "
        "on a machine with ncu run: ncu --import FILE.ncu-rep --csv --page raw > FILE.csv, then pass the CSV",
    )


def export_pages(rep: Path, exe: str) -> tuple[str, str]:
    """``(raw CSV, details CSV)`` of a report, from ``ncu --import``."""
    pages = []
    for page in ("raw", "details"):
        argv = [exe, "--import", str(rep), "--csv", "--page", page, "--print-kernel-base", "demangled"]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise CorruptInput(rep, f"ncu --import failed: {msg[-1] if msg else 'exit ' + str(proc.returncode)}")
        pages.append(proc.stdout)
    return pages[0], pages[1]


def _read_rep_cli(p: Path, exe: str) -> NcuProfile:
    raw, details = export_pages(p, exe)
    return merge(parse_csv_text(raw, str(p)), parse_csv_text(details, str(p)), kind="ncu-rep")


def merge(raw: NcuProfile, details: NcuProfile, kind: str | None = None) -> NcuProfile:
    """The raw page's metrics, plus what only the details page has (rule results, and
    metrics the raw page lacks), for the same launches."""
    have = raw.metrics.select("launch_id", "metric")
    extra = details.metrics.join(have, on=["launch_id", "metric"], how="anti")
    return NcuProfile(
        path=raw.path,
        kind=kind or raw.kind,
        launches=raw.launches,
        metrics=pl.concat([raw.metrics, extra]),
        rules=details.rules,
        ncu_version=raw.ncu_version or details.ncu_version,
        notes=raw.notes + details.notes,
    )

"""Benchmark ``proflab analyze`` against HTA 0.5.0 on one large Kineto trace.

In one run this script

1. generates a large trace with ``gen_kineto.py`` from a real recorded one
   (or takes ``--trace``);
2. runs HTA 0.5.0 in its own virtual environment (``benchmarks/.venv-hta``,
   created on first use) as a child process: ``TraceAnalysis(trace_dir=...)``
   (the load), ``get_temporal_breakdown(visualize=False)`` and
   ``get_idle_time_breakdown(visualize=False)``, each timed;
3. runs ``python -m proflab analyze TRACE --format json`` as a child process,
   the way a user would;
4. optionally (``--decoders``) times plain ``json.load``, ``orjson.loads`` and a
   msgspec typed decode of the same file, each in its own child process;

and prints wall times, peak RSS (``ru_maxrss`` of each child, from ``wait4``),
the ratio HTA/proflab and whether the targets are met.  ``--json-out`` writes
the same numbers as JSON.

The ratio compares HTA's load + temporal + idle-time phases (its imports
excluded) with proflab's whole process (interpreter start and imports
included).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_SOURCE = REPO / "tests" / "data" / "kineto" / "train_loop.pt.trace.json.gz"
HTA_VENV = HERE / ".venv-hta"
HTA_REQUIREMENT = "HolisticTraceAnalysis==0.5.0"
TARGET_RATIO = 20.0
TARGET_RSS_MIB = 1024.0

sys.path.insert(0, str(HERE))
import gen_kineto


@dataclass
class ChildRun:
    """Wall time, peak RSS and exit status of one child process."""

    cmd: list[str]
    wall_s: float
    maxrss_mib: float
    returncode: int
    log: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass
class Report:
    trace: str
    trace_mb: float
    events: int
    steps: int | None = None
    generate_s: float | None = None
    hta: dict[str, Any] = field(default_factory=dict)
    proflab: dict[str, Any] = field(default_factory=dict)
    decoders: dict[str, Any] = field(default_factory=dict)
    ratio: float | None = None
    targets: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- children


def run_child(cmd: list[str], log: Path, stdout: Path | None = None) -> ChildRun:
    """Run ``cmd``; measure its wall time and peak RSS (KiB on Linux) via wait4."""
    with open(log, "wb") as err, open(stdout or log.with_suffix(".out"), "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ChildRun(cmd, wall, usage.ru_maxrss / 1024, proc.returncode, str(log))


def tail(path: str | Path, n: int = 15) -> str:
    lines = Path(path).read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


def ensure_hta_venv(venv: Path) -> Path:
    """Create HTA's virtual environment on first use (or repair it); return its python."""
    python = venv / "bin" / "python"
    if python.exists():
        probe = "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False)
        if found.stdout.strip() == HTA_REQUIREMENT.split("==")[1]:
            return python
    else:
        print(f"creating {venv} (first use) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    print(f"installing {HTA_REQUIREMENT} into {venv} ...", flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", HTA_REQUIREMENT], check=True)
    return python


def run_hta(trace: Path, work: Path, venv: Path) -> dict[str, Any]:
    """HTA load + temporal breakdown + idle-time breakdown in HTA's venv."""
    python = ensure_hta_venv(venv)
    trace_dir = work / "hta_trace_dir"  # HTA wants a directory: one file per rank
    trace_dir.mkdir(exist_ok=True)
    link = trace_dir / ("rank0.json.gz" if trace.name.endswith(".gz") else "rank0.json")
    if not link.exists():
        link.symlink_to(trace.resolve())
    result_path = work / "hta_result.json"
    child = run_child([str(python), str(HERE / "_hta_run.py"), str(trace_dir), str(result_path)], work / "hta.log")
    if not child.ok or not result_path.exists():
        return {"ok": False, "error": f"exit {child.returncode}", "log_tail": tail(child.log)}
    res = json.loads(result_path.read_text())
    times = res["times_s"]
    return {
        "ok": True,
        "version": "0.5.0",
        "load_s": times["load"],
        "temporal_s": times["temporal"],
        "idle_time_s": times["idle_time"],
        "total_s": times["load"] + times["temporal"] + times["idle_time"],
        "import_s": times["import"],
        "process_wall_s": child.wall_s,
        "peak_rss_mib": child.maxrss_mib,
        "events_loaded": res["events"],
        "temporal_breakdown": res["temporal_breakdown"],
        "idle_time_breakdown": res["idle_time_breakdown"],
    }


def proflab_available() -> str | None:
    """None if ``python -m proflab`` can run here, else why not."""
    try:
        if importlib.util.find_spec("proflab") is None:
            return "proflab is not importable (pip install -e . from the repository root)"
        if importlib.util.find_spec("proflab.__main__") is None:
            return "proflab has no __main__ yet (python -m proflab does not run)"
    except ImportError as exc:
        return f"proflab import failed: {exc}"
    return None


def repo_revision() -> str | None:
    """Short commit of this checkout, with '+dirty' if src/ has local changes."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "src"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("+dirty" if dirty else "")


def run_proflab(trace: Path, work: Path) -> dict[str, Any]:
    """``python -m proflab analyze TRACE --format json``, as a user runs it."""
    why = proflab_available()
    if why:
        return {"ok": False, "error": why}
    out = work / "proflab.json"
    cmd = [sys.executable, "-m", "proflab", "analyze", str(trace), "--format", "json"]
    child = run_child(cmd, work / "proflab.log", stdout=out)
    info: dict[str, Any] = {"cmd": " ".join(cmd[1:]), "revision": repo_revision(), "returncode": child.returncode}
    try:
        json.loads(out.read_bytes())
    except ValueError:
        return {**info, "ok": False, "error": "no JSON report on stdout", "log_tail": tail(child.log)}
    return {**info, "ok": True, "wall_s": child.wall_s, "peak_rss_mib": child.maxrss_mib}


DECODERS = {
    "json.load": "import json\nwith opener(p, 'rb') as f: d = json.load(f)\nn = len(d['traceEvents'])",
    "orjson.loads": "import orjson\nwith opener(p, 'rb') as f: d = orjson.loads(f.read())\nn = len(d['traceEvents'])",
    "orjson.loads, gc off": "import orjson, gc\ngc.disable()\nwith opener(p, 'rb') as f: d = orjson.loads(f.read())\nn = len(d['traceEvents'])",
    "msgspec typed": """import msgspec
class Event(msgspec.Struct):
    ph: str
    name: str = ''
    cat: str = ''
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: dict | None = None
class Trace(msgspec.Struct):
    traceEvents: list[Event]
with opener(p, 'rb') as f: d = msgspec.json.decode(f.read(), type=Trace)
n = len(d.traceEvents)""",
}


def run_decoders(trace: Path, work: Path) -> dict[str, Any]:
    """Reference: decode the whole file with each decoder, each in its own child."""
    res: dict[str, Any] = {}
    prelude = (
        "import sys, time, gzip\np = sys.argv[1]\n"
        "opener = gzip.open if p.endswith('.gz') else open\nt0 = time.perf_counter()\n"
    )
    for name, body in DECODERS.items():
        code = prelude + body + "\nprint(n, time.perf_counter() - t0)"
        out = work / "decoder.out"
        child = run_child([sys.executable, "-c", code, str(trace)], work / "decoder.log", stdout=out)
        if child.ok:
            n, secs = out.read_text().split()
            res[name] = {
                "decode_s": float(secs),
                "wall_s": child.wall_s,
                "peak_rss_mib": child.maxrss_mib,
                "events": int(n),
            }
        else:
            res[name] = {"error": tail(child.log, 3)}
    return res


# --------------------------------------------------------------------------- report


def count_events(trace: Path) -> int:
    """Events in a trace file, without parsing it: each event has one "ph" key."""
    opener = gzip.open if trace.name.endswith(".gz") else open
    count, carry = 0, b""
    with opener(trace, "rb") as f:  # type: ignore[operator]
        while chunk := f.read(1 << 24):
            buf = carry + chunk
            count += buf.count(b'"ph":')
            carry = buf[-4:]  # shorter than the key: a split key is counted once
    return count


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_report(r: Report) -> None:
    print()
    print(f"trace: {r.trace}")
    print(f"       {r.trace_mb:.1f} MB, {r.events:,} events" + (f", {r.steps} steps" if r.steps else ""))
    if r.generate_s is not None:
        print(f"       generated in {r.generate_s:.1f} s")
    print()
    print(f"{'tool':<24}{'wall s':>10}{'peak RSS MiB':>15}")
    h = r.hta
    if h.get("ok"):
        print(f"{'HTA 0.5.0 load':<24}{fmt(h['load_s']):>10}")
        print(f"{'HTA temporal breakdown':<24}{fmt(h['temporal_s']):>10}")
        print(f"{'HTA idle-time breakdown':<24}{fmt(h['idle_time_s']):>10}")
        print(f"{'HTA total (3 phases)':<24}{fmt(h['total_s']):>10}{fmt(h['peak_rss_mib'], '.0f'):>15}")
        print(f"{'HTA whole process':<24}{fmt(h['process_wall_s']):>10}")
    elif h:
        print(f"{'HTA 0.5.0':<24}  FAILED: {h.get('error')}\n{h.get('log_tail', '')}")
    else:
        print(f"{'HTA 0.5.0':<24}  skipped")
    p = r.proflab
    if p.get("ok"):
        print(
            f"{'proflab analyze':<24}{fmt(p['wall_s']):>10}{fmt(p['peak_rss_mib'], '.0f'):>15}   (revision {p['revision']})"
        )
    else:
        print(f"{'proflab analyze':<24}  NOT MEASURED: {p.get('error')}")
        if p.get("log_tail"):
            print(p["log_tail"])
    for name, d in r.decoders.items():
        if "error" in d:
            print(f"{name:<24}  failed: {d['error']}")
        else:
            print(f"{name:<24}{fmt(d['decode_s']):>10}{fmt(d['peak_rss_mib'], '.0f'):>15}")
    print()
    t = r.targets
    if r.ratio is not None:
        print(
            f"ratio HTA/proflab: {r.ratio:.1f}x   (target >= {TARGET_RATIO:.0f}x: {'met' if t['ratio_met'] else 'NOT met'})"
        )
        print(
            f"proflab peak RSS: {p['peak_rss_mib']:.0f} MiB   "
            f"(target <= {TARGET_RSS_MIB:.0f} MiB: {'met' if t['rss_met'] else 'NOT met'})"
        )
    else:
        print(
            f"ratio HTA/proflab: not available (target >= {TARGET_RATIO:.0f}x, proflab peak RSS <= {TARGET_RSS_MIB:.0f} MiB)"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=300, help="size of the generated trace (default 300)")
    ap.add_argument("--trace", type=Path, help="use this (large) trace instead of generating one")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace to scale up")
    ap.add_argument("--keep", action="store_true", help="keep the generated trace and the logs")
    ap.add_argument("--json-out", type=Path, help="also write the numbers as JSON")
    ap.add_argument("--decoders", action="store_true", help="also time json / orjson / msgspec decodes")
    ap.add_argument("--skip-hta", action="store_true", help="do not run HTA")
    ap.add_argument("--hta-venv", type=Path, default=HTA_VENV, help="HTA's virtual environment")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="proflab-bench-"))
    try:
        steps = gen_s = None
        if args.trace:
            trace = args.trace.resolve()
        else:
            if not args.source.exists():
                sys.exit(f"no source trace {args.source}: pass --source REAL_TRACE or --trace BIG_TRACE")
            trace = work / "big.pt.trace.json"
            print(f"generating ~{args.size_mb:.0f} MB from {args.source} ...", flush=True)
            t0 = time.perf_counter()
            summary = gen_kineto.generate(args.source, trace, size_mb=args.size_mb)
            gen_s = time.perf_counter() - t0
            steps = summary["steps"]
        events = count_events(trace)
        report = Report(str(trace), trace.stat().st_size / 1e6, events, steps, gen_s)
        report.machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}

        if not args.skip_hta:
            print("running HTA 0.5.0 ...", flush=True)
            report.hta = run_hta(trace, work, args.hta_venv)
        print("running proflab analyze ...", flush=True)
        report.proflab = run_proflab(trace, work)
        if args.decoders:
            print("timing decoders ...", flush=True)
            report.decoders = run_decoders(trace, work)

        h, p = report.hta, report.proflab
        if h.get("ok") and p.get("ok"):
            report.ratio = h["total_s"] / p["wall_s"]
        report.targets = {
            "ratio_min": TARGET_RATIO,
            "rss_max_mib": TARGET_RSS_MIB,
            "ratio_met": report.ratio is not None and report.ratio >= TARGET_RATIO,
            "rss_met": bool(p.get("ok")) and p["peak_rss_mib"] <= TARGET_RSS_MIB,
        }
        print_report(report)
        if args.json_out:
            args.json_out.write_text(json.dumps(asdict(report), indent=2) + "\n")
    finally:
        if args.keep:
            print(f"\nkept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

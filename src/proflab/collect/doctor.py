"""``proflab doctor``: what this machine can profile, and why not.

Each check is one :class:`Check`: a status (``ok``, ``missing`` or ``warning``), what was
found, and the fix when it is not ok. The checks never raise: a probe that fails is a
``missing`` or ``warning`` line with the reason.

``required`` checks decide :attr:`DoctorReport.can_profile`: profiling a GPU program with
torch.profiler works when torch imports, is built with CUDA, sees a GPU, its profiler can
record CUDA activity (CUPTI), and the run folder can be written. The rest (NVML, GPM, ncu,
nsys, the counter permission, free disk) are what the other commands need; "compiled
readers" says whether the fast readers of large traces and exports are in use.

:attr:`DoctorReport.works` says what the checks add up to, one :class:`Capability` each
(trace analysis, many ranks on Dask, profiling CPU programs, profiling GPU programs, the GPU
monitor, the kernel deep dive, the Nsight Systems backend), with how to add what is missing. A machine without a
GPU is not a failure: trace analysis works anywhere, and the exit status is 1 only where
something that is there does not work (:meth:`DoctorReport.exit_status`), or where ``need``
asks for a capability this machine lacks.

torch is probed in a separate interpreter (``python``: the one that will run the program;
default this one), so a broken CUDA install cannot take proflab down, and proflab itself
never imports torch. Tools run as argument lists with timeouts, never through a shell.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Capability", "Check", "DoctorReport", "doctor", "counter_permission", "torch_install_fix", "PERMISSION_FIX",
           "LOW_DISK_BYTES"]

Status = Literal["ok", "missing", "warning"]
LOW_DISK_BYTES = 2 * 2**30  # a profiled window with stacks can write hundreds of MB per process
TORCH_PROBE_TIMEOUT_S = 180.0  # a cold import of a CUDA torch reads ~2 GB of libraries
TOOL_TIMEOUT_S = 60.0
NCU_PROBE_TIMEOUT_S = 240.0
PARAMS = Path("/proc/driver/nvidia/params")
PERMISSION_FIX = (
    "run the profiler as root (sudo -E ncu ...), or let every user read the counters: put "
    "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in a file under /etc/modprobe.d/, then reload "
    "the nvidia kernel module or reboot (in a container: --cap-add SYS_ADMIN); "
    "see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    required: bool = False  # part of the exit-status rule

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Capability:
    """What a group of checks adds up to: a thing proflab can or cannot do here."""

    name: str  # "trace analysis", "profiling GPU programs", ...
    commands: str  # the commands it serves
    works: bool
    detail: str  # what it runs on, or what is missing
    fix: str = ""  # how to add it ("" when it works, or when nothing can be done here)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NEEDS = ("analysis", "cpu", "gpu")  # doctor --need: the capability whose absence is exit 1
_NEED_CAPABILITY = {"analysis": "trace analysis", "cpu": "profiling CPU programs", "gpu": "profiling GPU programs"}
EXIT_RULE = ("exit 1 when something here does not work as it should: the run folder cannot be written, the interpreter "
             "given cannot run, or a GPU is present but torch.profiler cannot profile it; with --need gpu (or cpu), also "
             "when profiling GPU (CPU) programs does not work here; else exit 0 (no GPU is not a failure: trace analysis "
             "works anywhere)")


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[Check, ...]
    facts: dict[str, Any] = field(default_factory=dict)  # versions, GPUs, paths: what was found
    works: tuple[Capability, ...] = ()

    @property
    def can_profile(self) -> bool:
        """torch.profiler can record a GPU program here: every required check is ok."""
        return all(c.status == "ok" for c in self.checks if c.required)

    def broken(self) -> list[str]:
        """What is here but does not work (each a short reason): these make the exit status 1."""
        c = {x.name: x for x in self.checks}
        out = [f"run folder: {c['run folder'].detail}"] if "run folder" in c and c["run folder"].status != "ok" else []
        if "probe_error" in (self.facts.get("torch") or {}):
            out.append(f"torch: {self.facts['torch']['probe_error']}")
        torch_there = "torch" in c and c["torch"].status == "ok"
        if _gpu_present(self.facts) and torch_there and not self.can_profile:
            out.append("a GPU is here, but torch.profiler cannot profile it (" + ", ".join(
                x.name for x in self.checks if x.required and x.status != "ok") + ")")
        return out

    def exit_status(self, need: str | None = None) -> int:
        """0 or 1 by :data:`EXIT_RULE`; ``need`` one of :data:`NEEDS`."""
        if self.broken():
            return 1
        if need is not None:
            cap = next((w for w in self.works if w.name == _NEED_CAPABILITY[need]), None)
            return 0 if cap is not None and cap.works else 1
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "proflab.doctor/1",
            "can_profile": self.can_profile,
            "rule": EXIT_RULE,
            "checks": [c.to_dict() for c in self.checks],
            "works": [w.to_dict() for w in self.works],
            "broken": self.broken(),
            "facts": self.facts,
        }


def _gpu_present(facts: dict[str, Any]) -> bool:
    """An NVIDIA GPU is on this machine: NVML lists one, or torch sees one."""
    nv, t = facts.get("nvml") or {}, facts.get("torch") or {}
    return bool(any(g.get("name") for g in (nv.get("gpus") or [])) or t.get("devices"))


def torch_install_fix(python: str) -> str:
    """How to put torch into ``python``: the CPU build where there is no GPU (pip's default
    on Linux is a CUDA build of several GB), a CUDA build where there is one."""
    return (f"install PyTorch into {python}: without a GPU, the CPU build: {python} -m pip install torch==2.13.0 "
            "--index-url <PyTorch's CPU wheel index, from pytorch.org's install selector> ; with a GPU, the command for your CUDA driver from "
            "pytorch.org's install selector (pip install 'proflab[torch]' installs the build pip picks: on Linux, a "
            "CUDA build)")


def capabilities(checks: list[Check], facts: dict[str, Any], python: str) -> tuple[Capability, ...]:
    """What the checks add up to (see module doc)."""
    c = {x.name: x for x in checks}
    ok = lambda name: name in c and c[name].status == "ok"  # noqa: E731
    t = facts.get("torch") or {}
    out = [Capability("trace analysis", "analyze, report, compare, sql, memory, energy, demo", True,
                      "torch.profiler/Kineto traces and Nsight Systems exports, from any machine; no GPU or torch needed")]
    import importlib.util

    dask = importlib.util.find_spec("distributed") is not None  # (found, not imported: doctor stays fast)
    out.append(Capability("many ranks on Dask", "analyze of 5 or more ranks, --workers, --scheduler", dask,
                          "dask.distributed is installed" if dask else
                          "dask.distributed is not installed (up to 4 ranks are analysed without it)",
                          "" if dask else "pip install 'proflab[job]' (the job extra)"))
    if ok("torch") and ok("run folder"):
        out.append(Capability("profiling CPU programs", "run, try", True, f"torch {t.get('torch')} in {python}"))
    elif not ok("torch"):
        out.append(Capability("profiling CPU programs", "run, try", False, f"no torch in {python}", torch_install_fix(python)))
    else:
        out.append(Capability("profiling CPU programs", "run, try", False, "the run folder cannot be written", c["run folder"].fix))
    missing = [x.name for x in checks if x.required and x.status != "ok"]
    if not missing:
        out.append(Capability("profiling GPU programs", "run, try, scaling", True, f"torch {t.get('torch')}, CUDA {t.get('torch_cuda')}"))
    elif not _gpu_present(facts):
        out.append(Capability("profiling GPU programs", "run, try, scaling", False, "no NVIDIA GPU on this machine",
                              "run on a machine with an NVIDIA GPU and driver, with a CUDA build of torch"))
    else:
        first = next(x for x in checks if x.required and x.status != "ok")
        out.append(Capability("profiling GPU programs", "run, try, scaling", False, "missing: " + ", ".join(missing),
                              first.fix or (torch_install_fix(python) if first.name == "torch" else "")))
    out.append(Capability("GPU monitor and energy", "run (monitor.parquet), energy", ok("NVML") and ok("GPU"),
                          c["GPU"].detail if "GPU" in c else "", "" if ok("GPU") else (c["NVML"].fix if not ok("NVML") else c["GPU"].fix)))
    deep = ok("ncu") and ok("GPU") and c.get("counter permission", Check("", "missing", "")).status in ("ok", "warning")
    out.append(Capability("kernel deep dive", "kernels", deep,
                          c["ncu"].detail if deep else ("needs Nsight Compute (ncu) and a GPU" if not ok("ncu") else
                                                        "needs a GPU and its performance counters"),
                          "" if deep else (c["ncu"].fix if not ok("ncu") else c["GPU"].fix)))
    out.append(Capability("Nsight Systems backend", "run --backend nsys", ok("nsys") and ok("GPU"),
                          c["nsys"].detail if ok("nsys") else "needs Nsight Systems (nsys)",
                          "" if ok("nsys") else c["nsys"].fix))
    return tuple(out)


# Run in the target interpreter; prints one JSON object. Static text: nothing from the user.
_TORCH_PROBE = r"""
import ctypes, glob, json, os, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import torch
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out)); raise SystemExit(0)
out["torch"] = torch.__version__
out["torch_cuda"] = getattr(torch.version, "cuda", None)
out["torch_hip"] = getattr(torch.version, "hip", None)
try:
    ok = bool(torch.cuda.is_available())
    out["cuda_available"] = ok
    n = torch.cuda.device_count() if ok else 0
    out["devices"] = [torch.cuda.get_device_name(i) for i in range(n)]
except Exception as e:
    out["cuda_available"] = False
    out["cuda_error"] = f"{type(e).__name__}: {e}"
try:
    from torch.profiler import supported_activities
    out["profiler_activities"] = sorted(a.name for a in supported_activities())
except Exception as e:
    out["profiler_error"] = f"{type(e).__name__}: {e}"
roots = [os.path.dirname(torch.__file__)] + [p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]
pats = []
for r in roots:
    pats += [os.path.join(r, "lib", "libcupti.so*"), os.path.join(r, "nvidia", "*", "lib", "libcupti.so*"),
             os.path.join(r, "nvidia", "*", "*", "lib", "libcupti.so*")]
home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
pats += [os.path.join(home, "extras", "CUPTI", "lib64", "libcupti.so*"), os.path.join(home, "lib64", "libcupti.so*")]
found = sorted({p for pat in pats for p in glob.glob(pat)})
out["cupti_files"] = found[:8]
try:
    with open("/proc/self/maps") as fh:
        mapped = sorted({line.split()[-1] for line in fh if "libcupti" in line})
    out["cupti_mapped"] = mapped
except OSError:
    out["cupti_mapped"] = None
if found and not out.get("cupti_mapped"):
    try:
        ctypes.CDLL(found[0]); out["cupti_loaded"] = found[0]
    except OSError as e:
        out["cupti_load_error"] = str(e)
print(json.dumps(out))
"""


def _probe_torch(python: str) -> dict[str, Any]:
    try:
        got = subprocess.run([python, "-c", _TORCH_PROBE], capture_output=True, text=True,
                             timeout=TORCH_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return {"probe_error": f"{python}: no such interpreter"}
    except subprocess.TimeoutExpired:
        return {"probe_error": f"{python} took over {TORCH_PROBE_TIMEOUT_S:.0f} s to import torch"}
    except OSError as e:
        return {"probe_error": f"{python}: {e}"}
    for line in reversed(got.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    tail = (got.stderr.strip().splitlines() or [f"exit status {got.returncode}"])[-1]
    return {"probe_error": f"{python} could not run the torch probe ({tail})"}


def _torch_checks(t: dict[str, Any]) -> list[Check]:
    py = f"{t.get('executable', '?')}"
    if "probe_error" in t:
        return [Check("torch", "missing", t["probe_error"], "check the interpreter given with --python", True)]
    if "torch_error" in t:
        return [Check("torch", "missing", f"not importable in {py} ({t['torch_error']})", torch_install_fix(py), True)]
    out = [Check("torch", "ok", f"{t['torch']} in {py}", required=True)]
    if t.get("torch_hip"):
        out.append(Check("torch CUDA build", "warning", f"a ROCm build (HIP {t['torch_hip']}): proflab reads its traces, "
                         "but CUPTI, NVML and ncu are NVIDIA's", "", True))
    elif not t.get("torch_cuda"):
        out.append(Check("torch CUDA build", "missing", f"torch {t['torch']} is a CPU-only build: it cannot record GPU work",
                         "install a CUDA build of torch (pytorch.org's install selector gives the command for your CUDA driver)", True))
    else:
        out.append(Check("torch CUDA build", "ok", f"built with CUDA {t['torch_cuda']}", required=True))
    if t.get("cuda_available"):
        devs = t.get("devices") or []
        out.append(Check("CUDA", "ok", f"{len(devs)} device(s) visible to torch: {', '.join(devs)}", required=True))
    else:
        why = t.get("cuda_error") or ("the build has no CUDA" if not t.get("torch_cuda") else
                                      "torch.cuda.is_available() is False: no NVIDIA driver or GPU visible "
                                      "(check nvidia-smi and CUDA_VISIBLE_DEVICES)")
        out.append(Check("CUDA", "missing", f"unavailable: {why}",
                         "run on a machine with an NVIDIA GPU and driver, with a CUDA build of torch", True))
    acts = t.get("profiler_activities")
    files = t.get("cupti_mapped") or ([t["cupti_loaded"]] if t.get("cupti_loaded") else [])
    where = f" ({files[0]})" if files else ""
    if acts is None:
        out.append(Check("CUPTI", "missing", f"torch.profiler did not answer ({t.get('profiler_error')})",
                         "reinstall torch", True))
    elif "CUDA" in acts:
        out.append(Check("CUPTI", "ok", f"torch.profiler records CUDA activity{where}", required=True))
    else:
        why = "this torch build has no CUDA" if not t.get("torch_cuda") else "torch.profiler lists no CUDA activity (CUPTI not found or not loadable)"
        if t.get("cupti_load_error"):
            why += f"; loading {t['cupti_files'][0]} failed: {t['cupti_load_error']}"
        out.append(Check("CUPTI", "missing", f"{why}; activities: {', '.join(acts)}",
                         "use a CUDA build of torch (its wheels bring libcupti); for a toolkit install, put "
                         "$CUDA_HOME/extras/CUPTI/lib64 on LD_LIBRARY_PATH", True))
    return out


def _nvml_checks() -> tuple[list[Check], dict[str, Any]]:
    from proflab.collect.monitor import device_info

    info = device_info()
    if not info.get("available"):
        reason = info.get("reason", "")
        fix = "pip install nvidia-ml-py" if "nvidia-ml-py" in reason else "install the NVIDIA driver (NVML ships with it)"
        return [
            Check("NVML", "missing", reason, fix),
            Check("GPU", "missing", "no GPU found (NVML unavailable)", "run on a machine with an NVIDIA GPU and driver"),
            Check("GPM", "missing", "needs NVML and a Hopper or newer GPU", ""),
        ], info
    gpus = info.get("gpus") or []
    named = [g for g in gpus if g.get("name")]
    out = [Check("NVML", "ok", f"driver {info.get('driver_version')}, CUDA driver API {info.get('cuda_driver_version')}")]
    if named:
        desc = "; ".join(f"{g['index']}: {g['name']}, {g['memory_total_bytes'] / 2**30:.0f} GiB" if g.get("memory_total_bytes")
                         else f"{g['index']}: {g['name']}" for g in named)
        out.append(Check("GPU", "ok", f"{len(named)} GPU(s): {desc}"))
    else:
        errs = "; ".join(g.get("error", "") for g in gpus)
        out.append(Check("GPU", "missing", f"NVML lists no usable GPU{': ' + errs if errs else ''}",
                         "check nvidia-smi; in a container, pass the GPUs through (--gpus all)"))
    gpm = [g["index"] for g in named if g.get("gpm_supported")]
    if named and len(gpm) == len(named):
        out.append(Check("GPM", "ok", "supported on every GPU: the monitor samples SM, tensor-pipe and DRAM activity"))
    elif gpm:
        out.append(Check("GPM", "warning", f"supported on GPUs {gpm} only: the others get no SM/tensor/DRAM activity samples",
                         "GPM needs Hopper or newer"))
    else:
        out.append(Check("GPM", "warning", "not supported (needs a Hopper or newer GPU and driver 520+): the monitor samples "
                         "power, clocks and utilisation only", ""))
    return out, info


READER_FIX = ("install proflab where a C compiler (gcc or clang) is at hand: `pip install --force-reinstall --no-deps "
              "proflab`, or `pip install -e .` in a checkout")


def reader_check() -> Check:
    """Whether proflab's compiled readers are in use: the Kineto slice decoder and the SQLite
    column reader of Nsight Systems exports. Without them the reports are the same, and
    large inputs read slower (msgspec and the ADBC driver do it all)."""
    name = "compiled readers"
    if os.environ.get("PROFLAB_PURE_PYTHON", "") not in ("", "0"):
        return Check(name, "warning", "turned off by PROFLAB_PURE_PYTHON: the same reports, slower on large traces and exports",
                     "unset PROFLAB_PURE_PYTHON")
    try:
        from proflab.readers import _kineto_native, _sqlite_native
    except Exception as e:  # (never raise: a broken install is a line of its own)
        return Check(name, "warning", f"cannot tell ({type(e).__name__}: {e})", READER_FIX)
    off = []
    if not _kineto_native.available():  # (a build of another version of the source is set aside as none)
        off.append("the Kineto slice decoder is not built, or was built from another version (traces decode with msgspec)")
    if not _sqlite_native.available():
        built = _sqlite_native._sqlscan is not None and _sqlite_native._sqlscan.version() == _sqlite_native._VERSION
        off.append(("the SQLite column reader found no SQLite library" if built else
                    "the SQLite column reader is not built, or was built from another version") + " (exports read through the ADBC driver)")
    if off:
        return Check(name, "warning", "; ".join(off) + ": the same reports, slower on large inputs", READER_FIX)
    return Check(name, "ok", f"Kineto slices decoded and Nsight Systems exports read in C (SQLite {_sqlite_native.sqlite_version})")


def _tool(name: str) -> tuple[Check, dict[str, Any]]:
    exe = shutil.which(name)
    use = {"ncu": "proflab kernels (the Nsight Compute deep dive)", "nsys": "proflab run --backend nsys"}[name]
    install = "install Nsight Compute (it ships with the CUDA toolkit) and put ncu on the PATH" if name == "ncu" else \
        "install Nsight Systems (it ships with the CUDA toolkit) and put nsys on the PATH"
    if exe is None:
        return Check(name, "missing", f"not on the PATH: {use} cannot run", install), {}
    try:
        got = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check(name, "warning", f"{exe} --version failed ({type(e).__name__}: {e})", "check the install"), {"path": exe}
    import re

    text = got.stdout + got.stderr
    m = re.search(r"[Vv]ersion\s+(\S+)", text)
    version = m.group(1).rstrip(",") if m else None
    if got.returncode != 0 or not version:
        return Check(name, "warning", f"{exe} --version exited {got.returncode}", "check the install"), {"path": exe}
    return Check(name, "ok", f"{version} ({exe})"), {"path": exe, "version": version}


def counter_permission(params_text: str | None, *, is_root: bool, driver: bool) -> Check:
    """The performance-counter permission from the driver's ``RmProfilingAdminOnly`` (the
    text of /proc/driver/nvidia/params, or None where it cannot be read)."""
    name = "counter permission"
    if not driver:
        return Check(name, "missing", "no NVIDIA driver: no GPU performance counters", "")
    value = None
    for line in (params_text or "").splitlines():
        if line.strip().startswith("RmProfilingAdminOnly"):
            value = line.split(":", 1)[-1].strip()
    if value is None:
        return Check(name, "warning", f"cannot tell: {PARAMS} {'has no RmProfilingAdminOnly' if params_text else 'is not readable'}; "
                     "run proflab doctor --ncu-probe to try", "")
    if value == "0":
        return Check(name, "ok", "every user may read the GPU performance counters (RmProfilingAdminOnly: 0)")
    if is_root:
        return Check(name, "ok", "counters are admin-only (RmProfilingAdminOnly: 1), and this is root")
    return Check(name, "warning", "counters are admin-only (RmProfilingAdminOnly: 1): ncu as this user fails with "
                 "ERR_NVGPUCTRPERM", PERMISSION_FIX)


_NCU_PROBE_PROGRAM = "import torch; x = torch.ones(1024, device='cuda'); (x + 1).sum().item()"


def _ncu_probe(ncu: str, python: str) -> Check:
    """Profile one tiny kernel with ncu: the definitive permission answer."""
    with tempfile.TemporaryDirectory(prefix="proflab-doctor-") as tmp:
        argv = [ncu, "--clock-control", "none", "--metrics", "sm__cycles_elapsed.avg", "--launch-count", "1",
                "--export", str(Path(tmp) / "probe"), python, "-c", _NCU_PROBE_PROGRAM]
        try:
            got = subprocess.run(argv, capture_output=True, text=True, timeout=NCU_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return Check("ncu probe", "warning", f"ncu did not finish ({type(e).__name__})", "")
        text = got.stdout + got.stderr
        if "ERR_NVGPUCTRPERM" in text:
            return Check("ncu probe", "warning", "ncu was refused the counters (ERR_NVGPUCTRPERM)", PERMISSION_FIX)
        if (Path(tmp) / "probe.ncu-rep").exists():
            return Check("ncu probe", "ok", "ncu profiled a kernel: counters are readable")
        errs = [line for line in text.splitlines() if "==ERROR==" in line or "Error" in line]
        return Check("ncu probe", "warning", f"ncu wrote no report ({(errs or [f'exit status {got.returncode}'])[-1].strip()})", "")


def _folder_checks(folder: Path) -> list[Check]:
    target = folder
    while not target.exists() and target != target.parent:
        target = target.parent
    out = []
    made = "" if target == folder else f" (it will be created under {target})"
    if not target.is_dir():
        out.append(Check("run folder", "missing", f"{target} is not a folder", "pass --dir with a writable folder", True))
        return out
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".proflab-doctor-"):
            pass
        out.append(Check("run folder", "ok", f"{folder} is writable{made}", required=True))
    except OSError as e:
        out.append(Check("run folder", "missing", f"cannot write in {target} ({e.strerror or e})",
                         "pass --dir with a folder you can write, or fix its permissions", True))
    free = shutil.disk_usage(target).free
    if free < LOW_DISK_BYTES:
        out.append(Check("free disk", "warning", f"{free / 2**30:.1f} GiB free at {target}: a profiled run with stacks can "
                         f"write hundreds of MB per process", "free space or pass --dir on a larger disk"))
    else:
        out.append(Check("free disk", "ok", f"{free / 2**30:.1f} GiB free at {target}"))
    return out


def doctor(*, folder: str | Path = "proflab-runs", python: str | None = None, ncu_probe: bool = False) -> DoctorReport:
    """Every check (see module doc). ``python``: the interpreter that will run the program
    (default: this one). ``ncu_probe``: also profile one tiny kernel with ncu (a few seconds)."""
    python = python or sys.executable
    checks = [Check("python", "ok", f"{platform.python_version()} ({sys.executable}), {platform.system()} {platform.machine()}")]
    checks.append(reader_check())
    t = _probe_torch(python)
    checks += _torch_checks(t)
    nv, info = _nvml_checks()
    checks += nv
    facts: dict[str, Any] = {"torch": t, "nvml": info}
    for name in ("ncu", "nsys"):
        c, f = _tool(name)
        checks.append(c)
        facts[name] = f
    try:
        params = PARAMS.read_text(errors="replace")
    except OSError:
        params = None
    driver = bool(info.get("available")) or PARAMS.exists()
    checks.append(counter_permission(params, is_root=hasattr(os, "geteuid") and os.geteuid() == 0, driver=driver))
    if ncu_probe:
        if facts["ncu"].get("path") and t.get("cuda_available"):
            checks.append(_ncu_probe(facts["ncu"]["path"], python))
        else:
            checks.append(Check("ncu probe", "missing", "needs ncu and a CUDA-capable torch", ""))
    checks += _folder_checks(Path(folder))
    return DoctorReport(tuple(checks), facts, capabilities(checks, facts, python))

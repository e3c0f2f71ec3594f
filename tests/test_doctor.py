"""``proflab doctor`` on this machine, for real: a CPU-only torch, no NVIDIA driver, no ncu or
nsys. What it must say here: torch ok, CUDA build / CUDA / CUPTI / NVML / GPU missing; that trace
analysis and profiling CPU programs work and GPU profiling does not, with how to add it; exit 0
(no GPU is not a failure), 1 with --need gpu."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv

import pytest

from proflab.cli import main
from proflab.collect.doctor import PERMISSION_FIX, counter_permission, doctor


def _by_name(doc):
    return {c["name"]: c for c in doc["checks"]}


def _torch_here():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed in this interpreter")

    if torch.cuda.is_available():
        pytest.skip("this test describes a machine without CUDA; tests/gpu/test_doctor_gpu.py covers GPUs")
    return torch


def test_doctor_on_this_cpu_machine(tmp_path, capsys):
    torch = _torch_here()
    rc = main(["doctor", "-f", "json", "--dir", str(tmp_path / "runs")])
    doc = json.loads(capsys.readouterr().out)
    c = _by_name(doc)
    assert rc == 0 and doc["can_profile"] is False and doc["broken"] == []
    works = {w["name"]: w for w in doc["works"]}
    assert works["trace analysis"]["works"] and works["profiling CPU programs"]["works"]
    dask = works["many ranks on Dask"]  # the job extra: said which one adds it where it is missing
    assert dask["works"] or "proflab[job]" in dask["fix"]
    assert torch.__version__ in works["profiling CPU programs"]["detail"]
    if shutil.which("nvidia-smi") is None:
        gpu = works["profiling GPU programs"]
        assert not gpu["works"] and gpu["detail"] == "no NVIDIA GPU on this machine" and "NVIDIA GPU" in gpu["fix"]
    assert main(["doctor", "-f", "json", "--dir", str(tmp_path / "runs"), "--need", "gpu"]) == 1
    assert main(["doctor", "-f", "json", "--dir", str(tmp_path / "runs"), "--need", "cpu"]) == 0
    capsys.readouterr()
    assert c["torch"]["status"] == "ok" and torch.__version__ in c["torch"]["detail"]
    if torch.version.cuda is None:
        assert c["torch CUDA build"]["status"] == "missing" and "CPU-only" in c["torch CUDA build"]["detail"]
        assert c["torch CUDA build"]["fix"]
    assert c["CUDA"]["status"] == "missing" and "unavailable" in c["CUDA"]["detail"]
    assert c["CUPTI"]["status"] == "missing"
    if shutil.which("nvidia-smi") is None:
        assert c["NVML"]["status"] == "missing"
        assert c["GPU"]["status"] == "missing" and c["GPU"]["fix"]
        assert c["counter permission"]["status"] == "missing"
    for tool in ("ncu", "nsys"):
        if shutil.which(tool) is None:
            assert c[tool]["status"] == "missing" and "PATH" in c[tool]["fix"]
    assert c["compiled readers"]["status"] in ("ok", "warning") and not c["compiled readers"]["required"]
    assert c["run folder"]["status"] == "ok" and c["run folder"]["required"]
    assert c["free disk"]["status"] in ("ok", "warning")
    assert not (tmp_path / "runs").exists()  # checked, not created
    # the rule: required checks only
    assert {n for n, x in c.items() if x["required"]} == {"torch", "torch CUDA build", "CUDA", "CUPTI", "run folder"}


def test_doctor_terminal_is_one_line_per_check_as_a_subprocess(tmp_path):
    _torch_here()
    got = subprocess.run([sys.executable, "-m", "proflab", "doctor", "--dir", str(tmp_path)], capture_output=True,
                         text=True, timeout=600)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    checks = [line for line in lines if line.split(" ", 1)[0] in ("ok", "MISSING", "WARNING")]
    assert len(checks) == 14
    assert any(line.startswith("MISSING  CUDA") for line in checks)
    works = lines[lines.index("What works here") + 1:]
    assert works[0].startswith("  yes trace analysis") and "no GPU or torch needed" in works[0]
    assert any(line.startswith("  yes profiling CPU programs") for line in works)
    assert any(line.startswith("  no  profiling GPU programs") and "to add it:" in line for line in works)
    assert lines[-1].startswith("proflab works here for trace analysis and profiling CPU programs; not for profiling GPU programs")
    assert lines[-1].endswith("(exit 0).")
    assert not got.stderr.strip()


def test_doctor_unwritable_run_folder(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["doctor", "-f", "json", "--dir", str(blocker / "runs")]) == 1
    doc = json.loads(capsys.readouterr().out)
    c = _by_name(doc)
    assert c["run folder"]["status"] == "missing" and "not a folder" in c["run folder"]["detail"]
    assert doc["broken"] and doc["broken"][0].startswith("run folder:")


def test_doctor_probes_the_programs_interpreter(tmp_path, capsys):
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    rep = doctor(folder=tmp_path, python=str(env / "bin" / "python"))
    c = {x.name: x for x in rep.checks}
    assert c["torch"].status == "missing" and "No module named 'torch'" in c["torch"].detail
    assert not rep.can_profile
    # no torch there: analysis still works (exit 0), and the fix names that interpreter and the CPU build
    works = {w.name: w for w in rep.works}
    assert works["trace analysis"].works and not works["profiling CPU programs"].works
    fix = works["profiling CPU programs"].fix
    assert f"{env / 'bin' / 'python'} -m pip install torch==2.13.0" in fix and "CPU wheel index" in fix
    assert rep.exit_status() == 0 and rep.exit_status("cpu") == 1
    rep = doctor(folder=tmp_path, python=str(tmp_path / "no-such-python"))
    assert {x.name: x for x in rep.checks}["torch"].detail.endswith("no such interpreter")
    assert rep.exit_status() == 1 and "no such interpreter" in rep.broken()[0]


def test_a_gpu_that_torch_cannot_profile_is_broken():
    """A GPU on the machine (NVML lists it) with a CPU-only torch: exit 1, saying why; the
    same checks without the GPU: exit 0."""
    from proflab.collect.doctor import Check, DoctorReport, capabilities

    checks = [Check("torch", "ok", "2.13.0+cpu", required=True),
              Check("torch CUDA build", "missing", "CPU-only", "install a CUDA build", True),
              Check("NVML", "ok", "driver 580"), Check("GPU", "ok", "1 GPU(s): 0: NVIDIA H100"),
              Check("ncu", "missing", "not on the PATH", "install ncu"), Check("nsys", "missing", "not on the PATH", "install nsys"),
              Check("run folder", "ok", "writable", required=True)]
    facts = {"torch": {"torch": "2.13.0+cpu"}, "nvml": {"available": True, "gpus": [{"index": 0, "name": "NVIDIA H100"}]}}
    rep = DoctorReport(tuple(checks), facts, capabilities(checks, facts, "python"))
    assert rep.exit_status() == 1 and "torch CUDA build" in rep.broken()[0]
    gpu = {w.name: w for w in rep.works}["profiling GPU programs"]
    assert not gpu.works and gpu.detail == "missing: torch CUDA build" and gpu.fix == "install a CUDA build"
    no_gpu = {"torch": facts["torch"], "nvml": {"available": False}}
    rep = DoctorReport(tuple(checks), no_gpu, capabilities(checks, no_gpu, "python"))
    assert rep.exit_status() == 0 and rep.broken() == []


# /proc/driver/nvidia/params exists only where the NVIDIA driver is loaded: its two forms,
# as the driver writes them, are given here (the GPU test reads the real file).
@pytest.mark.parametrize(
    "text, root, status",
    [
        ("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\nEnableMSI: 1\n", False, "warning"),
        ("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\nEnableMSI: 1\n", True, "ok"),
        ("RmProfilingAdminOnly: 0\n", False, "ok"),
        ("EnableMSI: 1\n", False, "warning"),
        (None, False, "warning"),
    ],
)
def test_counter_permission(text, root, status):
    c = counter_permission(text, is_root=root, driver=True)
    assert c.status == status
    if status == "warning" and text and "AdminOnly: 1" in text:
        assert c.fix == PERMISSION_FIX and "NVreg_RestrictProfilingToAdminUsers=0" in c.fix and "ERR_NVGPUCTRPERM" in c.detail
    assert counter_permission(text, is_root=root, driver=False).status == "missing"


def test_doctor_json_follows_its_schema(tmp_path, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    from importlib import resources

    schema = json.loads(resources.files("proflab").joinpath("schema/doctor.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    main(["doctor", "-f", "json", "--dir", str(tmp_path)])
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, schema)
    assert doc["can_profile"] == all(c["status"] == "ok" for c in doc["checks"] if c["required"])


def test_doctor_says_whether_the_compiled_readers_are_in_use(monkeypatch):
    """Built here (a C compiler at install): ok, naming the SQLite library the export reader
    uses. Turned off, or a reader not built (a stand-in for an install without a compiler:
    one cannot be made here without reinstalling), a warning with the fix; never required."""
    from proflab.collect.doctor import READER_FIX, reader_check
    from proflab.readers import _kineto_native, _sqlite_native

    if not (_kineto_native.available() and _sqlite_native.available()):
        pytest.skip("the compiled readers are not built in this install")
    c = reader_check()
    assert c.status == "ok" and f"SQLite {_sqlite_native.sqlite_version}" in c.detail and not c.required
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    c = reader_check()
    assert c.status == "warning" and "PROFLAB_PURE_PYTHON" in c.detail and c.fix == "unset PROFLAB_PURE_PYTHON"
    monkeypatch.delenv("PROFLAB_PURE_PYTHON")
    monkeypatch.setattr(_sqlite_native, "_sqlscan", None)
    c = reader_check()
    assert c.status == "warning" and "SQLite column reader is not built" in c.detail and "Kineto" not in c.detail
    assert c.fix == READER_FIX
    # built, but no SQLite library found: said so, not "not built"
    monkeypatch.undo()
    monkeypatch.setattr(_sqlite_native, "_bound", False)
    c = reader_check()
    assert c.status == "warning" and "found no SQLite library" in c.detail

"""The C parsers (and the what-if replay's walk) built for fuzzing: AddressSanitizer, UndefinedBehaviorSanitizer and
libFuzzer's coverage counters (clang ``-fsanitize=address,undefined,fuzzer-no-link``), and
the runtime that carries them into Python (``asan_with_fuzzer.so``: ASan's runtime, its C++
part and libFuzzer without a main, in one shared object preloaded into the interpreter, so
that atheris drives the libFuzzer the parsers report their coverage to; atheris's own wheel
ships none). Everything lands in ``tests/fuzz/build/`` (ignored by git), rebuilt when a
source changes.

``build()`` returns the paths; ``missing()`` says why it cannot be built here (no clang, no
compiler runtime, no atheris), or None."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
SOURCES = {"kscan": ROOT / "src" / "proflab" / "readers" / "_kscan.c", "sqlscan": ROOT / "src" / "proflab" / "readers" / "_sqlscan.c",
           "walk": ROOT / "src" / "proflab" / "analysis" / "whatif" / "_replay.c"}
MODULES = {"kscan": "proflab.readers._kscan", "sqlscan": "proflab.readers._sqlscan", "walk": "proflab.analysis.whatif._replay"}
FLAGS = ["-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined,fuzzer-no-link",
         "-fno-sanitize-recover=undefined", "-fPIC", "-shared"]
# what the sanitizers do at run time: a report ends the run; CPython's own allocations at exit
# are not leaks of the parsers; a table too large for the machine is refused (MemoryError), as
# malloc refuses it outside the sanitizer
ASAN_OPTIONS = "detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:handle_abort=1:symbolize=1"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"


def _clang() -> str | None:
    return shutil.which(os.environ.get("CC_FUZZ", "clang"))


def _runtime_dir(clang: str) -> Path:
    out = subprocess.run([clang, "-print-resource-dir"], capture_output=True, text=True, check=True).stdout.strip()
    return Path(out) / "lib" / "linux"


def missing() -> str | None:
    """Why the sanitizer build and its fuzzers cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "the sanitizer build is made for Linux"
    clang = _clang()
    if clang is None:
        return "no clang on the PATH (apt-get install clang libclang-rt-dev)"
    rt = _runtime_dir(clang)
    for name in ("libclang_rt.asan-x86_64.a", "libclang_rt.asan_cxx-x86_64.a", "libclang_rt.fuzzer_no_main-x86_64.a"):
        if not (rt / name).is_file():
            return f"clang's runtime lacks {name} (apt-get install libclang-rt-dev)"
    try:
        import atheris  # noqa: F401
    except ImportError:
        return "atheris is not installed (pip install atheris; the test extra has it on Linux x86-64)"
    return None


def _key(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def build() -> dict[str, Path]:
    """The instrumented modules (``kscan``, ``sqlscan``, ``walk``: extension modules) and the preloaded
    runtime (``runtime``), built where absent or stale."""
    clang = _clang()
    rt = _runtime_dir(clang)
    BUILD.mkdir(parents=True, exist_ok=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    include = sysconfig.get_paths()["include"]
    out: dict[str, Path] = {}
    for name, src in SOURCES.items():
        key = _key(src.read_bytes(), " ".join(FLAGS).encode(), clang.encode(), include.encode())
        target = BUILD / key / f"_{name}{suffix}"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            extra = ["-ldl"] if name == "sqlscan" else []
            subprocess.run([clang, *FLAGS, f"-I{include}", str(src), "-o", str(target), *extra], check=True, capture_output=True)
        out[name] = target
    runtime = BUILD / f"asan_with_fuzzer-{_key(str(rt).encode())}.so"
    if not runtime.is_file():
        work = BUILD / "rt"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        # ASan's static runtime without its preinit object (a shared object may not hold a
        # .preinit_array), its C++ part (libFuzzer is C++) and libFuzzer with no main
        subprocess.run(["ar", "x", str(rt / "libclang_rt.asan-x86_64.a")], cwd=work, check=True)
        for f in work.glob("asan_preinit*.o"):
            f.unlink()
        subprocess.run(["ar", "rcs", "asan.a", *sorted(p.name for p in work.glob("*.o"))], cwd=work, check=True)
        cxx = shutil.which("clang++") or clang
        subprocess.run([cxx, "-shared", "-fPIC", "-o", str(runtime), "-Wl,--whole-archive", str(work / "asan.a"),
                        str(rt / "libclang_rt.asan_cxx-x86_64.a"), str(rt / "libclang_rt.fuzzer_no_main-x86_64.a"),
                        "-Wl,--no-whole-archive", "-lpthread", "-ldl", "-lrt", "-lm", *([] if cxx.endswith("++") else ["-lstdc++"])],
                       check=True, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    out["runtime"] = runtime
    return out


def environment(runtime: Path) -> dict[str, str]:
    """The environment a fuzzer's interpreter starts with: the runtime preloaded."""
    env = dict(os.environ, LD_PRELOAD=str(runtime), ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS=UBSAN_OPTIONS)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def load(name: str, path: Path):
    """The instrumented module (``MODULES[name]``: ``proflab.readers._kscan``, ...) from ``path``,
    in place of the installed one (its Python wrapper, imported after, takes it from
    ``sys.modules``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(MODULES[name], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

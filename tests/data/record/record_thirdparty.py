"""Record the third-party half of the gain-truth set: programs built on packages from the package
index (Hugging Face ``transformers``' Trainer, torchvision, Lightning), run unmodified, each fix
made as a user makes it (one argument or one line), the saving measured bare.

The programs are user scripts under ``thirdparty/``; each takes ``--fix NAME`` and ``--steps N``:
Hugging Face's Trainer on GPT-2 and BERT, torchvision's ResNet-50 and a timm ViT with their
DataLoaders, Lightning's demo transformer; then (the report half) a Llama-shaped model under the
Trainer and torchvision's ConvNeXt-Tiny under Lightning.
For every program, on one GPU:

``bare``    each variant runs as a process of its own, alternated (base, fix1, fix2, base, fix1,
            ...; ``--rounds`` rounds). The script runs as it is (``runpy``); this driver adds one
            thing beside it, a global optimizer step hook (``register_optimizer_step_post_hook``)
            that records a CUDA event on the current stream at each step's end, with no
            profiler: GPU-side step times, as ``proflab run`` measures its unprofiled steps but
            not by proflab. The first ``--skip`` steps (start-up, compilation, loader workers
            starting) are left out. The measured gain is the difference of the variants' medians.
``traces``  the variants that a truth row starts from, under ``proflab run --no-analyze`` with
            its default options, as a user records them: the run directory's trace and process
            record are kept as ``<program>.<variant>/`` (the trace renamed, host names dropped);
            with ``--record-shapes`` the operators' input shapes too, as
            ``<program>.<variant>.shapes/`` (for the per-op model's predictions); with
            ``--no-monitor`` without the GPU monitor's samples (they need polars).

``truth.json`` holds, per program, each variant's bare step times (ms), its median and its
per-process medians, and proflab's own unprofiled median from each recorded run beside them.

Usage::

    python tests/data/record/record_thirdparty.py --out DIR [--only PROGRAM ...] [--rounds 2]
    python tests/data/record/record_thirdparty.py --out DIR --only hf_gpt2 --variants tf32 bf16 --record-shapes --no-monitor
    python tests/data/record/record_thirdparty.py --out DIR --only hf_qwen2 --variants base tf32 --traces-only --record-shapes --no-monitor --xz-preset 3
    python tests/data/record/record_thirdparty.py --out DIR --only hf_neox hf_qwen2 --bare-only   # timed again, no traces
    python tests/data/record/record_thirdparty.py --child SCRIPT --json F -- --fix X   # one process
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import runpy
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

# program: (script, variants, the variants whose traces rows start from, steps per process)
PROGRAMS = {
    "hf_gpt2": ("hf_gpt2.py", ("base", "tf32", "bf16", "bf16-compile"), ("base", "tf32", "bf16"), 60),
    "tv_resnet": ("tv_resnet.py", ("base", "workers", "amp"), ("base", "workers"), 40),
    "lightning_lm": ("lightning_lm.py", ("base", "high", "bf16"), ("base", "high"), 60),
    # recorded after the models were set on the programs above: the gain truth's report half
    "hf_bert": ("hf_bert.py", ("base", "tf32", "bf16", "bf16-compile"), ("base", "tf32", "bf16"), 60),
    "timm_vit": ("timm_vit.py", ("base", "workers", "high", "amp"), ("base", "workers", "high"), 40),
    "hf_llama": ("hf_llama.py", ("base", "tf32", "bf16", "bf16-compile"), ("base", "tf32", "bf16"), 60),
    "lightning_cnn": ("lightning_cnn.py", ("base", "workers", "high", "bf16"), ("base", "workers", "high"), 40),
    # a later report set, recorded with shapes (--record-shapes --no-monitor), its rows named before
    # the recording: for each, base -> tf32 (tensor_cores_unused), tf32 -> bf16 (tensor_cores_tf32),
    # bf16 -> bf16-compile (torch.compile's claim), in gains_truth.py's report half
    "hf_qwen2": ("hf_qwen2.py", ("base", "tf32", "bf16", "bf16-compile"), ("base", "tf32", "bf16"), 40),
    "hf_neox": ("hf_neox.py", ("base", "tf32", "bf16", "bf16-compile"), ("base", "tf32", "bf16"), 40),
}
SKIP = 15  # steps left out of each process's bare times
LOG = [Path(os.devnull)]  # the programs' output (--out/programs.log)
XZ_PRESET = [9 | lzma.PRESET_EXTREME]  # the traces' compression (--xz-preset: a faster one on a timed lease)


def child(script: str, out: str, args: list[str]) -> None:
    """Run ``script`` unmodified, timing each optimizer step's end on the GPU's clock."""
    import torch

    cuda = torch.cuda.is_available()
    marks: list = []

    def hook(opt, a, kw):
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append(ev)
        else:
            marks.append(time.perf_counter_ns())

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(hook)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as ``python script.py`` puts it
    t0 = time.monotonic()
    runpy.run_path(script, run_name="__main__")
    if cuda:
        torch.cuda.synchronize()
        steps = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
    else:
        steps = [(b - a) / 1e6 for a, b in zip(marks, marks[1:])]
    Path(out).write_text(json.dumps({"steps": len(marks), "gpu_step_ms": [round(s, 4) for s in steps[SKIP:]],
                                     "process_s": round(time.monotonic() - t0, 1),
                                     "clock": "CUDA events" if cuda else "time.perf_counter_ns"}))


def _bare(script: Path, variant: str, steps: int, tmp: Path) -> dict:
    f = tmp / f"bare-{os.getpid()}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, __file__, "--child", str(script), "--json", str(f), "--", "--fix", variant,
           "--steps", str(steps)]
    with open(LOG[0], "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    return json.loads(f.read_text())


def _scrub(src: Path, dst: Path) -> None:
    """A trace as committed: host names dropped, the file named for what it holds, xz-compressed
    (about half the bytes of gzip's best; ``xz -9e`` afterwards gives the committed bytes of a
    trace written with a faster ``--xz-preset``)."""
    data = json.loads(gzip.open(src, "rt").read()) if src.suffix == ".gz" else json.loads(src.read_text())
    for key in ("hostname", "host_name"):
        data.pop(key, None)
    dist = data.get("distributedInfo")
    if isinstance(dist, dict):
        dist.pop("hostname", None)
    data["traceName"] = dst.name
    with lzma.open(dst, "wt", preset=XZ_PRESET[0]) as f:
        json.dump(data, f, separators=(",", ":"))


def _trace(name: str, script: Path, variant: str, steps: int, out: Path, tmp: Path, options: tuple = ()) -> dict:
    """One recorded run of ``script --fix variant`` under ``proflab run --no-analyze`` with
    ``options`` (``--record-shapes``, ``--no-monitor``), kept as ``out/<name>.<variant>[.shapes]/``."""
    runs = tmp / "runs"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    kept = f"{name}.{variant}" + (".shapes" if "--record-shapes" in options else "")
    cmd = [sys.executable, "-m", "proflab", "run", "--no-analyze", *options, "-o", str(runs), "--name", kept,
           "--", sys.executable, str(script), "--fix", variant, "--steps", str(steps)]
    with open(LOG[0], "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    run = max((p for p in runs.iterdir() if p.name.endswith(f"-{kept}")), key=lambda p: p.name)
    return keep_run(run, kept, out, options)


def keep_run(run: Path, name: str, out: Path, options: list[str] = ()) -> dict:
    """``proflab run``'s directory ``run`` as committed, ``out/<name>/``: its trace renamed for what
    it holds (host names dropped), its process records, a note for meta.json; returns proflab's
    own unprofiled step beside it."""
    dst = out / name
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "traces").mkdir(parents=True)
    (dst / "processes").mkdir()
    kept = {}
    for proc in sorted((run / "processes").glob("*.json")):
        rec = json.loads(proc.read_text())
        rec["argv"] = [Path(a).name if os.sep in a else a for a in rec.get("argv", [])]
        traces = []
        for i, t in enumerate(rec.get("traces") or []):
            rel = f"traces/{name}{'.' + str(i) if i else ''}.pt.trace.json.xz"
            _scrub(run / t, dst / rel)
            traces.append(rel)
        rec["traces"] = traces
        if rec.get("startup_traces"):  # the start-up window's trace is not kept (nor its host-named path)
            rec["startup_traces"] = []
            rec.setdefault("notes", []).append("a start-up trace was recorded; not kept with this truth set")
        (dst / "processes" / proc.name).write_text(json.dumps(rec, indent=1))
        if traces:
            kept = rec.get("step_times") or {}
    said = " ".join(options) if options else "default options"
    (dst / "meta.json").write_text(json.dumps({"recorded_by": "tests/data/record/record_thirdparty.py (proflab run "
                                               f"--no-analyze, {said}; meta.json reduced to this note)"}))
    return {"proflab_bare_ms": kept.get("bare_ms"), "proflab_bare_n": kept.get("bare_n"), "run": dst.name}


def measure(name: str, out: Path, rounds: int, tmp: Path, only_variants=None, save=lambda entry: None,
            options: tuple = (), traces_only: bool = False, bare_only: bool = False) -> dict:
    """One program's truth; ``save`` gets it as it grows (after the bare runs, after each trace):
    a recording cut short keeps what it measured. ``options``: ``proflab run``'s for the traces.
    ``traces_only``: no bare runs, only the traces (of variants whose bare times a recording cut
    short already measured; merged into that recording's ``truth.json`` by hand). ``bare_only``: the
    bare runs alone (a program timed again, all its variants in one session)."""
    script_name, variants, traced, steps = PROGRAMS[name]
    if only_variants:
        variants = tuple(v for v in variants if v in only_variants)
        traced = tuple(v for v in traced if v in only_variants)
    if bare_only:
        traced = ()
    script = HERE / "thirdparty" / script_name
    per: dict[str, list[dict]] = {} if traces_only else {v: [] for v in variants}
    t0 = time.monotonic()
    for _ in range(0 if traces_only else rounds):
        for v in variants:
            per[v].append(_bare(script, v, steps, tmp))
            print(f"{name} {v}: {statistics.median(per[v][-1]['gpu_step_ms']):.2f} ms", flush=True)
    bare = {}
    for v, procs in per.items():
        allsteps = [s for p in procs for s in p["gpu_step_ms"]]
        bare[v] = {"gpu_step_ms": allsteps, "median_ms": round(statistics.median(allsteps), 4),
                   "process_medians_ms": [round(statistics.median(p["gpu_step_ms"]), 4) for p in procs],
                   "process_s": [p["process_s"] for p in procs]}
    entry = {"script": f"thirdparty/{script_name}", "variants": list(variants), "steps_per_process": steps,
             "skipped_steps": SKIP, "rounds": rounds, "bare": bare, "recorded": {}}
    save(entry)
    for v in traced:
        entry["recorded"][v] = _trace(name, script, v, steps, out, tmp, options)
        save(entry)
    entry["took_s"] = round(time.monotonic() - t0, 1)
    return entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", nargs="*", help="only these variants (a CPU check: TF32 needs CUDA)")
    ap.add_argument("--record-shapes", action="store_true",
                    help="the traces record the operators' input shapes (<program>.<variant>.shapes/)")
    ap.add_argument("--no-monitor", action="store_true",
                    help="the traces without the GPU monitor's samples (a machine without polars)")
    only = ap.add_mutually_exclusive_group()  # (both would record nothing)
    only.add_argument("--traces-only", action="store_true",
                      help="no bare runs: only the traces of --variants (their bare times measured before)")
    only.add_argument("--bare-only", action="store_true", help="the bare runs alone, no traces")
    ap.add_argument("--xz-preset", type=int, default=None,
                    help="the traces' xz preset (default 9 extreme; recompress with xz -9e to commit)")
    ap.add_argument("--child")
    ap.add_argument("--json")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args(argv)
    if a.child:
        child(a.child, a.json, a.rest)
        return 0
    import tempfile

    import torch

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    truth_file = out / "truth.json"
    truth = json.loads(truth_file.read_text()) if truth_file.exists() else {"programs": {}}
    truth["recorded_with"] = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                              "torch": torch.__version__, "python": sys.version.split()[0],
                              "packages": _versions(("transformers", "torchvision", "lightning", "accelerate"))}
    LOG[0] = out / "programs.log"
    if a.xz_preset is not None:
        XZ_PRESET[0] = a.xz_preset
    options = tuple(o for o, on in (("--record-shapes", a.record_shapes), ("--no-monitor", a.no_monitor)) if on)
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only or list(PROGRAMS):

            def save(entry, name=name):
                truth["programs"][name] = entry
                truth_file.write_text(json.dumps(truth, indent=1))

            save(measure(name, out, a.rounds, Path(tmp), a.variants, save, options, a.traces_only, a.bare_only))
    return 0


def _versions(names) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for n in names:
        try:
            found[n] = version(n)
        except PackageNotFoundError:
            found[n] = None
    return found


if __name__ == "__main__":
    raise SystemExit(main())

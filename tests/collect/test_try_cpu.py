"""``proflab try`` on the CPU: real programs run as they are and with a knob, interleaved, their
unprofiled steps timed; the knob must really be set in the program, and the measured saving
must carry its interval (``collect/trial.py``, ``collect/knobs.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proflab.cli import main
from proflab.collect.knobs import Knob, environment, parse
from proflab.errors import UsageError

pytest.importorskip("torch")

PROFLAB = [sys.executable, "-m", "proflab"]
DATA = Path(__file__).resolve().parents[1] / "data" / "gains"

# A loop fed by a DataLoader whose samples take 3 ms each to make: workers hide it. It prints
# the DataLoader's and the optimizer's settings, which the knobs change.
SLOW_LOADER = """
import time, torch
class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.randn(32)
if __name__ == "__main__":
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Samples(), batch_size=8)
    print("workers", loader.num_workers, "foreach", opt.defaults.get("foreach"), flush=True)
    it = iter(loader)
    for _ in range(16):
        model(next(it)).sum().backward()
        opt.step()
        opt.zero_grad()
"""


def test_knobs_parse_and_refuse_what_they_do_not_know():
    assert parse("workers=4") == Knob("workers", "4")
    assert parse("tf32") == Knob("tf32")
    assert parse("nccl:ALGO=Ring") == Knob("nccl:ALGO", "Ring")
    for bad in ("faster", "workers", "workers=two", "tf32=1", "matmul-precision=low"):
        with pytest.raises(UsageError):
            parse(bad)
    env = environment([parse("expandable-segments"), parse("nccl:ALGO=Ring"), parse("env:OMP_NUM_THREADS=2")],
                      {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})  # fmt: skip
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    assert env["NCCL_ALGO"] == "Ring" and env["OMP_NUM_THREADS"] == "2"


def test_a_bad_knob_is_one_line_and_exit_2(capsys):
    assert main(["try", "faster", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown fix 'faster'" in err


def test_workers_are_set_in_the_program_and_the_saving_is_measured(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(SLOW_LOADER)
    done = subprocess.run(
        [*PROFLAB, "try", "workers=2", "foreach-optimizer", "--no-predict", "--rounds", "2", "--max-rounds", "2",
         "-f", "json", "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # the program's own prints: as it is, then with the knobs (interleaved: base, fix, fix, base)
    seen = [line for line in done.stdout.splitlines() if line.startswith("workers")]
    assert seen.count("workers 0 foreach None") == 2 and seen.count("workers 2 foreach True") == 2, seen
    t = json.loads(done.stdout[done.stdout.index("{"):])
    assert t["schema"] == "proflab.try/1" and t["knobs"] == ["workers=2", "foreach-optimizer"]
    assert len(t["base_runs"]) == len(t["fix_runs"]) == 2 and t["clock"] == "host"
    # 8 samples of 3 ms a step as it is; two workers make them beside the loop
    assert t["change_pct"] < -30 and t["ci95_pct"][1] < 0 and t["verdict"] == "faster", t
    assert (Path(t["folder"]) / "trial.json").exists()


def test_the_prediction_is_the_finding_that_names_the_knob(tmp_path):
    """The FP32 MLP's trace (gain-truth set, an H200) names `proflab try tf32`; the program here
    is a CPU one, so the measurement itself shows no clear change: the prediction is read."""
    prog = tmp_path / "prog.py"
    prog.write_text(SLOW_LOADER.replace("time.sleep(0.003)", "pass"))
    done = subprocess.run(
        [*PROFLAB, "try", "tf32", "--from", str(DATA / "tf32_mlp.base.pt.trace.json.gz"), "--rounds", "1",
         "--max-rounds", "1", "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "predicted: saves" in done.stdout and "[tensor_cores_unused, replay]" in done.stdout, done.stdout
    assert "measured:" in done.stdout and "95% interval" in done.stdout


def test_compile_mode_is_given_to_every_torch_compile_the_program_makes():
    """``compile-mode=reduce-overhead``: the fix a launch-bound compiled program is advised,
    made without code changes. A stand-in for torch records what torch.compile was asked (the
    knob wraps the real one in the profiled process; wrapping it here would leak into the
    other tests of this process)."""
    from types import SimpleNamespace

    from proflab.collect import _child

    assert parse("compile-mode=reduce-overhead") == Knob("compile-mode", "reduce-overhead")
    with pytest.raises(UsageError):
        parse("compile-mode=fastest")
    fake = SimpleNamespace(compile=lambda *args, **kwargs: kwargs)
    notes: list[str] = []
    _child.apply_knobs(fake, {"compile-mode": "reduce-overhead"}, notes)
    assert fake.compile(object()) == {"mode": "reduce-overhead"}
    assert fake.compile(object(), mode="default", dynamic=False) == {"mode": "reduce-overhead", "dynamic": False}
    assert fake.compile(object(), options={"max_autotune": True}) == {"mode": "reduce-overhead"}
    assert any("replaced a torch.compile's options" in n for n in notes)
    _child.apply_knobs(fake, {"compile-mode": "reduce-overhead"}, notes)  # set twice: wrapped once
    assert fake.compile.__wrapped__(object()) == {}

"""The default drill-down against ``ncu --set full`` on every kernel, on one small training step.

Runs, in one go on a machine with a GPU and ncu:

1. the training program with torch.profiler, for the timeline that names the hot kernels;
2. ``proflab kernels TRACE -- python train_step.py`` (top 5 kernels, targeted sections,
   launch skip/count), timed end to end, parsing and verdicts included;
3. ``ncu --set full --clock-control none python train_step.py`` on every kernel launch, timed
   (stopped at ``--full-timeout`` seconds; the ratio is then a lower bound).

Prints both wall times and their ratio.

    python benchmarks/bench_kernels_vs_full.py --steps 3
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "..", "tests", "data", "record", "train_step.py")


def timed(argv: list[str], timeout: float | None, log: str) -> tuple[float, bool]:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            return time.perf_counter() - t0, False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return time.perf_counter() - t0, True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="training steps the program runs under ncu")
    p.add_argument("--full-timeout", type=float, default=420.0)
    args = p.parse_args(argv)
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu is not on the PATH", file=sys.stderr)
        return 2
    py = sys.executable
    work = tempfile.mkdtemp(prefix="bench-kernels-")
    subprocess.run([py, PROGRAM, "--steps", "6", "--trace", os.path.join(work, "trace")], check=True)
    trace = sorted(glob.glob(os.path.join(work, "trace", "*.pt.trace.json.gz")))[-1]
    prog = [py, PROGRAM, "--steps", str(args.steps)]
    t_plain, _ = timed(prog, None, os.path.join(work, "plain.log"))
    t_proflab, _ = timed([py, "-m", "proflab", "kernels", trace, "--ncu-dir", os.path.join(work, "ncu"),
                          "-o", os.path.join(work, "kernels.txt"), "--", *prog], None, os.path.join(work, "proflab.log"))
    t_full, cut = timed([ncu, "--set", "full", "--clock-control", "none", "-f", "-o", os.path.join(work, "full"), *prog],
                        args.full_timeout, os.path.join(work, "full.log"))
    with open(os.path.join(work, "full.log")) as f:
        profiled = sum(1 for line in f if line.startswith("==PROF== Profiling"))
    print(f"program alone ({args.steps} steps): {t_plain:.1f} s")
    print(f"proflab kernels (top 5, targeted sections, parse + verdicts): {t_proflab:.1f} s")
    print(f"ncu --set full on every kernel: {'>' if cut else ''}{t_full:.1f} s "
          f"({profiled} launches profiled{', stopped at the timeout' if cut else ''})")
    print(f"ratio full / proflab: {'>' if cut else ''}{t_full / t_proflab:.1f}x")
    print(f"work dir: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

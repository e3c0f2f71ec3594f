"""Record real Nsight Compute outputs of ``ncu_workloads.py`` for ``tests/data/ncu/``.

Writes, into ``--out``:

- ``workloads_full.ncu-rep``: ``--set full`` on one launch of every workload kernel;
- ``workloads_full_raw.csv`` and ``workloads_full_details.csv``: that report exported with
  ``--page raw`` and ``--page details`` (``--csv``);
- ``workloads_targeted_stdout.csv``: a targeted section list printed straight to stdout with
  ``--csv --page raw``, so ``==PROF==`` lines and the program's own output are mixed in, as
  users see it;
- ``workloads_targeted.ncu-rep`` with its ``_raw.csv`` and ``_details.csv`` exports: proflab's
  default section list (``proflab.collect.ncu.DEFAULT_SECTIONS``), what ``proflab kernels``
  collects;
- ``ncu_version.txt``.

With ``--only KERNEL ... --prefix NAME`` the same full and targeted recordings are made of
those kernels alone, named ``NAME_full*`` and ``NAME_targeted*`` (no stdout capture); the
``spill_*`` captures are ``--only pf_spill --prefix spill``.

Usage (on a machine with a GPU and ncu on the PATH)::

    python tests/data/record/record_ncu.py --out DIR
    python tests/data/record/record_ncu.py --out DIR --only pf_spill --prefix spill
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "ncu_workloads.py")
TARGETED_SECTIONS = (
    "SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "ComputeWorkloadAnalysis",
    "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables", "SourceCounters",
)
COMMON = ("--clock-control", "none", "--profile-from-start", "off", "--import-source", "no")


def run(argv: list[str], stdout_path: str | None = None) -> None:
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    if stdout_path is None:
        subprocess.run(argv, check=True)
    else:
        with open(stdout_path, "w") as f:
            subprocess.run(argv, check=True, stdout=f, stderr=subprocess.STDOUT)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--targeted-only", action="store_true", help="skip the --set full recording")
    p.add_argument("--only", nargs="+", help="record these workloads of ncu_workloads.py only")
    p.add_argument("--prefix", default="workloads", help="file name prefix of the recordings")
    args = p.parse_args(argv)
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu is not on the PATH", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    py = sys.executable
    prog = [py, WORKLOADS, *(["--only", *args.only] if args.only else [])]
    pre = args.prefix
    run([ncu, "--version"], out("ncu_version.txt"))
    if not args.targeted_only:
        rep = out(f"{pre}_full.ncu-rep")
        run([ncu, *COMMON, "--set", "full", "-f", "-o", rep[: -len(".ncu-rep")], *prog])
        for page in ("raw", "details"):
            run([ncu, "--import", rep, "--csv", "--page", page, "--print-kernel-base", "demangled"],
                out(f"{pre}_full_{page}.csv"))
    sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "src"))
    from proflab.collect.ncu import DEFAULT_SECTIONS

    rep = out(f"{pre}_targeted.ncu-rep")
    default = [a for s in DEFAULT_SECTIONS for a in ("--section", s)]
    run([ncu, *COMMON, *default, "-f", "-o", rep[: -len(".ncu-rep")], *prog])
    for page in ("raw", "details"):
        run([ncu, "--import", rep, "--csv", "--page", page, "--print-kernel-base", "demangled"],
            out(f"{pre}_targeted_{page}.csv"))
    if args.only:
        return 0
    sections = [a for s in TARGETED_SECTIONS for a in ("--section", s)]
    run([ncu, *COMMON, *sections, "--csv", "--page", "raw", py, WORKLOADS],
        out("workloads_targeted_stdout.csv"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

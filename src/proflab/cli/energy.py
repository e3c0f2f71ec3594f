"""``proflab energy``: the energy of a proflab run, per GPU, window and step."""

from __future__ import annotations

import argparse

from proflab.cli._common import format_arg, write_out
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_energy"]


def add_parsers(sub) -> None:
    en = sub.add_parser(
        "energy",
        help="energy of a proflab run: joules per GPU, per profiled window and step, power cap and thermal throttling",
        description=(
            "Reads RUN_DIR's monitor.parquet (NVML samples) and traces: energy per GPU from the NVML energy counter "
            "(integrated power as the cross-check), idle power and the energy spent idle, the energy of each trace's "
            "profiled window, GPU-side step and user range where the counter resolves them, TFLOPS/W where the "
            "FLOPs are known (every operator's, from a --record-shapes trace; the step proflab run counted; proflab "
            "kernels' Nsight Compute counts; or --flops-per-step), and power_capped / "
            "thermal_throttled findings."
        ),
        epilog="example: proflab energy proflab-runs/20260101-120000-train -f json",
    )
    en.add_argument("run_dir", metavar="RUN_DIR", help="a proflab run directory with monitor.parquet")
    format_arg(en)
    en.add_argument("-o", "--output", metavar="FILE", help="write here (atomically): .json, .md, .txt")
    en.add_argument("--flops-per-step", type=float, metavar="FLOP",
                    help="FLOPs of one step of one rank, when known (default: the model FLOPs of the operators' recorded "
                         "shapes, else the step proflab run counted, else Nsight Compute's counts)")
    en.set_defaults(func=cmd_energy)


def cmd_energy(args: argparse.Namespace) -> int:
    from proflab.report.energy import energy
    from proflab.render import format_for_path

    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    if args.flops_per_step is not None and not args.flops_per_step > 0:
        raise UsageError("--flops-per-step must be > 0")
    rep = energy(args.run_dir, flops_per_step=args.flops_per_step).to_dict()
    if fmt == "json":
        import json

        text = json.dumps(rep, indent=2) + "\n"
    else:
        from proflab.render.energy import render_energy

        text = render_energy(rep, fmt)
    return write_out(args, text)

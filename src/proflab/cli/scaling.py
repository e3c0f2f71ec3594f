"""``proflab scaling``: scaling efficiency across GPU counts, from runs made already or launched here."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from proflab.cli._common import format_arg, output_file, write_out
from proflab.cli._recording import recording_args, recording_defaults, recording_options
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_scaling"]


def add_parsers(sub) -> None:
    sc = sub.add_parser(
        "scaling",
        help="scaling efficiency of one program across GPU counts, and where the loss goes",
        description=(
            "Each RUN is one run of the same program at some GPU count: a proflab run directory, a folder of its "
            "rank traces, or one trace (1 GPU). Reports weak or strong scaling efficiency against the run with the "
            "fewest GPUs and splits the loss per step into exposed communication, imbalance and the rest."
        ),
        epilog=(
            "examples:\n  proflab scaling --mode weak runs/1gpu runs/2gpu runs/4gpu --plot scaling.png\n"
            "  proflab scaling --mode weak --gpus 1,2 -- torchrun --nproc_per_node {gpus} train.py"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sc.add_argument("runs", nargs="*", metavar="RUN", help="run directory, folder of rank traces, or trace file")
    sc.add_argument(
        "--gpus", metavar="N,N,...",
        help="launch the command after -- once per GPU count under proflab run (its {gpus} placeholder, or the "
        "value of its --nproc_per_node / --nproc-per-node, set to each count), then compare the runs",
    )  # fmt: skip
    sc.add_argument("--runs-dir", default=None, metavar="DIR", help="with --gpus: where the run directories go (default: proflab-runs)")
    sc.add_argument("--mode", required=True, choices=("weak", "strong"), help="weak: same work per GPU; strong: same total work")
    sc.add_argument("--plot", metavar="FILE", help="write the efficiency and loss plot here (.png, .svg, .pdf)")
    format_arg(sc)
    sc.add_argument("-o", "--output", metavar="FILE", help="write here (atomically): .json, .md, .txt")
    recording_args(sc)  # with --gpus: what each proflab run records, as `proflab run` takes them
    sc.set_defaults(func=cmd_scaling)


_NPROC = re.compile(r"^--nproc[-_]per[-_]node(?:=(.*))?$")


def _scaling_command(cmd: list[str], gpus: int) -> list[str]:
    """``cmd`` for one GPU count: its ``{gpus}`` placeholders, else its torchrun
    ``--nproc_per_node`` value, set to ``gpus``."""
    if any("{gpus}" in a for a in cmd):
        return [a.replace("{gpus}", str(gpus)) for a in cmd]
    out, i, found = [], 0, False
    while i < len(cmd):
        m = _NPROC.match(cmd[i])
        if m and m.group(1) is not None:
            out.append(cmd[i].split("=", 1)[0] + f"={gpus}")
            found = True
        elif m and i + 1 < len(cmd):
            out += [cmd[i], str(gpus)]
            i += 1
            found = True
        else:
            out.append(cmd[i])
        i += 1
    if not found:
        raise UsageError("--gpus: the command needs a {gpus} placeholder or torchrun's --nproc_per_node to set the GPU count")
    return out


def _launch_scaling_runs(args: argparse.Namespace) -> list[str]:
    """Run the command under ``proflab run`` once per GPU count (fewest first); the run
    directories, for the scaling comparison."""
    from proflab.collect import rundir
    from proflab.collect.launcher import RunOptions, run

    if not args.gpus or not args.trailing:
        raise UsageError("--gpus needs GPU counts and the command after --, e.g. --gpus 1,2 -- torchrun --nproc_per_node {gpus} train.py")
    try:
        counts = sorted({int(x) for x in args.gpus.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--gpus {args.gpus!r}: comma-separated GPU counts, e.g. 1,2,4") from None
    if len(counts) < 2 or counts[0] < 1:
        raise UsageError("--gpus needs at least two GPU counts, each >= 1")
    cmds = {n: _scaling_command(args.trailing, n) for n in counts}
    root = Path(args.runs_dir or rundir.DEFAULT_ROOT)
    batch = rundir.new_run_dir(root, "scaling")
    runs = []
    for n in counts:
        print(f"proflab scaling: {n} GPU(s): {' '.join(cmds[n])}", file=sys.stderr, flush=True)
        rc = run(cmds[n], RunOptions(root=str(batch), name=f"{n}gpu", **recording_options(args), analyze=False), out=sys.stderr)
        made = sorted(p for p in batch.iterdir() if p.is_dir() and p.name.endswith(f"-{n}gpu"))
        if rc != 0 or not made:
            raise UsageError(f"the run at {n} GPU(s) exited with status {rc}: its run directory is {made[-1] if made else batch}")
        runs.append(str(made[-1]))
    return runs


def cmd_scaling(args: argparse.Namespace) -> int:
    from proflab.report.scaling import point_of, profiler_notes, scaling_rows
    from proflab.render import format_for_path
    from proflab.report import ScalingReport

    if args.gpus is not None or args.trailing:
        if args.runs:
            raise UsageError("give either runs to compare or --gpus with a command after --, not both")
        args.runs = _launch_scaling_runs(args)
    else:
        defaults = recording_defaults()
        given = [k for k, v in recording_options(args).items() if v != defaults[k]]
        if given:
            raise UsageError(f"what is recorded ({', '.join(given)}) applies to the runs --gpus launches; these runs are recorded already")
    if len(args.runs) < 2:
        raise UsageError("scaling needs at least two runs (at different GPU counts)")
    if args.plot and not args.plot.endswith((".png", ".svg", ".pdf")):
        raise UsageError(f"{args.plot}: --plot writes .png, .svg or .pdf")
    fmt = args.format or (format_for_path(args.output) if args.output else None) or "term"
    points = []
    for run in args.runs:
        from proflab.report import job as jobs
        from proflab.report.analyze import analyze
        from proflab.readers import expand_paths

        paths = expand_paths([run])
        if len(paths) == 1:
            from proflab.collect.rundir import unprofiled_step_ms

            # a run directory's one process: proflab run timed its steps outside the window
            bare = unprofiled_step_ms(paths[0])
            rep = analyze(paths[0], bare_step_ms=bare)
        else:
            try:
                rep = jobs.analyze_job(paths)
            except jobs.NotAJob as e:
                raise UsageError(f"{run}: not one job's rank traces ({e})") from None
            bare = None
        points.append(point_of(run, rep, bare_step_ms=bare))
    gpus = [p.gpus for p in points]
    if len(set(gpus)) < 2:
        raise UsageError(f"the runs are all at {gpus[0]} GPU(s): scaling needs at least two GPU counts")
    notes = []
    if min(gpus) != 1:
        notes.append(f"the base is the run with {min(gpus)} GPUs, not 1: efficiencies are relative to it")
    rows = scaling_rows(points, args.mode)
    rep = ScalingReport(args.mode, tuple(rows), tuple(notes + profiler_notes(rows)))
    if args.plot:
        from proflab.render.scaling import plot_scaling

        with output_file(Path(args.plot)) as tmp:
            plot_scaling(rep, tmp, Path(args.plot).suffix[1:])
    if fmt == "json":
        import json

        text = json.dumps(rep.to_dict(), indent=2) + "\n"
    else:
        from proflab.render.scaling import render_scaling

        text = render_scaling(rep, fmt)
    return write_out(args, text)

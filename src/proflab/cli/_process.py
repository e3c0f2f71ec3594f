"""The process around a command: the allocator, BLAS threads and heap set before the command
loads polars and numpy, and the end of the process once it is done."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path


def return_freed_memory(setting: str | None = None) -> None:
    """Polars' allocator (jemalloc) keeps freed pages for 10 s by default; a read builds and
    drops a table per slice, so a large trace held up to twice its tables in freed pages
    (500 MB trace: 386 -> 187 MiB after reading). Return them at once (``_AT_ONCE``: ~3 % more
    CPU time on a Kineto trace), or as ``setting`` says (``allocator_setting``: kept a while
    where the budget has room). Only when polars is not loaded yet (the setting is read when
    it starts), and never over the user's own setting; the reader's helper process inherits it.

    Polars (1.x) writes its own default into the environment when it is imported, followed by
    any setting it found there, so a process started from one that had imported polars (a test
    run, a notebook) inherits that default: it is polars', not the user's, and is dropped
    (it raised the peak of a 126 MB nsys export from 416 to 604 MiB); what followed it is kept."""
    if "polars" in sys.modules:
        return
    from proflab._env import set_own

    inherited = os.environ.get("_RJEM_MALLOC_CONF")
    own = _POLARS_MALLOC_DEFAULT.sub("", inherited) if inherited is not None else ""
    set_own("_RJEM_MALLOC_CONF", own or setting or _AT_ONCE)


# what polars 1.x puts first (1.37: "dirty_decay_ms:500,muzzy_decay_ms:1000"; earlier 1.x: -1),
# with POLARS_THP=1 its transparent-huge-page options, then "," and the setting it found
_POLARS_MALLOC_DEFAULT = re.compile(r"^dirty_decay_ms:500,muzzy_decay_ms:-?\d+(?:,thp:always,metadata_thp:always)?(?:,|$)")


_AT_ONCE = "dirty_decay_ms:0,muzzy_decay_ms:0"
# Freed pages kept a while are taken again by the next table built instead of being returned
# and faulted in anew. An Nsight Systems export's, 100 ms: its whole analysis 13-19 % faster
# (0.5 to 2.1 GB H100 exports and 0.7 to 1.5 GB T4 ones: 1,048 MB, 10.3 -> 8.5 s, system time
# 4.6 -> 2.7 s), its peak from 5 % lower to 14 % higher (the 521 MB export: 766 -> 848-873 MiB).
_EXPORT_KEPT = "dirty_decay_ms:100,muzzy_decay_ms:0"
# A Kineto trace's, 10 ms and one arena for all threads. The slices are decoded on two threads,
# each with an arena of its own, which nothing uses once the decode is done: their freed pages
# waited there, however short the keep time, for the allocator's background thread (kept 100
# ms, the 514 MB benchmark trace peaked at 430-490 MiB, past its bound of 0.4 x its size + 300
# MB, 482 MiB). In one arena the tables built next take them, and the work of every thread
# returns those kept past 10 ms; with the merge no longer copying its parts (``_merge``) the
# 514 MB trace takes 2.85 -> 2.39 s (median of six, interleaved), its peak 359 -> 369-375 MiB.
# bench_scaling.py's realistic shapes, one run each (before that merge change): 65 MB 0.98 ->
# 0.77 s, 163 MB 1.17 -> 1.08 s, 507 MB 2.21 -> 2.00 s, 1,509 MB 7.52 -> 5.81 s; peaks 188 ->
# 190, 212 -> 224, 293 -> 325, 636 -> 638 MiB; with it, kept, 189, 223, 356 and 640 MiB: within
# the bound at every size.
_KINETO_KEPT = "dirty_decay_ms:10,muzzy_decay_ms:0,narenas:1"
_KEPT_PEAK = 1.2  # at most this times the peak of returning them at once (the estimate's)


def allocator_setting(args: argparse.Namespace) -> str:
    """Polars' allocator setting for this command: freed pages kept a while (``_EXPORT_KEPT``,
    ``_KINETO_KEPT``) where every input is an Nsight Systems export, or every one a Kineto
    trace, whose analysis leaves the room under the memory budget that kept pages may take
    (``_room_for_kept``: estimated before polars starts, from an export's tables' rows,
    ``readers._export_rows``, and from a Kineto trace's size, ``readers._kineto_size``);
    else returned at once (``_AT_ONCE``): inputs of both kinds, folders and run directories
    (not looked into), files neither reader takes."""
    if getattr(args, "command", None) not in ("analyze", "sql", "compare", "report"):
        return _AT_ONCE
    paths = args.paths if args.command != "sql" else [args.trace]
    budget = args.memory_budget
    chosen = getattr(args, "steps", None) is not None or getattr(args, "window", None) is not None
    kinds = set()
    for p in paths:
        got = _whole_need(Path(p)) if p is not None and os.path.isfile(p) else None
        if got is None or not _room_for_kept(got[1], budget, chosen, part=got[0] == "export"):
            return _AT_ONCE
        kinds.add(got[0])
    if kinds == {"export"}:
        return _EXPORT_KEPT
    return _KINETO_KEPT if kinds == {"kineto"} else _AT_ONCE


def _room_for_kept(need: int, budget: int | None, chosen: bool, part: bool = True) -> bool:
    """Whether kept freed pages fit the budget (``allocator_setting``): ``need``, the estimated
    peak of a whole read; ``chosen``, a part the user chose (read as chosen, whatever the
    budget). A whole read fits where ``need`` times ``_KEPT_PEAK`` does; with ``part`` (an
    export), so does one over the budget, read in a part the budget plans (no ``--steps`` /
    ``--window``): the part fills ``PART_MARGIN`` of what the budget leaves beyond the fixed
    cost, which leaves the room whenever the budget is at least 2.25 times the fixed cost (360
    MB; the parts of ``--all-parts`` fill less). The 1048 MB export within the default budget
    (a part of 77 % of its events, planned at 0.8 of the room then): 13.6-14.7 -> 12.3-13.2 s,
    1,135 -> 1,226-1,233 MiB."""
    from proflab.readers._export_rows import COST_FIXED, PART_MARGIN

    if budget is None or need * _KEPT_PEAK <= budget:
        return True
    planned = COST_FIXED + PART_MARGIN * (budget - COST_FIXED)  # the peak a part is planned to
    return part and not chosen and need > budget > COST_FIXED and planned * _KEPT_PEAK <= budget


def _whole_need(path: Path) -> tuple[str, int] | None:
    """("export" or "kineto", the estimated peak in bytes of reading and analysing ``path``
    whole), without polars; None where it is neither an export that opens nor a file the
    Kineto reader would take."""
    from proflab.readers import _export_rows, _kineto_size

    if _export_rows.sniff(path):
        whole = _export_rows.whole_bytes(path)
        return None if whole is None else ("export", whole[1])
    if path.suffix == ".nsys-rep" or not _kineto_size.looks_like_kineto(path):
        return None
    try:
        return "kineto", _kineto_size.need(path)
    except OSError:
        return None


def one_blas_thread() -> None:
    """numpy's OpenBLAS starts a thread per core when numpy is imported, and they spin a while
    waiting for work that analysis never gives them (its only BLAS call is a line fit over a
    few points): 0.2 CPU s of a 2-core machine's 3 s analysis of a 500 MB trace, in the reader's
    helper process too. Only for the commands that analyse files, never over the user's own
    setting, and a program that proflab runs gets the user's environment (``_env``)."""
    if "numpy" not in sys.modules and "OPENBLAS_NUM_THREADS" not in os.environ:
        from proflab._env import set_own

        set_own("OPENBLAS_NUM_THREADS", "1")


def map_large_blocks() -> None:
    """numpy's arrays come from the C library's heap: a fixed mapping threshold, and its free
    memory given back as each analysis table is built (``proflab._heap``)."""
    from proflab import _heap

    _heap.fix_threshold()


def end(status: int | None) -> None:
    """End the process with ``status`` once the command is done: what ``sys.exit`` does, less
    the interpreter's teardown of every module (polars, numpy and the rest: 80-95 ms of every
    command on 2 cores, 0.84 s in all for a small trace's analysis). The atexit functions still
    run (temporary folders, helper processes, logging) and stdout and stderr are flushed; the
    usual exit where a thread that is not a daemon is still running, or atexit is not what
    CPython's is."""
    import atexit
    import threading

    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others or run_exit_functions is None:
        sys.exit(status)
    run_exit_functions()
    code = status or 0
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (BrokenPipeError, ValueError):  # the reader went away (`| head`), or it was closed
            pass
        except OSError:
            code = code or 1
    os._exit(code & 0xFF)

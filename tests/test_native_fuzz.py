"""The C parsers and the what-if replay's walk stay under fuzzing (issue 48, item 10; issue 54):
their sanitizer build (ASan, UBSan,
libFuzzer's coverage counters) is fuzzed by atheris, seeded from real inputs
(``tests/fuzz/corpus``); what once crashed (``tests/fuzz/crashers``) runs again each time. This
is the short run CI makes; ``tests/fuzz/run.py`` makes the long one (README: Fuzzing the C
parsers). Skipped, with the reason, where clang, its sanitizer runtime or atheris is absent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).parent / "fuzz"
sys.path.insert(0, str(FUZZ))
import native  # noqa: E402
import run as fuzz_run  # noqa: E402

pytestmark = pytest.mark.skipif(native.missing() is not None, reason=f"no sanitizer build here: {native.missing()}")

# the short run: seconds per parser (the build, when stale, adds ~10 s)
SECONDS = {"kscan": 15, "sqlscan": 20, "walk": 10}


@pytest.mark.parametrize("name", ["kscan", "sqlscan", "walk"])
def test_what_once_crashed_runs_clean(name):
    files = sorted(str(p) for p in (FUZZ / "crashers" / name).iterdir() if p.is_file())
    assert files, "each parser keeps its crashers (and a regression input)"
    assert fuzz_run.replay(name, files) == 0


@pytest.mark.parametrize("name", ["kscan", "sqlscan", "walk"])
def test_a_short_coverage_guided_run_finds_nothing(name, tmp_path):
    """From the committed seeds, mutated under the sanitizers for a few seconds: no memory
    error, no undefined behaviour, no exception out of the parser, no hang, no crash file."""
    seeds = list((FUZZ / "corpus" / name).iterdir())
    assert len(seeds) >= 5
    crashes = tmp_path / "crashes"
    rc = fuzz_run.fuzz(name, SECONDS[name], work=tmp_path / "corpus", crashes=crashes)
    found = sorted(p.name for p in crashes.iterdir()) if crashes.exists() else []
    assert rc == 0 and not found, f"{name}: libFuzzer ended {rc}, wrote {found} (in {crashes})"
    assert len(list((tmp_path / "corpus").iterdir())) > 0  # it reached code the seeds did not

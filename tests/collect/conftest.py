"""Fixtures of the collection tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def stand_in_nsys(tmp_path, monkeypatch):
    """An ``nsys`` on PATH that records the command line it was given and writes no report (no
    real nsys can run here); returns the file its arguments land in, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "argv.txt"
    fake = bin_dir / "nsys"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{argv_file}"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return argv_file

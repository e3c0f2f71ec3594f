"""proflab's own settings in its process environment, kept apart from the user's.

proflab tunes libraries for its own analysis (polars' allocator, numpy's BLAS threads) through
environment variables, which child processes inherit. A program that proflab runs (``proflab
run``, an Nsight Compute deep dive) must see the environment as the user gave it:
``user_environ()`` is ``os.environ`` with proflab's own settings undone.
"""

from __future__ import annotations

import os

__all__ = ["set_own", "user_environ"]

_MISSING = object()
_ORIGINAL: dict[str, object] = {}  # key -> the value before proflab set it (or _MISSING)
_SET: dict[str, str] = {}  # key -> what proflab set it to


def set_own(key: str, value: str) -> None:
    """Set a variable for proflab's own process and its helpers."""
    current = os.environ.get(key)
    if key not in _SET or current != _SET[key]:  # first time, or changed by someone else since
        _ORIGINAL[key] = _MISSING if current is None else current
    _SET[key] = value
    os.environ[key] = value


def user_environ() -> dict[str, str]:
    """The environment for a program proflab runs: the user's, without proflab's settings
    (a variable changed since proflab set it is left as it is now)."""
    env = dict(os.environ)
    for key, value in _ORIGINAL.items():
        if env.get(key) != _SET[key]:
            continue
        if value is _MISSING:
            env.pop(key, None)
        else:
            env[key] = value  # type: ignore[assignment]
    return env

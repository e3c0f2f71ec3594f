"""Where the shared fixtures live: ``shared/fixtures`` beside the repository (Nsight Systems
exports, ncu pages and a chrome trace too large to commit), or ``$PROFLAB_SHARED_FIXTURES``.
A clone of the repository alone has none: every test that needs one skips with the reason
(``PROFLAB_SHARED_FIXTURES=/nonexistent`` runs the suite as such a clone does)."""

from __future__ import annotations

import os
from pathlib import Path

FIXTURES = Path(os.environ.get("PROFLAB_SHARED_FIXTURES") or Path(__file__).resolve().parents[2] / "shared" / "fixtures")
NSYS = FIXTURES / "nsys"
ABSENT = f"shared fixtures absent ({FIXTURES})"

"""JSON: the ``proflab.report/1`` contract. One report is an object; several, an array."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["render_json"]


def _clean(obj: Any) -> Any:
    # JSON has no NaN/Infinity; a non-finite number is a missing value.
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def render_json(reports) -> str:
    docs = [_clean(r.to_dict()) for r in reports]
    return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, ensure_ascii=False) + "\n"

"""Control characters shown as escapes, never obeyed: trace names, file names and the text
of other libraries' errors reach terminals and pages (``render._text.printable``, error
messages)."""

from __future__ import annotations

import re

__all__ = ["escape"]

# C0 and C1 controls (ESC starts ANSI and OSC sequences: colours, titles, hyperlinks, screen
# clears; C1's CSI does the same in one byte) and the bidirectional overrides that reorder
# what is shown. Newline and tab stay unless asked for: renderers lay those out themselves.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNPRINTABLE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape(text: str, *, one_line: bool = False) -> str:
    """``text`` with every control character as an escape (``\\x1b``); ``one_line``: newlines
    and tabs too."""
    return (_UNPRINTABLE_LINE if one_line else _UNPRINTABLE).sub(_escape, text)

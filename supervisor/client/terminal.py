"""What the client prints to a terminal: the server's own bytes must not drive it. ANSI and OSC
escapes (colours, a window title, an OSC 52 clipboard write, a hyperlink), other C0 controls, DEL
and C1 controls are shown escaped (`\\x1b[31m`), tab and newline kept. Output to a pipe or a file
is left as the server wrote it."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def sanitize(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)

"""Where a thread is now, in one line: its innermost frames (for a call it is late with)."""

from __future__ import annotations

import sys
import threading
import traceback


def innermost(thread: threading.Thread, frames: int = 4) -> str:
    """`thread`'s innermost `frames` frames, innermost first: "name (file:line) <- ..."."""
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return "(not running)"
    return " <- ".join(f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.lineno})"
                       for f in reversed(traceback.extract_stack(frame, limit=frames)))

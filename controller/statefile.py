"""The files of a controller's ``state_dir``: JSON lines written whole and read back line by
line (the open findings, `controller.openfindings`; the learned paths, `controller.keptpaths`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def write_lines(path: Path, lines: Iterable[bytes]) -> None:
    """Write ``lines`` (each with its newline) to ``path`` whole: a temporary file beside it,
    renamed over it, so a reader sees the old file or the new one, never a torn one; raises
    OSError."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(b"".join(lines))
    os.replace(tmp, path)


def read_lines(path: Path) -> list[bytes]:
    """Return the lines of ``path`` (none when there is no file); raises OSError for any other
    failure to read it."""
    try:
        return path.read_bytes().splitlines()
    except FileNotFoundError:
        return []

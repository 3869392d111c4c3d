"""What kind of file a path is, from ``stat`` alone: nothing is opened (opening a FIFO blocks, and a device such as
/dev/zero never ends). :mod:`svgen.safeio` refuses what is not a regular file with it; image scans report it."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional


def not_regular(mode: int) -> Optional[str]:
    """What a ``stat`` mode is, in words, where it is not a regular file (None where it is one)."""
    if stat.S_ISREG(mode):
        return None
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def irregular(path) -> Optional[str]:
    """Why ``path`` (symlinks followed) is not a regular file, in words (``a FIFO (named pipe)``, ``a symbolic link to
    '/dev/zero', a character device``, ``a symbolic link to 'gone.jpg', which does not exist``), or None where it is
    one. Decided by ``stat`` alone, nothing opened: opening a FIFO blocks, and a device such as /dev/zero never
    ends."""
    path = Path(path)
    link = path.is_symlink()
    via = f"a symbolic link to {os.readlink(path)!r}" if link else ""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{via}, which does not exist" if link else "no such file"
    except OSError as e:   # ELOOP (a link loop), EACCES on a folder on the way …
        return f"{via}: {e.strerror or e}" if link else (e.strerror or str(e))
    kind = not_regular(st.st_mode)
    return None if kind is None else f"{via}, {kind}" if link else kind

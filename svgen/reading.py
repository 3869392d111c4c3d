"""Bounded reads of the files svgen is given: a name that is a symbolic link to ``/dev/zero``, a FIFO or a folder is
one :class:`SvgenError` line, never an endless read or a hang; and an :class:`OSError` as one line.

* :func:`check_regular` and :func:`read_regular` read a file only when it is a regular file no larger than a cap
  (``follow=False``: and not a symbolic link, as for the files inside an artifact).
* :func:`os_error` / :func:`as_os_error`: an OS error (or a library's wrapper of one) as one line.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Optional

from svgen.filekind import not_regular
from svgen.errors import SvgenError

MAX_JSON_BYTES = 64 << 20  # svgen.json: 64 MiB holds the names of millions of classes
MAX_TEXT_BYTES = 256 << 20  # class lists, templates, lists of paths


def os_error(e: OSError, what: str) -> SvgenError:
    """One line for an :class:`OSError` while doing ``what`` (``cannot write X: No space left on device``)."""
    reason = e.strerror or str(e) or type(e).__name__
    return SvgenError(f"{what}: {reason}")


def as_os_error(e: BaseException) -> Optional[OSError]:
    """``e`` as an :class:`OSError` if it is one, or a library's wrapper of one (safetensors raises
    ``SafetensorError: … I/O error: No space left on device (os error 28)``); else None."""
    if isinstance(e, OSError):
        return e
    found = re.search(r"\(os error (\d+)\)", str(e)) if isinstance(e, Exception) else None
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code))
    return None


def check_regular(path, what: str = "file", follow: bool = True) -> os.stat_result:
    """``stat`` of ``path`` when it is a regular file; otherwise one line. ``follow=False``: a symbolic link is
    refused too (an artifact's files are its own: a link would lead out of the folder)."""
    path = Path(path)
    try:
        st = os.stat(path) if follow else os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise SvgenError(f"{what} {path} is a symbolic link; it was not followed (copy the file in its place)")
    except FileNotFoundError:
        raise SvgenError(f"{what} not found: {path}") from None
    except OSError as e:  # EACCES on a folder on the way: unreadable, not missing
        raise os_error(e, f"cannot read {what} {path}") from None
    kind = not_regular(st.st_mode)   # a folder, a FIFO, a character device …: said precisely
    if kind is not None:
        raise SvgenError(f"{what} {path} is {kind}, not a regular file")
    return st


def read_regular(path, cap: int = MAX_JSON_BYTES, what: str = "file", follow: bool = True) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``cap`` bytes, else :class:`SvgenError`.

    Opened with ``O_NONBLOCK`` so a FIFO swapped in after the check cannot hang the open (``follow=False``: with
    ``O_NOFOLLOW``, nor a link), and read at most ``cap + 1`` bytes whatever the file claims.
    """
    path = Path(path)
    check_regular(path, what, follow)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise os_error(e, f"cannot read {what} {path}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SvgenError(f"{what} {path} is not a regular file")
        try:   # read(n) allocates n bytes up front: ask for what the file holds (+1 shows growth past the cap)
            data = f.read(min(st.st_size, cap) + 1)
        except OSError as e:
            raise os_error(e, f"cannot read {what} {path}") from None
    if len(data) > cap:
        raise SvgenError(f"{what} {path} is larger than {cap >> 20} MiB; not an svgen file")
    return data

"""One writer at a time of an artifact, so no update is lost.

:func:`artifact_lock` is held from reading an artifact to replacing it (``svgen add-classes``), and every save of an
artifact takes it too (``fit --force`` onto one): two writers never both start from the same version, each replace
the other's, and both say ``wrote``. A second writer waits for the first, then reads what the first wrote.

The lock is an exclusive ``flock`` on ``.NAME.lock`` beside the artifact (not inside it: every write swaps the
artifact's folder whole, and a lock inside would leave with the old version). The holder removes the file before it
lets go; a waiter that then holds a removed file tries again on the one now there, so no lock file outlives its
writer. One left by a writer killed with -9 is free (the system released its lock): the next writer of that target
removes it (:func:`svgen.safeio.recover`) or takes it. Where ``fcntl`` is missing the file is created exclusively and
holds its writer's process id: a second writer is refused in one line while that file is there and its writer may
still run; a file whose writer has ended (told where the system can say) is taken over.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from svgen.errors import SvgenError
from svgen.safeio import lock_file, os_error, process_alive

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows: the exclusive-file fallback)
    fcntl = None

log = logging.getLogger(__name__)

_held = threading.local()   # this thread's locks {lock file: depth}: a save inside add-classes' lock takes it again
_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def lock_path(path) -> Path:
    """``.NAME.lock`` beside artifact ``path`` (beside the folder it names, when ``path`` is a link to one)."""
    return lock_file(os.path.realpath(path))


@contextmanager
def artifact_lock(path) -> Iterator[Path]:
    """Hold the writer's lock of artifact ``path`` (which may not exist yet) while the block runs; waits while
    another process holds it. Taken again by the same thread, it is already held. Yields the lock file's path."""
    lock = lock_path(path)
    held = _held.__dict__.setdefault("locks", {})
    if str(lock) in held or not lock.parent.is_dir():   # a missing folder: the write itself says so in one line
        held[str(lock)] = held.get(str(lock), 0) + 1
        try:
            yield lock
        finally:
            held[str(lock)] -= 1
            if not held[str(lock)]:
                del held[str(lock)]
        return
    release = _flock(lock, path) if fcntl is not None else _exclusive(lock, path)
    held[str(lock)] = 1
    try:
        yield lock
    finally:
        del held[str(lock)]
        release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino)


def _flock(lock: Path, path) -> Callable[[], None]:
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | _FLAGS, 0o666)
        except OSError as e:
            raise os_error(e, f"cannot lock {path} for writing ({lock})") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.warning("waiting for another svgen process that is writing %s", path)
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, lock):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)   # its holder removed it on letting go: lock the file that is there now

    def release() -> None:
        try:
            os.unlink(lock)   # still locked: whoever waits on this file sees it gone and locks the next one
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    return release


def _alive(pid: int) -> bool:
    return os.name == "nt" or pid == os.getpid() or process_alive(pid)   # Windows: os.kill would end it; assume so


def _exclusive(lock: Path, path) -> Callable[[], None]:
    """Without ``fcntl``: create ``lock`` exclusively with this process's id; refuse while its writer may run."""
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o666)
        except FileExistsError:
            try:
                owner = int(lock.read_text(encoding="ascii").strip() or -1)
            except (OSError, ValueError):
                owner = -1
            if owner < 0 or _alive(owner):
                raise SvgenError(f"{path} is being written by another svgen process"
                                 + (f" (process {owner})" if owner >= 0 else "")
                                 + f"; try again when it has finished (or remove {lock} if none runs)") from None
            log.warning("removing %s, left by svgen process %d, which has ended", lock, owner)
            lock.unlink(missing_ok=True)
            continue
        except OSError as e:
            raise os_error(e, f"cannot lock {path} for writing ({lock})") from None
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(f"{os.getpid()}\n")
        return lambda: lock.unlink(missing_ok=True)
    raise SvgenError(f"cannot lock {path} for writing: other processes keep taking {lock}")

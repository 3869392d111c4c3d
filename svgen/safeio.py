"""Filesystem primitives that never lose what exists: no-replace and exchanging renames, the recovery of what an
interrupted writer left behind, and the one rule of what ``force`` may replace (the bounded reads are
:mod:`svgen.reading`).

* ``force`` replaces only what svgen could have written: a regular file (:func:`check_replaceable_file`), an
  artifact or an empty folder (:func:`check_replaceable_dir`); never a link, device, FIFO or socket, and nothing is
  ever written inside an artifact (:func:`check_outside_artifact`).
* :func:`rename_noreplace` moves a finished temporary into place and fails when the target appeared
  meanwhile (``renameat2(RENAME_NOREPLACE)`` on Linux; ``link`` + ``unlink`` for files and a plain
  ``rename``, which never replaces a non-empty folder, elsewhere).
* :func:`exchange` swaps a finished temporary with the target in one step (``renameat2(RENAME_EXCHANGE)``), so
  the target is at every instant the complete old or the complete new version. Elsewhere the old version is first
  renamed to ``.NAME.old-*``, which the next writer of that target puts back if it was left (:func:`recover`).
* Every temporary (``.NAME.tmp-PID-*``, ``.NAME.old-PID-*``) is created and held under an exclusive ``flock``
  while its writer lives (:func:`temporary`); :func:`recover` removes only those whose lock is free and whose
  writer (the process id in the name) is gone (a crash, kill -9), never a concurrent writer's.
* :func:`atomic_file`, :func:`atomic_dir` and :func:`atomic_text` are how every file svgen writes reaches disk.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from svgen.errors import SvgenError, TargetExistsError
from svgen.filekind import not_regular
from svgen.reading import (MAX_JSON_BYTES, MAX_TEXT_BYTES, as_os_error, check_regular, os_error,  # noqa: F401
                           read_regular)  # (the bounded reads' home until they moved: svgen/reading.py)

log = logging.getLogger(__name__)

_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_NOT_SUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}


# ----------------------------------------------------------------------------- renaming

def _libc_renameat2():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _libc_renameat2()


def _rename2(src, dst, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done, False when this kernel/file system cannot do it;
    raises :class:`OSError` for a real failure (``EEXIST``: the target exists)."""
    if _renameat2 is None:
        return False
    rc = _renameat2(_AT_FDCWD, os.fsencode(str(src)), _AT_FDCWD, os.fsencode(str(dst)), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in _NOT_SUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(dst))


def rename_noreplace(src, dst) -> None:
    """Rename ``src`` to ``dst``; :class:`FileExistsError` if ``dst`` exists (even one that appeared a
    moment ago: the check and the rename are one step where the system allows)."""
    if _rename2(src, dst, _RENAME_NOREPLACE):
        return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "File exists", str(dst))
    if os.path.isdir(src):
        os.rename(src, dst)  # POSIX: never replaces a non-empty folder (ENOTEMPTY), and an artifact is not empty
        return
    os.link(src, dst)  # fails with EEXIST if dst appeared meanwhile
    os.unlink(src)


def exchange(new, target) -> None:
    """Swap ``new`` and ``target`` (both exist): afterwards ``target`` is the new version and ``new``'s
    name holds the old one, which the caller removes. One atomic step where the system allows; else
    two renames through a locked ``.NAME.old-*`` sibling that :func:`recover` puts back after a crash."""
    if _rename2(new, target, _RENAME_EXCHANGE):
        return
    target = Path(target)
    with temporary(target, "old", directory=True) as old:
        parked = old / "artifact"
        os.rename(target, parked)
        try:
            rename_noreplace(new, target)
        except BaseException:
            os.rename(parked, target)
            raise
        os.rename(parked, new)  # the old version now under the caller's temporary name


# ----------------------------------------------------------------------------- temporaries

def _prefix(target: Path, kind: str) -> str:
    return f".{target.name}.{kind}-"


def _owner_alive(path: Path, target: Path) -> bool:
    """Whether the process whose id the temporary's name carries (``.NAME.tmp-PID-XXXX``) still runs:
    it covers the instant between creating a temporary and locking it."""
    rest = next((path.name[len(_prefix(target, k)):] for k in ("tmp", "old")
                 if path.name.startswith(_prefix(target, k))), "")
    pid = rest.split("-", 1)[0]
    return pid.isdigit() and int(pid) != os.getpid() and process_alive(int(pid))


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (POSIX: on Windows ``os.kill`` would end it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


@contextmanager
def temporary(target, kind: str = "tmp", directory: bool = False, suffix: str = "") -> Iterator[Path]:
    """A fresh sibling ``.NAME.<kind>-XXXX`` of ``target`` held under an exclusive lock while the block
    runs; removed afterwards if it still exists (the caller renames it away on success)."""
    target = Path(target)
    parent = target.absolute().parent
    try:
        prefix = f"{_prefix(target, kind)}{os.getpid()}-"
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=parent)
            tmp = Path(name)
    except OSError as e:
        raise os_error(e, f"cannot write {target}") from None
    try:
        _lock(fd)
        yield tmp
    finally:
        try:
            remove(tmp)
        finally:
            os.close(fd)


def remove(path) -> None:
    """Remove a file or folder tree if it exists."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _abandoned(path: Path) -> bool:
    """True when no live process holds ``path``'s lock (its writer crashed or was killed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    except OSError:
        return False
    try:
        return _lock(fd)
    finally:
        os.close(fd)


def leftovers(target) -> list:
    """The ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings of ``target`` whose writer is gone."""
    target = Path(target)
    parent = target.absolute().parent
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    found = [parent / n for n in sorted(names)
             if n.startswith((_prefix(target, "tmp"), _prefix(target, "old")))]
    return [p for p in found if _abandoned(p) and not _owner_alive(p, target)]


def lock_file(target) -> Path:
    """``.NAME.lock`` beside ``target``: the writer's lock of an artifact (:mod:`svgen.locks`)."""
    target = Path(target)
    return target.absolute().parent / f".{target.name}.lock"


def _remove_free_lock(path: Path) -> None:
    """Remove a lock file no process holds (its writer was killed), under its lock: a process that waited on it
    then finds it gone and locks the next one (:mod:`svgen.locks`). One that holds a process id is the no-``fcntl``
    kind, which ``flock`` cannot tell held: it is left to its own check."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        mine = os.fstat(fd)
        free = stat.S_ISREG(mine.st_mode) and not mine.st_size and _lock(fd)
        if free and os.path.samestat(mine, os.stat(path, follow_symlinks=False)):
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def recover(target) -> Optional[Path]:
    """Tidy up after an interrupted writer of ``target``: an old version parked in ``.NAME.old-*`` goes
    back to ``target`` if the target is missing; every other abandoned temporary, and a lock file no process
    holds, is removed. Returns the path restored, if any."""
    target = Path(target)
    _remove_free_lock(lock_file(target))
    restored = None
    for p in leftovers(target):
        parked = p / "artifact"
        if p.name.startswith(_prefix(target, "old")) and parked.exists() and not os.path.lexists(target):
            try:
                rename_noreplace(parked, target)
                restored = target
                log.warning("restored %s from %s, left by an interrupted write", target, p)
            except OSError:
                pass
        log.info("removing %s, left by an interrupted write", p)
        remove(p)
    return restored


# ----------------------------------------------------------------------------- atomic writes

ARTIFACT_FILES = ("svgen.json", "weights.safetensors")


def check_target_name(path) -> Path:
    """Refuse targets that can never be replaced: '', '/', '.', '..' or the current folder (or one above it)."""
    if not str(path).strip():
        raise SvgenError("the output path is empty; name the folder or file to write")
    path = Path(path)
    if path.name in ("", ".", "..") or path.resolve() == Path(path.resolve().anchor):
        raise SvgenError(f"cannot write to {str(path)!r}: name a new folder or file inside a folder")
    here = Path.cwd().resolve()
    if path.resolve() == here or path.resolve() in here.parents:
        raise SvgenError(f"cannot write to {path}: it is the current folder or one above it")
    check_outside_artifact(path)
    return path


def check_outside_artifact(path, what: str = "") -> None:
    """Refuse a ``path`` inside an svgen artifact (a folder holding ``svgen.json``), ``force`` or not: a file or
    folder added there damages the artifact (``force`` replaces a target, it never writes into one). ``what``:
    how the message names the path (``--out X``)."""
    for folder in Path(path).resolve().parents:
        if os.path.lexists(folder / ARTIFACT_FILES[0]):
            raise SvgenError(f"{what or path} lies inside the svgen artifact {folder}; writing there would damage "
                             "it: choose a name outside the artifact")


def _not_replaced(why: str, rest: str = "replaces only an svgen artifact or an empty folder") -> SvgenError:
    return SvgenError(f"{why}; force=True {rest}", cli=f"{why}; --force {rest}")


def check_replaceable_dir(path: Path) -> None:
    """With ``force``, only an svgen artifact (``svgen.json`` + ``weights.safetensors``, nothing else) or
    an empty folder may be replaced; anything else is refused in one line and left as it is."""
    if path.is_symlink():
        raise _not_replaced(f"{path} is a symbolic link", "replaces only an svgen artifact folder, give its real path")
    if not path.is_dir():
        raise _not_replaced(f"{path} exists and is not a folder")
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise os_error(e, f"cannot inspect {path}") from None
    if not names:
        return
    other = [n for n in names if n not in ARTIFACT_FILES]
    if "svgen.json" not in names or other:
        what = f"it holds {other[0]!r}" if other else "it has no svgen.json"
        raise _not_replaced(f"{path} is not an svgen artifact ({what})",
                            "replaces only an svgen artifact or an empty folder, so it was left as it is")


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _place(tmp: Path, path: Path, force: bool, check_existing) -> None:
    """Move the finished ``tmp`` to ``path``: never over something that appeared meanwhile without
    ``force``; with it, by an atomic exchange (the old version then sits under ``tmp``'s name)."""
    for _ in range(8):  # a concurrent writer may create or remove the target between the steps
        try:
            rename_noreplace(tmp, path)
            return
        except FileExistsError:
            pass
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        if not force:
            raise TargetExistsError(path, appeared=True)
        check_existing(path)
        try:
            exchange(tmp, path)
            return
        except FileNotFoundError:
            continue  # the target vanished between the checks: try the plain rename again
    raise SvgenError(f"cannot write {path}: other processes keep replacing it")


def check_dir_target(path, force: bool = False) -> Path:
    """Refuse, before any work, a folder target that :func:`atomic_dir` would refuse: a bad name, an
    existing one without ``force``, with ``force`` one that is not an svgen artifact or empty, or a
    missing parent folder."""
    path = check_target_name(path)
    recover(path)  # first: an artifact an interrupted write parked goes back, so it counts as existing
    if os.path.lexists(path):
        if not force:
            raise TargetExistsError(path)
        check_replaceable_dir(path)
    parent = path.absolute().parent
    if not parent.is_dir():
        raise SvgenError(f"cannot write {path}: folder {parent} does not exist")
    return path


@contextmanager
def _write_errors(path: Path):
    """An OS error (or a library's wrapper of one) while writing ``path`` becomes one line."""
    try:
        yield
    except Exception as e:
        if as_os_error(e) is None:
            raise
        raise os_error(as_os_error(e), f"cannot write {path}") from None


def follow_umask(path, directory: bool = False) -> None:
    """Give a ``mkstemp``/``mkdtemp`` path (created 0600/0700) the mode a plain ``open``/``mkdir`` would have:
    0666/0777 minus the umask (0644/0755 under 022), so artifacts and exported heads can be shared and deployed."""
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(path, (0o777 if directory else 0o666) & ~mask)


def atomic_dir(path, files: dict, force: bool = False, mode=follow_umask) -> Path:
    """Create folder ``path`` from ``{name: writer(file_path)}`` atomically (see the module docstring).

    Files are written into a locked temporary sibling folder then renamed into place (never over an artifact
    that appeared meanwhile) or, with ``force``, exchanged with the existing one in one step: a failure or a kill
    leaves the complete old or the complete new folder. ``mode(path, directory)`` sets new files' permissions
    (default :func:`follow_umask`). ``force`` replaces only an svgen artifact or an empty folder.
    """
    path = check_dir_target(path, force)
    with temporary(path, "tmp", directory=True) as tmp, _write_errors(path):
        if mode:
            mode(tmp, True)
        for name, writer in files.items():
            writer(tmp / name)
            if mode:
                mode(tmp / name, False)
            _fsync(tmp / name)
        _place(tmp, path, force, check_replaceable_dir)
    return path


def check_replaceable_file(path) -> None:
    """A file target that exists must be a regular file, the only kind ``force`` replaces: a folder, a symbolic link
    (``/dev/stdout``), a device (``/dev/null``), a FIFO or a socket is one line and left as it is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise os_error(e, f"cannot inspect {path}") from None
    if stat.S_ISDIR(mode):
        raise SvgenError(f"{path} is a folder; give a file name to write")
    if not stat.S_ISREG(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else f"{not_regular(mode)}, not a regular file"
        raise _not_replaced(f"{path} is {kind}", "replaces only a regular file, so it was left as it is")


def atomic_file(path, writer, force: bool = False, mode=follow_umask, suffix: Optional[str] = None) -> Path:
    """Write file ``path`` via ``writer(tmp_path)`` into a locked temporary sibling, then rename it into
    place (never over a file that appeared meanwhile, unless ``force``). A failure leaves nothing behind and
    never harms an existing file. The temporary file ends in ``suffix`` (default: ``path``'s own, which
    writers such as ``numpy.savez`` and ``savefig`` read)."""
    suffix = Path(path).suffix if suffix is None else suffix
    path = check_target_name(path)
    recover(path)
    check_replaceable_file(path)
    if os.path.lexists(path) and not force:
        raise TargetExistsError(path)
    parent = path.absolute().parent
    if not parent.is_dir():
        raise SvgenError(f"cannot write {path}: folder {parent} does not exist")
    with temporary(path, "tmp", suffix=suffix) as tmp, _write_errors(path):
        writer(tmp)
        if mode:
            mode(tmp, False)
        _fsync(tmp)
        if force:
            check_replaceable_file(path)
            os.replace(tmp, path)  # a file is replaced in one step
        else:
            _place(tmp, path, False, check_replaceable_file)
    return path


def atomic_text(path, text: str, force: bool = False) -> Path:
    """:func:`atomic_file` for a UTF-8 text."""
    return atomic_file(path, lambda p: p.write_text(text, encoding="utf-8"), force=force)

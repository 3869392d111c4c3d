"""``.npy`` files read safely: the header checked before anything is allocated, no pickle, native byte order.

Every ``.npy`` svgen reads (the CLI's features, labels and prototypes; the Ray engine's embedding shards) goes
through :func:`check_npy_header` and :func:`load_npy`, so a damaged or hostile file is the same one
:class:`SvgenError` line on every path: a header whose shape holds a negative or non-integer size, one claiming
more data than the file holds (10¹²×512 on a 1 kB file would otherwise ask for 2 TB), an object array (a pickle).
A big-endian array is converted to native byte order once, here, so every consumer (torch included, which refuses
a foreign byte order) takes it alike.
"""

from __future__ import annotations

import tokenize
from pathlib import Path

import numpy as np

from svgen.errors import SvgenError


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def check_npy_header(path, what: str, strings: bool = False):
    """``(shape, dtype)`` of a ``.npy`` file's header, checked against the file's size; one line if it is damaged
    (``strings``: the file may hold class names, and an object array is told how to save them instead)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            shape, _, dtype = read.get(version, np.lib.format.read_array_header_2_0)(f)
            offset = f.tell()
    except tokenize.TokenError:  # NumPy re-reads a header it cannot parse as Python 2 source: cut off inside
        raise SvgenError(f"{what} file {path} has a damaged .npy header (it ends inside its dictionary: "
                         "cut off or overwritten)") from None
    except (ValueError, OSError, EOFError, OverflowError, TypeError, SyntaxError) as e:
        raise SvgenError(f"{what} file {path} has a damaged .npy header ({_first_line(e)})") from None
    if not all(type(n) is int and n >= 0 for n in shape):
        raise SvgenError(f"{what} file {path} has a damaged .npy header: its shape {shape} holds a size that is not "
                         "a non-negative integer")
    if dtype.hasobject and strings:
        raise SvgenError(f"{what} file {path} holds Python objects (dtype object), which only pickle reads and svgen "
                         "never unpickles; save class names as a string array: "
                         "numpy.save(path, numpy.asarray(names, dtype=str))")
    if dtype.hasobject:
        raise SvgenError(f"{what} file {path} is not a plain numeric .npy array (it holds Python objects)")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    have = path.stat().st_size - offset
    if need > have:
        raise SvgenError(f"{what} file {path} claims shape {shape} of {dtype} ({need:,} bytes) but holds "
                         f"{have:,}; it is truncated or damaged")
    return tuple(shape), dtype


def native(arr: np.ndarray) -> np.ndarray:
    """``arr`` in native byte order (a big-endian array copied once; anything else unchanged)."""
    if not arr.dtype.isnative:
        return arr.astype(arr.dtype.newbyteorder("="))
    return arr


def load_npy(path, what: str, mmap: bool = False, strings: bool = False) -> np.ndarray:
    """The array of a ``.npy`` file (``mmap``: memory-mapped) after :func:`check_npy_header`, without pickle,
    in native byte order."""
    check_npy_header(path, what, strings)
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (ValueError, OverflowError, TypeError) as e:
        raise SvgenError(f"{what} file {path} is not a plain numeric .npy array ({_first_line(e)})") from None
    except (OSError, EOFError) as e:
        raise SvgenError(f"{what} file {path} is not a readable .npy file ({_first_line(e)})") from None
    return native(arr) if isinstance(arr, np.ndarray) else arr

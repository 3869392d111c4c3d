"""Large collections as deterministic fixed-size blocks of inputs, and one block's predictions.

``svgen classify --engine ray`` reads its inputs through this module; each block becomes one
output part file, so a block is the unit of work, of resumption and of atomic output.

Sources (:func:`plan_blocks`), taken in the order given:

* a **folder**: its image files, searched recursively, sorted (as ``svgen classify``);
* a **glob** (``'photos/**/*.jpg'``, quoted so the shell leaves it alone): the matching files,
  sorted, each then taken as below by its suffix;
* a **list file** (``.txt``/``.lst``): one path per line; relative paths are relative to the
  list file's folder; blank lines and lines starting with ``#`` are ignored;
* a **table of paths** (``.csv``/``.parquet``): the column ``path_column`` (default ``path``);
  relative paths are relative to the table's folder;
* **WebDataset shards** (``.tar``): every member with an image suffix, in archive order, named
  ``SHARD.tar/MEMBER`` in the output;
* any other file: an image (checked when it is read; unreadable ones are reported, not fatal).

With ``features=True`` the sources are embedding shards instead: ``.npy`` (N×D, read with
``mmap``) or ``.parquet`` with one list-of-numbers column (``features_column``, default the
only such column). Rows get a global id (``index``) in the order of the shards, plus their
``source`` file and ``row`` within it.

A block never mixes kinds of source and a feature block never spans two shards, so blocks are a
pure function of the sources and ``block_size``; :func:`plan_digest` fingerprints a plan so a
rerun can tell whether it is continuing the same job. One block's predictions: :mod:`svgen.engine.predictions`.
"""

from __future__ import annotations

import csv
import fnmatch
import glob as globlib
import hashlib
import json
import logging
import os
import posixpath
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from svgen.errors import SvgenError, setting_error

log = logging.getLogger(__name__)

LIST_SUFFIXES = {".txt", ".lst"}
TABLE_SUFFIXES = {".csv", ".parquet"}
TAR_SUFFIXES = {".tar"}
FEATURE_SUFFIXES = {".npy", ".parquet"}
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class Block:
    """One unit of work: ``kind`` is ``images``, ``tar`` or ``features``; ``spec`` is plain JSON data.

    * images: ``{"paths": [...]}``
    * tar: ``{"shard": PATH, "members": [[name, offset, size], ...]}``
    * features: ``{"file": PATH, "start": i, "stop": j, "id0": global id of row i, "column": name|None}``
    """

    index: int
    kind: str
    spec: dict

    @property
    def size(self) -> int:
        if self.kind == "images":
            return len(self.spec["paths"])
        if self.kind == "tar":
            return len(self.spec["members"])
        return self.spec["stop"] - self.spec["start"]

    def to_json(self) -> str:
        return json.dumps({"index": self.index, "kind": self.kind, "spec": self.spec}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Block":
        d = json.loads(text)
        return cls(d["index"], d["kind"], d["spec"])


def plan_digest(blocks: Sequence[Block]) -> str:
    """sha256 of the plan: equal for the same sources, order and block size."""
    h = hashlib.sha256()
    for b in blocks:
        h.update(b.to_json().encode())
        h.update(b"\n")
    return h.hexdigest()


# ----------------------------------------------------------------------------- enumeration

def _require_pyarrow(what: str):
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SvgenError(f"reading {what} needs pyarrow: pip install 'svgen[ray]' (or pyarrow)") from None
    return pyarrow


def _match_parts(names: tuple, pats: tuple) -> bool:
    """Whether path components ``names`` match glob components ``pats`` (``**``: zero or more folders)."""
    if not pats:
        return not names
    if pats[0] == "**":
        return any(_match_parts(names[i:], pats[1:]) for i in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], pats[0]) and _match_parts(names[1:], pats[1:])


def glob_files(pattern: str) -> List[Path]:
    """The regular files matching ``pattern`` (``**`` = any folders), sorted, each file once.

    Unlike :func:`glob.glob`, which follows symlinked folders into loops (planning never ends, or a
    file comes back under hundreds of names), a folder is entered once however many links lead to it,
    and a file reached by two names is taken once, under the first in sorted order. Names starting
    with ``.`` are skipped unless the pattern spells the dot, as :func:`glob.glob` does.
    """
    parts = Path(pattern).parts
    fixed = next((i for i, p in enumerate(parts) if _GLOB_CHARS & set(p)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    rest = parts[fixed:]
    if "**" not in rest:  # no recursion: the matches are bounded by the pattern's depth
        found = [Path(f) for f in globlib.glob(pattern) if Path(f).is_file()]
    else:
        dotted = rest[-1].startswith(".")
        found, seen = [], set()
        _first_visit(root, seen)
        for top, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and _first_visit(Path(top) / d, seen))
            rel = Path(top).relative_to(root).parts
            found += [Path(top) / name for name in files
                      if (dotted or not name.startswith(".")) and _match_parts(rel + (name,), rest)]
    unique, files_seen = [], set()
    for f in sorted(found):
        try:
            st = f.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in files_seen:
            files_seen.add((st.st_dev, st.st_ino))
            unique.append(f)
    return unique


def _first_visit(folder: Path, seen: set) -> bool:
    try:
        st = folder.stat()
    except OSError:
        return False
    key = (st.st_dev, st.st_ino)
    if key in seen:
        return False
    seen.add(key)
    return True


def _expand(source: str) -> List[Path]:
    """A source name as files (a folder stays one entry); a glob pattern that matches nothing is an error."""
    p = Path(source)
    if p.exists():
        return [p]
    if _GLOB_CHARS & set(source):
        found = glob_files(source)
        if not found:
            raise SvgenError(f"no files match {source!r}")
        return found
    raise SvgenError(f"no such file or folder: {source}")


def _list_file(path: Path) -> List[str]:
    from svgen.safeio import MAX_TEXT_BYTES, read_regular

    try:
        lines = read_regular(path, MAX_TEXT_BYTES, what="list file").decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise SvgenError(f"cannot read list file {path}: {e}") from None
    return [str(path.parent / s) for s in (line.strip() for line in lines) if s and not s.startswith("#")]


def _table_column(path: Path, column: str) -> List[str]:
    if path.suffix.lower() == ".csv":
        try:
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise SvgenError(f"cannot read {path}: {e}") from None
        header, rows = (rows[0], rows[1:]) if rows else ([], [])
        if column not in header:
            why = f"{path} has no column {column!r} (columns: {', '.join(header) or 'none'})"
            raise SvgenError(f"{why}; name the column of paths with path_column=",
                             cli=f"{why}; name the column of paths with --path-column")
        at = header.index(column)
        values = [r[at] if at < len(r) else "" for r in rows]
    else:
        pa = _require_pyarrow(f"{path}")
        try:
            schema = pa.parquet.read_schema(path)
            if column not in schema.names:
                why = f"{path} has no column {column!r} (columns: {', '.join(schema.names)})"
                raise SvgenError(f"{why}; name the column of paths with path_column=",
                                 cli=f"{why}; name the column of paths with --path-column")
            values = pa.parquet.read_table(path, columns=[column]).column(column).to_pylist()
        except SvgenError:
            raise
        except Exception as e:
            raise SvgenError(f"cannot read {path} as Parquet: {(str(e).splitlines() or [''])[0]}") from None
    empty = [i for i, v in enumerate(values) if not v]
    if empty:
        raise SvgenError(f"{path}: row {empty[0] + 1} of column {column!r} has no path")
    return [str(path.parent / str(v)) for v in values]


TAR_TAIL = "<rest of shard unreadable>"  # the member name of a damaged shard's lost tail (one failure)


def _tar_members(path: Path) -> List[list]:
    """``[name, data offset, size]`` of the shard's image members, in archive order.

    Every member named like an image is an input: a regular file is read where it lies; a hard or symbolic link
    to a regular member of the same shard is read as that member (a symbolic link is resolved inside the shard
    only: one that is absolute or leaves it through ``..`` is never followed); anything else (a link to nothing,
    a link loop, a device, a FIFO, a folder) is an entry ``[name, -1, 0, reason]``, a failure. Members not
    named like images (a WebDataset sample's ``.cls``, ``.json``, ``.txt``) are its labels and captions, not inputs.

    Python's ``tarfile`` stops quietly at a header it cannot read, so a shard cut at a header boundary
    (or with garbage where a header belongs) would lose its remaining members without a trace. A whole
    archive ends with a zero block; when that is not where reading stopped, a last entry named
    :data:`TAR_TAIL` (offset -1) stands for the unknown members lost, and becomes one failure.
    """
    from svgen.encoders.images import IMAGE_SUFFIXES

    members, whole, seen = [], False, []
    try:
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
            # uncompressed, as WebDataset shards are: members can be read by offset
            try:
                for m in tar:
                    seen.append(m)
            except tarfile.ReadError:  # "unexpected end of data": cut inside a member
                pass
            else:
                f.seek(tar.offset)
                whole = f.read(tarfile.BLOCKSIZE) == bytes(tarfile.BLOCKSIZE)
    except (tarfile.TarError, OSError) as e:
        raise SvgenError(f"cannot read {path} as an uncompressed tar shard: {e}") from None
    by_name = {posixpath.normpath(m.name): m for m in seen}  # the last of a repeated name, as tar extracts it
    for m in seen:
        if Path(m.name).suffix.lower() in IMAGE_SUFFIXES:
            target, why = _tar_target(m, by_name)
            members.append([m.name, target.offset_data, target.size] if target is not None else [m.name, -1, 0, why])
    if not whole:
        log.warning("%s is truncated or damaged after %d image member(s); the rest is reported as a failure",
                    path, len(members))
        members.append([TAR_TAIL, -1, 0])
    return members


def _tar_target(m, by_name: dict, hops: int = 32):
    """``(regular member, None)`` that member ``m`` stands for, following hard and symbolic links inside the shard
    only, or ``(None, reason)``."""
    for _ in range(hops):
        if m.isfile():
            return m, None
        if not (m.islnk() or m.issym()):
            kind = ("a folder" if m.isdir() else "a FIFO" if m.isfifo() else "a device" if m.ischr() or m.isblk()
                    else "not a regular file")
            return None, f"not an image file: the tar member is {kind}"
        link = m.linkname if m.islnk() else posixpath.join(posixpath.dirname(m.name), m.linkname)
        name = posixpath.normpath(link)
        if m.issym() and (posixpath.isabs(m.linkname) or name == ".." or name.startswith("../")):
            return None, f"symbolic link to {m.linkname!r}, outside the shard: not followed"
        if name not in by_name:
            return None, f"{'hard' if m.islnk() else 'symbolic'} link to {m.linkname!r}, which is not in the shard"
        m = by_name[name]
    return None, f"a chain of more than {hops} links (a loop?)"


def _chunks(items: list, size: int):
    for s in range(0, len(items), size):
        yield items[s:s + size]


def plan_blocks(sources: Sequence[str], block_size: int, features: bool = False, path_column: str = "path",
                features_column: Optional[str] = None, dim: Optional[int] = None) -> List[Block]:
    """The sources as blocks of at most ``block_size`` inputs (see the module docstring).

    Raises :class:`SvgenError` (one line) for a missing source, an unreadable list/table/shard,
    a feature shard of the wrong dimension (``dim``), or no inputs at all.
    """
    if block_size < 1:
        raise setting_error("block_size", "--block-size", f"must be at least 1, got {block_size}")
    if not sources:
        raise SvgenError("nothing to classify: give image folders, files, globs, lists, tables or shards")
    blocks: List[Block] = []
    if features:
        id0 = 0
        for source in sources:
            for f in _expand(source):
                if f.is_dir() or f.suffix.lower() not in FEATURE_SUFFIXES:
                    raise SvgenError(f"features=True takes .npy or .parquet embedding shards, got {f}",
                                     cli=f"--features takes .npy or .parquet embedding shards, got {f}")
                n, column = feature_shape(f, features_column, dim)
                for s in range(0, n, block_size):
                    stop = min(n, s + block_size)
                    blocks.append(Block(len(blocks), "features", {"file": str(f), "start": s, "stop": stop,
                                                                  "id0": id0 + s, "column": column}))
                id0 += n
    else:
        from svgen.encoders.images import find_images

        loose: List[str] = []

        def flush():
            for chunk in _chunks(loose, block_size):
                blocks.append(Block(len(blocks), "images", {"paths": chunk}))
            loose.clear()

        for source in sources:
            for f in _expand(source):
                suffix = f.suffix.lower()
                if f.is_dir():
                    loose.extend(find_images([str(f)]))
                elif suffix in LIST_SUFFIXES:
                    loose.extend(_list_file(f))
                elif suffix in TABLE_SUFFIXES:
                    loose.extend(_table_column(f, path_column))
                elif suffix in TAR_SUFFIXES:
                    flush()
                    for chunk in _chunks(_tar_members(f), block_size):
                        blocks.append(Block(len(blocks), "tar", {"shard": str(f), "members": chunk}))
                else:
                    loose.append(str(f))
        flush()
    if not blocks:
        raise SvgenError(f"no inputs found in {', '.join(sources)}")
    return blocks


# ----------------------------------------------------------------------------- feature shards

def _parquet_feature_column(path: Path, want: Optional[str]):
    pa = _require_pyarrow(f"{path}")
    try:
        meta = pa.parquet.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except Exception as e:
        raise SvgenError(f"cannot read {path} as Parquet: {(str(e).splitlines() or [''])[0]}") from None
    lists = [f.name for f in schema if pa.types.is_list(f.type) or pa.types.is_fixed_size_list(f.type)
             or pa.types.is_large_list(f.type)]
    if want is None:
        if len(lists) != 1:
            why = f"{path} has {len(lists)} list columns ({', '.join(lists) or 'none'})"
            raise SvgenError(f"{why}; name the embedding column with features_column=",
                             cli=f"{why}; name the embedding column with --features-column")
        want = lists[0]
    elif want not in lists:
        raise SvgenError(f"{path} has no list column {want!r} (list columns: {', '.join(lists) or 'none'})")
    return meta.num_rows, want


def feature_shape(path: Path, column: Optional[str] = None, dim: Optional[int] = None) -> Tuple[int, Optional[str]]:
    """(rows, Parquet column or None) of an embedding shard, checking its dimension against ``dim``."""
    if path.suffix.lower() == ".npy":
        from svgen.npy import load_npy

        x = load_npy(path, "features", mmap=True)  # a damaged header (a negative size, say) is one line
        if x.ndim != 2 or not np.issubdtype(x.dtype, np.number):
            raise SvgenError(f"features file {path} holds {x.dtype} of shape {x.shape}; expected N×D numbers")
        n, d, column = x.shape[0], x.shape[1], None
    else:
        n, column = _parquet_feature_column(path, column)
        d = read_features(path, 0, min(n, 1), column).shape[1] if n else dim
    if dim is not None and d != dim:
        raise SvgenError(f"features in {path} have dimension {d} but the artifact expects {dim}")
    return n, column


def read_features(path, start: int, stop: int, column: Optional[str] = None) -> np.ndarray:
    """Rows ``start:stop`` of an embedding shard as a writable float32 array of its own (only the row
    groups needed are read).

    The sources are read-only (a ``.npy`` opened with ``mmap_mode="r"``, Arrow's buffers), and
    ``torch.from_numpy`` of a read-only array warns; the rows are copied once here instead.
    """
    path = Path(path)
    if path.suffix.lower() == ".npy":
        from svgen.npy import load_npy

        return _writable(load_npy(path, "features", mmap=True)[start:stop])
    pa = _require_pyarrow(f"{path}")
    f = pa.parquet.ParquetFile(path)
    groups, first, at = [], None, 0
    for g in range(f.num_row_groups):
        n = f.metadata.row_group(g).num_rows
        if at + n > start and at < stop:
            groups.append(g)
            first = at if first is None else first
        at += n
    table = f.read_row_groups(groups, columns=[column]) if groups else None
    if table is None:
        return np.zeros((0, 0), dtype=np.float32)
    col = table.column(column).combine_chunks().slice(start - first, stop - start)
    values = col.flatten().to_numpy(zero_copy_only=False)
    rows = len(col)
    if rows and values.size % rows:
        raise SvgenError(f"{path}: the rows of column {column!r} do not all have the same length")
    return _writable(values).reshape(rows, -1 if rows else 0)


def _writable(x) -> np.ndarray:
    """``x`` as a C-contiguous, writable float32 ndarray (copied only when it is not one already)."""
    return np.require(x, dtype=np.float32, requirements=["C", "W", "E"])


# ----------------------------------------------------------------------------- reading images

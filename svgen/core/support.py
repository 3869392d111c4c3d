"""The support set: rows, the class of each row, and where each row came from.

One small concept that the solve (:mod:`svgen.adapt.lda`), the heads, the classifier and the
artifact all take. A zero-shot fit has only ``text`` rows (the generated support vectors, C·K
class-major rows); labelled image embeddings (few-shot "shots") join as ``image`` rows.

=================  ======  =============================================
``rows``           M×D     unit rows
``labels``         M       class index of each row (int64)
``source``         M       0 = text, 1 = image, 2 = pool (uint8; names in SOURCES)
=================  ======  =============================================

``pool`` rows are unlabelled images placed by the transductive kernel head
(:mod:`svgen.adapt.solvers.transduction`); their ``labels`` are the argmax of the soft posterior they were
solved towards. They are not shots: adding shots or classes later drops them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from svgen.errors import SvgenError

SOURCES = ("text", "image", "pool")
TEXT, IMAGE, POOL = 0, 1, 2


@dataclass
class SupportSet:
    rows: torch.Tensor
    labels: torch.Tensor
    source: torch.Tensor

    @classmethod
    def from_text(cls, support: torch.Tensor) -> "SupportSet":
        """Text rows from C×K×D class-major support vectors."""
        C, K, D = support.shape
        return cls(F.normalize(support.reshape(C * K, D), dim=-1), torch.arange(C).repeat_interleave(K),
                   torch.full((C * K,), TEXT, dtype=torch.uint8))

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def part(self, source: int) -> "SupportSet":
        keep = self.source == source
        return SupportSet(self.rows[keep], self.labels[keep], self.source[keep])

    def subset(self, index) -> "SupportSet":
        """The rows at ``index`` (integer indices)."""
        i = torch.as_tensor(np.asarray(index), dtype=torch.int64)
        return SupportSet(self.rows[i], self.labels[i], self.source[i])

    def join(self, other: "SupportSet") -> "SupportSet":
        return SupportSet(torch.cat([self.rows, other.rows.to(self.rows.dtype)]), torch.cat([self.labels, other.labels]),
                          torch.cat([self.source, other.source]))

    def one_hot(self, n_classes: int, dtype=torch.float64) -> torch.Tensor:
        """The M×C class indicator Y."""
        return F.one_hot(self.labels, n_classes).to(dtype)

    def counts(self, n_classes: int, source: int = IMAGE) -> np.ndarray:
        """Rows per class from one source (shots per class for ``IMAGE``)."""
        return np.bincount(self.labels[self.source == source].numpy(), minlength=n_classes)


def check_real_dense(x, what: str) -> None:
    """Refuse, with one line each, what no embedding array can be: a scipy sparse matrix (numpy would make a 0-d
    object array of it) or a torch sparse tensor (most operators have no sparse kernel), or complex numbers (a cast to float would drop the imaginary part silently)."""
    if type(x).__module__.startswith("scipy.sparse") or (isinstance(x, torch.Tensor) and x.layout != torch.strided):
        raise SvgenError(f"{what}: a sparse matrix, and sparse input is not supported; pass a dense array")
    if isinstance(x, torch.Tensor):
        kind = "c" if x.is_complex() else "f"
    else:
        try:
            kind = x.dtype.kind if isinstance(getattr(x, "dtype", None), np.dtype) else np.asarray(x).dtype.kind
        except (TypeError, ValueError):
            return   # not an array at all: the caller's conversion says so
    if kind == "c":
        raise SvgenError(f"{what}: complex numbers (Complex data not supported); expected real embeddings")


def image_rows(X, y, n_classes: int, dim: int, what: str = "shots") -> SupportSet:
    """Validate labelled image embeddings once, at the boundary, and return them as image rows.

    ``X`` is N×D raw embeddings, ``y`` N integer class indices in ``[0, n_classes)``. Every
    defect (empty set, dimension mismatch, NaN/inf or all-zero rows, a label that is not a class,
    lengths that differ) is one :class:`SvgenError` line.
    """
    check_real_dense(X, what)
    try:
        # a float32 copy: the caller's array may be read-only (a memory-mapped .npy) and is never written through
        x = X.detach().to(torch.float32).clone() if isinstance(X, torch.Tensor) else torch.from_numpy(
            np.array(X, dtype=np.float32))
    except (TypeError, ValueError) as e:
        raise SvgenError(f"{what} must be a numeric N×D array ({e})") from None
    y = np.asarray(y)
    if x.dim() != 2:
        raise SvgenError(f"{what} must be an N×D array, got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise SvgenError(f"{what}: the set is empty (no labelled embeddings)")
    if x.shape[1] != dim:
        raise SvgenError(f"{what} have dimension {x.shape[1]} but the artifact expects {dim}")
    bad = ~torch.isfinite(x).all(dim=1)
    if bad.any():
        raise SvgenError(f"{what} contain NaN or inf (first at row {int(bad.nonzero()[0])})")
    zero = x.norm(dim=1) == 0
    if zero.any():
        raise SvgenError(f"{what} have an all-zero row at {int(zero.nonzero()[0])}; cannot L2-normalise it")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise SvgenError(f"{what}: {x.shape[0]} embeddings but labels of shape {y.shape}; expected {x.shape[0]} labels")
    if not (np.issubdtype(y.dtype, np.integer) or (np.issubdtype(y.dtype, np.floating)
                                                    and np.all(np.isfinite(y)) and np.all(y == np.round(y)))):
        raise SvgenError(f"{what}: labels must be integer class indices, got {y.dtype} values")
    y = y.astype(np.int64)
    out = (y < 0) | (y >= n_classes)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise SvgenError(f"{what}: label {int(y[i])} at row {i} is not a class index (expected 0..{n_classes - 1})")
    return SupportSet(F.normalize(x, dim=-1), torch.from_numpy(y), torch.full((x.shape[0],), IMAGE, dtype=torch.uint8))


def origin_records(origins, n: int, what: str = "origins") -> list:
    """``n`` records of where labelled images came from, checked: a str is a file path (``{"path": …}``), an int a
    row (``{"row": …}``), a dict keeps its ``path``, ``file`` and ``row``; None is ``{}`` (not known)."""
    if isinstance(origins, (str, bytes)) or not hasattr(origins, "__len__"):
        raise SvgenError(f"{what} must be a sequence of {n} file paths, rows or records, got {type(origins).__name__}")
    if len(origins) != n:
        raise SvgenError(f"{what}: {len(origins)} entries for {n} labelled images; give one per image")
    out = []
    for i, o in enumerate(origins):
        if o is None:
            out.append({})
        elif isinstance(o, str):
            out.append({"path": o})
        elif isinstance(o, (int, np.integer)) and not isinstance(o, bool) and o >= 0:
            out.append({"row": int(o)})
        elif isinstance(o, dict) and set(o) <= {"path", "file", "row"} and (
                all(isinstance(o.get(k, ""), str) for k in ("path", "file"))
                and (("row" not in o) or (isinstance(o["row"], (int, np.integer)) and not isinstance(o["row"], bool)
                                          and o["row"] >= 0))
                and ("file" not in o or "row" in o)):
            out.append({k: (int(v) if k == "row" else v) for k, v in o.items()})
        else:
            raise SvgenError(f"{what}[{i}] is {o!r}; expected a file path, a row number, or a dict with 'path', "
                             "or 'file' and 'row'")
    return out


def joined_origins(before, n_before: int, new, n_new: int):
    """The origins of ``n_before`` earlier image rows (``before``, None: not recorded) then of ``n_new`` new ones
    (``new``, the same), unknown ones as ``{}``; None where neither is recorded."""
    if before is None and new is None:
        return None
    return (before if before is not None else [{}] * n_before) + (new if new is not None else [{}] * n_new)

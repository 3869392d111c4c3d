"""Validation at the boundary: every array and name a user hands svgen is checked once, here, and every defect is
one :class:`~svgen.errors.SvgenError` line (the CLI prints it; nothing half-done follows)."""

from __future__ import annotations

import logging
from typing import List, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from svgen.core.support import check_real_dense
from svgen.errors import SvgenError
from svgen.npy import native
from svgen.encoders.prompts import validate_classes

log = logging.getLogger(__name__)


def check_pool(U, dim: int) -> torch.Tensor:
    """Validate an unlabelled pool (N×D image embeddings) against the artifact's dimension."""
    u = check_embeddings(U, "unlabelled images", ndims=(2,))
    if u.shape[1] != dim:
        raise SvgenError(f"unlabelled images have dimension {u.shape[1]} but the artifact expects {dim}")
    if u.shape[0] < 2:
        raise SvgenError(f"the unlabelled pool has {u.shape[0]} image(s); it needs at least 2")
    return u


def check_embeddings(x, what: str = "prototypes", ndims=(2, 3)) -> torch.Tensor:
    """Validate an embedding array once, at the boundary: real, right rank, finite, no zero rows.

    Every consumer L2-normalises the rows, so a row whose float32 norm would overflow (1e38) or
    underflow (1e-42) is divided by its largest |entry| first (:func:`safe_rows`): its direction is
    kept instead of being scored as a zero vector or refused as one. Only per-row vectors are
    allocated, never a second N×D array.
    """
    check_real_dense(x, what)
    try:
        a = x.detach().cpu() if isinstance(x, torch.Tensor) else native(np.asarray(x))  # torch refuses big-endian
        t = torch.as_tensor(a if isinstance(a, torch.Tensor) else np.asarray(a), dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        if isinstance(e, SvgenError):
            raise
        raise SvgenError(f"{what} must be a numeric array ({e})") from None
    if t.dim() not in ndims:
        shapes = " or ".join({2: "N×D", 3: "C×T×D"}[n] if what != "prototypes" else {2: "C×D", 3: "C×T×D"}[n] for n in ndims)
        raise SvgenError(f"{what} must be a {shapes} array, got shape {tuple(t.shape)}")
    if t.numel() == 0 or t.shape[-1] == 0:
        raise SvgenError(f"{what}: empty (shape {tuple(t.shape)})")
    bad = ~torch.isfinite(t)
    if bad.any():
        row = int(bad.reshape(t.shape[0], -1).any(dim=1).nonzero()[0])
        raise SvgenError(f"{what}: NaN or inf (first at row {row})")
    peak = torch.linalg.vector_norm(t, ord=float("inf"), dim=-1)  # max |entry| per row, no N×D temporary
    zero = peak == 0
    if zero.any():
        row = int(zero.reshape(t.shape[0], -1).any(dim=1).nonzero()[0])
        raise SvgenError(f"{what}: an all-zero vector at row {row}; cannot L2-normalise it")
    return safe_rows(t, peak)


SAFE_PEAK = (1e-18, 1e18)  # rows whose largest |entry| is in here square and sum without over/underflow


def safe_rows(t: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
    """``t`` with every row whose largest |entry| (``peak``) leaves :data:`SAFE_PEAK` divided by it, so
    its float32 norm neither overflows (1e38) nor underflows (1e-42). The row's direction, all that the
    heads use, is unchanged; other rows are left bit-identical."""
    bad = (peak < SAFE_PEAK[0]) | (peak > SAFE_PEAK[1])
    if not bad.any():
        return t
    t = t.clone()
    t[bad] = t[bad] / peak[bad].unsqueeze(-1)
    return t


DUPLICATE_COS = 0.9999  # prototypes at least this close are one class to the kernel (tied scores, a singular solve)


def duplicate_prototypes(P: torch.Tensor, threshold: float = DUPLICATE_COS, block: int = 1024) -> List[tuple]:
    """Pairs ``(i, j, cos)``, i < j, of unit rows of ``P`` (C×D) with ``cos(p_i, p_j) ≥ threshold``.

    Computed in row blocks, so memory stays ``block × C`` however many classes there are.
    """
    P = F.normalize(P.float(), dim=-1)
    pairs = []
    for s in range(0, P.shape[0], block):
        cos = P[s:s + block] @ P.T
        rows, cols = torch.nonzero(cos >= threshold, as_tuple=True)
        for r, c in zip(rows.tolist(), cols.tolist()):
            if s + r < c:
                pairs.append((s + r, c, float(cos[r, c])))
    return pairs


def twin_classes(classes: Sequence[str], P: torch.Tensor):
    """C class indices, each class's first *twin* — the lowest-indexed class with the same name and a coinciding
    prototype (cos ≥ :data:`DUPLICATE_COS`), itself where there is none — or None where no class has a twin.

    Twins are one class listed twice (OpenAI's ImageNet list names "missile" twice): every head scores them alike,
    and :func:`svgen.heads.predictor.tie` makes the tie exact, so the first of them wins, and ``classify`` names it.
    Only classes of a repeated name are compared (O(C) for a list without repeats)."""
    groups: dict = {}
    for i, name in enumerate(classes):
        groups.setdefault(str(name), []).append(i)
    first = None
    for members in groups.values():
        if len(members) < 2:
            continue
        Q = F.normalize(P[members].float(), dim=-1)
        cos = Q @ Q.T
        for b in range(1, len(members)):
            a = next((a for a in range(b) if cos[b, a] >= DUPLICATE_COS), None)
            if a is not None:
                if first is None:
                    first = torch.arange(len(classes))
                first[members[b]] = first[members[a]]
    return first


def check_distinct(P: torch.Tensor, classes: Sequence[str], new_from: int = 0) -> None:
    """Refuse classes whose prototypes coincide (cos ≥ 0.9999), naming them, before any solve; only
    pairs that involve a row from ``new_from`` on (classes being added) count."""
    from svgen.encoders.prototypes import short_name

    pairs = [(i, j, c) for i, j, c in duplicate_prototypes(P) if j >= new_from]
    if pairs:
        shown = "; ".join(f"{short_name(classes[i])} and {short_name(classes[j])} (cos {c:.6f})"
                          for i, j, c in pairs[:5]) + (" …" if len(pairs) > 5 else "")
        raise SvgenError(f"{len(pairs)} pair(s) of classes have identical or near-identical prototypes, so no "
                         f"classifier can tell them apart: {shown}. Names that differ only in case or spacing "
                         "encode alike (CLIP's tokenizer lower-cases); remove or rename one of each pair")


def check_vocabulary(P: torch.Tensor, classes: Sequence[str], strict: bool = False) -> List[tuple]:
    """Repeated class names and coinciding prototypes: refused with ``strict``, else one warning
    naming them, and the fit goes on; returns the prototype pairs ``(i, j, cos)``.

    Published vocabularies repeat names (OpenAI's ImageNet list has 'missile' and 'sunglasses'
    twice; the LVIS ∪ Objects365 ∪ OpenImages union 539 pairs) and open_clip classifies with
    them. Coinciding classes tie under every head, and their support vectors coincide, so K_SS is
    singular; the vote solve ``(K_SS + M·λ·I)⁻¹ Y`` stays well-posed because λ > 0.
    """
    from svgen.encoders.prompts import duplicate_names
    from svgen.encoders.prototypes import short_name

    names = duplicate_names(classes)
    pairs = duplicate_prototypes(P)
    if strict and pairs:
        check_distinct(P, classes)
    if strict and names:
        validate_classes(classes, source="class list")
    if names or pairs:
        said = []
        if names:
            said.append(f"{len(names)} repeated class name(s) ({', '.join(map(repr, names[:5]))}"
                        f"{' …' if len(names) > 5 else ''})")
        if pairs:
            said.append(f"{len(pairs)} pair(s) of classes with identical or near-identical prototypes ("
                        + "; ".join(f"{short_name(classes[i])} [{i}] and {short_name(classes[j])} [{j}], cos {c:.6f}"
                                    for i, j, c in pairs[:5]) + (" …" if len(pairs) > 5 else "") + ")")
        log.warning("%s: fitting on; such classes tie (the ridge keeps the vote solve well-posed); "
                    "strict=True (svgen fit --strict) refuses them", " and ".join(said))
    return pairs


def looks_like_labels(classes) -> bool:
    """Whether ``classes`` passed to :meth:`SVGClassifier.fit` is rather a vector of per-image labels
    (scikit-learn's ``fit(X, y)`` reflex): repeated entries that are not all strings, or mostly repeats."""
    values = list(np.asarray(classes.cpu() if isinstance(classes, torch.Tensor) else classes, dtype=object).ravel())
    distinct = len(set(map(str, values)))
    return distinct < len(values) and (any(not isinstance(v, str) for v in values) or distinct <= len(values) // 2)


def check_not_labels(classes) -> None:
    """Refuse per-image labels given as the class names of :meth:`SVGClassifier.fit` (scikit-learn's ``fit(X, y)``
    reflex without prototypes in the constructor), naming the routes that take labelled images."""
    if classes is None or not looks_like_labels(classes):
        return
    values = [str(v) for v in np.asarray(classes, dtype=object).ravel()]
    raise SvgenError(f"fit(prototypes, classes) takes C text prototypes and their C class names, but classes "
                     f"has {len(values)} entries with {len(set(values))} distinct: per-image labels? "
                     "svgen fits from text; labelled images join as shots: "
                     "SVGClassifier(prototypes=P, classes=names).fit(X, y), "
                     "SVGClassifier().fit(prototypes, classes=names, shots=(X, y)), or clf.adapt(X, y) "
                     "on a fitted classifier (y: class indices or names)")


def check_no_labels(y) -> None:
    """Refuse labels ``y`` in the text fit (no prototypes in the constructor): ``fit(X, y)`` always means labelled
    images, even when every label is distinct and could pass for C class names."""
    if y is not None:
        raise SvgenError("fit(X, y) fits labelled images, which need the text side in the constructor: "
                         "SVGClassifier(prototypes=P, classes=names).fit(X, y); the text fit is "
                         "fit(prototypes, classes=names) (names as classes=, not y), and labelled images "
                         "join it as shots=(X, y) or with adapt(X, y)")


def label_type(y) -> np.dtype:
    """The dtype of per-image labels ``y`` (numpy's; a tensor's as numpy has it): the type scikit-learn's fit(X, y)
    keeps for ``classes_``. Booleans are refused (True/False are not class indices, and numpy counts them as 0/1)."""
    arr = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
    if arr.dtype.kind == "b":
        raise SvgenError("y holds booleans; labels are class indices (integers) or class names")
    return arr.dtype.newbyteorder("=")


def label_indices(y, classes: Sequence[str], what: str = "y", owner: str = "the classifier"):
    """``y`` as class indices: class names are looked up in ``classes`` (a repeated name: its first
    row); integer indices pass through unchanged (checked where they are used). ``what`` and ``owner`` name the
    labels and whose classes they are in the message for an unknown name."""
    arr = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
    if arr.dtype.kind not in "USO":
        return y
    index = {}
    for i, name in enumerate(classes):
        index.setdefault(name, i)
    names = [str(v) for v in arr.ravel()]
    unknown = sorted({n for n in names if n not in index})
    if unknown:
        raise SvgenError(f"{what} holds {len(unknown)} name(s) that are not classes of {owner}: "
                         f"{', '.join(map(repr, unknown[:5]))}{' …' if len(unknown) > 5 else ''}")
    return np.asarray([index[n] for n in names], dtype=np.int64).reshape(arr.shape)

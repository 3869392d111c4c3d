"""Which classes a classifier confuses: predicted from its kernel head's support vectors alone
(``svgen diagnose --confusions``), and measured on labelled data (``svgen eval --confusions``).

**Predicted.** A head classifies the kernel head's support vectors: the score of the directed pair ``a → b`` is

    conf(a → b) = mean over the support rows s of class a of p_head(b | s),

the probability the head (the artifact's default head unless one is named: exactly what ``classify`` gives an input,
its temperature, prior term and pool factor included) puts on class ``b`` at the rows that stand for class ``a``. It is
the expected share of a's support set that the head would call ``b``. For the kernel head (the default of a text-only
artifact) it is large where b's support set overlaps a's under the kernel *and* b's votes reach into it; after shots
the default head may be the linear head or the mixture, and the pairs are those of the head that is deployed and
measured. A class without rows in the kernel head (after shots for some classes only) is never an ``a``. Pairs are
directed (conf(a → b) ≠ conf(b → a)), so they compare with measured (true, predicted) pairs one to one.
docs/usage.md ("Which classes are confused") reports how well it predicts measured confusions; docs/history.md what
else was tried.

The rows are scored one block of classes at a time and only the best pairs so far are kept, so memory holds one
block's rows × C probabilities and the C×C table is never formed (any C, sparse votes included).

**Measured.** On labelled data, the off-diagonal (true, predicted) pairs of a head's top-1 decisions, most frequent
first; among pairs with the same count, the more confident errors first (summed probability of the predicted class).
Not symmetrised: ``a → b`` counts the rows of ``a`` called ``b`` only. Beside them the same head's predicted pairs are
ranked by what conf(a → b) expects those data to show, **n_a · conf(a → b)** expected rows of a called b, n_a being
the rows of a in the labels (the class sizes of the data, not its outcomes): a count against counts, where the share
alone would rank a class with 4 rows beside one with 33.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from svgen.heads.scoring import topk
from svgen.steps import Clock

log = logging.getLogger(__name__)

SCORE = "conf(a → b): the mean probability the {head} head gives b at the support vectors of a"
PREDICTED_WINDOW = 100   # a measured pair is "predicted" when it is among this many top predicted pairs
BLOCK_CELLS = 1 << 22    # rows × classes of probabilities held at once


@dataclass
class Pair:
    """One directed pair ``a → b``: ``score`` is conf(a → b) for a predicted pair; ``count`` (rows of a called b)
    and ``confidence`` (their summed probability of b) for a measured one."""

    a: int
    b: int
    score: float = 0.0
    count: int = 0
    confidence: float = 0.0

    def to_json(self, names, **extra) -> dict:
        return {"true": str(names[self.a]), "predicted": str(names[self.b]), "a": self.a, "b": self.b,
                "score": self.score, "count": self.count, "confidence": self.confidence, **extra}


def _class_blocks(labels: torch.Tensor, n_classes: int, block_cells: int):
    """(first class, last class + 1, row indices) for consecutive blocks of classes, about ``block_cells / C``
    rows each (at least one class)."""
    order = torch.argsort(labels, stable=True)
    bounds = torch.searchsorted(labels[order].contiguous(), torch.arange(n_classes + 1))
    rows_per_block = max(1, block_cells // max(n_classes, 1))
    c0 = 0
    while c0 < n_classes:
        c1 = c0 + 1
        while c1 < n_classes and int(bounds[c1 + 1] - bounds[c0]) <= rows_per_block:
            c1 += 1
        yield c0, c1, order[int(bounds[c0]):int(bounds[c1])]
        c0 = c1


def support_confusion(clf, classes=None, block_cells: int = BLOCK_CELLS, head: Optional[str] = None) -> torch.Tensor:
    """conf(a → b) of ``head`` (the default head when None) for ``a`` in ``classes`` (indices; all when None): a
    len(classes)×C float64 table, the diagonal included (what the head keeps of a's own rows); a class without support
    rows (after shots for some classes, the kernel head's rows are the shots) has a row of zeros. For a few rows of the
    table; :func:`predicted_pairs` ranks them all without forming C×C."""
    rows, labels = _support(clf)
    C = len(clf.class_names_)
    want = torch.arange(C) if classes is None else torch.as_tensor(np.asarray(classes, dtype=np.int64))
    keep = torch.isin(labels, want)
    sub_rows, sub_labels = rows[keep], labels[keep]
    out = torch.zeros(C, C, dtype=torch.float64) if classes is None else None
    table = {}
    for c0, c1, idx in _class_blocks(sub_labels, C, block_cells):
        if idx.numel() == 0:
            continue
        block = _block_means(clf, sub_rows[idx], sub_labels[idx], c0, c1, head)
        if out is not None:
            out[c0:c1] = block
        else:
            for c in range(c0, c1):
                table[c] = block[c - c0]
    if out is not None:
        return out
    return torch.stack([table.get(int(c), torch.zeros(C, dtype=torch.float64)) for c in want])


def _support(clf):
    """The deployed kernel head's rows (M×D, unit) and their classes (M)."""
    ss = clf.heads_.kernel.support_set()
    return ss.rows.float(), ss.labels.to(torch.int64)


def _block_means(clf, rows: torch.Tensor, labels: torch.Tensor, c0: int, c1: int, head: Optional[str]) -> torch.Tensor:
    """(c1 − c0)×C: for each class of the block, the mean probability ``head`` gives each class over its rows."""
    with torch.no_grad():
        p = torch.as_tensor(clf.predict_proba(rows, head=head)).double()
    sums = torch.zeros(c1 - c0, p.shape[1], dtype=torch.float64).index_add_(0, labels - c0, p)
    counts = torch.bincount(labels - c0, minlength=c1 - c0).double()
    return sums / counts.clamp_min(1.0)[:, None]


def predicted_pairs(clf, top: int, among=None, block_cells: int = BLOCK_CELLS, sizes=None,
                    head: Optional[str] = None) -> List[Pair]:
    """The ``top`` directed pairs ``a → b`` (a ≠ b) of largest conf(a → b) of ``head`` (the default head when None),
    largest first (equal scores: lower a, then lower b first); ``among`` (class indices; None: all): only pairs whose
    ``a`` is one of them (the classes labelled data can show confused). ``sizes`` (C rows per class of labelled data):
    ranked by the expected count ``sizes[a]·conf(a → b)`` instead, only classes with rows an ``a``; each pair's
    ``score`` stays conf(a → b). The head scores the kernel head's support rows a block of classes at a time."""
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    clock = Clock(log)
    rows, labels = _support(clf)
    C = len(clf.class_names_)
    weight = None if sizes is None else torch.as_tensor(np.asarray(sizes, dtype=np.float64))
    if weight is not None:
        labelled = np.flatnonzero(weight.numpy() > 0)
        among = labelled if among is None else np.intersect1d(among, labelled)
    if among is not None:
        keep = torch.isin(labels, torch.as_tensor(np.asarray(among, dtype=np.int64)))
        rows, labels = rows[keep], labels[keep]
    best_v = torch.empty(0, dtype=torch.float64)
    best_i = torch.empty(0, dtype=torch.int64)
    best_s = torch.empty(0, dtype=torch.float64)   # conf(a → b) of each pair kept
    for c0, c1, idx in _class_blocks(labels, C, block_cells):
        if idx.numel() == 0:
            continue
        block = _block_means(clf, rows[idx], labels[idx], c0, c1, head)
        ranked = block.clone() if weight is None else block * weight[c0:c1, None]
        ranked[torch.arange(c1 - c0), torch.arange(c0, c1)] = -float("inf")   # a → a is no confusion
        ranked[torch.bincount(labels[idx] - c0, minlength=c1 - c0) == 0] = -float("inf")   # a has no rows
        k = min(top, ranked.numel())
        v, i = torch.topk(ranked.reshape(-1), k)
        best_v, best_i = torch.cat([best_v, v]), torch.cat([best_i, i + c0 * C])
        best_s = torch.cat([best_s, block.reshape(-1)[i]])
        if best_v.numel() > top:
            best_v, best_i, best_s = _best(best_v, best_i, best_s, top)
    best_v, best_i, best_s = _best(best_v, best_i, best_s, top)
    keep = torch.isfinite(best_v)
    clock.lap("confusions: the %s head on the %d support rows, %d classes", head or clf.default_head_, rows.shape[0], C)
    return [Pair(int(i) // C, int(i) % C, float(s)) for s, i in zip(best_s[keep], best_i[keep])]


def _best(values: torch.Tensor, index: torch.Tensor, scores: torch.Tensor, top: int):
    """The ``top`` largest ``values`` (with their index and score), largest first; equal values in the lower flat
    index (a·C + b) first."""
    order = torch.from_numpy(np.lexsort((index.numpy(), -values.numpy()))[:top])
    return values[order], index[order], scores[order]


def measured_pairs(y_true, y_pred, confidence, top: int) -> List[Pair]:
    """The ``top`` most frequent off-diagonal (true, predicted) pairs; equal counts: the larger summed
    ``confidence`` (the probability of the predicted class) first, then the lower (true, predicted)."""
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    confidence = np.asarray(confidence, dtype=np.float64)
    wrong = y_true != y_pred
    if not wrong.any():
        return []
    keys, inverse = np.unique(np.stack([y_true[wrong], y_pred[wrong]], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse, minlength=len(keys))
    mass = np.bincount(inverse, weights=confidence[wrong], minlength=len(keys))
    order = np.lexsort((keys[:, 1], keys[:, 0], -mass, -counts))[:top]
    return [Pair(int(keys[j, 0]), int(keys[j, 1]), count=int(counts[j]), confidence=float(mass[j])) for j in order]


def measured_on(clf, x, y, block_rows: int = 4096, head: Optional[str] = None):
    """(top-1 class, its probability) of ``head`` (the default head when None) for every row of ``x`` (N×D; a
    memory-mapped array is read block by block)."""
    preds, conf = [], []
    for s in range(0, x.shape[0], block_rows):
        xb = x[s:s + block_rows]
        xb = xb.to(torch.float32) if isinstance(xb, torch.Tensor) else torch.from_numpy(np.array(xb, dtype=np.float32))
        with torch.no_grad():
            p = torch.as_tensor(clf.predict_proba(xb, head=head))
        v, i = topk(p, 1)
        v, i = v[:, 0], i[:, 0]
        preds.append(i.numpy())
        conf.append(v.double().numpy())
    return (np.concatenate(preds) if preds else np.zeros(0, np.int64)), (np.concatenate(conf) if conf else np.zeros(0))


def confusion_report(clf, x, y, top: int = 20, window: int = PREDICTED_WINDOW, predictions=None) -> dict:
    """``svgen eval --confusions``: the ``top`` measured pairs of the default head on (x, y), each with its rank among
    the ``window`` top predicted pairs (None: not among them), and the ``top`` predicted pairs, the same head's;
    JSON-ready. The predicted pairs are ranked by the rows ``y`` expects them to show, n_a·conf(a → b)
    (``expected``), so only those whose true class occurs in ``y`` (the only ones these labels can show).
    ``predictions``: the default head's (top-1 class, its probability) per row where the caller has them already
    (``svgen eval`` scores every head once, :func:`svgen.evaluation.metrics.evaluate_heads`); else the rows are
    scored here."""
    names = list(clf.class_names_)
    pred, conf = measured_on(clf, x, y) if predictions is None else predictions
    measured = measured_pairs(y, pred, conf, top)
    sizes = np.bincount(np.asarray(y, dtype=np.int64), minlength=len(names))
    predicted = predicted_pairs(clf, max(window, top), sizes=sizes)
    rank = {(p.a, p.b): r for r, p in enumerate(predicted[:window], 1)}
    true = sorted({m.a for m in measured})   # conf(a → b) of each measured pair, from the rows of its a only
    table = dict(zip(true, support_confusion(clf, true))) if true else {}
    scores = {(m.a, m.b): float(table[m.a][m.b]) for m in measured}
    rows = [m.to_json(names, score=scores[(m.a, m.b)], expected=float(sizes[m.a]) * scores[(m.a, m.b)],
                      predicted_rank=rank.get((m.a, m.b))) for m in measured]
    return {"head": clf.default_head_, "n": int(len(y)), "errors": int((np.asarray(y) != pred).sum()),
            "window": window, "measured": rows,
            "measured_in_predicted": sum(r["predicted_rank"] is not None for r in rows),
            "predicted": [p.to_json(names, rank=r, expected=float(sizes[p.a]) * p.score)
                          for r, p in enumerate(predicted[:top], 1)]}

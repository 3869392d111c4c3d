"""Classification metrics over N×C score matrices (pure functions, numpy in and out).

* ``top_k_accuracy``: the fraction of rows whose true class is among the k best scores
  (``sklearn.metrics.top_k_accuracy_score``; k ≥ C gives 1).
* ``mean_per_class_recall``: recall (top-1) of each class that occurs in the labels, averaged
  over those classes (``sklearn.metrics.balanced_accuracy_score``). Classes with no examples
  are left out rather than counted as zero.
* ``evaluate``: both, for one head, as a dict ``{acc1, acc5, mean_per_class_recall, n}``.

Ties: a true class is counted among the top k when fewer than k classes score strictly higher.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from svgen.errors import SvgenError


def _as_scores(scores) -> np.ndarray:
    if hasattr(scores, "detach"):
        scores = scores.detach().cpu().numpy()
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2:
        raise SvgenError(f"scores must be an N×C array, got shape {s.shape}")
    return s


def check_labels(labels, n: int, n_classes: int, what: str = "labels") -> np.ndarray:
    """Validate class indices: 1-D integers (or whole-number floats), ``n`` of them, each in ``[0, n_classes)``."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise SvgenError(f"{what} must be a 1-D array of class indices, got shape {y.shape}")
    if np.issubdtype(y.dtype, np.floating):  # 0.0, 1.0, … (e.g. saved from a float tensor) are indices too
        whole = np.isfinite(y) & (y == np.round(y))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise SvgenError(f"{what} must hold integer class indices; got {y.dtype} values, "
                             f"{float(y[i])!r} at position {i} is not a whole number")
        y = y.astype(np.int64)
    if not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
        raise SvgenError(f"{what} must hold integer class indices, got {y.dtype} values")
    if y.shape[0] != n:
        raise SvgenError(f"{what} has {y.shape[0]} entries but there are {n} feature rows; they must match")
    y = y.astype(np.int64)
    bad = np.flatnonzero((y < 0) | (y >= n_classes))
    if bad.size:
        i = int(bad[0])
        raise SvgenError(f"{what} has {bad.size} index(es) outside 0..{n_classes - 1} "
                         f"(the artifact's classes), first {int(y[i])} at position {i}")
    return y


def ranks(scores, labels) -> np.ndarray:
    """0-based rank of each row's true class: how many classes score strictly higher."""
    s = _as_scores(scores)
    y = np.asarray(labels, dtype=np.int64)
    true = s[np.arange(s.shape[0]), y]
    return (s > true[:, None]).sum(axis=1)


def top_k_accuracy(scores, labels, k: int = 1) -> float:
    """Fraction of rows whose true class is among the ``k`` best scores."""
    if len(labels) == 0:
        return float("nan")
    return float((ranks(scores, labels) < k).mean())


def mean_per_class_recall(predictions, labels) -> float:
    """Mean over the classes present in ``labels`` of the fraction of that class predicted right."""
    pred = np.asarray(predictions, dtype=np.int64)
    y = np.asarray(labels, dtype=np.int64)
    if y.size == 0:
        return float("nan")
    classes, inverse = np.unique(y, return_inverse=True)
    hits = np.bincount(inverse, weights=(pred == y).astype(np.float64), minlength=classes.size)
    counts = np.bincount(inverse, minlength=classes.size)
    return float((hits / counts).mean())


def evaluate(scores, labels) -> Dict[str, float]:
    """``{acc1, acc5, mean_per_class_recall, n}`` of one head's N×C scores against class indices."""
    s = _as_scores(scores)
    y = check_labels(labels, s.shape[0], s.shape[1])
    r = ranks(s, y)
    pred = s.argmax(axis=1)
    return {
        "acc1": float((r < 1).mean()) if y.size else float("nan"),
        "acc5": float((r < 5).mean()) if y.size else float("nan"),
        "mean_per_class_recall": mean_per_class_recall(pred, y),
        "n": int(y.size),
    }


def paired_bootstrap(correct_a, correct_b, n_resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Dict[str, float]:
    """Paired bootstrap of ``mean(a) − mean(b)`` for per-sample 0/1 outcomes of two classifiers on the
    same samples: resample the samples with replacement ``n_resamples`` times, keep the pairing,
    and report the difference with its percentile interval (all in the units of the inputs).

    Returns ``{"diff", "low", "high", "n", "resamples"}``.
    """
    a = np.asarray(correct_a, dtype=np.float64).ravel()
    b = np.asarray(correct_b, dtype=np.float64).ravel()
    if a.shape != b.shape or a.size == 0:
        raise SvgenError(f"paired bootstrap needs two equally long, non-empty outcome arrays, got {a.shape} and {b.shape}")
    d = a - b
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for s in range(0, n_resamples, 256):  # bounded memory: 256 resamples at a time
        idx = rng.integers(0, d.size, size=(min(256, n_resamples - s), d.size))
        means[s:s + idx.shape[0]] = d[idx].mean(axis=1)
    tail = 100 * (1 - level) / 2
    return {"diff": float(d.mean()), "low": float(np.percentile(means, tail)),
            "high": float(np.percentile(means, 100 - tail)), "n": int(d.size), "resamples": int(n_resamples)}


HEAD_ORDER = ("cosine", "kernel", "linear", "mixture")   # the heads a classifier has, in this order


def evaluate_heads(clf, x, labels, bins: dict = None) -> dict:
    """``{head: {acc1, acc5, mean_per_class_recall, nll, ece, temperature, n}}`` for every head of ``clf`` (the
    mixture's only where shots fitted one; its temperature is 1 and its logits are ``log p``).

    ``nll`` and ``ece`` (15 bins) judge ``clf.predict_proba``; ``bins``, when given, receives each
    head's reliability bins (for ``--plot``).
    """
    from svgen.calibration.temperatures import calibration_metrics, reliability, softmax
    from svgen.evaluation.metrics import check_labels, evaluate

    from svgen.heads import predictor

    y = check_labels(labels, x.shape[0], len(clf.classes_))
    out = {}
    for head in (h for h in HEAD_ORDER if h in clf.head_names_):
        scores = clf.decision_function(x, head=head)
        logits, T = clf.logits(x, head=head), predictor.temperature(clf.heads_, head)
        r = evaluate(scores, y)
        n = r.pop("n")
        out[head] = {**r, **calibration_metrics(logits, T, y), "temperature": T, "n": n}
        if bins is not None:
            bins[head] = reliability(softmax(logits, T), y)
    return out

"""Classification metrics over N×C score matrices (pure functions, numpy in and out).

* ``top_k_accuracy``: the fraction of rows whose true class is among the k best scores
  (``sklearn.metrics.top_k_accuracy_score``; k ≥ C gives 1).
* ``mean_per_class_recall``: recall (top-1) of each class that occurs in the labels, averaged
  over those classes (``sklearn.metrics.balanced_accuracy_score``). Classes with no examples
  are left out rather than counted as zero.
* ``evaluate``: both, for one head, as a dict ``{acc1, acc5, mean_per_class_recall, n}``.
* ``nll`` and ``reliability``: of N×C probabilities against class indices (the mean −log p of the true class, and
  the 15 confidence bins ECE is summed from, :func:`svgen.heads.calibration.ece`).
* ``evaluate_heads``: every head of a classifier with ``nll`` and ``ece`` too, streamed over blocks of
  rows (:class:`HeadTally` keeps sums only), so memory stays at one block of scores whatever N is.

Ties: the top k are the classes ``classify`` lists (:func:`svgen.heads.scoring.topk`: equal scores in the
lower class index first, as ``argmax``), so a true class tied with a lower-indexed one is not counted at
top-1 — ``acc1`` is the accuracy of the predictions ``classify`` prints. A class listed twice (same name, same
prototype: twins) ties exactly with its first listing in every head, and both count as that class
(:func:`same_class`); with class names as labels, a prediction counts where its name is the label's, as one judges
the names ``classify`` prints.
"""

from __future__ import annotations

import logging
from typing import Dict

import numpy as np

from svgen.errors import SvgenError

log = logging.getLogger(__name__)


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
    if y.dtype == np.bool_:   # numpy would count True/False as 1/0
        raise SvgenError(f"{what} hold booleans; expected integer class indices or class names")
    if not np.issubdtype(y.dtype, np.integer):
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


def top_classes(scores, k: int) -> np.ndarray:
    """N×min(k, C) class indices of each row's ``k`` best scores, best first, as ``classify`` lists them (NaN last)."""
    import torch

    from svgen.heads.scoring import topk

    s = torch.as_tensor(scores)
    nan = torch.isnan(s)
    if bool(nan.any()):   # a damaged score never tops a row (svgen.io.output ranks it last too)
        s = torch.where(nan, torch.full_like(s, -float("inf")), s)
    return topk(s, k)[1].numpy()


def top_k_accuracy(scores, labels, k: int = 1) -> float:
    """Fraction of rows whose true class is among the ``k`` classes ``classify`` lists first."""
    if len(labels) == 0:
        return float("nan")
    y = np.asarray(labels, dtype=np.int64)
    return float((top_classes(_as_scores(scores), k) == y[:, None]).any(axis=1).mean())


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
    tally = HeadTally(s.shape[1])
    tally.add_ranking(s, y)
    r = tally.result()
    return {name: r[name] for name in ("acc1", "acc5", "mean_per_class_recall", "n")}


class HeadTally:
    """One head's metrics as running sums over blocks of rows: hits at top 1 and top 5 (the classes ``classify``
    lists, :func:`top_classes`), per-class hits and counts, the summed NLL, and the 15 confidence bins' counts,
    confidence and hit sums (ECE). The result is that of the whole matrix at once, whatever the blocks."""

    def __init__(self, n_classes: int, n_bins: int = None, same: np.ndarray = None):
        from svgen.heads.calibration import ECE_BINS

        self.C, self.bins = n_classes, n_bins or ECE_BINS
        self.same = same   # C stand-ins (:func:`same_class`): predictions and labels compared through them (None: as is)
        self.n = self.hit1 = self.hit5 = 0
        self.nll = 0.0
        self.class_hits = np.zeros(n_classes)
        self.class_count = np.zeros(n_classes, dtype=np.int64)
        self.bin_count = np.zeros(self.bins, dtype=np.int64)
        self.bin_conf = np.zeros(self.bins)
        self.bin_hits = np.zeros(self.bins)

    def add_ranking(self, scores, y: np.ndarray) -> None:
        """Top-1 / top-5 hits and per-class recall of one block's scores (``y``: its class indices)."""
        top = top_classes(scores, 5)
        if self.same is not None:
            top, y = self.same[top], self.same[y]
        hit = top == y[:, None]
        self.n += int(y.size)
        self.hit1 += int(hit[:, 0].sum())
        self.hit5 += int(hit.any(axis=1).sum())
        self.class_hits += np.bincount(y, weights=hit[:, 0].astype(np.float64), minlength=self.C)
        self.class_count += np.bincount(y, minlength=self.C)

    def add_probabilities(self, logits, temperature: float, y: np.ndarray) -> tuple:
        """NLL and reliability bins of one block's ``softmax(logits / T)``; returns (each row's top-1 class, its
        probability)."""
        from svgen.heads.calibration import confidence_bins, example_nll, softmax

        self.nll += float(example_nll(logits, temperature, y).sum())
        p = softmax(logits, temperature)
        conf = p.max(dim=1).values.numpy()
        top1 = predicted = top_classes(p, 1)[:, 0]
        if self.same is not None:
            top1, y = self.same[top1], self.same[y]
        count, conf_sum, hits = confidence_bins(conf, (top1 == y).astype(np.float64), self.bins)
        self.bin_count += count
        self.bin_conf += conf_sum
        self.bin_hits += hits
        return predicted, conf

    def reliability(self) -> dict:
        """The bins as :func:`reliability` gives them."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"edges": np.linspace(0, 1, self.bins + 1), "count": self.bin_count.copy(),
                    "confidence": self.bin_conf / self.bin_count, "accuracy": self.bin_hits / self.bin_count}

    def result(self) -> Dict[str, float]:
        """``{acc1, acc5, mean_per_class_recall, nll, ece, n}`` (NaN where there are no rows)."""
        nan = float("nan")
        seen = self.class_count > 0
        used = self.bin_count > 0
        ece = float(np.abs(self.bin_hits[used] - self.bin_conf[used]).sum() / self.n) if self.n else nan
        return {"acc1": self.hit1 / self.n if self.n else nan, "acc5": self.hit5 / self.n if self.n else nan,
                "mean_per_class_recall": float((self.class_hits[seen] / self.class_count[seen]).mean())
                if self.n else nan,
                "nll": self.nll / self.n if self.n else nan, "ece": ece, "n": int(self.n)}


def _probs_labels(probs, labels):
    p = np.asarray(probs.detach().cpu().numpy() if hasattr(probs, "detach") else probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if p.ndim != 2 or y.shape != (p.shape[0],):
        raise SvgenError(f"probabilities must be N×C with N labels, got {p.shape} and {y.shape}")
    return p, y


def nll(probs, labels, eps: float = 1e-15) -> float:
    """Mean negative log-likelihood of the true class, ``−mean_i log p_{i,y_i}`` (p clipped to [eps, 1])."""
    p, y = _probs_labels(probs, labels)
    return float(-np.log(np.clip(p[np.arange(len(y)), y], eps, 1.0)).mean())


def reliability_of(conf, correct, n_bins: int = None) -> dict:
    """Top-1 confidences and their correctness in the 15 (``n_bins``) bins ``(b/B, (b+1)/B]`` (the first takes 0
    too): the edges, and per bin the count, mean confidence and accuracy (NaN where empty)."""
    from svgen.heads.calibration import ECE_BINS, confidence_bins

    n_bins = n_bins or ECE_BINS
    count, conf_sum, hits = confidence_bins(np.asarray(conf, np.float64), np.asarray(correct, np.float64), n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"edges": np.linspace(0, 1, n_bins + 1), "count": count, "confidence": conf_sum / count,
                "accuracy": hits / count}


def reliability(probs, labels, n_bins: int = None) -> dict:
    """:func:`reliability_of` of N×C probabilities against class indices (what ``svgen eval --plot`` draws)."""
    p, y = _probs_labels(probs, labels)
    return reliability_of(p.max(axis=1), p.argmax(axis=1) == y, n_bins)


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


EVAL_BLOCK_ROWS = 4096   # rows scored at once: classify's blocks (svgen.io.output.BLOCK_ROWS), so near-ties round alike


def same_class(clf, by_name: bool = False) -> np.ndarray:
    """C class indices, each class's stand-in when predictions are judged: its first twin (the same name and prototype
    listed again, :attr:`svgen.SVGClassifier.twins_`), or with ``by_name`` (labels given as names) the first class of
    its name, since ``classify`` prints names and a prediction is right when its name is the label's."""
    C = len(clf.class_names_)
    if by_name:
        first: dict = {}
        return np.asarray([first.setdefault(str(name), i) for i, name in enumerate(clf.class_names_)], dtype=np.int64)
    twins = clf.twins_
    return np.arange(C) if twins is None else twins.cpu().numpy().astype(np.int64)


def evaluate_heads(clf, x, labels, bins: dict = None, block_rows: int = None, progress: bool = False,
                   by_name: bool = False, top1: dict = None) -> dict:
    """``{head: {acc1, acc5, mean_per_class_recall, nll, ece, temperature, n}}`` for every head of ``clf`` (the
    mixture's only where shots fitted one; its temperature is 1 and its logits are ``log p``).

    ``x`` (N×D; a memory-mapped array is read block by block) is scored ``block_rows`` rows at a time
    (:data:`EVAL_BLOCK_ROWS`), each head once per block (its scores rank, its logits give the probabilities), and
    every metric accumulated (:class:`HeadTally`): memory holds one block's N_b×C scores, not N×C. ``nll`` and
    ``ece`` (15 bins) judge ``clf.predict_proba``; ``bins``, when given, receives each head's reliability bins (for
    ``--plot``); ``progress``: a bar over the rows. ``by_name``: the labels were class names, and a prediction counts
    where its name is the label's (:func:`same_class`); else a class and its twins count as one. ``top1``, when
    given: for each head it names, receives (every row's top-1 class, its probability), as ``eval --confusions``
    counts them without scoring the rows again.
    """
    import time

    import torch

    from svgen.heads import predictor
    from svgen.steps import timed

    y = check_labels(labels, x.shape[0], len(clf.class_names_))
    block_rows = block_rows or EVAL_BLOCK_ROWS
    heads = [h for h in HEAD_ORDER if h in clf.head_names_]
    temps = {h: predictor.temperature(clf.heads_, h) for h in heads}
    same = same_class(clf, by_name)
    tallies = {h: HeadTally(len(clf.class_names_), same=same) for h in heads}
    spent = dict.fromkeys(heads, 0.0)
    kept = {h: [] for h in top1 or ()}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=int(y.size), desc="eval", unit="row")
    with timed(log, f"eval: {len(heads)} heads ({', '.join(heads)}) on {y.size} row(s), {len(clf.class_names_)} "
                    f"classes") as info:
        try:
            for s in range(0, y.size, block_rows):
                xb = x[s:s + block_rows]   # a float32 copy: memory-mapped rows are read-only
                xb = xb.to(torch.float32).clone() if isinstance(xb, torch.Tensor) else torch.from_numpy(
                    np.array(xb, dtype=np.float32))
                yb = y[s:s + block_rows]
                with torch.no_grad():
                    for h in heads:
                        t0 = time.perf_counter()
                        scores, logits = clf.scores_and_logits(xb, head=h)   # each head scored once per block
                        tallies[h].add_ranking(scores, yb)
                        got = tallies[h].add_probabilities(logits, temps[h], yb)
                        if top1 is not None and h in top1:
                            kept[h].append(got)
                        spent[h] += time.perf_counter() - t0
                if bar is not None:
                    bar.update(int(yb.size))
                log.debug("eval: rows %d-%d of %d scored", s, s + yb.size, y.size)
        finally:
            if bar is not None:
                bar.close()
        info.extend(f"{h} {spent[h]:.2f}s" for h in heads)
    for h, got in kept.items():
        top1[h] = (np.concatenate([g[0] for g in got]) if got else np.zeros(0, np.int64),
                   np.concatenate([g[1] for g in got]).astype(np.float64) if got else np.zeros(0))
    out = {}
    for h in heads:
        r = tallies[h].result()
        n = r.pop("n")
        out[h] = {**r, "temperature": temps[h], "n": n}
        if bins is not None:
            bins[h] = tallies[h].reliability()
    return out

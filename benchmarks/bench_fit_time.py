#!/usr/bin/env python
"""Few-shot fit time (D = 512): svgen against scikit-learn's logistic regression, 100 classes × 16 shots by
default, ``--classes 1000 --per-class 2`` (or 16) for ImageNet scale.

Targets: 16 × 100 in ≤ 10 s on 2 cores (issue 11); 1,000 × 16 in ≤ 30 s and ≤ 2 GB, 1,000 × 2 in
≤ 10 s (issue 22; peak RSS of the process is reported). In one run, on the
same shots, ``--repeats`` times each (alternating, so load spikes hit both):

* ``svgen zero-shot fit``  ``SVGClassifier(seed=0).fit(P)`` on the stand-in prototypes P (class
  means of the shots; the sets have no text embeddings)
* ``svgen adapt``          ``clf.adapt(X, y)``: both few-shot heads with every setting chosen by exact LOO
* ``logistic regression``  the stock alternative: ``sklearn.linear_model.LogisticRegression()``
  (default C = 1, lbfgs, ``max_iter=1000``) fitted once on the same shots — no C search, so it is
  the cheapest form of the baseline the few-shot benchmark runs four times over

Shots: the 16-shot ``train16`` rows of CoOp Caltech101 (100 classes) in
``../shared/data/clip-vit-b32/coop-fewshot/`` when present, else (``--synthetic``, or more than 100
classes) Gaussian classes whose prototypes are their noisy centres, not the shots' means. Wall-clock and process CPU seconds are reported (min and
median over the repeats) with the 1-minute load average before and after each: the machine is
shared, and the ratio to logistic regression from the same run is the comparable number.

    python -m benchmarks.bench_fit_time                 # 3 repeats
    python -m benchmarks.bench_fit_time --repeats 5 --synthetic

Writes ``bench-results/bench_fit_time.json``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import warnings

import numpy as np

from benchmarks.bench_common import DATA, clock as timed, machine, print_table, save_result

CALTECH = DATA / "coop-fewshot" / "caltech101"


def shots(synthetic: bool, n_classes: int = 100, k: int = 16, dim: int = 512):
    if n_classes > 100 or k > 16:
        synthetic = True
    if not synthetic and (CALTECH / "train16_features.npy").exists():
        X = np.load(CALTECH / "train16_features.npy").astype(np.float32)
        y = np.load(CALTECH / "train16_labels.npy").astype(np.int64)
        keep = np.concatenate([np.flatnonzero(y == c)[:k] for c in range(n_classes)])
        X, y, source = X[keep], y[keep], "CoOp Caltech101 train16 (real CLIP ViT-B/32)"
    else:
        rng = np.random.default_rng(0)
        centres = rng.normal(size=(n_classes, dim))
        y = np.repeat(np.arange(n_classes), k)
        X = (centres[y] + 1.5 * rng.normal(size=(len(y), dim))).astype(np.float32)
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        P = centres + 0.5 * rng.normal(size=centres.shape)
        return X, y, P / np.linalg.norm(P, axis=1, keepdims=True), "synthetic Gaussian classes"
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    P = np.stack([X[y == c].mean(0) for c in range(n_classes)])
    return X, y, P / np.linalg.norm(P, axis=1, keepdims=True), source


def summary(runs):
    out = {}
    for key in ("wall_s", "cpu_s"):
        v = [r[key] for r in runs]
        out[key] = {"min": min(v), "median": statistics.median(v)}
    out["load"] = [r["load_before"] for r in runs]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", action="store_true", help="random unit vectors instead of the CoOp features")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=16, help="shots per class")
    ap.add_argument("--out", default=None, help="result name under bench-results/ (default: bench_fit_time[_CxK])")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("bench_fit_time: --repeats must be at least 1", file=sys.stderr)
        return 2
    from sklearn.linear_model import LogisticRegression

    from svgen import SVGClassifier

    logging.basicConfig(level=logging.WARNING)
    from benchmarks.bench_common import peak_rss_mb

    X, y, P, source = shots(args.synthetic, args.classes, args.per_class)
    runs = {"svgen zero-shot fit": [], "svgen adapt": [], "logistic regression": []}
    for r in range(args.repeats):
        clf, t = timed(lambda: SVGClassifier(seed=0).fit(P))
        runs["svgen zero-shot fit"].append(t)
        _, t = timed(lambda: clf.adapt(X, y))
        runs["svgen adapt"].append(t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, t = timed(lambda: LogisticRegression(max_iter=1000).fit(X, y))
        runs["logistic regression"].append(t)
        print(f"repeat {r + 1}: " + "  ".join(f"{m} {v[-1]['wall_s']:.2f}s wall / {v[-1]['cpu_s']:.2f}s cpu"
                                               for m, v in runs.items()) + f"  (load {t['load_after']})", flush=True)
    summ = {m: summary(v) for m, v in runs.items()}
    lr = summ["logistic regression"]
    rows = []
    for m, s in summ.items():
        rows.append({"step": m, "wall min": s["wall_s"]["min"], "wall median": s["wall_s"]["median"],
                     "cpu median": s["cpu_s"]["median"],
                     "× logreg (median wall)": s["wall_s"]["median"] / lr["wall_s"]["median"]})
    print()
    print_table(rows, ["step", "wall min", "wall median", "cpu median", "× logreg (median wall)"],
                title=f"{len(y)} shots ({len(P)} classes × {args.per_class}, D = {X.shape[1]}), {source}, "
                      f"{args.repeats} repeats; peak RSS {peak_rss_mb():.0f} MB")
    fs = clf.fewshot_
    name = args.out or ("bench_fit_time" if (args.classes, args.per_class) == (100, 16)
                        else f"bench_fit_time_{args.classes}x{args.per_class}")
    path = save_result(name, {"shots": int(len(y)), "peak_rss_mb": peak_rss_mb(), "classes": int(len(P)), "dim": int(X.shape[1]), "source": source,
                                  "repeats": args.repeats, "runs": runs, "summary": summ,
                                  "adapt_vs_logreg_median_wall": summ["svgen adapt"]["wall_s"]["median"]
                                  / lr["wall_s"]["median"],
                                  "fewshot_choice": {"kernel": fs["kernel"], "linear": fs["linear"],
                                                     "default_head": fs["default_head"]},
                                  "machine": machine()})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Benchmark: ``svgen diagnose --confusions`` on LVIS, its time and how well it predicts measured confusions.

Fits (or loads, ``--artifact``) the LVIS zero-shot artifact of docs/usage.md (1,203 classes × K=4), then

* times :func:`svgen.evaluation.confusions.predicted_pairs` (top 20 pairs, blocks of classes) against the stock
  dense computation in the same run: every support row's kernel-head probabilities at once (M×C) and the C×C table
  of class means (one matrix product), then its top 20; both must list the same pairs;
* measures the default head on the LVIS dev features (one exemplar mean per even class) and counts how many of the 20
  most-confused measured (true, predicted) pairs are among the top 100 predicted pairs: directed (a → b) and
  unordered ({a, b}), over all pairs and over the pairs whose true class occurs in the labels (what ``svgen eval
  --confusions`` marks);
* the same counts for the scores tried and dropped (docs/history.md), computed densely here.

* with ``--coop``, the same count on the seven CoOp validation sets (text-like prototypes, many rows per class, so a
  measured pair is a frequent error, not a single one): zero-shot, and after 4 labelled shots per class drawn from val
  (seed 0; the rest of val measures).

    .venv/bin/python -m benchmarks.bench_confusions [--artifact lvis.svgen] [--json]
    .venv/bin/python -m benchmarks.bench_confusions --coop      # ~5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_common import DATA, machine, print_table, save_result

WINDOW, MEASURED = 100, 20


def fit_lvis(out: Path) -> None:
    from svgen.cli import main

    code = main(["-q", "fit", "--prototypes", str(DATA / "lvis_v1_clip_a+cname.npy"), "--classes",
                 str(DATA / "lvis_classes.txt"), "-K", "4", "--out", str(out)])
    if code != 0:
        sys.exit(f"fit failed ({code})")


def dense_table(clf) -> torch.Tensor:
    """The stock way: all rows' probabilities at once, the C×C class-mean table by one product."""
    ss = clf.heads_.kernel.support_set()
    with torch.no_grad():
        p = clf.predict_proba(ss.rows.float(), head="kernel").double()
    Y = torch.nn.functional.one_hot(ss.labels, len(clf.classes_)).double()
    return (Y.T @ p) / Y.sum(0).clamp_min(1)[:, None]


def top_pairs(table: torch.Tensor, n: int, among=None, symmetric: bool = False):
    t = table.clone()
    t.fill_diagonal_(-float("inf"))
    if among is not None:
        keep = torch.zeros(t.shape[0], dtype=torch.bool)
        keep[torch.as_tensor(among)] = True
        t[~keep] = -float("inf") if not symmetric else t[~keep]
        if symmetric:
            t[~keep[:, None] & ~keep[None, :]] = -float("inf")
    if symmetric:
        t = torch.triu(t, 1) + torch.tril(torch.full_like(t, -float("inf")))
    v, i = torch.topk(t.reshape(-1), n)
    C = t.shape[0]
    return [(int(j) // C, int(j) % C) for j in i]


def hits(measured, pairs) -> dict:
    directed = set(pairs)
    unordered = {(min(a, b), max(a, b)) for a, b in pairs}
    return {"directed": sum((m.a, m.b) in directed for m in measured),
            "unordered": sum((min(m.a, m.b), max(m.a, m.b)) in unordered for m in measured)}


def directed_ranks(table: torch.Tensor, measured, among) -> dict:
    """The rank (1 = most confusable) of each measured pair among the directed pairs whose true class is in
    ``among``."""
    t = table[torch.as_tensor(among)].clone()
    t[torch.arange(len(among)), torch.as_tensor(among)] = -float("inf")
    flat = t.reshape(-1)
    at = {int(c): i for i, c in enumerate(among)}
    ranks = [int((flat > t[at[m.a], m.b]).sum()) + 1 for m in measured]
    return {"of": int(len(among) * (table.shape[0] - 1)), "ranks": ranks}


def alternatives(clf) -> dict:
    """The scores tried before the chosen one (C×C tables; symmetric ones say so)."""
    from svgen.core.kernels import kernel

    kh = clf.heads_.kernel
    ss = kh.support_set()
    R = ss.rows.double()
    C = len(clf.classes_)
    Y = torch.nn.functional.one_hot(ss.labels, C).double()
    A = (kh.votes.to_dense() if kh.votes.is_sparse else kh.votes).double()
    K = kernel(R, R, kh.bandwidth, clf.kernel)
    G = Y.T @ K @ Y
    d = G.diagonal().clamp_min(1e-300).sqrt()
    KA = K @ A
    T = clf.heads_.calibration.temperatures["kernel"]
    P = torch.nn.functional.normalize(clf.prototypes_.double(), dim=-1)
    # an image has cosine ≈ 0.3 with its class's text: at such an input the RBF kernel is exp(0.3·(cos − 1)/σ²) up
    # to a factor per input, which the log-score logits cancel: the kernel head at "image-like" inputs, bandwidth σ/√0.3
    wide = kernel(R, R, kh.bandwidth / 0.3 ** 0.5, clf.kernel) @ A
    p_wide = torch.softmax(torch.log(wide.clamp_min(1e-30)) / T, 1)
    return {"cosine of the kernel mean embeddings of S_a, S_b (symmetric)": (G / d[:, None] / d[None, :], True),
            "mean vote for b at S_a, k(S_a, S)·A": ((Y.T @ KA) / Y.sum(0)[:, None], False),
            "mean softmax(vote / T) of b at S_a": ((Y.T @ torch.softmax(KA / T, 1)) / Y.sum(0)[:, None], False),
            "chosen, kernel widened to image-like inputs (σ/√0.3)": ((Y.T @ p_wide) / Y.sum(0)[:, None], False),
            "reference: cosine of the class prototypes (symmetric)": (P @ P.T, True)}


COOP = ("caltech101", "fgvc", "oxford_flowers", "oxford_pets", "stanford_cars", "sun397", "ucf101")


def coop_rows(shots_list=(0, 4), seed: int = 0) -> list:
    """Of the 20 most-confused measured pairs of each CoOp val set, how many are among the top 100 predicted (the
    report ``svgen eval --confusions`` prints), zero-shot and with k shots per class taken from val."""
    from svgen import SVGClassifier
    from svgen.evaluation.confusions import confusion_report

    rows = []
    for name in COOP:
        folder = DATA / "coop-fewshot" / name
        P = np.load(folder / "textlike_prototypes.npy").astype(np.float32)
        X = np.load(folder / "val_features.npy").astype(np.float32)
        y = np.load(folder / "val_labels.npy")
        for k in shots_list:
            shot = np.zeros(len(y), bool)
            rng = np.random.default_rng(seed)
            for c in np.unique(y) if k else ():
                i = np.flatnonzero(y == c)
                shot[rng.choice(i, min(k, len(i) - 1), replace=False)] = True
            clf = SVGClassifier().fit(P, classes=[f"c{i}" for i in range(len(P))],
                                      shots=(X[shot], y[shot]) if k else None)
            r = confusion_report(clf, torch.from_numpy(X[~shot]), y[~shot], top=MEASURED, window=WINDOW)
            rows.append({"dataset": name, "shots": k, "head": r["head"], "errors": r["errors"],
                         "n": r["n"], "of 20 in top 100": r["measured_in_predicted"]})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--artifact", help="an LVIS artifact already fit as in docs/usage.md (else fit one, ~15 s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--coop", action="store_true", help="the seven CoOp val sets instead of LVIS (zero-shot, 4 shots)")
    args = ap.parse_args(argv)
    if args.coop:
        rows = coop_rows()
        for k in sorted({r["shots"] for r in rows}):
            mine = [r for r in rows if r["shots"] == k]
            rows.append({"dataset": "total", "shots": k, "head": "", "errors": sum(r["errors"] for r in mine),
                         "n": sum(r["n"] for r in mine), "of 20 in top 100": sum(r["of 20 in top 100"] for r in mine)})
        path = save_result("confusions_coop", {"rows": rows, "window": WINDOW, "machine": machine()})
        print(json.dumps(rows, indent=2) if args.json else "")
        print_table(rows, ["dataset", "shots", "head", "n", "errors", "of 20 in top 100"],
                    title=f"CoOp val: of the {MEASURED} most-confused measured pairs, how many are among the top "
                          f"{WINDOW} predicted")
        print(f"wrote {path}")
        return
    if not (DATA / "lvis_dev_image_features.npy").is_file():
        sys.exit(f"{DATA} is absent: this benchmark needs the shared LVIS embeddings")
    from svgen import SVGClassifier
    from svgen.evaluation.confusions import measured_on, measured_pairs, predicted_pairs

    with tempfile.TemporaryDirectory() as tmp:
        art = Path(args.artifact) if args.artifact else Path(tmp) / "lvis.svgen"
        if not args.artifact:
            fit_lvis(art)
        clf = SVGClassifier.load(art)
    ss = clf.heads_.kernel.support_set()
    t0, c0 = time.perf_counter(), time.process_time()
    ours = predicted_pairs(clf, MEASURED)
    t_ours, c_ours = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    table = dense_table(clf)
    stock = top_pairs(table, MEASURED)
    t_stock, c_stock = time.perf_counter() - t0, time.process_time() - c0
    same = [(p.a, p.b) for p in ours] == stock

    x = np.load(DATA / "lvis_dev_image_features.npy")
    y = np.load(DATA / "lvis_dev_labels.npy")
    pred, conf = measured_on(clf, x, y)
    measured = measured_pairs(y, pred, conf, MEASURED)
    present = np.unique(y)
    rows = [{"score": "chosen: mean kernel-head probability of b at S_a", "over": over,
             **hits(measured, top_pairs(table, WINDOW, among))}
            for over, among in (("all pairs", None), ("true class labelled", present))]
    for name, (t, sym) in alternatives(clf).items():
        for over, among in (("all pairs", None), ("true class labelled", present)):
            rows.append({"score": name, "over": over, **hits(measured, top_pairs(t, WINDOW, among, symmetric=sym))})
    ranks = directed_ranks(table, measured, present)
    result = {"artifact": f"LVIS zero-shot, {len(clf.classes_)} classes × K={clf.fit_config_.n_support}, "
                          f"{len(ss)} support rows",
              "top20_s": {"svgen (blocks of classes)": t_ours, "dense M×C then C×C (stock)": t_stock,
                          "ratio": t_ours / t_stock, "same_pairs": same},
              "top20_cpu_s": {"svgen (blocks of classes)": c_ours, "dense M×C then C×C (stock)": c_stock},
              "measured_pair_ranks": {"of_directed_pairs": ranks["of"], "ranks": ranks["ranks"],
                                      "median": float(np.median(ranks["ranks"])) if ranks["ranks"] else None},
              "measured": {"n": int(len(y)), "errors": int((pred != y).sum()),
                           "counts_of_top20": [m.count for m in measured]},
              "window": WINDOW, "hits_of_20": rows, "machine": machine()}
    path = save_result("confusions", result)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['artifact']}: top {MEASURED} pairs in {t_ours:.2f} s (svgen, blocks) vs {t_stock:.2f} s "
          f"(dense stock), ratio {t_ours / t_stock:.2f}, same pairs: {same}")
    print(f"CPU time: {c_ours:.2f} s (svgen) vs {c_stock:.2f} s (stock)")
    print(f"ranks of the measured pairs among the {ranks['of']} directed pairs with a labelled true class (chosen "
          f"score): median {result['measured_pair_ranks']['median']:.0f}, {sorted(ranks['ranks'])}")
    print(f"measured on {len(y)} dev rows: {result['measured']['errors']} errors; counts of the top {MEASURED} "
          f"measured pairs: {result['measured']['counts_of_top20']}")
    print_table(rows, ["score", "over", "directed", "unordered"],
                title=f"of the {MEASURED} most-confused measured pairs, how many are among the top {WINDOW} predicted")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

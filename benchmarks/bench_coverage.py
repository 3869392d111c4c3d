#!/usr/bin/env python
"""Shots for only some of the classes: is svgen still never below zero-shot?

Data: ``benchmarks/bench_adapt.py``'s (real CLIP ViT-B/32 validation features of the CoOp sets, their text-like
prototypes). For each seed a random share ``--coverage`` of the classes gets k validation shots each; the other
classes get none; the queries are every other validation image (of all classes). Compared, image by image:

* ``zero_shot``  cosine, ``softmax(100 · x̂ P̂ᵀ)``
* ``untilted``   the mixture of the adapted kernel and linear heads at the weight the shots alone chose, without
                 the tilt (what svgen deployed before :mod:`svgen.adapt.shotless`)
* ``svgen``      the default head (``predict_proba``): the mixture at the weight fitted with the tilt, the classes
                 without shots × e^δ

Reported per dataset, coverage and shot count: top-1 and NLL, paired bootstrap 95% intervals of svgen − zero-shot
(all queries, and the queries of classes with and without shots) and of untilted − zero-shot; w and δ per seed.

    python -m benchmarks.bench_coverage                         # 6 sets × coverage 0.1/0.25/0.5/0.9 × 1/4 shots
    python -m benchmarks.bench_coverage --datasets sun397 --coverage 0.5 --shots 4 --seeds 1

Writes ``bench-results/bench_coverage.json`` (``--out``) and prints the table (``--render FILE`` reprints it).
"""

from __future__ import annotations

import copy
import json
import sys

import numpy as np

from benchmarks.bench_common import (bootstrap, coop_parser, fmt_ci, image_nll, load_dataset, machine, render_or_missing,
                                     md_table, save_result, softmax)

DATASETS = ("caltech101", "fgvc", "oxford_pets", "sun397", "stanford_cars", "ucf101")
COVERAGE = (0.1, 0.25, 0.5, 0.9)


def draw(y, n_classes, share, k, seed):
    """(shots, queries, classes with shots): k shots of each of round(share·C) random classes (seeded)."""
    rng = np.random.default_rng(seed)
    some = rng.permutation(n_classes)[: max(2, int(round(share * n_classes)))]
    s = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:k] for c in some]))
    return s, np.setdiff1d(np.arange(len(y)), s), some


def run(name, shares, shots, seeds, log):
    X, y, P, C, base = load_dataset(name)
    rows = []
    for share in shares:
        for k in shots:
            per = {m: {"top1": [], "nll": []} for m in ("zero_shot", "untilted", "svgen")}
            covered, deltas, weights = [], [], []
            for seed in range(seeds):
                s, q, some = draw(y, C, share, k, seed)
                clf = copy.deepcopy(base).adapt(X[s].astype(np.float32), y[s])
                Q, yq = X[q].astype(np.float32), y[q]
                cal = clf.heads_.calibration
                w = clf.fewshot_["head_choice"]["mixture_weight"]
                probs = {"zero_shot": softmax(100.0 * X[q] @ P.T), "svgen": np.asarray(clf.predict_proba(Q), np.float64),
                         "untilted": w * np.asarray(clf.predict_proba(Q, head="kernel"), np.float64)
                         + (1 - w) * np.asarray(clf.predict_proba(Q, head="linear"), np.float64)}
                for m, p in probs.items():
                    per[m]["top1"].append((p.argmax(1) == yq).astype(float))
                    per[m]["nll"].append(image_nll(p, yq))
                covered.append(np.isin(yq, some))
                deltas.append(float(cal.shotless_offset or 0.0))
                weights.append(float(cal.mixture_weight if cal.mixture_weight is not None
                                     else {"kernel": 1.0, "linear": 0.0}[clf.default_head_]))
            cat = {m: {k2: np.concatenate(v) for k2, v in d.items()} for m, d in per.items()}
            g = np.concatenate(covered)
            d1 = 100 * (cat["svgen"]["top1"] - cat["zero_shot"]["top1"])
            row = {"dataset": name, "coverage": share, "shots": k, "deltas": deltas, "weights": weights,
                   "top1": {m: 100 * float(v["top1"].mean()) for m, v in cat.items()},
                   "nll": {m: float(v["nll"].mean()) for m, v in cat.items()},
                   "svgen_vs_zero_shot": bootstrap(d1),
                   "with_shots": bootstrap(d1[g]), "without_shots": bootstrap(d1[~g]),
                   "nll_vs_zero_shot": bootstrap(cat["svgen"]["nll"] - cat["zero_shot"]["nll"]),
                   "untilted_vs_zero_shot": bootstrap(100 * (cat["untilted"]["top1"] - cat["zero_shot"]["top1"]))}
            rows.append(row)
            log(f"{name:>14} cover {share:.2f} k={k}: zero-shot {row['top1']['zero_shot']:.1f} untilted "
                f"{row['top1']['untilted']:.1f} svgen {row['top1']['svgen']:.1f} δ {np.round(deltas, 2).tolist()} "
                f"w {np.round(weights, 2).tolist()}")
    return rows


def markdown(result: dict) -> str:
    lines = [f"Shots for a share of the classes; {len(result['seeds'])} seeds; the queries are every other validation "
             "image; intervals: paired bootstrap 95%.", ""]
    lines += md_table(
        ["dataset", "share with shots:", "shots:", "zero-shot / untilted / svgen top-1", "svgen − zero-shot top-1",
         "classes with shots", "without", "NLL svgen − zero-shot", "untilted − zero-shot top-1", "δ per seed",
         "w per seed"],
        [[r["dataset"], f"{r['coverage']:.2f}", r["shots"],
          f"{r['top1']['zero_shot']:.1f} / {r['top1']['untilted']:.1f} / {r['top1']['svgen']:.1f}",
          fmt_ci(r["svgen_vs_zero_shot"]), fmt_ci(r["with_shots"]), fmt_ci(r["without_shots"]),
          fmt_ci(r["nll_vs_zero_shot"], 3), fmt_ci(r["untilted_vs_zero_shot"]), ", ".join(f"{d:.2f}" for d in r["deltas"]),
          ", ".join(f"{w:.2f}" for w in r["weights"]) if "weights" in r else "–"] for r in result["rows"]])
    below = [r for r in result["rows"] if r["svgen_vs_zero_shot"]["diff"] < -0.3 or r["nll_vs_zero_shot"]["diff"] > 0]
    lines += ["", f"Rows below zero-shot − 0.3 in top-1 or above it in NLL: {len(below)} of {len(result['rows'])}"
              + (": " + "; ".join(f"{r['dataset']} {r['coverage']:.2f} × {r['shots']}" for r in below) if below else "")
              + "."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = coop_parser(__doc__, [1, 4], "bench_coverage", datasets=DATASETS, seeds=3)
    ap.add_argument("--coverage", nargs="+", type=float, default=list(COVERAGE), help="shares of classes with shots")
    args = ap.parse_args(argv)
    done = render_or_missing(args, markdown, "bench_coverage")
    if done is not None:
        return done
    log = lambda s: print(s, flush=True)  # noqa: E731
    rows = [r for n in args.datasets for r in run(n, args.coverage, args.shots, args.seeds, log)]
    result = {"datasets": args.datasets, "shots": args.shots, "coverage": args.coverage,
              "seeds": list(range(args.seeds)), "machine": machine(), "rows": rows}
    print("\n" + markdown(json.loads(json.dumps(result))), end="")
    print(f"\nwrote {save_result(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

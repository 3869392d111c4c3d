#!/usr/bin/env python
"""Few-shot benchmark: svgen's closed-form heads over image shots against the stock alternatives.

Data: real OpenAI CLIP ViT-B/32 features of five CoOp datasets in
``../shared/data/clip-vit-b32/coop-fewshot/`` (``train16``: 16 images per class, each row the mean
of 10 augmented views; ``val``: single centre crops; the test splits are held out). For 1, 2, 4,
8 and 16 shots per class, drawn from train16 with 3 seeds, in one run:

* ``ncm``      nearest class mean (cosine to the stand-in prototypes)
* ``logreg``   scikit-learn LogisticRegression, C chosen on a split of the shots
* ``tip``      Tip-Adapter training-free cache ``100·x̂Pᵀ + α·exp(−β(1 − x̂Xᵀ))Y``, β and α chosen
               on the same split
* ``lda``      GDA with one shared covariance (scikit-learn LDA, Ledoit–Wolf shrinkage)
* ``svgen_kernel`` / ``svgen_linear``  ``SVGClassifier.fit(P)`` then ``adapt(X, y)``: the
               kernel-vote head and the linear (LDA with prior means) head, settings by exact LOO over the shots
* ``svgen_loo``  the head ``loo_better_head`` names: the paired LOO comparison of the two heads with the
               prior off, kernel only if ahead by more than one standard error (no validation labels)

These sets have no text embeddings: **the stand-in prototypes P are the class means of the shots**
(for every method that needs prototypes: ncm, tip, svgen). They contain the very shots the heads are
fitted on, so svgen's leave-one-out sees a prior that already knows the left-out shot; with real
text prototypes that leak does not exist. "A split of the shots": half of each class's shots fit,
the other half score; with 1 shot per class there is nothing to split and the defaults are used
(logreg C=1, Tip-Adapter β=5.5, α=1). Nothing is chosen on validation labels; they are only
scored. Paired bootstrap intervals (images resampled within each dataset, seeds averaged per
image) compare svgen's heads with the best baseline on the mean over the datasets.

    python -m benchmarks.bench_fewshot                       # all 5 datasets, ~20 min on 2 idle cores (hours under load)
    python -m benchmarks.bench_fewshot --datasets oxford_pets --shots 1 4 --seeds 1   # quick look

Writes ``bench-results/bench_fewshot.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.bench_common import DATA, machine, print_table, save_result

FEWSHOT = DATA / "coop-fewshot"
DATASETS = ("caltech101", "fgvc", "oxford_flowers", "oxford_pets", "ucf101")
SHOTS = (1, 2, 4, 8, 16)
BASELINES = ("ncm", "logreg", "tip", "lda")
SVGEN = ("svgen_kernel", "svgen_linear", "svgen_loo")
LOGREG_C = (0.1, 1.0, 10.0, 100.0)
TIP_BETA = (1.0, 2.0, 3.5, 5.5, 7.0, 9.0)
TIP_ALPHA = (0.25, 0.5, 1.0, 2.0, 4.0)


def unit(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def class_means(X, y, C):
    return unit(np.stack([X[y == c].mean(axis=0) for c in range(C)]))


def split(y, seed):
    """Half of each class's shots (at least one) for fitting, the rest for scoring; None with 1 shot."""
    rng = np.random.default_rng(seed)
    fit, score = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        if len(idx) < 2:
            return None
        half = len(idx) // 2
        fit += list(idx[:half]); score += list(idx[half:])
    return np.array(fit), np.array(score)


# ----------------------------------------------------------------------------- baselines

def logreg(X, y, C_value):
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LogisticRegression(C=C_value, max_iter=300, tol=1e-3).fit(X, y)


def fit_logreg(X, y, C, seed):
    parts = split(y, seed)
    best = 1.0
    if parts is not None:
        a, b = parts
        accs = [(logreg(X[a], y[a], c).predict(X[b]) == y[b]).mean() for c in LOGREG_C]
        best = LOGREG_C[int(np.argmax(accs))]
    m = logreg(X, y, best)
    W = np.zeros((C, X.shape[1]), np.float32)
    b = np.full(C, -1e9, np.float32)
    W[m.classes_], b[m.classes_] = m.coef_, m.intercept_
    return (lambda Q: Q @ W.T + b), {"C": best}


def tip_scores(Q, P, X, Y, beta, alpha):
    return 100.0 * Q @ P.T + alpha * np.exp(-beta * (1.0 - Q @ X.T)) @ Y


def fit_tip(X, y, C, seed):
    parts = split(y, seed)
    beta, alpha = 5.5, 1.0
    if parts is not None:
        a, b = parts
        P, Y = class_means(X[a], y[a], C), np.eye(C, dtype=np.float32)[y[a]]
        grid = [(be, al) for be in TIP_BETA for al in TIP_ALPHA]
        accs = [(tip_scores(X[b], P, X[a], Y, be, al).argmax(1) == y[b]).mean() for be, al in grid]
        beta, alpha = grid[int(np.argmax(accs))]
    P, Y = class_means(X, y, C), np.eye(C, dtype=np.float32)[y]
    return (lambda Q: tip_scores(Q, P, X, Y, beta, alpha)), {"beta": beta, "alpha": alpha}


def fit_lda(X, y, C, seed):
    """Gaussian classes with one shared covariance Σ (Ledoit–Wolf-shrunk within-class scatter), equal
    priors: ``x Σ⁻¹μ_cᵀ − ½ μ_c Σ⁻¹ μ_cᵀ``. With 1 shot per class there is no within-class scatter and Σ = I."""
    from sklearn.covariance import ledoit_wolf

    mu = np.stack([X[y == c].mean(axis=0) for c in range(C)]).astype(np.float64)
    R = X - mu[y]
    if len(y) > C:
        cov, shrink = ledoit_wolf(R, assume_centered=True)
    else:
        cov, shrink = np.eye(X.shape[1]), 1.0
    Wt = np.linalg.solve(cov, mu.T)
    b = -0.5 * np.einsum("cd,dc->c", mu, Wt)
    return (lambda Q: Q @ Wt + b), {"shrinkage": float(shrink)}


def fit_ncm(X, y, C, seed):
    P = class_means(X, y, C)
    return (lambda Q: Q @ P.T), {}


def fit_svgen(X, y, C, seed):
    from svgen import SVGClassifier

    clf = SVGClassifier(seed=seed).fit(class_means(X, y, C))
    t_zero = time.perf_counter()
    clf.adapt(X, y)
    t_adapt = time.perf_counter() - t_zero
    fs = clf.fewshot_
    info = {"kernel": {k: fs["kernel"][k] for k in ("sigma", "ridge_lambda", "prior_weight", "loo_error")},
            "linear": {k: fs["linear"][k] for k in ("shrinkage", "prior_shots", "loo_error")},
            "loo_better_head": fs["default_head"], "adapt_s": t_adapt}
    return clf, info


# ----------------------------------------------------------------------------- run

def sample_shots(y, k, seed):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(np.flatnonzero(y == c))[:k] for c in np.unique(y)])


def run_dataset(name, shots_list, seeds, log):
    d = FEWSHOT / name
    Xtr, ytr = unit(np.load(d / "train16_features.npy")), np.load(d / "train16_labels.npy").astype(np.int64)
    Xv, yv = unit(np.load(d / "val_features.npy")), np.load(d / "val_labels.npy").astype(np.int64)
    C = int(ytr.max()) + 1
    out = {}
    for k in shots_list:
        correct = {m: np.zeros(len(yv)) for m in BASELINES + SVGEN}
        times = {m: [] for m in BASELINES + ("svgen",)}
        choices = {m: [] for m in BASELINES + ("svgen",)}
        for seed in seeds:
            idx = sample_shots(ytr, k, seed)
            X, y = Xtr[idx], ytr[idx]
            for m, fit in (("ncm", fit_ncm), ("logreg", fit_logreg), ("tip", fit_tip), ("lda", fit_lda)):
                t0 = time.perf_counter()
                score, info = fit(X, y, C, seed)
                times[m].append(time.perf_counter() - t0)
                choices[m].append(info)
                correct[m] += (np.asarray(score(Xv)).argmax(1) == yv) / len(seeds)
            t0 = time.perf_counter()
            clf, info = fit_svgen(X, y, C, seed)
            times["svgen"].append(time.perf_counter() - t0)
            choices["svgen"].append(info)
            for head in ("kernel", "linear"):
                pred = np.asarray(clf.decision_function(Xv, head=head)).argmax(1)
                correct[f"svgen_{head}"] += (pred == yv) / len(seeds)
                if info["loo_better_head"] == head:
                    correct["svgen_loo"] += (pred == yv) / len(seeds)
        acc = {m: float(100 * v.mean()) for m, v in correct.items()}
        out[k] = {"acc": acc, "correct": correct, "fit_s": {m: float(np.mean(v)) for m, v in times.items()},
                  "choices": choices}
        log(f"{name:>15} {k:>2} shots: " + "  ".join(f"{m} {a:.1f}" for m, a in acc.items())
            + "  | fit s: " + " ".join(f"{m} {np.mean(v):.2f}" for m, v in times.items()))
    return out


def paired_bootstrap(per_dataset, a, b, reps=2000, seed=0):
    """95% interval of mean-over-datasets accuracy(a) − accuracy(b), images resampled within datasets."""
    return bootstrap_mean([100 * (r["correct"][a] - r["correct"][b]) for r in per_dataset], reps, seed)


def bootstrap_mean(diffs, reps=2000, seed=0):
    """Mean over datasets of per-image differences ``diffs`` (one array per dataset) and its 95% interval,
    images resampled within each dataset."""
    rng = np.random.default_rng(seed)
    est = float(np.mean([d.mean() for d in diffs]))
    boot = np.zeros(reps)
    for d in diffs:
        boot += d[rng.integers(0, len(d), size=(reps, len(d)))].mean(axis=1)
    boot /= len(diffs)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"diff": est, "ci95": [float(lo), float(hi)]}


def coop_parser(doc: str, shots, out: str, extra_datasets=(), datasets=DATASETS,
                seeds: int = 3) -> argparse.ArgumentParser:
    """The options every CoOp benchmark shares (this one, ``bench_transductive``, ``bench_adapt``, ``bench_pool``;
    ``extra_datasets`` are accepted by ``--datasets`` but not run by default)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(datasets), choices=(*datasets, *extra_datasets))
    ap.add_argument("--shots", nargs="+", type=int, default=list(shots))
    ap.add_argument("--seeds", type=int, default=seeds)
    ap.add_argument("--out", default=out, help="result name under bench-results/")
    ap.add_argument("--render", metavar="RESULT.json", help="print the markdown tables of a saved result and stop")
    return ap


def render_or_missing(args, markdown_fn, name: str):
    """``--render``: print a saved result's tables (exit 0); no CoOp data: say so (exit 2); else None (run)."""
    if args.render:
        print(markdown_fn(json.loads(Path(args.render).read_text())), end="")
        return 0
    if not FEWSHOT.is_dir():
        print(f"{name}: {FEWSHOT} is absent; nothing to measure", file=sys.stderr)
        return 2
    return None


def main(argv=None):
    args = coop_parser(__doc__, SHOTS, "bench_fewshot").parse_args(argv)
    code = render_or_missing(args, markdown, "bench_fewshot")
    if code is not None:
        return code
    logging.basicConfig(level=logging.WARNING)
    log = lambda s: print(s, flush=True)  # noqa: E731
    seeds = list(range(args.seeds))
    results, loads = {}, []
    for name in args.datasets:     # saved after every dataset: a cut-short run leaves a consistent result
        loads.append(round(os.getloadavg()[0], 2))
        results[name] = run_dataset(name, args.shots, seeds, log)
        path = summarise(results, list(results), args, seeds, loads, log, final=name == args.datasets[-1])
    print(markdown(json.loads(path.read_text())), end="")
    return 0


def summarise(results, datasets, args, seeds, loads, log, final=True):
    """Means over ``datasets``, paired bootstrap intervals, tables; writes the result JSON, returns its path."""
    methods = BASELINES + SVGEN
    rows, summary = [], {}
    for k in args.shots:
        per = [results[n][k] for n in datasets]
        mean = {m: float(np.mean([r["acc"][m] for r in per])) for m in methods}
        best_base = max(BASELINES, key=lambda m: mean[m])
        best_svgen = max(("svgen_kernel", "svgen_linear"), key=lambda m: mean[m])
        summary[k] = {"mean_acc": mean, "best_baseline": best_base,
                      "svgen_kernel_vs_best": paired_bootstrap(per, "svgen_kernel", best_base),
                      "svgen_linear_vs_best": paired_bootstrap(per, "svgen_linear", best_base),
                      "svgen_loo_vs_best": paired_bootstrap(per, "svgen_loo", best_base),
                      "svgen_better_vs_logreg": paired_bootstrap(per, best_svgen, "logreg"),
                      "fit_s": {m: float(np.mean([r["fit_s"][m] for r in per])) for m in per[0]["fit_s"]},
                      # per dataset: svgen's LOO-chosen head against logistic regression and the best baseline
                      "per_dataset_loo_vs": {n: {"logreg": paired_bootstrap([results[n][k]], "svgen_loo", "logreg"),
                                                 best_base: paired_bootstrap([results[n][k]], "svgen_loo", best_base)}
                                             for n in datasets}}
        rows.append({"shots": k, **{m: mean[m] for m in methods}, "best baseline": best_base,
                     "kernel−best [95% CI]": _ci(summary[k]["svgen_kernel_vs_best"]),
                     "loo−best [95% CI]": _ci(summary[k]["svgen_loo_vs_best"])})
    if final:
        print()
        print_table(rows, ["shots", *methods, "best baseline", "kernel−best [95% CI]", "loo−best [95% CI]"],
                    title=f"mean top-1 over {len(datasets)} datasets (val), {len(seeds)} seeds; stand-in prototypes = "
                          "class means of the shots")
        print()
        print_table([{"shots": k, **summary[k]["fit_s"]} for k in args.shots],
                    ["shots", *results[datasets[0]][args.shots[0]]["fit_s"]], title="mean fit time per fit (s)")
        print()
        per_ds = [{"dataset": n, "shots": k, **{m: results[n][k]["acc"][m] for m in methods}}
                  for n in datasets for k in args.shots]
        print_table(per_ds, ["dataset", "shots", *methods], title="per dataset")
    kept = {n: {k: {f: v for f, v in r.items() if f != "correct"} for k, r in results[n].items()} for n in datasets}
    path = save_result(args.out, {"datasets": datasets, "shots": args.shots, "seeds": seeds,
                                  "prototypes": "stand-in: class means of the shots", "summary": summary,
                                  "per_dataset": kept, "complete": final, "load_average_1m_per_dataset": loads,
                                  "machine": machine()})
    log(f"wrote {path} ({len(datasets)} of {len(args.datasets)} datasets)")
    return path


def _ci(r):
    return f"{r['diff']:+.2f} [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]"


NAMES = {"ncm": "nearest class mean", "logreg": "logistic regression", "tip": "Tip-Adapter", "lda": "LDA (GDA)",
         "svgen_kernel": "svgen kernel", "svgen_linear": "svgen linear", "svgen_loo": "svgen (LOO-chosen head)"}


def markdown(result: dict) -> str:
    """The docs tables (mean over datasets, intervals, fit times, per dataset) from a saved result."""
    shots, datasets = result["shots"], result["datasets"]
    summ = {int(k): v for k, v in result["summary"].items()}
    methods = list(BASELINES + SVGEN)
    out = ["| method | " + " | ".join(f"{k} shot{'s' if k > 1 else ''}" for k in shots) + " |",
           "|---|" + "---:|" * len(shots)]
    for m in methods:
        cells = []
        for k in shots:
            v = summ[k]["mean_acc"][m]
            best = max(summ[k]["mean_acc"][b] for b in methods)
            cells.append(f"**{v:.2f}**" if v == best else f"{v:.2f}")
        out.append(f"| {NAMES[m]} | " + " | ".join(cells) + " |")
    out += ["", "| shots | best baseline | svgen kernel − best | svgen linear − best | better svgen head − logreg |",
            "|---:|---|---|---|---|"]
    for k in shots:
        s = summ[k]
        out.append(f"| {k} | {NAMES[s['best_baseline']]} | {_ci(s['svgen_kernel_vs_best'])} | "
                   f"{_ci(s['svgen_linear_vs_best'])} | {_ci(s['svgen_better_vs_logreg'])} |")
    fit_cols = list(summ[shots[0]]["fit_s"])
    out += ["", "| shots | " + " | ".join(fit_cols) + " (zero-shot fit + adapt) | svgen adapt only |",
            "|---:|" + "---:|" * (len(fit_cols) + 1)]
    for k in shots:
        adapt = np.mean([c["adapt_s"] for n in datasets for c in result["per_dataset"][n][str(k)]["choices"]["svgen"]])
        out.append(f"| {k} | " + " | ".join(f"{summ[k]['fit_s'][m]:.2f}" for m in fit_cols) + f" | {adapt:.2f} |")
    if "per_dataset_loo_vs" in summ[shots[0]]:
        out += ["", "| dataset | shots | svgen (LOO-chosen head) − logistic regression | − best baseline (mean over datasets) |",
                "|---|---:|---|---|"]
        for n in datasets:
            for k in shots:
                s = summ[k]
                vs = s["per_dataset_loo_vs"][n]
                out.append(f"| {n} | {k} | {_ci(vs['logreg'])} | {_ci(vs[s['best_baseline']])} "
                           f"({NAMES[s['best_baseline']]}) |")
    out += ["", "| dataset | shots | " + " | ".join(NAMES[m] for m in methods) + " |",
            "|---|---:|" + "---:|" * len(methods)]
    for n in datasets:
        for k in shots:
            acc = result["per_dataset"][n][str(k)]["acc"]
            out.append(f"| {n} | {k} | " + " | ".join(f"{acc[m]:.1f}" for m in methods) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The kernel head's residual in logit space (ProKeR's form) against svgen's probability form, guarded (dev data).

svgen's adapted kernel head corrects CLIP's zero-shot *probabilities*: ``s = p₀ + k(x̂, X)V``
(:mod:`svgen.adapt.residual`). ProKeR adds the same kernel ridge residual to the zero-shot *logits*:
``z = 100·x̂P̂ᵀ + α·k(x̂, X)V``. This compares the kernel head's query top-1 of

* ``prob``     svgen's head exactly (``residual.fit_residual_head``; a refused head scores as zero-shot);
* ``logit``    the logit form with σ, c and α ∈ {1, 4, 16, 64, 256} chosen on the same balanced folds, the same
               class subset, median distance and grids (ties: larger c, then larger σ, then smaller α);
* ``guarded``  the logit form only where its held-out accuracy on those folds beats the probability form's by
               more than one standard error of the paired per-shot difference, else ``prob``.

Protocol as ``benchmarks.bench_adapt``: text-like prototypes, k validation shots per class, the rest of val are
the queries. Only the kernel head is compared (not svgen's choice between it and the LDA head), and the logit form
would need a new artifact format: a measurement, not a shipped method (docs/fewshot.md, "Tried and not adopted").

    python -m benchmarks.bench_logit_form                       # 2 and 4 shots, 7 sets, 3 seeds: ~2 min on 2 cores
    python -m benchmarks.bench_logit_form --datasets fgvc --shots 2 8 --seeds 1
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from benchmarks.bench_adapt import DATASETS, FEWSHOT, sample, unit
from benchmarks.bench_common import machine, save_result
from svgen.adapt import residual
from svgen.adapt.config import DEFAULT

ALPHAS = (1.0, 4.0, 16.0, 64.0, 256.0)
TAU = 100.0
VARIANTS = ("zs", "prob", "logit", "guarded")


def class_subset(labels, n_max, seed):
    """Indices of every shot of a random set of classes, at most ``n_max`` in all (None: all of them)."""
    if labels.shape[0] <= n_max:
        return None
    rng = np.random.default_rng(seed)
    counts = np.bincount(labels)
    chosen, total = [], 0
    for c in rng.permutation(np.flatnonzero(counts)):
        if total + counts[c] > n_max and chosen:
            continue
        chosen.append(c)
        total += counts[c]
    return np.flatnonzero(np.isin(labels, chosen))


def logit_select(Xs, ys, P, C, seed=0):
    sub = class_subset(ys, DEFAULT.select_max, seed)
    X, y = (Xs, ys) if sub is None else (Xs[sub], ys[sub])
    Y = np.eye(C)[y]
    z0 = TAU * X @ P.T
    p0 = residual.prior_probs(X, P, TAU)
    R = Y - p0
    d2 = np.maximum(2.0 - 2.0 * X @ X.T, 0.0)
    med = residual.median_distance(X, seed)
    folds = residual.balanced_folds(y, seed)
    held = np.concatenate(folds)
    nS, nC, nA = len(DEFAULT.sigma_factors), len(DEFAULT.ridges), len(ALPHAS)
    correct = np.zeros((nS, nC, nA, held.size), dtype=bool)
    start = 0
    for hf in folds:
        keep = np.setdiff1d(np.arange(len(y)), hf)
        for i, f in enumerate(DEFAULT.sigma_factors):
            s = f * med
            e, U = np.linalg.eigh(np.exp(-d2[np.ix_(keep, keep)] / (2 * s * s)))
            e, UR = np.maximum(e, 0.0), U.T @ R[keep]
            KU = np.exp(-d2[np.ix_(hf, keep)] / (2 * s * s)) @ U
            for j, c in enumerate(DEFAULT.ridges):
                corr = KU @ (UR / (e + c)[:, None])
                for a, al in enumerate(ALPHAS):
                    correct[i, j, a, start:start + hf.size] = (z0[hf] + al * corr).argmax(1) == y[hf]
        start += hf.size
    acc = correct.mean(axis=3)
    i, j, a = max(np.ndindex(acc.shape), key=lambda t: (acc[t], DEFAULT.ridges[t[1]], t[0], -t[2]))
    to_all = (lambda r: r) if sub is None else (lambda r: sub[r])
    return {"sigma": DEFAULT.sigma_factors[i] * med, "sigma_factor": DEFAULT.sigma_factors[i], "c": DEFAULT.ridges[j],
            "alpha": ALPHAS[a], "held_acc": float(acc[i, j, a]), "held_correct": correct[i, j, a],
            "held_rows": to_all(held), "median": med}


def run_dataset(name: str, shots, seeds) -> list:
    Xall = unit(np.load(FEWSHOT / name / "val_features.npy"))
    yall = np.load(FEWSHOT / name / "val_labels.npy").astype(np.int64)
    P = unit(np.load(FEWSHOT / name / "textlike_prototypes.npy"))
    C = P.shape[0]
    out = []
    for k in shots:
        if np.bincount(yall, minlength=C).min() <= k:
            continue
        rows = []
        for seed in range(seeds):
            t0 = time.perf_counter()
            s, q = sample(yall, k, seed)
            Xs, ys, Q, yq = Xall[s], yall[s], Xall[q], yall[q]
            # (1) probability form, exactly as deployed
            fit = residual.fit_residual_head(Xs.astype(np.float32), ys, P.astype(np.float32), C, seed=0)
            Xs, P_ = fit.rows, residual.unit(P.astype(np.float32))   # what the head saw (float32 -> unit float64)
            p0q = residual.prior_probs(Q, P_)
            s_prob = p0q + residual.rbf(Q, fit.rows, fit.sigma) @ fit.votes
            prob_ok = s_prob.argmax(1) == yq
            zs_ok = p0q.argmax(1) == yq
            held_prob = fit.held_scores.argmax(1) == ys[fit.held_rows]
            # (2) logit form on the same folds
            L = logit_select(Xs, ys, P_, C, seed=0)
            assert np.array_equal(L["held_rows"], fit.held_rows)
            assert abs(L["median"] - fit.record["selection"]["median_distance"]) < 1e-9
            V = residual.solve(Xs, ys, P_, C, L["sigma"], L["c"], TAU, 0)
            z_log = TAU * Q @ P_.T + L["alpha"] * residual.rbf(Q, Xs, L["sigma"]) @ V
            log_ok = z_log.argmax(1) == yq
            # (3) guard: paired per held-out shot, logit − prob
            d = L["held_correct"].astype(float) - held_prob.astype(float)
            se = float(d.std(ddof=1) / math.sqrt(d.size))
            pick_logit = bool(d.mean() > se)
            g_ok = log_ok if pick_logit else prob_ok
            # extra: logit form refused to zero-shot by paired_decision (same rule as the prob form)
            zs_held = residual.prior_probs(Xs[fit.held_rows], P_).argmax(1) == ys[fit.held_rows]
            dz = L["held_correct"].astype(float) - zs_held
            sez = float(dz.std(ddof=1) / math.sqrt(dz.size))
            logref_ok = log_ok if dz.mean() >= -sez else zs_ok
            r = {"dataset": name, "k": k, "seed": seed, "n_query": int(len(q)),
                 "zs": 100 * zs_ok.mean(), "prob": 100 * prob_ok.mean(), "logit": 100 * log_ok.mean(),
                 "guarded": 100 * g_ok.mean(), "logit_refusable": 100 * logref_ok.mean(),
                 "prob_adopted": bool(fit.adopted), "prob_sigma_factor": fit.record["selection"]["sigma_factor"],
                 "prob_c": fit.record["ridge_c"], "prob_held": float(held_prob.mean()),
                 "logit_held": L["held_acc"], "logit_sigma_factor": L["sigma_factor"], "logit_c": L["c"],
                 "logit_alpha": L["alpha"], "guard_diff": float(d.mean()), "guard_se": se, "pick_logit": pick_logit,
                 "n_held": int(d.size), "secs": time.perf_counter() - t0}
            rows.append(r)
        out.extend(rows)
    return out


def summary(rows: list) -> str:
    lines = []
    for k in sorted({r["k"] for r in rows}):
        R = [r for r in rows if r["k"] == k]
        sets = sorted({r["dataset"] for r in R})
        lines.append(f"{k} shots, {len(sets)} datasets, query top-1 (mean over seeds): " + " ".join(f"{v:>8}" for v in VARIANTS)
                     + "  guard picked logit")
        means = {v: [] for v in VARIANTS}
        for d in sets:
            Rd = [r for r in R if r["dataset"] == d]
            m = {v: float(np.mean([r[v] for r in Rd])) for v in VARIANTS}
            for v in VARIANTS:
                means[v].append(m[v])
            lines.append(f"  {d:<15}" + " ".join(f"{m[v]:8.2f}" for v in VARIANTS)
                         + f"  {sum(r['pick_logit'] for r in Rd)}/{len(Rd)}")
        lines.append(f"  {'mean':<15}" + " ".join(f"{np.mean(means[v]):8.2f}" for v in VARIANTS)
                     + f"  {sum(r['pick_logit'] for r in R)}/{len(R)}")
        wrong = [r for r in R if r["pick_logit"] and r["logit"] < r["prob"]]
        lines.append(f"  the guard picked the logit form {sum(r['pick_logit'] for r in R)} times; "
                     f"{len(wrong)} of them were worse on the queries")
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks.bench_fewshot import coop_parser, render_or_missing

    args = coop_parser(__doc__, (2, 4), "bench_logit_form", datasets=DATASETS).parse_args(argv)
    code = render_or_missing(args, lambda result: result["summary"] + "\n", "bench_logit_form")
    if code is not None:
        return code
    rows = [r for name in args.datasets for r in run_dataset(name, args.shots, args.seeds)]
    text = summary(rows)
    print(text)
    path = save_result(args.out, {"machine": machine(), "rows": rows, "summary": text})
    print(f"wrote {path}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

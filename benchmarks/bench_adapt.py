#!/usr/bin/env python
"""svgen with labelled shots against its peers, on text-like prototypes, in one run.

Data: real CLIP ViT-B/32 validation features of seven CoOp datasets and their **text-like
prototypes** (``../shared/data/clip-vit-b32/coop-fewshot/*/textlike_prototypes.npy``: class means of
the train rows mapped into CLIP's text region; they contain no validation image). Shots are k
single validation images per class (k = 1, 2, 4, 8, 16 where every class has more than k), the
queries the rest of the validation set, 3 seeds. Every method sees the same prototypes, shots and
queries:

* ``zero_shot``     cosine, ``100 · x̂ P̂ᵀ`` (CLIP's zero-shot classifier)
* ``svgen``         ``SVGClassifier().fit(P).adapt(X, y)``, the default head (what classify uses), defaults unchanged
* ``tip``           Tip-Adapter, paper defaults: ``100·x̂P̂ᵀ + α·exp(−β(1 − x̂Xᵀ))Y``, α = 1, β = 5.5
* ``tip_cv``        Tip-Adapter, β and α by 2-fold cross-validation on the shots
* ``gda_cv``        GDA (Wang et al., ICLR 2024): class means, one covariance with the authors' KS shrinkage
                    estimator ``Σ⁻¹ = D·((N − 1)S + tr(S)·I)⁺`` (S the pooled within-class sample covariance),
                    ``100·x̂P̂ᵀ + α·(x̂Σ⁻¹μᵀ − ½ μΣ⁻¹μᵀ)``, α from the authors' grid {10⁻⁴ … 100} by cross-validation on the
                    shots (1 shot: S = 0 and the formula gives zero-shot; Σ = I and α = 1 stand in, as for the variant)
* ``gda_loo``       the same GDA (KS estimator) with α from the authors' grid by exact leave-one-shot-out over
                    all shots of all classes (each left-out shot scored against every class; 1 shot: as ``gda_cv``)
* ``proker``        ProKeR with its published fixed settings (its code's ImageNet mode): raw-cosine logits
                    ``x̂P̂ᵀ + k(x̂, X)·A``, ``A = (K/λ + I)⁻¹(Y − XP̂ᵀ)``, ``k = exp(−β(1 − cos))``, (β, λ) = (3, .05),
                    (2.6, .05), (1.5, .05), (1.66, .07), (1.7, .1) at 1 / 2 / 4 / 8 / 16 shots
* ``gda_lw_cv``     the same with a Ledoit–Wolf-shrunk covariance (scikit-learn) and svgen's α grid: a variant that
                    cross-validates better on few shots (the older tables of docs/history.md call it ``gda_cv``)
* ``proker_cv``     ProKeR-style kernel ridge on the zero-shot residual:
                    ``100·x̂P̂ᵀ + α·k(x, X)(K + λI)⁻¹(Y − softmax(100·XP̂ᵀ))``, β, λ, α by cross-validation (1 shot: β = 5.5, λ = 1, α = 1)
* ``logreg_cv``     scikit-learn LogisticRegression on the shots alone, C by cross-validation
* ``lpp``           LP++ (Huang et al., CVPR 2024): ``x̂Wᵀ + b + α_c·x̂P̂ᵀ``, full-batch gradient descent with the
                    step sizes and starting point derived from the shots (:func:`lpp_fit`); validation-free by
                    design, so its defaults are what a user runs (the final iterate of 300 epochs)
* ``*_oracle``      Tip-Adapter, GDA and ProKeR with the hyper-parameters that maximise **query** accuracy, and
                    LP++ at the epoch (every 10th) with the best query accuracy (what the authors' code does with
                    a labelled validation split): not something a user can do; an upper line only

``svgen_kernel`` and ``svgen_linear`` are svgen's two heads alone; for each of svgen's heads (kernel, linear, the
default) the tables also give its accuracy estimated on the held-out shots (``fewshot_["head_choice"]``) next to its
accuracy on the queries. ``--datasets all7`` runs the seven sets as one problem of 1,033 classes (labels offset
set by set, prototypes stacked): the many-classes, few-shots regime of ImageNet, with more shots than
``AdaptConfig.select_max`` from 1 shot on. ``--peers`` runs a subset of the peers (the slow ones are ``logreg_cv`` and ``lpp``).

"Cross-validation on the shots": half of each class's shots fit, the other half score, then the
halves swap; with one shot per class there is nothing to split and the defaults above are used.
Reported per dataset and shot count: top-1, top-5 and NLL (svgen: ``predict_proba``; zero-shot:
softmax of the cosine logits), paired bootstrap 95% intervals of svgen − zero-shot and svgen − tip.

    python -m benchmarks.bench_adapt                                # everything, ~15 min on 2 idle cores
    python -m benchmarks.bench_adapt --datasets oxford_pets --shots 1 2 --seeds 1
    python -m benchmarks.bench_adapt --compare before.json after.json   # two saved results side by side

Writes ``bench-results/bench_adapt.json`` and prints the tables (``--render FILE`` prints the markdown).
"""

from __future__ import annotations

import copy
import sys
import time
import warnings

import numpy as np

from benchmarks.bench_common import (COOP_SETS as DATASETS, UNION, bootstrap, load_dataset, machine, sample,
                                     save_result, softmax)
from benchmarks.bench_common import unit  # noqa: F401  (tests take the helpers from here)

SHOTS = (1, 2, 4, 8, 16)
TIP_BETA = (1.0, 2.0, 3.5, 5.5, 7.0, 9.0)
ALPHAS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
RIDGES = (0.01, 0.1, 1.0, 10.0)
LOGREG_C = (0.1, 1.0, 10.0, 100.0)
LPP_EPOCHS = 300      # LP++'s default (the authors' configs/base.yaml train_epoch)
LPP_ALPHA_EVERY = 10  # LP++ updates its blending vector every 10th epoch
GDA_ALPHAS = (1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0)   # the GDA authors' grid (main_few_shots.py)
PEERS = ("tip", "tip_cv", "gda_cv", "gda_loo", "gda_lw_cv", "proker", "proker_cv", "logreg_cv", "lpp")
PROKER_PUBLISHED = {1: (3.0, 0.05), 2: (2.6, 0.05), 4: (1.5, 0.05), 8: (1.66, 0.07), 16: (1.7, 0.1)}   # (β, λ)
HEADS = ("kernel", "linear", "default")
SVGEN_INFO = ("estimate", "query", "default_heads", "mixture_weights", "kernel_adopted", "adapt_s")
ORACLES = ("tip_oracle", "gda_oracle", "gda_lw_oracle", "proker_oracle", "lpp_oracle")


def halves(y, seed):
    """Two folds, half of each class's shots in each; None with one shot per class."""
    if np.bincount(y).min() < 2:
        return None
    rng = np.random.default_rng(seed)
    a = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        a += list(idx[:len(idx) // 2])
    a = np.sort(np.array(a))
    return [(a, np.setdiff1d(np.arange(len(y)), a)), (np.setdiff1d(np.arange(len(y)), a), a)]


# ----------------------------------------------------------------------------- peers: score functions

def tip_scores(Q, P, X, Y, beta, alpha):
    return 100.0 * Q @ P.T + alpha * np.exp(-beta * (1.0 - Q @ X.T)) @ Y


def gda_terms(X, y, C, estimator="ks"):
    """(W, b): ``x Σ⁻¹μᵀ − ½ μΣ⁻¹μᵀ`` from class means and one shared covariance: GDA's KS estimator
    ``Σ⁻¹ = D·((N − 1)S + tr(S)·I)⁺`` with S the sample covariance of the class-centred shots (``estimator="ks"``, as
    the authors' code computes it), or a Ledoit–Wolf-shrunk covariance (``"lw"``). With one shot per class (no
    within-class scatter) Σ = I."""
    from sklearn.covariance import ledoit_wolf

    mu = np.stack([X[y == c].mean(axis=0) for c in range(C)])
    D = X.shape[1]
    if len(y) <= C:
        inv = np.eye(D)
    elif estimator == "ks":
        S = np.cov((X - mu[y]).T)
        inv = D * np.linalg.pinv((len(y) - 1) * S + np.trace(S) * np.eye(D))
    else:
        inv = np.linalg.inv(ledoit_wolf(X - mu[y], assume_centered=True)[0])
    W = inv @ mu.T
    return W, -0.5 * np.einsum("cd,dc->c", mu, W)


def proker_terms(X, y, P, C, beta, lam):
    K = np.exp(-beta * (1.0 - X @ X.T))
    R = np.eye(C)[y] - softmax(100.0 * X @ P.T)
    return np.linalg.solve(K + lam * np.eye(len(y)), R)


def proker_published(Q, X, y, P, C, k):
    """ProKeR at its published fixed (β, λ) for ``k`` shots: ``x̂P̂ᵀ + k(x̂, X)(K/λ + I)⁻¹(Y − XP̂ᵀ)`` (raw cosines)."""
    beta, lam = PROKER_PUBLISHED[k]
    K = np.exp(-beta * (1.0 - X @ X.T))
    A = np.linalg.solve(K / lam + np.eye(len(y)), np.eye(C)[y] - X @ P.T)
    return Q @ P.T + np.exp(-beta * (1.0 - Q @ X.T)) @ A


def gda_loo_logits(X, y, C):
    """N×C exact leave-one-shot-out logits of GDA's discriminant (KS estimator, :func:`gda_terms`): shot i left out
    downdates its class mean and the within-class scatter ``S_w`` by rank one (``n/(n−1)·u uᵀ``, ``u = x_i − x̄_c``)
    and the KS trace term; in the eigenbasis of ``S_w`` the inverse is diagonal plus a Sherman–Morrison term. Every
    class keeps its shots; each left-out shot is scored against all C classes. Needs ≥ 2 shots in every class."""
    N, D = X.shape
    n = np.bincount(y, minlength=C).astype(float)
    mu = np.zeros((C, D))
    np.add.at(mu, y, X)
    mu /= n[:, None]
    U = X - mu[y]
    omega, V = np.linalg.eigh(U.T @ U)
    omega = np.maximum(omega, 0.0)
    beta = n[y] / (n[y] - 1)
    Uv, Xv, Mv = U @ V, X @ V, mu @ V
    t = (omega.sum() - beta * (Uv * Uv).sum(axis=1)) / (N - 2)     # the KS trace term without shot i
    B = 1.0 / (omega[None, :] + t[:, None])                         # N×D
    w = B * Uv
    coef = beta / (1.0 - beta * (Uv * w).sum(axis=1))
    own = (n[y][:, None] * Mv[y] - Xv) / (n[y] - 1)[:, None]       # the own class's mean without shot i
    WM, xw = w @ Mv.T, (Xv * w).sum(axis=1)
    z = (Xv * B) @ Mv.T + coef[:, None] * xw[:, None] * WM - 0.5 * (B @ (Mv * Mv).T + coef[:, None] * WM * WM)
    wo = (w * own).sum(axis=1)
    r = np.arange(N)
    z[r, y] = (Xv * B * own).sum(axis=1) + coef * xw * wo - 0.5 * ((own * own * B).sum(axis=1) + coef * wo * wo)
    return D * z


def gda_loo_scorer(X, y, P, C):
    """GDA (KS estimator) with α from the authors' grid by exact leave-one-shot-out (ties: the smaller α); one shot
    per class: Σ = I and α = 1, as :func:`gda_terms`."""
    W, b = gda_terms(X, y, C, "ks")
    alpha = 1.0
    if np.bincount(y, minlength=C).min() >= 2:
        Z, L = 100.0 * X @ P.T, gda_loo_logits(X, y, C)
        alpha = GDA_ALPHAS[int(np.argmax([((Z + a * L).argmax(1) == y).mean() for a in GDA_ALPHAS]))]
    return lambda Q: 100.0 * Q @ P.T + alpha * (Q @ W + b), {"alpha": alpha}


def lpp_fit(X, y, P, C, epochs=LPP_EPOCHS, snapshot_every=None, dtype=np.float32):
    """LP++ (Huang, Shakeri, Dolz, Boudiaf, Bahig, Ben Ayed, CVPR 2024) on shots ``X`` (unit rows), labels ``y``,
    unit text prototypes ``P``: logits ``x̂Wᵀ + b + α ⊙ x̂P̂ᵀ`` (one blending weight per class), the mean
    cross-entropy of the shots minimised by block coordinate descent with data-derived step sizes, as in the
    authors' code (FewShot-CLIP-Strong-Baseline, ``methods/linear_probe_p2.py``, case 1):

    * W starts at the class *sums* of the shots, b at 0 (the code's ``nn.Linear`` bias starts random);
    * α starts at ``250 · mean_c mean_{i∈c} x̂_i·p̂_c`` for every class;
    * (W, b): full-batch SGD with momentum 0.9 at step ``4N / λ_max(XᵀX)``, every epoch;
    * α: a gradient step of ``N / (4 · max_c Σ_i (x̂_i·p̂_c)²)`` every 10th epoch. The code never zeroes α's
      gradient, so that step follows the gradients of *all* epochs so far, summed; kept, since that is what
      produced the published numbers.

    Returns the scorer of the final iterate and, with ``snapshot_every``, the scorers at every such epoch."""
    X = np.asarray(X, dtype=dtype)
    Pd = np.asarray(P, dtype=dtype)
    N = len(y)
    Y = np.eye(C, dtype=dtype)[y]
    S = X @ Pd.T                                          # N×C text logits (cosines)
    W = (Y.T @ X).astype(dtype)                           # class sums
    b = np.zeros(C, dtype=dtype)
    own = np.bincount(y, weights=S[np.arange(N), y], minlength=C) / np.maximum(np.bincount(y, minlength=C), 1)
    alpha = np.full(C, 250.0 * own.mean(), dtype=dtype)
    lr_w = 4.0 * N / float(np.linalg.eigvalsh(X.T.astype(np.float64) @ X.astype(np.float64)).max())
    lr_alpha = N / (4.0 * float((S.astype(np.float64) ** 2).sum(axis=0).max()))
    vW, vb = np.zeros_like(W), np.zeros_like(b)
    g_alpha = np.zeros(C, dtype=np.float64)
    snaps = []

    def scorer(W, b, alpha):
        return lambda Q: np.asarray(Q, dtype=dtype) @ W.T + b + alpha * (np.asarray(Q, dtype=dtype) @ Pd.T)

    for epoch in range(epochs):
        G = softmax((X @ W.T + b + alpha * S).astype(np.float64))
        G = (G - Y) / N                                   # d(mean CE)/d(logits)
        g_alpha += (G * S).sum(axis=0)                    # accumulated, as in the authors' code
        vW = 0.9 * vW + (G.T @ X).astype(dtype)
        vb = 0.9 * vb + G.sum(axis=0).astype(dtype)
        W = (W - lr_w * vW).astype(dtype)
        b = (b - lr_w * vb).astype(dtype)
        if (epoch + 1) % LPP_ALPHA_EVERY == 0:
            alpha = (alpha - lr_alpha * g_alpha).astype(dtype)
        if snapshot_every and (epoch + 1) % snapshot_every == 0:
            snaps.append(scorer(W.copy(), b.copy(), alpha.copy()))
    return scorer(W, b, alpha), snaps


def peer_grids(X, y, P, C):
    """For each tunable peer: a list of (settings, scorer(Q) → logits) over its grid, fitted on (X, y)."""
    Y = np.eye(C)[y]
    held = {}   # one slot: the last query set (held, so its identity stays its own), its affinities at one β

    def affinity(Q, be, B):
        """(``100·QP̂ᵀ`` once per query set, ``exp(−β(1 − QXᵀ)) B`` once per β and B: the grids run β by β)."""
        if held.get("Q") is not Q:
            held.clear()
            held.update(Q=Q, zs=100.0 * Q @ P.T)
        if held.get("beta") != be:
            held.update(beta=be, K=np.exp(-be * (1.0 - Q @ X.T)), B=None)
        if held["B"] is not B:
            held.update(B=B, KB=held["K"] @ B)
        return held["zs"], held["KB"]

    def tip(Q, be, al):
        zs, KY = affinity(Q, be, Y)
        return zs + al * KY

    grids = {"tip": [({"beta": be, "alpha": al}, (lambda Q, be=be, al=al: tip(Q, be, al)))
                     for be in TIP_BETA for al in ALPHAS]}
    for name, estimator, alphas in (("gda", "ks", GDA_ALPHAS), ("gda_lw", "lw", ALPHAS)):
        W, b = gda_terms(X, y, C, estimator)
        grids[name] = [({"alpha": al}, (lambda Q, al=al, W=W, b=b: 100.0 * Q @ P.T + al * (Q @ W + b)))
                       for al in alphas]
    prok = []
    for be in TIP_BETA:
        for lam in RIDGES:
            B = proker_terms(X, y, P, C, be, lam)
            prok += [({"beta": be, "lambda": lam, "alpha": al},
                      (lambda Q, be=be, B=B, al=al: (lambda zs, KB: zs + al * KB)(*affinity(Q, be, B))))
                     for al in (1.0, 4.0, 16.0, 64.0, 256.0)]
    grids["proker"] = prok
    return grids


def cv_choice(X, y, P, C, seed):
    """Each peer's settings by 2-fold cross-validation on the shots (None with one shot per class)."""
    folds = halves(y, seed)
    if folds is None:
        return None
    acc = {}
    for a, b in folds:
        for name, grid in peer_grids(X[a], y[a], P, C).items():
            for i, (_, f) in enumerate(grid):
                acc.setdefault(name, np.zeros(len(grid)))[i] += (f(X[b]).argmax(1) == y[b]).mean()
    full = peer_grids(X, y, P, C)
    return {name: full[name][int(np.argmax(acc[name]))] for name in full}


def logreg_scorer(X, y, C, seed):
    from sklearn.linear_model import LogisticRegression

    def fit(Xf, yf, c):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # tol 1e-6: with hundreds of classes the starting gradient is ~1/C, below scikit-learn's default
            # stopping rule at 1e-3 by the first step (sun397: constant predictions, 0.3%)
            return LogisticRegression(C=c, max_iter=1000, tol=1e-6).fit(Xf, yf)

    folds = halves(y, seed)
    best = 10.0
    if folds is not None:
        scores = [sum((fit(X[a], y[a], c).predict(X[b]) == y[b]).mean() for a, b in folds) for c in LOGREG_C]
        best = LOGREG_C[int(np.argmax(scores))]
    m = fit(X, y, best)
    W = np.zeros((C, X.shape[1]))
    bias = np.full(C, -1e9)
    W[m.classes_], bias[m.classes_] = m.coef_, m.intercept_
    return (lambda Q: Q @ W.T + bias), {"C": best}


# ----------------------------------------------------------------------------- one dataset

def top5(z, y):
    return np.any(np.argsort(-z, axis=1)[:, :5] == y[:, None], axis=1)


def nll_of(p, y):
    return -np.log(np.maximum(p[np.arange(len(y)), y], 1e-300))


def run_dataset(name, shots, seeds, log, peers=PEERS):
    X, y, P, C, base = load_dataset(name)
    out = {}
    for k in shots:
        if np.bincount(y, minlength=C).min() <= k:
            log(f"{name:>15} {k:>2} shots: skipped (a class has ≤ {k} validation images)")
            continue
        per = {"correct": {}, "top5": {}, "nll": {}}
        info = []
        for seed in range(seeds):
            s, q = sample(y, k, seed)
            Xs, ys, Q, yq = X[s], y[s], X[q], y[q]
            z0 = 100.0 * Q @ P.T
            logits = {"zero_shot": z0, "tip": tip_scores(Q, P, Xs, np.eye(C)[ys], 5.5, 1.0)}
            t0 = time.perf_counter()
            clf = copy.deepcopy(base).adapt(Xs.astype(np.float32), ys)
            t_svgen = time.perf_counter() - t0
            scores = np.asarray(clf.decision_function(Q.astype(np.float32)), dtype=np.float64)
            probs = {"svgen": np.asarray(clf.predict_proba(Q.astype(np.float32))), "zero_shot": softmax(z0)}
            logits["svgen"] = scores
            for head in ("kernel", "linear"):
                logits[f"svgen_{head}"] = np.asarray(clf.decision_function(Q.astype(np.float32), head), dtype=np.float64)
            hc = clf.fewshot_["head_choice"]
            est = {"kernel": hc["held_out_accuracy"]["kernel"], "linear": hc["held_out_accuracy"]["linear"],
                   "default": hc["held_out_accuracy"]["mixture" if clf.default_head_ == "mixture" else clf.default_head_]}
            if "gda_loo" in peers:
                logits["gda_loo"] = gda_loo_scorer(Xs, ys, P, C)[0](Q)
            if "proker" in peers:
                logits["proker"] = proker_published(Q, Xs, ys, P, C, k)
            cv = cv_choice(Xs, ys, P, C, seed)
            grids = peer_grids(Xs, ys, P, C)
            defaults = {"tip": {"beta": 5.5, "alpha": 1.0}, "gda": {"alpha": 1.0}, "gda_lw": {"alpha": 1.0},
                        "proker": {"beta": 5.5, "lambda": 1.0, "alpha": 1.0}}
            for peer in ("tip", "gda", "gda_lw", "proker"):
                if cv is not None:
                    settings, f = cv[peer]
                else:   # one shot per class: the defaults
                    settings, f = next((st, g) for st, g in grids[peer] if st == defaults[peer])
                logits[f"{peer}_cv"] = f(Q)
                accs = [(g(Q).argmax(1) == yq).mean() for _, g in grids[peer]]
                logits[f"{peer}_oracle"] = grids[peer][int(np.argmax(accs))][1](Q)
            if "logreg_cv" in peers:
                logits["logreg_cv"] = logreg_scorer(Xs, ys, C, seed)[0](Q)
            if "lpp" in peers:
                f, snaps = lpp_fit(Xs, ys, P, C, snapshot_every=LPP_ALPHA_EVERY)
                logits["lpp"] = f(Q)
                accs = [(g(Q).argmax(1) == yq).mean() for g in snaps]
                logits["lpp_oracle"] = snaps[int(np.argmax(accs))](Q)
            for m, z in logits.items():
                per["correct"].setdefault(m, []).append(z.argmax(1) == yq)
                per["top5"].setdefault(m, []).append(top5(z, yq))
            for m, p in probs.items():
                per["nll"].setdefault(m, []).append(nll_of(p, yq))
            info.append({"seed": seed, "adapt_s": t_svgen, "kernel": clf.fewshot_["kernel"]["decision"],
                         "sigma": clf.fewshot_["kernel"]["sigma"], "ridge_c": clf.fewshot_["kernel"]["ridge_c"],
                         "kernel_logits": clf.kernel_logits_, "T": clf.temperatures_["kernel"],
                         "default_head": clf.default_head_, "mixture_weight": hc["mixture_weight"],
                         "held_out_estimate": est,
                         "query_accuracy": {h: float((logits["svgen" if h == "default" else f"svgen_{h}"].argmax(1)
                                                      == yq).mean()) for h in HEADS}})
        res = {key: {m: np.concatenate(v).astype(float) for m, v in d.items()} for key, d in per.items()}
        out[k] = {**res, "info": info}
        acc = {m: 100 * v.mean() for m, v in res["correct"].items()}
        log(f"{name:>15} {k:>2} shots: " + "  ".join(f"{m} {a:.1f}" for m, a in acc.items())
            + f" | nll zs {res['nll']['zero_shot'].mean():.3f} svgen {res['nll']['svgen'].mean():.3f}"
            + f" | adapt {np.mean([i['adapt_s'] for i in info]):.2f}s")
    return out


def summarise(results, shots):
    rows = []
    for k in shots:
        runs = {n: r[k] for n, r in results.items() if k in r}
        if not runs:
            continue
        first = next(iter(runs.values()))["correct"]
        methods = [m for m in ("zero_shot", "svgen", "svgen_kernel", "svgen_linear", *PEERS, *ORACLES) if m in first]
        for name, r in runs.items():
            c, t5, nl = r["correct"], r["top5"], r["nll"]
            rows.append({"dataset": name, "shots": k,
                         **{m: 100 * float(c[m].mean()) for m in methods},
                         "svgen_top5": 100 * float(t5["svgen"].mean()), "zero_shot_top5": 100 * float(t5["zero_shot"].mean()),
                         "svgen_nll": float(nl["svgen"].mean()), "zero_shot_nll": float(nl["zero_shot"].mean()),
                         "svgen_minus_zero_shot": bootstrap(100 * (c["svgen"] - c["zero_shot"])),
                         "svgen_minus_tip": bootstrap(100 * (c["svgen"] - c["tip"])),
                         "top5_svgen_minus_zero_shot": bootstrap(100 * (t5["svgen"] - t5["zero_shot"])),
                         "nll_svgen_minus_zero_shot": bootstrap(nl["svgen"] - nl["zero_shot"]),
                         "kernel_adopted": [i["kernel"]["adopted"] for i in r["info"]],
                         "default_heads": [i["default_head"] for i in r["info"]],
                         "mixture_weights": [i["mixture_weight"] for i in r["info"]],
                         "estimate": {h: 100 * float(np.mean([i["held_out_estimate"][h] for i in r["info"]]))
                                      for h in HEADS},
                         "query": {h: 100 * float(np.mean([i["query_accuracy"][h] for i in r["info"]]))
                                   for h in HEADS},
                         "adapt_s": float(np.mean([i["adapt_s"] for i in r["info"]]))})
        mean = {"dataset": "mean", "shots": k, "n_datasets": len(runs),
                **{m: float(np.mean([100 * runs[n]["correct"][m].mean() for n in runs])) for m in methods}}
        for m in PEERS:   # the default head − each peer, over the data sets' mean (images resampled within each)
            if m in mean:
                mean[f"svgen_minus_{m}"] = bootstrap([100 * (runs[n]["correct"]["svgen"] - runs[n]["correct"][m])
                                                      for n in runs])
        mean["best_realistic_peer"] = max((m for m in PEERS if m in mean), key=lambda m: mean[m])
        mean["best_oracle_peer"] = max((m for m in ORACLES if m in mean), key=lambda m: mean[m])
        rows.append(mean)
    return rows


def markdown(result: dict) -> str:
    rows = result["rows"]
    cols = [m for m in ("zero_shot", "svgen", "svgen_kernel", "svgen_linear", *PEERS, *ORACLES) if m in rows[0]]
    out = ["| dataset | shots | " + " | ".join(cols) + " | svgen − zero-shot [95% CI] | svgen − tip [95% CI] "
           "| top-5 zs → svgen | NLL zs → svgen |",
           "|---|---:|" + "---:|" * len(cols) + "---|---|---|---|"]
    for r in rows:
        vals = " | ".join(f"{r[m]:.1f}" for m in cols)
        if r["dataset"] == "mean":
            out.append(f"| **mean of {r['n_datasets']}** | {r['shots']} | {vals} | best realistic peer: "
                       f"{r['best_realistic_peer']} | best query-tuned: {r['best_oracle_peer']} | | |")
            continue
        d, t = r["svgen_minus_zero_shot"], r["svgen_minus_tip"]
        out.append(f"| {r['dataset']} | {r['shots']} | {vals} | {d['diff']:+.2f} [{d['ci95'][0]:+.2f}, "
                   f"{d['ci95'][1]:+.2f}] | {t['diff']:+.2f} [{t['ci95'][0]:+.2f}, {t['ci95'][1]:+.2f}] "
                   f"| {r['zero_shot_top5']:.1f} → {r['svgen_top5']:.1f} | {r['zero_shot_nll']:.3f} → "
                   f"{r['svgen_nll']:.3f} |")
    out += ["", "Each svgen head's accuracy estimated on the held-out shots → on the queries (mean of the seeds; "
            "the gap is estimate − query):", "",
            "| dataset | shots | default heads | " + " | ".join(f"{h} est → query (gap)" for h in HEADS) + " |",
            "|---|---:|---|" + "---|" * len(HEADS)]
    for r in rows:
        if r["dataset"] == "mean" or "estimate" not in r:
            continue
        heads = ", ".join(sorted(set(r["default_heads"])))
        out.append(f"| {r['dataset']} | {r['shots']} | {heads} | " + " | ".join(
            f"{r['estimate'][h]:.1f} → {r['query'][h]:.1f} ({r['estimate'][h] - r['query'][h]:+.1f})"
            for h in HEADS) + " |")
    return "\n".join(out) + "\n"


def compare(before: dict, after: dict) -> str:
    """Markdown: the default head before → after on each dataset and shot count (with the realistic peers' best), and
    each head's held-out-shot estimate against its query accuracy, before and after (two saved results)."""
    key = lambda r: (r["dataset"], r["shots"])   # noqa: E731
    old = {key(r): r for r in before["rows"]}
    peers = [m for m in PEERS if m in after["rows"][0]]
    out = ["| dataset | shots | zero-shot | svgen before | svgen after | after − before | svgen after − zero-shot "
           "[95% CI] | " + " | ".join(peers) + " |", "|---|---:|---:|---:|---:|---:|---|" + "---:|" * len(peers)]
    for r in after["rows"]:
        b = old.get(key(r))
        if b is None:
            continue
        ci = "" if r["dataset"] == "mean" else (f"{r['svgen_minus_zero_shot']['diff']:+.2f} "
                                                f"[{r['svgen_minus_zero_shot']['ci95'][0]:+.2f}, "
                                                f"{r['svgen_minus_zero_shot']['ci95'][1]:+.2f}]")
        name = f"**mean of {r['n_datasets']}**" if r["dataset"] == "mean" else r["dataset"]
        out.append(f"| {name} | {r['shots']} | {r['zero_shot']:.2f} | {b['svgen']:.2f} | {r['svgen']:.2f} | "
                   f"{r['svgen'] - b['svgen']:+.2f} | {ci} | " + " | ".join(f"{r[m]:.2f}" for m in peers) + " |")
    out += ["", "| dataset | shots | head | estimate before → query (gap) | estimate after → query (gap) | "
            "default head before → after |", "|---|---:|---|---|---|---|"]
    for r in after["rows"]:
        b = old.get(key(r))
        if b is None or "estimate" not in r or "estimate" not in b:
            continue
        for h in HEADS:
            cell = lambda x: f"{x['estimate'][h]:.1f} → {x['query'][h]:.1f} ({x['estimate'][h] - x['query'][h]:+.1f})"  # noqa: E731
            heads = (f"{', '.join(sorted(set(b['default_heads'])))} → {', '.join(sorted(set(r['default_heads'])))}"
                     if h == "default" else "")
            out.append(f"| {r['dataset']} | {r['shots']} | {h} | {cell(b)} | {cell(r)} | {heads} |")
    return "\n".join(out) + "\n"


DEV_PEERS = ("gda_cv", "proker", "proker_cv")


def dev_page(before: dict, after: dict) -> str:
    """Markdown: the default head against its two heads, zero-shot, the realistic peers of issue 47 and the default
    head of ``before`` on every dataset and shot count of ``after``, with the acceptance checks of issue 47 item 7."""
    key = lambda r: (r["dataset"], r["shots"])   # noqa: E731
    old = {key(r): r for r in before["rows"]}
    ok = lambda b: "yes" if b else "**no**"   # noqa: E731
    seeds = after.get("seeds") or before.get("seeds")
    out = ["# The default head on the dev sets (issue 47 item 7)", "",
           "Generated by `python -m benchmarks.bench_adapt --page BEFORE.json AFTER.json` (do not edit by hand). "
           f"**Dev-only numbers**: CoOp validation sets with text-like prototypes, {seeds} seeds, every method on the "
           "same shots and queries (the module docstring of `benchmarks/bench_adapt.py` defines each column); held-out "
           "ImageNet is the test these settings were not tuned on. *default* is what `classify` uses after "
           "`SVGClassifier().fit(P).adapt(X, y)`; *before* is the default head of the BEFORE run (the same shots and "
           "queries); the interval is a paired bootstrap over the query images."
           + (f" Run: `OMP_NUM_THREADS=1 python -m benchmarks.bench_adapt --datasets {' '.join(after['datasets'])} "
              f"--shots {' '.join(map(str, after['shots']))} --seeds {seeds} --peers {' '.join(after['peers'])}`."
              if all(k in after for k in ("datasets", "shots", "peers")) else "")
           + (" svgen's columns of AFTER were rerun on the same shots and queries and merged (`--merge`) into a run "
              "whose peer columns they share." if "merged" in after else ""), "",
           "| dataset | shots | default | kernel | linear | zero-shot | " + " | ".join(DEV_PEERS) + " | default before "
           "| default − zero-shot [95% CI] | top-5 before → after | NLL before → after | ≥ max(kernel, linear) − 0.1 "
           "| ≥ before − 0.3 |", "|---|---:|" + "---:|" * (5 + len(DEV_PEERS)) + "---|---|---|---|---|"]
    for r in after["rows"]:
        b = old.get(key(r))
        if r["dataset"] == "mean" or b is None:
            continue
        d = r["svgen_minus_zero_shot"]
        out.append(f"| {r['dataset']} | {r['shots']} | {r['svgen']:.2f} | {r['svgen_kernel']:.2f} | "
                   f"{r['svgen_linear']:.2f} | {r['zero_shot']:.2f} | " + " | ".join(f"{r[m]:.2f}" for m in DEV_PEERS)
                   + f" | {b['svgen']:.2f} | {d['diff']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}] | "
                   f"{b['svgen_top5']:.2f} → {r['svgen_top5']:.2f} | {b['svgen_nll']:.3f} → {r['svgen_nll']:.3f} | "
                   f"{ok(r['svgen'] >= max(r['svgen_kernel'], r['svgen_linear']) - 0.1)} | "
                   f"{ok(r['svgen'] >= b['svgen'] - 0.3)} |")
    out += ["", "| shots | datasets | default (mean) | default before (mean) | "
            + " | ".join(f"{m} (mean)" for m in DEV_PEERS) + " | default ≥ every peer's mean |",
            "|---:|---|---:|---:|" + "---:|" * len(DEV_PEERS) + "---|"]
    for k in sorted({r["shots"] for r in after["rows"]}):
        rows = [r for r in after["rows"] if r["shots"] == k and r["dataset"] != "mean" and key(r) in old]
        if not rows:
            continue
        mean = {m: float(np.mean([r[m] for r in rows])) for m in ("svgen", *DEV_PEERS)}
        was = float(np.mean([old[key(r)]["svgen"] for r in rows]))
        out.append(f"| {k} | {', '.join(r['dataset'] for r in rows)} | {mean['svgen']:.2f} | {was:.2f} | "
                   + " | ".join(f"{mean[m]:.2f}" for m in DEV_PEERS)
                   + f" | {ok(all(mean['svgen'] >= mean[m] for m in DEV_PEERS))} |")
    return "\n".join(out) + "\n"


def means_page(*results: dict) -> str:
    """Markdown: issue 47's check on the means over the data sets at each shot count of ``results`` (saved runs,
    e.g. 1–4 shots on all seven sets and 8–16 shots where the sets have enough images): the default head's mean
    against its two heads, zero-shot and each realistic peer, with the paired bootstrap of default − peer."""
    ok = lambda b: "yes" if b else "**no**"   # noqa: E731
    runs = " and ".join(f"`--datasets {' '.join(r['datasets'])} --shots {' '.join(map(str, r['shots']))} --seeds "
                        f"{r['seeds']} --peers {' '.join(r['peers'])}`" for r in results)
    out = ["# The default head against the peers, mean over the CoOp sets (issue 47)", "",
           "Generated by `python -m benchmarks.bench_adapt --means RESULT.json…` (do not edit by hand) from the runs "
           f"{runs} (`OMP_NUM_THREADS=1 python -m benchmarks.bench_adapt …`). **Dev-only numbers** (CoOp validation "
           "sets, text-like prototypes; every method on the same shots and queries; a set takes part at k shots where "
           "each of its classes has more than k validation images). The interval is the paired bootstrap of the "
           "difference of the means over the sets (images resampled within each set).", "",
           "| shots | sets | default | kernel | linear | zero-shot | " + " | ".join(DEV_PEERS) + " | "
           + " | ".join(f"default − {m} [95% CI]" for m in DEV_PEERS) + " | default ≥ every peer's mean |",
           "|---:|---|" + "---:|" * (4 + len(DEV_PEERS)) + "---|" * len(DEV_PEERS) + "---|"]
    for result in results:
        for mean in (r for r in result["rows"] if r["dataset"] == "mean"):
            k = mean["shots"]
            sets = [r["dataset"] for r in result["rows"] if r["shots"] == k and r["dataset"] != "mean"]
            ci = [mean.get(f"svgen_minus_{m}") for m in DEV_PEERS]
            out.append(f"| {k} | {', '.join(sets)} | " + " | ".join(
                f"{mean[m]:.2f}" for m in ("svgen", "svgen_kernel", "svgen_linear", "zero_shot", *DEV_PEERS))
                + " | " + " | ".join(f"{c['diff']:+.2f} [{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}]" if c else "—"
                                     for c in ci)
                + f" | {ok(all(mean['svgen'] >= mean[m] for m in DEV_PEERS))} |")
    for result in results:   # every set and every peer of the run, as the run prints them
        out += ["", f"## Every set and peer: --shots {' '.join(map(str, result['shots']))}", "", markdown(result)]
    return "\n".join(out).rstrip("\n") + "\n"


def merge(base: dict, update: dict) -> dict:
    """``base`` with svgen's results replaced by ``update``'s where both have the dataset and shot count (a rerun of
    svgen on the same shots and queries: every peer column both have must agree, or ValueError), the means of svgen's
    columns recomputed."""
    ours = lambda m: m.startswith(("svgen", "top5_svgen", "nll_svgen")) or m in SVGEN_INFO   # noqa: E731
    new = {(r["dataset"], r["shots"]): r for r in update["rows"] if r["dataset"] != "mean"}
    rows = []
    for r in base["rows"]:
        u = new.get((r["dataset"], r["shots"]))
        if u is not None:
            for m in set(r) & set(u):
                if not ours(m) and isinstance(r[m], float) and abs(r[m] - u[m]) > 1e-9:
                    raise ValueError(f"{r['dataset']} {r['shots']} shots: {m} differs, not the same shots and queries")
            r = {**r, **{m: v for m, v in u.items() if ours(m)}}
        rows.append(r)
    for i, mean in enumerate(rows):
        if mean["dataset"] == "mean":
            parts = [r for r in rows if r["shots"] == mean["shots"] and r["dataset"] != "mean"]
            kept = {m: v for m, v in mean.items() if not isinstance(v, dict)}   # intervals need the images: dropped
            rows[i] = {**kept, **{m: float(np.mean([r[m] for r in parts])) for m in kept if ours(m)}}
    return {**base, "rows": rows, "merged": {"base": base.get("machine"), "update": update.get("machine"),
                                            "updated": sorted(f"{d} {k}" for d, k in new)}}


def main(argv=None):
    from benchmarks.bench_common import coop_parser, render_or_missing

    ap = coop_parser(__doc__, SHOTS, "bench_adapt", datasets=DATASETS, extra_datasets=(UNION,))
    ap.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS, help="the peers to run (default: all)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE.json", "AFTER.json"),
                    help="print the before/after tables of two saved results and stop")
    ap.add_argument("--page", nargs=2, metavar=("BEFORE.json", "AFTER.json"),
                    help="print the dev results page of issue 47 item 7 (the default head, its heads, the peers, the "
                         "default head of BEFORE and the acceptance checks) and stop")
    ap.add_argument("--means", nargs="+", metavar="RESULT.json",
                    help="print the page of the means over the data sets against the peers (issue 47) and stop")
    ap.add_argument("--merge", nargs=2, metavar=("BASE.json", "UPDATE.json"),
                    help="write BASE with svgen's results from UPDATE (a rerun of svgen on some of the same cells) "
                         "as --out, and stop")
    args = ap.parse_args(argv)
    if args.merge:
        import json
        from pathlib import Path

        print(f"wrote {save_result(args.out, merge(*(json.loads(Path(p).read_text()) for p in args.merge)))}")
        return 0
    if args.means:
        import json
        from pathlib import Path

        print(means_page(*(json.loads(Path(p).read_text()) for p in args.means)), end="")
        return 0
    if args.page:
        import json
        from pathlib import Path

        print(dev_page(*(json.loads(Path(p).read_text()) for p in args.page)), end="")
        return 0
    if args.compare:
        import json
        from pathlib import Path

        print(compare(*(json.loads(Path(p).read_text()) for p in args.compare)), end="")
        return 0

    code = render_or_missing(args, markdown, "bench_adapt")
    if code is not None:
        return code
    log = lambda s: print(s, flush=True)  # noqa: E731
    results = {name: run_dataset(name, args.shots, args.seeds, log, args.peers) for name in args.datasets}
    result = {"machine": machine(), "datasets": args.datasets, "shots": args.shots, "seeds": args.seeds,
              "peers": args.peers,
              "rows": summarise(results, args.shots)}
    path = save_result(args.out, result)
    print(markdown(result), end="")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

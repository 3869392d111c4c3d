"""The linear head with shots (svgen.adapt.lda): zero-shot logits + α·s·LDA logits, α on the balanced folds.
Each number is checked against a brute-force recomputation from the formulas (refits without each fold, the
spread ratio by a second formula, the deployed head against the two terms computed apart)."""

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.core.support import IMAGE
from svgen.adapt import heldout
from svgen.adapt.lda import fit_lda_head, lda_covariance, lda_head_weights, prior_means, spread_ratio
from svgen.adapt.config import DEFAULT, AdaptConfig
from svgen.adapt.solvers.lda import fold_logits as lda_fold_logits

C, D = 6, 24


def _problem(per_class, seed=0, noise=1.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(C, D))
    protos = (centres[:, None, :] + 0.7 * rng.normal(size=(C, 3, D))).astype(np.float32)   # a noisy text prior
    y = np.repeat(np.arange(C), per_class)
    X = (centres[y] + noise * rng.normal(size=(len(y), D))).astype(np.float32)
    q = np.repeat(np.arange(C), 5)
    Q = (centres[q] + noise * rng.normal(size=(len(q), D))).astype(np.float32)
    return protos, X, y, Q


def _tau(X, y):
    """The LDA shrinkage target tr S_w/(df·D) on all shots (leave-one-out holds it fixed)."""
    S = lda_covariance(X, y, C, 0.0)
    t = float(torch.diagonal(S).sum()) / X.shape[1]
    return t if t > 0 else 1.0


def lda_head(P, shots, n_classes, config=DEFAULT, seed=0):
    """The LDA head of ``shots`` as adapt fits it: (W, b, its (γ, κ)), judged on the fit's held-out evidence."""
    return fit_lda_head(P, shots, n_classes, heldout.evidence(shots.labels.numpy(), n_classes, config, seed), config)


def _unit(a):
    a = np.asarray(a, dtype=np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def fold_logits(clf):
    """(held-out rows, zero-shot logits, LDA logits) on the kernel head's balanced folds of ``clf``'s shots, the LDA
    head refitted without each fold at the recorded (γ, κ) by a direct solve; folds concatenated."""
    rec = clf.fewshot_["linear"]
    shots = clf.support_set_.part(IMAGE)
    Xd, yt = shots.rows.double(), shots.labels
    folds = heldout.balanced_folds(yt.numpy(), 0)
    m = prior_means(clf.prototypes_, Xd)
    held = np.concatenate(folds)
    L_held = []
    for f in folds:
        keep = torch.from_numpy(np.setdiff1d(np.arange(len(yt)), f))
        W, b = lda_head_weights(Xd[keep], yt[keep], m, rec["shrinkage"], rec["prior_shots"], equal_radius=True)
        L_held.append((Xd[f] @ W.T + b).numpy())
    return held, 100.0 * Xd.numpy()[held] @ _unit(clf.prototypes_.numpy()).T, np.concatenate(L_held)


@pytest.mark.parametrize("per_class", [2, 4])
def test_alpha_is_the_best_held_out_accuracy_and_the_head_is_the_two_terms(per_class):
    protos, X, y, Q = _problem(per_class, noise=1.2)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, y)
    rec = clf.fewshot_["linear"]
    shots = clf.support_set_.part(IMAGE)
    Xd, yt = shots.rows.double(), shots.labels
    P = clf.prototypes_
    Pn = _unit(P.numpy())
    # the LDA head on all shots at the recorded (γ, κ), as fit_lda_head gives it
    W_lda, b_lda, choice = lda_head(P, shots, C)
    assert choice.shrinkage == rec["shrinkage"] and choice.prior_shots == rec["prior_shots"]
    Xn = Xd.numpy()
    Z_all = 100.0 * Xn @ Pn.T
    # α: brute force over the grid on the kernel head's balanced folds, LDA refitted without each fold
    held, Z_held, L_held = fold_logits(clf)
    m = prior_means(P, Xd)
    # s by a second formula, on the held-out shots: root mean square of the class-centred logits
    rms = lambda A: np.sqrt(np.mean((A - A.mean(axis=1, keepdims=True)) ** 2))
    assert rec["fold_scale"] == pytest.approx(rms(Z_held) / rms(L_held), rel=1e-6)
    # the deployed head's scale: on its exact leave-one-out logits (refits without each shot)
    L_loo = np.stack([(Xd[i] @ W.T + b).numpy() for i in range(len(yt))
                      for W, b in [lda_head_weights(Xd[torch.arange(len(yt)) != i], yt[torch.arange(len(yt)) != i], m,
                                                    rec["shrinkage"], rec["prior_shots"], equal_radius=True,
                                                    centre=Xd.mean(0), tau=_tau(Xd, yt))]])
    assert rec["scale"] == pytest.approx(rms(Z_all) / rms(L_loo), rel=1e-6)
    # the LDA part's own temperature (the pool's transduction continues it): the minimiser of its LOO NLL
    from scipy import optimize

    def nll(log_t):
        a = L_loo / np.exp(log_t)
        a = a - a.max(axis=1, keepdims=True)
        return float(-(a[np.arange(len(yt)), yt.numpy()] - np.log(np.exp(a).sum(axis=1))).mean())

    best = optimize.minimize_scalar(nll, bounds=(-20, 20), method="bounded", options={"xatol": 1e-10})
    assert rec["lda_temperature_fitted"] and rec["lda_temperature"] == pytest.approx(float(np.exp(best.x)), rel=1e-3)
    accs = [float(((Z_held + a * rec["fold_scale"] * L_held).argmax(1) == yt.numpy()[held]).mean()) for a in DEFAULT.alphas]
    assert rec["alpha"] == DEFAULT.alphas[int(np.argmax(accs))]          # the first best: ties to the smaller α
    assert rec["held_out_accuracy"] == pytest.approx(max(accs))
    assert rec["zero_shot_held_out_accuracy"] == pytest.approx(accs[0])
    assert clf.fewshot_["head_choice"]["held_out_accuracy"]["linear"] == pytest.approx(max(accs))
    # the deployed head is one matrix equal to the two terms computed apart
    Qn = _unit(Q)
    want = 100.0 * Qn @ Pn.T + rec["alpha"] * rec["scale"] * (Qn @ W_lda.double().numpy().T + b_lda.double().numpy())
    got = np.asarray(clf.decision_function(Q, head="linear"), dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # the LDA part is kept as it was fitted (the pool's solve continues it), not rebuilt from the record
    part = clf.lda_
    np.testing.assert_allclose(part.weight.numpy(), W_lda.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(part.bias.numpy(), b_lda.numpy(), rtol=1e-5, atol=1e-5)
    assert (part.shrinkage, part.temperature) == (rec["shrinkage"], rec["lda_temperature"])


def test_a_text_prior_already_right_on_every_shot_keeps_the_zero_shot_head():
    """Zero-shot ranks every held-out shot first, so no α > 0 does better: the tie goes to α = 0, and the linear
    head is CLIP's cosine head exactly (zero-shot is a candidate)."""
    protos, X, y, Q = _problem(4, seed=3, noise=0.05)
    protos = np.repeat(protos[:, :1, :], 3, axis=1)      # every template the same text row
    rng = np.random.default_rng(5)
    X = (np.asarray(protos[:, 0])[y] + 0.05 * rng.normal(size=X.shape)).astype(np.float32)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, y)
    rec = clf.fewshot_["linear"]
    assert rec["zero_shot_held_out_accuracy"] == 1.0 and rec["alpha"] == 0.0
    np.testing.assert_allclose(np.asarray(clf.decision_function(Q, head="linear")),
                               np.asarray(clf.decision_function(Q, head="cosine")), rtol=1e-5, atol=1e-3)


def test_one_shot_per_class_keeps_the_lda_head_alone():
    protos, X, y, Q = _problem(1)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, y)
    rec = clf.fewshot_["linear"]
    assert rec["form"] == "lda" and "alpha" not in rec
    W, b, _ = lda_head(clf.prototypes_, clf.support_set_.part(IMAGE), C)
    np.testing.assert_allclose(clf.heads_.linear.weight.numpy(), W.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(clf.heads_.linear.bias.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    # its LDA part is the head itself, at the linear head's leave-one-out temperature where that was fitted
    part, cal = clf.lda_, clf.heads_.calibration
    assert torch.equal(part.weight, clf.heads_.linear.weight) and torch.equal(part.bias, clf.heads_.linear.bias)
    assert part.temperature == (cal.temperatures["linear"] if cal.record["loo"]["linear"]["fitted"] else None)


def test_spread_ratio_is_scale_equivariant():
    rng = np.random.default_rng(0)
    Z, L = rng.normal(size=(9, 4)), rng.normal(size=(9, 4))
    assert spread_ratio(3.0 * Z, L) == pytest.approx(3.0 * spread_ratio(Z, L))
    assert spread_ratio(Z, 2.0 * L + 5.0) == pytest.approx(spread_ratio(Z, L) / 2.0)


def test_many_classes_a_linear_head_that_hurts_is_not_chosen():
    """Regression (issue 38). 300 classes × 4 shots, more than select_max (1,024): the text prototypes are
    right for the images' classes but carry a class-specific part in directions the images do not use, so the LDA head
    has weak prior means for classes without shots. Choosing α on the shots of a subset of whole classes, the LDA
    head refitted on those classes alone (the old rule, recomputed here), makes
    the other classes easy to beat: it picks a large α, and that linear head is well below zero-shot on the queries.
    Scoring each held-out shot against all classes, every fold refitted on every other shot, the adapted linear head
    and the default head are not below zero-shot. (The evidence is the default 1,024 held-out shots at most: with 128,
    α's argmax is noise on a problem where the LDA part never helps, and chose a hurting α in 2 of 8 draws of it.)"""

    cfg = AdaptConfig(lda_loo_max=64)   # 1,200 shots: above select_max
    rng = np.random.default_rng(0)
    n_cls, Di, Dt = 300, 32, 16
    cen = np.zeros((n_cls, Di + Dt))
    cen[:, :Di] = _unit(rng.normal(size=(n_cls, Di)))
    side = np.zeros_like(cen)
    side[:, Di:] = _unit(rng.normal(size=(n_cls, Dt)))
    P = _unit(cen + side)

    def draw(n):
        yy = np.repeat(np.arange(n_cls), n)
        noise = np.zeros((len(yy), Di + Dt))
        noise[:, :Di] = 0.35 * rng.normal(size=(len(yy), Di))
        noise[:, Di:] = 0.02 * rng.normal(size=(len(yy), Dt))
        return _unit(cen[yy] + noise).astype(np.float32), yy

    X, y = draw(4)
    Q, yq = draw(20)
    acc = lambda z: float((np.asarray(z).argmax(1) == yq).mean())   # noqa: E731
    zero_shot = acc(Q @ P.T)
    clf = SVGClassifier(n_support=2, steps=5, adapt_config=cfg).fit(P.astype(np.float32)).adapt(X, y)
    # the old rule: α on the folds of a subset of whole classes, the LDA head refitted on those classes' shots alone
    shots = clf.support_set_.part(IMAGE)
    W, b, choice = lda_head(clf.prototypes_, shots, n_cls, cfg)
    # the old rule's subset: every shot of a random set of whole classes, at most 128 shots in all
    rng, counts, chosen, total = np.random.default_rng(0), np.bincount(y), [], 0
    for c in rng.permutation(np.flatnonzero(counts)):
        if total + counts[c] <= 128 or not chosen:
            chosen.append(c)
            total += counts[c]
    sub = np.flatnonzero(np.isin(y, chosen))
    folds = [(sub[f], sub[f]) for f in heldout.balanced_folds(y[sub], 0)]
    Xd = shots.rows.double()
    L = lda_fold_logits(Xd, shots.labels, prior_means(clf.prototypes_, Xd), choice.shrinkage, choice.prior_shots,
                        folds, sub)
    rows = np.concatenate([s for _, s in folds])
    Pn = _unit(clf.prototypes_.numpy())
    Z = 100.0 * Xd.numpy()[rows] @ Pn.T
    s_fold = spread_ratio(Z, L)
    old_alpha = DEFAULT.alphas[int(np.argmax([((Z + a * s_fold * L).argmax(1) == y[rows]).mean()
                                              for a in DEFAULT.alphas]))]
    rec = clf.fewshot_["linear"]
    old = (100.0 * Pn + old_alpha * rec["scale"] * W.double().numpy(), old_alpha * rec["scale"] * b.double().numpy())
    assert old_alpha >= 2.0
    assert acc(Q @ old[0].T + old[1]) < zero_shot - 0.015   # it hurts
    # the rule now: the adapted linear head, and the default head, are not below zero-shot
    assert clf.fewshot_["head_choice"]["classes_compared"] == "all"
    assert rec["alpha"] < old_alpha
    assert acc(clf.decision_function(Q, "linear")) >= zero_shot - 0.005
    assert acc(clf.decision_function(Q)) >= zero_shot - 0.005


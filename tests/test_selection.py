"""The held-out shots every adaptive choice is scored on (svgen.adapt.select): the fold scheme, the shot sample and
the one paired acceptance test."""

import numpy as np
import pytest

from svgen.adapt import config as adapt_config
from svgen.adapt import heldout
from svgen.adapt import select


def test_scored_folds_subsample_the_scored_shots_never_the_removed_ones():
    y = np.repeat(np.arange(300), 4)                          # 1,200 shots: 4 folds of 300 before subsampling
    full = heldout.balanced_folds(y, seed=3)
    assert [f.size for f in full] == [300] * 4
    assert all(np.unique(y[f]).size == 300 for f in full)                # one shot of every class per fold
    folds = heldout.scored_folds(full, y, seed=3, n_max=256)
    assert len(folds) == 1                                                # as few folds as hold 256 shots
    removed, scored = folds[0]
    assert removed is full[0]                                             # the refit: every class one shot short
    assert scored.size == 256 and np.isin(scored, removed).all() and np.unique(y[scored]).size == 256
    two = heldout.scored_folds(full, y, seed=3, n_max=600)                 # two folds of 300 hold 600
    assert [r is f for (r, _), f in zip(two, full)] == [True, True] and sum(s.size for _, s in two) == 600
    one = heldout.scored_folds(full, y, seed=3, n_max=400)                 # one fold of 300 fits, two do not
    assert len(one) == 1 and one[0][1] is full[0]
    other = heldout.scored_folds(full, y, seed=4, n_max=256)[0][1]          # the classes scored: a seeded draw
    assert not np.array_equal(np.sort(y[other]), np.sort(y[scored]))
    roomy = heldout.scored_folds(full, y, seed=3, n_max=2000)              # under the cap: every removed shot scored
    assert len(roomy) == len(full) and all(r is f and s is f for (r, s), f in zip(roomy, full))


def test_shot_sample_spreads_over_classes_first():
    y = np.repeat(np.arange(10), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert heldout.shot_sample(y, len(y)) is None
    s = heldout.shot_sample(y, 10, seed=1)
    assert s.size == 10 and np.unique(y[s]).size == 10                    # one of each class before any second
    s = heldout.shot_sample(y, 25, seed=1)
    counts = np.bincount(y[s], minlength=10)
    assert s.size == 25 and counts.min() >= 1 and counts.max() - counts[counts < np.bincount(y)].min() <= 1
    assert np.array_equal(heldout.shot_sample(y, 25, seed=1), s)           # seeded
    assert np.isin(heldout.shot_sample(y, 12, seed=1), s).all()            # a smaller sample is part of a larger


def test_paired_test_one_level_and_ties_keep():
    from svgen.records import kernel_decision as decision_record

    rng = np.random.default_rng(0)
    base = rng.random(400) < 0.6

    def kernel(correction):   # the kernel head's choice: zero-shot, or a correction unless behind it
        return select.choose({"zero-shot": base, "corrected": correction}, None, "kernel", 1.0)

    tie = kernel(base.copy())
    assert tie.chosen == "corrected" and tie.versus_zero_shot.difference == 0.0   # exactly level SE or less: kept
    worse = base & (rng.random(400) < 0.7)                                # loses 30% of the baseline's right answers
    d = kernel(worse)
    assert d.chosen == "zero-shot" and d.best == "corrected" and not d.adapted
    assert d.versus_zero_shot.difference == pytest.approx(worse.mean() - base.mean())
    diff = worse.astype(float) - base
    assert d.versus_zero_shot.standard_error == pytest.approx(diff.std(ddof=1) / np.sqrt(400))
    rec = decision_record(False, d.versus_zero_shot, 1.0)
    assert rec["adopted"] is False and rec["shots_compared"] == 400
    one = base.copy()
    one[np.flatnonzero(base)[0]] = False                                  # behind by one shot: within 1 SE, kept
    assert kernel(one).chosen == "corrected"


def test_the_rule_text_is_format_3s_at_level_one_and_names_another_level():
    from svgen.records import kernel_decision as decision_record

    assert decision_record(True, None, 1.0)["rule"] == (
        "adapted unless its accuracy on held-out shots (one per class at a time) is below zero-shot's by more than 1 SE "
        "(paired)")
    assert "by more than 2 SE" in decision_record(True, None, 2.0)["rule"]


def test_paired_weights_reduce_to_the_unweighted_standard_error_and_match_a_second_formula():
    rng = np.random.default_rng(1)
    a, b = rng.random(50), rng.random(50)
    p = select.paired(a, b)
    assert p.standard_error == pytest.approx((a - b).std(ddof=1) / np.sqrt(50))
    eq = select.paired(a, b, np.full(50, 7.0))
    assert eq.difference == pytest.approx(p.difference) and eq.standard_error == pytest.approx(p.standard_error)
    w = rng.random(50)
    q = select.paired(a, b, w)
    wn = w / w.sum()
    m = wn @ (a - b)
    assert q.difference == pytest.approx(m)
    assert q.standard_error == pytest.approx(np.sqrt(50 / 49 * np.sum(wn ** 2 * (a - b - m) ** 2)))


def test_behind_and_ahead_are_one_test_with_one_tie_rule():
    p = select.Paired(0.5, 0.6, -0.1, 0.1, 10)
    assert not select.behind(p, 1.0) and select.behind(p, 0.5)      # exactly 1 SE: not behind (the tie)
    q = select.Paired(0.6, 0.5, 0.1, 0.1, 10)
    assert not select.ahead(q, 1.0) and select.ahead(q, 0.5)


def test_adapt_config_refuses_bad_values_and_records_what_changed():
    assert adapt_config.AdaptConfig().changed() == {}
    assert adapt_config.AdaptConfig(level=2.0).changed() == {"level": 2.0}
    for bad in ({"level": -1.0}, {"level": float("nan")}, {"alphas": ()}, {"ridges": (1.0, -2.0)}, {"max_folds": 0}):
        with pytest.raises(ValueError):
            adapt_config.AdaptConfig(**bad)


def _shots_problem():
    rng = np.random.default_rng(0)
    P = rng.normal(size=(6, 16)).astype(np.float32)
    y = np.repeat(np.arange(6), 4)
    return P, (P[y] + 0.8 * rng.normal(size=(len(y), 16))).astype(np.float32), y


def test_the_classifiers_adapt_config_reaches_the_choices_and_is_a_plain_parameter():
    from sklearn.base import clone

    from svgen import AdaptConfig, SVGClassifier

    P, X, y = _shots_problem()
    only_zero = AdaptConfig(alphas=(0.0,), sigma_factors=(0.5,), ridges=(0.1,))
    clf = SVGClassifier(seed=0, adapt_config=only_zero).fit(P).adapt(X, y)
    lin, ker = clf.fewshot_["linear"], clf.fewshot_["kernel"]
    assert lin["alpha"] == 0.0 and list(lin["grid"]) == ["0"]                 # α from the config's grid only
    assert ker["ridge_c"] == pytest.approx(0.1) and ker["selection"]["sigma_factor"] == 0.5
    default = SVGClassifier(seed=0).fit(P).adapt(X, y)
    assert len(default.fewshot_["linear"]["grid"]) == len(AdaptConfig().alphas)
    assert default.fewshot_["kernel"]["ridge_c"] != pytest.approx(0.1)
    assert clf.get_params()["adapt_config"] is only_zero and clone(clf).adapt_config == only_zero
    assert "adapt_config=AdaptConfig(" in repr(clf)


def test_a_wrong_adapt_config_is_one_line_at_fit_and_at_adapt():
    from svgen import SVGClassifier, SvgenError

    P, X, y = _shots_problem()
    with pytest.raises(SvgenError, match="^adapt_config must be an svgen.AdaptConfig, got dict$"):
        SVGClassifier(seed=0, adapt_config={"level": 2}).fit(P)   # the zero-shot fit's text temperatures use it
    clf = SVGClassifier(seed=0).fit(P)
    clf.adapt_config = {"level": 2}
    with pytest.raises(SvgenError, match="^adapt_config must be an svgen.AdaptConfig, got dict$"):
        clf.adapt(X, y)


# ----------------------------------------------------------------------------- choose() and the table of choices

class Labels:
    def __init__(self, labels, weights=None):
        self.labels, self.weights = np.asarray(labels), weights


def hits(n, right):
    out = np.zeros(n)
    out[:right] = 1.0
    return out


def test_choose_keeps_the_best_correction_unless_it_is_behind_zero_shot():
    rng = np.random.default_rng(2)
    zero = (rng.random(200) < 0.5).astype(float)
    better = np.maximum(zero, rng.random(200) < 0.3)                # only gains: ahead of zero-shot
    close = zero.copy()
    close[np.flatnonzero(zero)[0]] = 0.0                            # one image lost: within 1 SE
    c = select.choose({"zero": zero, "close": close, "better": better}, None, "kernel", 1.0)
    assert c.chosen == "better" and c.index == 2 and c.adapted and c.mean == pytest.approx(better.mean())
    assert c.versus_zero_shot.difference == pytest.approx(better.mean() - zero.mean())
    c = select.choose({"zero": zero, "close": close}, None, "kernel", 1.0)
    assert c.chosen == "close"                                      # below zero-shot, not behind: kept
    worse = zero * (rng.random(200) < 0.5)
    c = select.choose({"zero": zero, "worse": worse}, None, "kernel", 1.0)
    assert c.chosen == "zero" and not c.adapted and c.best == "worse"
    assert c.versus_zero_shot.difference == pytest.approx(worse.mean() - zero.mean())   # the refused one's evidence


def test_choose_ties_go_to_the_candidate_nearest_zero_shot():
    a = hits(10, 6)
    c = select.choose({"zero": hits(10, 5), "near": a, "far": a[::-1].copy()}, None, "alpha", 1.0)
    assert c.chosen == "near"                                       # equal means: the earlier candidate
    c = select.choose({"zero": a, "far": a[::-1].copy()}, None, "kernel_logits", 1.0)
    assert c.chosen == "zero"                                       # BEST: zero-shot among the candidates


def test_choose_nearest_not_behind_the_best_and_scores_outputs_on_the_evidence_labels():
    y = np.arange(40) % 4
    right = np.eye(4)[y]
    wrong = np.eye(4)[(y + 1) % 4]
    nearly = right.copy()
    nearly[0] = wrong[0]                                            # 39 of 40: not behind the best
    c = select.choose({"g=0.7": wrong, "g=0.4": nearly, "g=0.1": right}, Labels(y), "lda", 1.0)
    assert c.chosen == "g=0.4" and c.best == "g=0.1" and c.means == {"g=0.7": 0.0, "g=0.4": 39 / 40, "g=0.1": 1.0}
    probs = np.full((40, 4), 0.1)
    probs[np.arange(40), y] = 0.7
    assert select.Score.NLL.per_image(probs, y) == pytest.approx(np.full(40, np.log(0.7)))
    assert select.Score.TOP5.per_image(wrong, y).sum() == 40        # 4 classes: every label in the top 5


def test_choose_weighs_images_and_a_pool_needs_to_be_ahead_and_not_behind_on_the_guards():
    zero, cand = hits(4, 2), np.array([0.0, 0.0, 1.0, 1.0])
    w = np.array([0.1, 0.1, 0.4, 0.4])
    c = select.choose({"zero": zero, "cand": cand}, Labels(np.zeros(4), w), "kernel", 1.0)
    assert c.means == {"zero": pytest.approx(0.2), "cand": pytest.approx(0.8)}
    y = np.arange(100) % 5
    base = {select.Score.TOP1: hits(100, 50), select.Score.TOP5: hits(100, 90), select.Score.NLL: -np.ones(100)}
    pool = {**base, select.Score.TOP1: hits(100, 80)}
    assert select.choose({"inductive": base, "pool": pool}, Labels(y), "pool", 1.0).chosen == "pool"
    bad = {**pool, select.Score.NLL: -np.linspace(0.5, 4.0, 100)}     # NLL higher than zero-shot's by > 1 SE
    c = select.choose({"inductive": base, "pool": bad}, Labels(y), "pool", 1.0)
    assert c.chosen == "inductive" and "NLL" in c.why


def test_every_choice_in_the_table_names_a_module_that_exists():
    from pathlib import Path
    here = Path(select.__file__).parent
    for name, rule in select.CHOICES.items():
        assert (here / rule.where).exists(), name
        assert isinstance(rule.score, select.Score) and isinstance(rule.accept, select.Accept)


def test_the_manual_holds_the_table_of_choices_the_code_holds():
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "adaptation.md").read_text()
    start = doc.index("<!-- choices table: generated from svgen.adapt.select.CHOICES -->\n")
    end = doc.index("<!-- end of the choices table -->")
    assert doc[doc.index("\n", start) + 1:end] == select.choices_table()

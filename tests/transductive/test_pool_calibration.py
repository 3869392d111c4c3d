"""A zero-shot pool's heads claim the accuracy the pool check measured (issue 40, item 5).

Kept without labels, the adapted heads' temperatures give them a mean top-1 probability on the pool equal to the
check's cross-half agreement (a label-free accuracy: a head adapted on one half predicting the other half's own
posterior class), instead of the inductive head's entropy, which left the far more accurate pool head
under-confident (oxford_pets: mean top-1 probability 0.25 at 73% top-1, ECE 0.48 against the inductive 0.22).
A temperature moves no argmax.
"""

import copy

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.adapt.config import DEFAULT

C, D = 6, 16


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _kept(monkeypatch, agreement):
    """The check keeps the pool at a cross-half ``agreement`` (None: a check that measured none, the entropy rule)."""
    from svgen.adapt import pool as pool_adapt
    from svgen.adapt import gate as pool_gate
    from svgen.state import Check, Evidence, Gate, Paired

    gate = Gate(Paired(agreement or 0.9, 0.5, 0.1, 0.01, 0), Paired(1.0, 1.0, 0.0, 0.0, 0), DEFAULT.level, None, 9, 0)
    monkeypatch.setattr(pool_gate, "check_without_shots", lambda stage, *a, **k:
                        Check(Evidence.HALVES, stage.default_head, gate))
    if agreement is None:
        monkeypatch.setattr(pool_adapt, "agreement_target", lambda check: None)


@pytest.fixture(scope="module")
def pool():
    rng = np.random.default_rng(3)
    centres = _unit(rng.normal(size=(C, D)))
    protos = (centres + 1.2 * rng.normal(size=(C, D)) / np.sqrt(D)).astype(np.float32)
    yu = np.repeat(np.arange(C), 30)
    U = _unit(centres[yu] + 0.6 * rng.normal(size=(len(yu), D)) / np.sqrt(D)).astype(np.float32)
    return SVGClassifier(n_support=2, steps=5, seed=0).fit(protos), U


@pytest.mark.parametrize("agreement", [0.55, 0.8, 0.95])
def test_kept_pool_heads_claim_the_checks_agreement(pool, monkeypatch, agreement):
    base, U = pool
    _kept(monkeypatch, agreement)
    clf = copy.deepcopy(base).adapt(unlabelled=U)
    assert clf.transductive_["fallback"] is None
    assert clf.calibration_["method"] == "confidence-matched" and f"{agreement:.4g}" in clf.calibration_["rule"]
    heads = ["linear"] + (["kernel"] if clf.heads_.pool_factor is not None else [])
    for head in heads:
        p = clf.predict_proba(U, head)
        assert p.max(axis=1).mean() == pytest.approx(agreement, abs=1e-4), head
    # the same pool at the old entropy target: the very same argmax, only the confidence differs
    _kept(monkeypatch, None)
    old = copy.deepcopy(base).adapt(unlabelled=U)
    assert old.calibration_["method"] == "entropy-matched"
    for head in heads:
        np.testing.assert_array_equal(clf.predict_proba(U, head).argmax(1), old.predict_proba(U, head).argmax(1))


def test_match_confidence_hits_its_target_and_clips_it():
    from svgen.heads import calibration as cal

    z = torch.from_numpy(np.random.default_rng(0).normal(size=(300, 9)))
    for target in (0.2, 0.5, 0.9):
        t = cal.match_top1(z, target)
        assert float(torch.softmax(t * z, 1).max(1).values.mean()) == pytest.approx(target, abs=1e-6)
    t = cal.match_top1(z, 0.01)   # below 1/C: as flat as the bracket allows
    assert float(torch.softmax(t * z, 1).max(1).values.mean()) < 1 / 9 + 1e-3


def test_oxford_pets_zero_shot_pool_is_calibrated(shared_data):
    """The reported case: oxford_pets text-like prototypes, the validation set as the pool (real gate)."""
    root = shared_data / "clip-vit-b32" / "coop-fewshot" / "oxford_pets"
    X = _unit(np.load(root / "val_features.npy")).astype(np.float32)
    y = np.load(root / "val_labels.npy")
    P = _unit(np.load(root / "textlike_prototypes.npy")).astype(np.float32)
    from svgen.heads.calibration import ece

    base = SVGClassifier().fit(P)
    before = base.predict_proba(X)
    clf = copy.deepcopy(base).adapt(unlabelled=X)
    assert clf.transductive_["fallback"] is None
    after = clf.predict_proba(X)
    acc, conf = (after.argmax(1) == y).mean(), after.max(1).mean()
    assert acc > (before.argmax(1) == y).mean() + 0.2          # the pool's gain (40.6% → 72.6%)
    assert abs(conf - acc) < 0.05                                # was 0.25 at 0.73
    assert ece(after, y) < ece(before, y)                        # was 0.48 against 0.22
    nll = lambda p: -np.log(np.maximum(p[np.arange(len(y)), y], 1e-300)).mean()   # noqa: E731
    assert nll(after) < nll(before)


def test_agreement_target_is_the_rule_of_succession():
    from svgen.adapt.pool import agreement_target
    from svgen.state import Check, Evidence, Gate, Paired, Reason

    def halves(agreement, images):
        gate = Gate(Paired(agreement, 0.5, agreement - 0.5, 0.01, images), Paired(1.0, 1.0, 0.0, 0.0, images),
                    DEFAULT.level, None, 9, 0)
        return Check(Evidence.HALVES, "kernel", gate)

    assert agreement_target(halves(1.0, 10)) == pytest.approx(11 / 12)   # never certainty
    assert agreement_target(halves(0.5, 100)) == pytest.approx(0.5)
    assert agreement_target(halves(0.75, 0)) == 0.75
    stopped = Check(Evidence.HALVES, "kernel", stopped=Reason.HALF_DID_NOT_ADAPT, why="x")
    assert agreement_target(stopped) is None   # no measurement: the entropy rule

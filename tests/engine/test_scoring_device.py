"""Scoring on the encoder's device (``svgen.engine.predictions.score(..., device=...)``): the heads are copied there
once and every head scores there. No GPU here: the CPU runs the device path itself, and PyTorch's ``meta`` device
(shapes and devices, no values) shows that no step of a head mixes in a tensor left on the CPU."""

from pathlib import Path

import numpy as np
import pytest
import torch

import svgen
from svgen.engine import predictions
from svgen.heads import predictor

GOLDEN = Path(__file__).resolve().parents[1] / "io" / "golden"
CASES = ("v1_zero_shot", "v1_local_votes", "v4_shots", "v5_shots_for_some_classes", "v6_shots_pool_kept",
         "v6_zero_shot_pool_kept", "v2_pool_rows", "legacy_v3_shots")


def _load(case):
    clf = svgen.SVGClassifier.load(GOLDEN / case / "artifact")
    return clf, torch.from_numpy(np.load(GOLDEN / case / "queries.npy", allow_pickle=False))


@pytest.mark.parametrize("case", CASES)
def test_the_device_path_scores_as_the_classifier(case):
    """With a device (here the CPU) every head's scores and probabilities are the classifier's own (exactly in one
    block; in blocks of 7 rows to float rounding)."""
    clf, q = _load(case)
    for head in clf.head_names_:
        for probs in (False, True):
            want = (clf.predict_proba if probs else clf.decision_function)(q, head=head)
            got = predictions.score(clf, q, head, probs, device="cpu")
            assert got.device.type == "cpu" and got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            torch.testing.assert_close(predictions.score(clf, q, head, probs, batch=7, device="cpu"), want,
                                       rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_every_head_scores_on_the_heads_device(case):
    """On the ``meta`` device each head's scores and probabilities come out on that device: nothing in the
    computation is left on the CPU. (Sparse local votes use an operator ``meta`` cannot run; a GPU runs it.)"""
    clf, q = _load(case)
    heads, P = predictions.on_device(clf, torch.device("meta"))
    assert all(t.device.type == "meta" for t in (heads.linear.weight, heads.kernel.rows, heads.kernel.votes, P))
    assert clf.heads_.linear.weight.device.type == "cpu"   # a copy: the classifier's own state stays where it was
    skip = {"kernel", "mixture"} if heads.kernel.votes.is_sparse else set()
    for head in set(clf.head_names_) - skip:
        for fn in (predictor.scores, predictor.proba):
            out = fn(heads, P, clf.fit_config_.kernel, q.to("meta"), head)
            assert out.device.type == "meta" and tuple(out.shape) == (q.shape[0], len(clf.classes_)), (head, fn)


def test_the_device_copy_is_made_once_per_state():
    clf, q = _load("v4_shots")
    first = predictions.on_device(clf, torch.device("cpu"))
    assert predictions.on_device(clf, torch.device("cpu")) is first
    clf.adapt(q[:6].numpy(), np.arange(6))   # new heads: a new copy
    assert predictions.on_device(clf, torch.device("cpu")) is not first


def test_a_new_state_is_never_scored_with_an_old_copy():
    """The copy is tied to the state object itself, not its id: a state freed and replaced (whose id Python may
    hand to the next) is never scored with the copy of the one before."""
    import dataclasses

    clf, q = _load("v1_zero_shot")
    for i in range(40):
        linear = dataclasses.replace(clf.heads_.linear, bias=torch.full_like(clf.heads_.linear.bias, float(i)))
        clf.heads_ = dataclasses.replace(clf.heads_, linear=linear)   # the one before is freed
        if i % 2:   # every other state scored: a new one can sit where the last scored one was
            heads, _ = predictions.on_device(clf, torch.device("cpu"))
            assert float(heads.linear.bias[0]) == float(i)

"""The mixture head (svgen.adapt.temperatures): w·p_kernel + (1 − w)·p_linear with w by the held-out NLL.

The weight is checked against a brute-force grid over the same held-out probabilities recomputed from the formulas
(both heads refitted without each fold by direct solves); the head's probabilities, scores and every export against
numpy from the stored tensors; the artifact (format 4) through save, load and its errors; the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.adapt import temperatures as held_temperatures
from svgen.core import logits as logit_kinds
from svgen.heads import calibration
from svgen.errors import SvgenError
from svgen.adapt import heldout, residual
from svgen.io.artifacts import FORMAT_VERSION_MIXTURE, FORMAT_VERSION_PRIOR

from test_linear_head import fold_logits
from test_residual import _problem


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _true_class(p, y):
    return p[np.arange(len(y)), y]


# ----------------------------------------------------------------------------- the weight

def test_weight_is_the_nll_minimiser_on_a_fine_grid():
    rng = np.random.default_rng(0)
    for trial in range(20):
        N, C = 40, 6
        y = rng.integers(0, C, N)
        pk = rng.dirichlet(np.full(C, 0.3 + trial % 3), size=N)
        pl = rng.dirichlet(np.full(C, 0.5), size=N)
        fit = held_temperatures.fit_weight(pk, pl, y)
        a, b = _true_class(pk, y), _true_class(pl, y)
        grid = np.linspace(0.0, 1.0, 20001)
        nll = -np.log(grid[:, None] * a + (1 - grid[:, None]) * b).mean(axis=1)
        assert fit["weight"] == pytest.approx(grid[np.argmin(nll)], abs=1e-4)
        assert fit["nll"] == pytest.approx(nll.min(), abs=1e-7)
        assert fit["nll_kernel"] == pytest.approx(nll[-1]) and fit["nll_linear"] == pytest.approx(nll[0])
        assert fit["nll"] <= min(fit["nll_kernel"], fit["nll_linear"]) + 1e-12


def test_weight_at_the_ends_and_on_a_tie():
    y = np.array([0, 1, 0, 1])
    right = np.array([[0.9, 0.1], [0.2, 0.8], [0.8, 0.2], [0.3, 0.7]])
    wrong = right[:, ::-1].copy()
    assert held_temperatures.fit_weight(right, wrong, y)["weight"] == 1.0      # the kernel head alone
    assert held_temperatures.fit_weight(wrong, right, y)["weight"] == 0.0      # the linear head alone
    assert held_temperatures.fit_weight(right, right, y)["weight"] == 1.0      # a tie keeps the kernel head
    zero = np.array([[1.0, 0.0]] * 4)                                # probability 0 on a true class: still finite
    assert np.isfinite(held_temperatures.fit_weight(zero, right, y)["nll"])


@pytest.mark.parametrize("w", [-0.1, 1.5, float("nan"), "0.5", True, None])
def test_weight_check_refuses_what_is_not_in_the_unit_interval(w):
    with pytest.raises(SvgenError, match="mixture_weight"):
        calibration.check_weight(w)


@pytest.fixture(scope="module")
def mixed():
    """Shots whose held-out evidence weighs both heads (0 < w < 1)."""
    X, y, P = _problem(seed=5, C=5, D=16, per_class=4)
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32)).adapt(X.astype(np.float32), y)
    assert clf.default_head_ == "mixture" and 0.0 < clf.heads_.calibration.mixture_weight < 1.0
    return clf, X, y, P


def test_fitted_weight_is_the_grid_minimiser_of_both_heads_refitted_without_each_fold(mixed):
    clf, X, y, P = mixed
    fs = clf.fewshot_
    k = fs["kernel"]
    assert k["decision"]["adopted"]
    held, Z, L = fold_logits(clf)
    lin = fs["linear"]
    pl = _softmax((Z + lin["alpha"] * lin["fold_scale"] * L) / clf.temperatures_["linear"])
    # the kernel head at its recorded σ and c, refitted without each fold by a direct solve
    Xu, Pu = residual.unit(clf.support_set_.part(1).rows.numpy()), residual.unit(P)
    p0 = residual.prior_probs(Xu, Pu)
    R = np.eye(5)[y] - p0
    scores = []
    for f in heldout.balanced_folds(y, 0):
        keep = np.setdiff1d(np.arange(len(y)), f)
        V = np.linalg.solve(residual.rbf(Xu[keep], Xu[keep], k["sigma"]) + k["ridge_c"] * np.eye(keep.size), R[keep])
        scores.append(p0[f] + residual.rbf(Xu[f], Xu[keep], k["sigma"]) @ V)
    cal = clf.heads_.calibration
    zk = logit_kinds.kernel_logits(torch.from_numpy(np.concatenate(scores)), cal.kernel_logits,
                                   torch.from_numpy(p0[held]), cal.kernel_floor).numpy()
    pk = _softmax(zk / cal.temperatures["kernel"])
    a, b = _true_class(pk, y[held]), _true_class(pl, y[held])
    grid = np.linspace(0.0, 1.0, 20001)
    nll = -np.log(grid[:, None] * a + (1 - grid[:, None]) * b).mean(axis=1)
    hc = fs["head_choice"]
    assert hc["mixture_weight"] == pytest.approx(grid[np.argmin(nll)], abs=2e-4)
    assert cal.mixture_weight == hc["mixture_weight"] and fs["default_head"] == "mixture"
    assert hc["held_out_nll"]["mixture"] == pytest.approx(nll.min(), abs=1e-6)
    assert hc["held_out_nll"]["kernel"] == pytest.approx(nll[-1], rel=1e-5)
    assert hc["held_out_nll"]["linear"] == pytest.approx(nll[0], rel=1e-5)
    assert hc["evidence"] == "balanced folds" and hc["shots_compared"] == len(held)


def test_one_shot_per_class_weighs_the_heads_on_leave_one_out():
    X, y, P = _problem(seed=0, C=5, D=16, per_class=1)
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32)).adapt(X.astype(np.float32), y)
    hc = clf.fewshot_["head_choice"]
    assert hc["evidence"] == "leave-one-out" and hc["shots_compared"] == 5
    w = hc["mixture_weight"]
    assert clf.default_head_ == ("kernel" if w == 1 else "linear" if w == 0 else "mixture")


# ----------------------------------------------------------------------------- the head

def test_mixture_is_the_weighted_probabilities_and_its_scores_their_log(mixed):
    clf, X, _, _ = mixed
    Q = (X[:7] + 0.3 * np.random.default_rng(1).normal(size=X[:7].shape)).astype(np.float32)
    w = clf.heads_.calibration.mixture_weight
    want = w * clf.predict_proba(Q, "kernel") + (1 - w) * clf.predict_proba(Q, "linear")
    got = clf.predict_proba(Q, "mixture")
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(clf.decision_function(Q, "mixture"), np.log(np.maximum(want, 1e-30)), rtol=1e-5)
    np.testing.assert_allclose(clf.logits(Q, "mixture"), clf.decision_function(Q, "mixture"))
    for entry in ("decision_function", "predict_proba", "predict"):   # no head named: the mixture
        np.testing.assert_array_equal(getattr(clf, entry)(Q), getattr(clf, entry)(Q, "mixture"))
    assert "mixture" in clf.head_names_


def test_a_classifier_without_shots_has_no_mixture():
    _, _, P = _problem(seed=1)
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32))
    assert clf.head_names_ == ("kernel", "linear", "cosine") and clf.default_head_ == "kernel"
    with pytest.raises(SvgenError, match="no mixture head"):
        clf.predict_proba(P.astype(np.float32), "mixture")


# ----------------------------------------------------------------------------- the artifact

def test_round_trip_is_format_4_and_predicts_the_same(mixed, tmp_path):
    clf, X, _, _ = mixed
    art = clf.save(tmp_path / "m.svgen")
    meta = json.loads((art / "svgen.json").read_text())
    assert meta["format_version"] == FORMAT_VERSION_MIXTURE
    assert meta["calibration"]["mixture_weight"] == clf.heads_.calibration.mixture_weight
    assert "mixture:" in meta["calibration"]["probabilities"]
    back = SVGClassifier.load(art)
    assert back.default_head_ == "mixture"
    Q = X.astype(np.float32)
    np.testing.assert_array_equal(back.predict_proba(Q), clf.predict_proba(Q))


def test_single_head_fits_stay_format_3(tmp_path):
    X, y, P = _problem(seed=0, C=5, D=16, per_class=2)
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32)).adapt(X.astype(np.float32), y)
    assert clf.default_head_ == "linear" and clf.heads_.calibration.mixture_weight is None
    meta = json.loads((clf.save(tmp_path / "l.svgen") / "svgen.json").read_text())
    assert meta["format_version"] == FORMAT_VERSION_PRIOR and "mixture_weight" not in meta["calibration"]


def _rewrite(art: Path, change) -> None:
    meta = json.loads((art / "svgen.json").read_text())
    change(meta)
    (art / "svgen.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(format_version=FORMAT_VERSION_PRIOR), "only valid in format version 4"),
    (lambda m: m["calibration"].update(mixture_weight=1.5), "mixture_weight"),
    (lambda m: m["calibration"].pop("mixture_weight"), "no mixture_weight"),
    (lambda m: m["fewshot"].update(default_head="ensemble"), "default_head"),
])
def test_a_damaged_mixture_record_is_one_clear_error(mixed, tmp_path, change, message):
    clf = mixed[0]
    art = clf.save(tmp_path / "m.svgen")
    _rewrite(art, change)
    with pytest.raises(SvgenError, match=message) as e:
        SVGClassifier.load(art)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- exports and the CLI

def _script():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import zero_shot_classify

    return zero_shot_classify


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "onnx"])
def test_every_export_of_the_mixture_is_the_mixture(mixed, tmp_path, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    from svgen.io.export import export_head, load_head

    clf, X, _, _ = mixed
    Q = (3.0 * X).astype(np.float32)    # raw, not unit: every export normalises
    path = tmp_path / f"m.{fmt}"
    info = export_head(clf, path, fmt, head="mixture")
    head = _script().load_head(str(path))
    assert head["head"] == "mixture"
    np.testing.assert_allclose(head["probs"](Q), clf.predict_proba(Q), atol=2e-6)
    np.testing.assert_allclose(head["score"](Q), clf.decision_function(Q), atol=2e-4)
    if fmt == "onnx":
        assert info["checked"] is not None
        return
    # the file's formula from its arrays alone: w·softmax(kernel logits / T_k) + (1 − w)·softmax(linear logits / T_l)
    h = load_head(path)
    x = residual.unit(Q)
    w = float(h["mixture_weight"])
    assert w == pytest.approx(clf.heads_.calibration.mixture_weight, rel=1e-7) and float(h["temperature"]) == 1.0
    lin = _softmax(float(h["linear.logit_scale"]) * (x @ h["linear.weight"] + h["linear.bias"])
                   / float(h["linear.temperature"]))
    p0 = residual.prior_probs(x, h["kernel.prior_prototypes"], float(h["kernel.prior_logit_scale"]))
    s = p0 + residual.rbf(x, h["kernel.support_vectors"].astype(np.float64), float(h["kernel.bandwidth"])) \
        @ h["kernel.vote_weights"]
    z = logit_kinds.kernel_logits(torch.from_numpy(s), h["kernel_logits"], torch.from_numpy(p0),
                                  float(h["kernel.kernel_floor"]) if "kernel.kernel_floor" in h else None).numpy()
    ker = _softmax(z / float(h["kernel.temperature"]))
    np.testing.assert_allclose(w * ker + (1 - w) * lin, clf.predict_proba(Q), atol=2e-6)


def test_cli_eval_marks_the_mixture_and_classify_export_use_it(mixed, tmp_path, capsys):
    from svgen.cli import main

    clf, X, y, _ = mixed
    art = clf.save(tmp_path / "m.svgen")
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    np.save(tmp_path / "y.npy", y)
    assert main(["eval", str(art), "--features", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]) == 0
    table = capsys.readouterr().out
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["cosine", "kernel", "linear", "mixture*"]
    assert main(["eval", str(art), "--features", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["default_head"] == "mixture" and res["mixture"]["temperature"] == 1.0
    assert res["mixture"]["acc1"] == pytest.approx(clf.score(X.astype(np.float32), y))
    assert main(["classify", str(art), "--features", str(tmp_path / "x.npy"), "--top-k", "1", "--format", "jsonl",
                 "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["labels"][0] for r in rows] == list(clf.predict(X.astype(np.float32)))
    assert {r["head"] for r in rows} == {"mixture"}
    assert main(["export", str(art), "--out", str(tmp_path / "h.npz")]) == 0
    from svgen.io.export import load_head

    assert load_head(tmp_path / "h.npz")["head"] == "mixture"
    capsys.readouterr()
    assert main(["diagnose", str(art)]) == 0
    w = clf.heads_.calibration.mixture_weight
    assert f"default head: mixture (w = {w:.3g} × the kernel head's probabilities" in capsys.readouterr().out


def test_cli_asking_a_zero_shot_artifact_for_the_mixture_is_one_line(tmp_path, capsys):
    from svgen.cli import main

    _, _, P = _problem(seed=1)
    art = SVGClassifier(n_support=2).fit(P.astype(np.float32)).save(tmp_path / "z.svgen")
    np.save(tmp_path / "x.npy", P.astype(np.float32))
    code = main(["classify", str(art), "--features", str(tmp_path / "x.npy"), "--head", "mixture"])
    err = capsys.readouterr().err
    assert code != 0 and "no mixture head" in err and len(err.strip().splitlines()) == 1

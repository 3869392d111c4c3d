"""The kernel head's kind of logits: ``"log"`` (log max(score, 1e-30)) or ``"score"`` (the raw vote).

``adapt`` with shots fits T for both kinds on the same leave-one-out scores and keeps the lower LOO
NLL; everything else is ``"log"``. The kind travels in ``svgen.json`` and every export. Probabilities
are checked against numpy computations from the stored tensors, not against the code under test.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.adapt import temperatures as held_temperatures
from svgen.core import logits as logit_kinds
from svgen.heads import calibration
from svgen.errors import SvgenError
from svgen.adapt.config import DEFAULT
from svgen.io.export import export_head, load_head

from test_calibration_shots import C, D, _problem

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "zero_shot_classify.py"


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _nll(z, y, T):
    return float(-np.log(_softmax(z / T)[np.arange(len(y)), y]).mean())


def _kernel_scores(clf, x):
    """``exp(-||x̂ - s||² / 2σ²) @ A`` in float64 numpy from the classifier's stored tensors."""
    xh = np.asarray(x, dtype=np.float64)
    xh = xh / np.linalg.norm(xh, axis=1, keepdims=True)
    S = clf.support_vectors_.double().numpy().reshape(-1, xh.shape[1])
    S = S / np.linalg.norm(S, axis=1, keepdims=True)
    d2 = ((xh[:, None, :] - S[None]) ** 2).sum(-1)
    votes = np.exp(-d2 / (2 * float(clf.bandwidth_) ** 2)) @ clf.vote_weights_.double().numpy()
    if clf.kernel_prior_ is None:
        return votes
    P = clf.prototypes_.double().numpy()      # an adapted head (format 3) adds softmax(τ x̂ P̂ᵀ)
    return votes + _softmax(clf.kernel_prior_ * xh @ (P / np.linalg.norm(P, axis=1, keepdims=True)).T)


def _log_probs(clf, x):
    return _softmax(np.log(np.maximum(_kernel_scores(clf, x), 1e-30)) / clf.temperatures_["kernel"])


def _raw_probs(clf, x):
    return _softmax(_kernel_scores(clf, x) / clf.temperatures_["kernel"])


def _floored_probs(clf, x):
    """``softmax(log max(s, ε·p₀·max s / max p₀, 1e-30) / T)`` in numpy from the stored tensors."""
    s = _kernel_scores(clf, x)
    xh = np.asarray(x, dtype=np.float64)
    xh = xh / np.linalg.norm(xh, axis=1, keepdims=True)
    P = clf.prototypes_.double().numpy()
    p0 = _softmax(clf.kernel_prior_ * xh @ (P / np.linalg.norm(P, axis=1, keepdims=True)).T)
    f = clf.heads_.calibration.kernel_floor * p0 * s.max(1, keepdims=True) / p0.max(1, keepdims=True)
    return _softmax(np.log(np.maximum(np.maximum(s, f), 1e-30)) / clf.temperatures_["kernel"])


PROBS = {"log": _log_probs, "score": _raw_probs, "floored": _floored_probs}


def _queries(n=40, seed=3):
    protos, _, _ = _problem(1)
    rng = np.random.default_rng(seed)
    return (np.asarray(protos)[rng.integers(0, C, n)] + 0.4 * rng.normal(size=(n, D))).astype(np.float32) * 2.0


@pytest.fixture(scope="module")
def raw_votes():
    """Noisy, overlapping shots (4 per class): leave-one-out prefers the raw votes here."""
    protos, X, y = _problem(4, noise=1.6)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, y)
    assert clf.kernel_logits_ == "score"
    return clf


def _with_kind(clf, kind):
    """A copy of ``clf`` whose kernel head uses ``kind``, at that kind's LOO temperature."""
    c = copy.deepcopy(clf)
    cand = c.calibration_["kernel_logits_choice"]["candidates"][kind]
    return c.set_temperatures({"kernel": cand["temperature"]}, method="loo-nll", kernel_logits=kind,
                              kernel_floor=cand.get("floor"))


# ----------------------------------------------------------------------------- the choice

def test_choice_picks_raw_votes_when_a_left_out_true_vote_is_not_positive():
    rng = np.random.default_rng(0)
    N, k = 80, 4
    y = rng.integers(0, k, N)
    one_hot = np.eye(k)[y]
    s = 0.05 + 0.05 * rng.random((N, k)) + (0.9 + 0.05 * rng.normal(size=(N, 1))) * one_hot   # ridge votes, left out
    s[:3, y[:3]] = -0.05                                         # three shots' own class votes ≤ 0
    out = held_temperatures.choose_kernel_logits(torch.as_tensor(s), y, fallback=0.3)
    c = out["candidates"]
    assert out["kind"] == "score" and out["temperature"] == c["score"]["temperature"]
    z_log = np.log(np.maximum(s, 1e-30))
    assert c["log"]["nll"] == pytest.approx(_nll(z_log, y, c["log"]["temperature"]), rel=1e-6)
    assert c["score"]["nll"] == pytest.approx(_nll(s, y, c["score"]["temperature"]), rel=1e-6)
    # log's floor puts those three at p ≈ 0 unless T is huge: its best is about uniform (NLL log k)
    assert c["log"]["nll"] > 0.95 * np.log(k) and c["log"]["temperature"] > 10
    assert c["score"]["nll"] < 0.1 * c["log"]["nll"]
    for kind, z in (("log", z_log), ("score", s)):               # each T is the NLL minimiser of its kind
        T = c[kind]["temperature"]
        assert _nll(z, y, T) <= min(_nll(z, y, T * 1.05), _nll(z, y, T / 1.05))
    assert out["loo_true_vote_not_positive"] == pytest.approx(3 / N)
    assert out["nll_score_minus_log"]["mean"] == pytest.approx(c["score"]["nll"] - c["log"]["nll"], rel=1e-6)


def test_choice_keeps_log_for_kernel_masses():
    """Parzen regime: scores are positive masses and the labels follow softmax(log mass): log wins."""
    rng = np.random.default_rng(1)
    N, k = 400, 5
    z = 1.5 * rng.normal(size=(N, k))
    y = np.array([rng.choice(k, p=p) for p in _softmax(z)])
    out = held_temperatures.choose_kernel_logits(torch.as_tensor(np.exp(z)), y, fallback=0.3, signed_votes=False)
    assert out["kind"] == "log" and out["log_tail_guard"]["charge"] == 0
    assert out["candidates"]["log"]["nll"] < out["candidates"]["score"]["nll"]
    assert out["temperature"] == pytest.approx(1.0, abs=0.25)    # the temperature that generated the labels


def test_event_rate_bound_is_the_wilson_bound_at_the_level():
    """The one significance convention (issue 38): the rate p at which the seen rate k/n lies ``level`` standard
    errors √(p(1 − p)/n) below p, the closed form checked against solving that equation by bisection."""
    def solved(k, n, level):
        lo, hi = k / n, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mid - k / n < level * np.sqrt(mid * (1 - mid) / n) else (lo, mid)
        return (lo + hi) / 2

    for level in (0.5, 1.0, 2.0):
        for k, n in ((0, 1), (0, 400), (0, 1600), (3, 100), (10, 37), (36, 37)):
            p = held_temperatures.event_rate_bound(k, n, level)
            assert p == pytest.approx(solved(k, n, level), rel=1e-9, abs=1e-15)
            assert p - k / n == pytest.approx(level * np.sqrt(p * (1 - p) / n), rel=1e-9)
    for n in (1, 7, 400):
        assert held_temperatures.event_rate_bound(0, n, 1.0) == pytest.approx(1 / (n + 1), rel=1e-12)
    assert held_temperatures.event_rate_bound(5, 5, 1.0) == 1.0 and held_temperatures.event_rate_bound(0, 0, 1.0) == 1.0
    assert held_temperatures.event_rate_bound(3, 100, 0.0) == pytest.approx(0.03)        # level 0: the seen rate


def test_signed_votes_charge_log_for_what_the_shots_did_not_show():
    """Shots tighter than new images never show a true vote ≤ 0; with signed vote weights new images can,
    and log's loss there is unbounded: the charge ``1/(n + 1)·median(z_max − log ε)/T`` (level 1) can outweigh
    log's lower plain LOO NLL, which then picks the raw votes. Without signed weights nothing is charged."""
    rng = np.random.default_rng(1)
    N, k = 100, 5
    z = 1.5 * rng.normal(size=(N, k))
    y = np.array([rng.choice(k, p=p) for p in _softmax(z)])
    s = torch.as_tensor(np.exp(z))
    plain = held_temperatures.choose_kernel_logits(s, y, fallback=0.3, signed_votes=False)
    out = held_temperatures.choose_kernel_logits(s, y, fallback=0.3, signed_votes=True)
    c, g = out["candidates"], out["log_tail_guard"]
    assert plain["kind"] == "log" and c["log"]["nll"] < c["score"]["nll"]        # plain LOO prefers log ...
    T = c["log"]["temperature"]
    assert g["seen"] == 0 and g["rate_bound"] == pytest.approx(1 / (N + 1), rel=1e-9)
    assert g["loss"] == pytest.approx(np.median(z.max(axis=1) - np.log(1e-30)) / T, rel=1e-9)
    assert g["charge"] == pytest.approx(g["rate_bound"] * g["loss"], rel=1e-12)
    assert c["log"]["nll"] + g["charge"] > c["score"]["nll"] and out["kind"] == "score"   # ... the guard does not
    assert out["temperature"] == c["score"]["temperature"] and "0 of 100 shots" in out["reason"]


def test_shots_all_ranked_first_keep_log_and_the_text_temperature():
    s = np.array([[0.9, 0.1], [0.2, 0.7], [1.2, -0.3]])
    out = held_temperatures.choose_kernel_logits(torch.as_tensor(s), [0, 1, 0], fallback=0.7)
    assert out["kind"] == "log" and out["temperature"] == 0.7 and out["nll_score_minus_log"] is None


def test_zero_shot_is_log(tmp_path):
    protos, _, _ = _problem(1)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    assert clf.kernel_logits_ == "log"
    meta = json.loads((clf.save(tmp_path / "zs.svgen") / "svgen.json").read_text())["calibration"]
    assert meta["kernel_logits"] == "log" and "text rule" in meta["kernel_logits_choice"]["reason"]
    x = _queries()
    np.testing.assert_allclose(clf.predict_proba(x, "kernel"), _log_probs(clf, x), rtol=1e-4, atol=1e-6)  # float32 scores inside


def test_adapt_records_the_choice_and_predict_proba_is_softmax_of_raw_votes(raw_votes):
    clf = raw_votes
    choice = clf.calibration_["kernel_logits_choice"]
    c = choice["candidates"]
    assert c["score"]["nll"] < c["log"]["nll"] and "leave-one-out NLL on the shots" in choice["reason"]
    assert clf.temperatures_["kernel"] == c["score"]["temperature"]
    assert clf.calibration_["loo"]["kernel"]["nll"] == c["score"]["nll"]
    x = _queries()
    p = clf.predict_proba(x, "kernel")
    np.testing.assert_allclose(p, _raw_probs(clf, x), rtol=1e-4, atol=1e-6)  # float32 scores inside
    assert np.abs(p - _log_probs(clf, x)).max() > 1e-3          # the two kinds differ here (the check can fail)
    np.testing.assert_allclose(clf.logits(x, "kernel"), _kernel_scores(clf, x), rtol=1e-5, atol=1e-6)


def test_set_temperatures_checks_the_kind(raw_votes):
    clf = copy.deepcopy(raw_votes)
    with pytest.raises(SvgenError, match="'log' or 'score'"):
        clf.set_temperatures({"kernel": 0.1}, method="x", kernel_logits="sqrt")
    with pytest.raises(SvgenError, match="needs its temperature"):
        clf.set_temperatures({"linear": 0.1}, method="x", kernel_logits="log")
    clf.set_temperatures({"linear": 0.1}, method="x")              # the kind is kept
    assert clf.kernel_logits_ == "score"


def test_transduction_keeps_the_kind_with_its_temperature(raw_votes):
    """With shots a pool never re-solves the kernel head: kept or refused, the head keeps its LOO-fitted T
    and its kind of logits together (a re-solve with shots lost accuracy: docs/history.md)."""
    c = copy.deepcopy(raw_votes)
    T, kind = c.temperatures_["kernel"], c.kernel_logits_
    x = _queries(60, seed=9)
    before = c.predict_proba(x, "kernel")
    c.adapt_pool(x)
    assert c.transductive_.get("kernel_head", {}).get("replaced") in (None, False)
    assert c.kernel_logits_ == kind == "score" and c.temperatures_["kernel"] == T
    np.testing.assert_array_equal(c.predict_proba(x, "kernel"), before)


# ----------------------------------------------------------------------------- the artifact

def test_round_trip_keeps_the_kind_and_old_artifacts_read_as_log(raw_votes, tmp_path):
    x = _queries()
    art = raw_votes.save(tmp_path / "raw.svgen")
    meta = json.loads((art / "svgen.json").read_text())
    assert meta["calibration"]["kernel_logits"] == "score"
    assert set(meta["calibration"]["kernel_logits_choice"]["candidates"]) == {"log", "score", "floored"}
    back = SVGClassifier.load(art)
    assert back.kernel_logits_ == "score"
    np.testing.assert_allclose(back.predict_proba(x, "kernel"), raw_votes.predict_proba(x, "kernel"), rtol=1e-6)

    # an artifact written before the kind existed: no field means log, with its stored T
    for name in ("kernel_logits", "kernel_logits_choice", "probabilities"):
        meta["calibration"].pop(name)
    (art / "svgen.json").write_text(json.dumps(meta))
    old = SVGClassifier.load(art)
    assert old.kernel_logits_ == "log" and old.temperatures_["kernel"] == pytest.approx(raw_votes.temperatures_["kernel"])
    np.testing.assert_allclose(old.predict_proba(x, "kernel"), _log_probs(old, x), rtol=1e-4, atol=1e-6)  # float32 scores inside

    protos, _, _ = _problem(1)
    zs = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    zart = zs.save(tmp_path / "zs.svgen")
    znew = SVGClassifier.load(zart)
    zmeta = json.loads((zart / "svgen.json").read_text())
    for name in ("kernel_logits", "kernel_logits_choice"):
        zmeta["calibration"].pop(name)
    (zart / "svgen.json").write_text(json.dumps(zmeta))
    zold = SVGClassifier.load(zart)
    assert zold.kernel_logits_ == "log"
    np.testing.assert_array_equal(zold.predict_proba(x, "kernel"), znew.predict_proba(x, "kernel"))


@pytest.mark.parametrize("bad", ["sqrt", None, 3])
def test_a_corrupted_kind_is_one_line(raw_votes, tmp_path, cli, bad):
    art = raw_votes.save(tmp_path / "raw.svgen")
    meta = json.loads((art / "svgen.json").read_text())
    meta["calibration"]["kernel_logits"] = bad
    (art / "svgen.json").write_text(json.dumps(meta))
    np.save(tmp_path / "x.npy", _queries())
    code, out, err = cli("classify", art, "--features", tmp_path / "x.npy", "--probs")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "calibration.kernel_logits must be 'log' or 'score'" in err and "Traceback" not in err
    meta["calibration"] = ["not", "an", "object"]
    (art / "svgen.json").write_text(json.dumps(meta))
    code, _, err = cli("eval", art, "--features", tmp_path / "x.npy", "--labels", tmp_path / "x.npy")
    assert code == 2 and "'calibration' must be a JSON object" in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- exports

@pytest.mark.parametrize("kind", ["log", "score", "floored"])
@pytest.mark.parametrize("fmt", ["safetensors", "npz", "onnx"])
def test_exports_give_predict_proba_for_every_kind(raw_votes, tmp_path, kind, fmt):
    clf = _with_kind(raw_votes, kind)
    x = _queries()
    want = clf.predict_proba(x, "kernel")
    ref = PROBS[kind](clf, x)
    np.testing.assert_allclose(want, ref, rtol=1e-4, atol=1e-6)  # float32 scores inside
    f = tmp_path / f"kernel.{fmt}"
    if fmt == "onnx":
        onnx = pytest.importorskip("onnx")
        ort = pytest.importorskip("onnxruntime")
        export_head(clf, f, "onnx", head="kernel")
        model = onnx.load(str(f))
        ops = {n.op_type for n in model.graph.node}
        assert ("Log" in ops) == (kind != "score")
        props = {p.key: p.value for p in model.metadata_props}
        assert props["kernel_logits"] == kind
        got = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"]).run(["probs"], {"embeddings": x})[0]
        np.testing.assert_allclose(got, want, atol=2e-5)
        return
    export_head(clf, f, fmt, head="kernel")
    h = load_head(f)
    assert h["kernel_logits"] == kind
    assert h["probabilities"] == {"log": "probs = softmax(log(max(scores, 1e-30)) / temperature)",
                                  "score": "probs = softmax(scores / temperature)"}.get(kind, h["probabilities"])
    assert ("kernel_floor" in h["probabilities"]) == (kind == "floored")
    # numpy from the head file's arrays and fields alone
    S, A, sig = h["support_vectors"].astype(np.float64), h["vote_weights"].astype(np.float64), float(h["bandwidth"])
    xh = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = np.exp(-((xh[:, None, :] - S[None]) ** 2).sum(-1) / (2 * sig ** 2)) @ A
    if "prior_prototypes" in h:   # an adapted head (format 3): + softmax(τ x̂ P̂ᵀ)
        s = s + _softmax(float(h["prior_logit_scale"]) * xh @ h["prior_prototypes"].astype(np.float64).T)
    z = np.log(np.maximum(s, 1e-30)) if h["kernel_logits"] == "log" else s
    if h["kernel_logits"] == "floored":    # ε × the prior term, scaled to each row's top score
        p0 = _softmax(float(h["prior_logit_scale"]) * xh @ h["prior_prototypes"].astype(np.float64).T)
        fl = float(h["kernel_floor"]) * p0 * s.max(1, keepdims=True) / p0.max(1, keepdims=True)
        z = np.log(np.maximum(np.maximum(s, fl), 1e-30))
    np.testing.assert_allclose(_softmax(z / float(h["temperature"])), want, atol=2e-5)
    script = runpy.run_path(str(SCRIPT))
    np.testing.assert_allclose(script["load_head"](str(f))["probs"](x), want, atol=2e-5)


def test_script_refuses_an_unknown_kind(raw_votes, tmp_path, capsys):
    f = tmp_path / "kernel.npz"
    export_head(raw_votes, f, "npz", head="kernel")
    with np.load(f, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["kernel_logits"] = np.asarray("sqrt")
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    main = runpy.run_path(str(SCRIPT))["main"]
    capsys.readouterr()
    assert main([str(bad), str(tmp_path), "--probs"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "kernel_logits is 'sqrt'" in err and "Traceback" not in err


def test_script_prints_the_librarys_raw_vote_probabilities(tmp_path, tiny_model, cli, classes_file, capsys):
    """End to end on images: an artifact whose kernel head uses raw votes, classified by ``svgen classify
    --probs`` and by the exported head through ``scripts/zero_shot_classify.py``: the same numbers."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images = tmp_path / "images"
    images.mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(images / f"{i}.png")
    ckpt = ["--checkpoint", tiny_model["safetensors"]]
    # one prompt: on the random tiny model the default 7-template ensemble puts the support vectors on the
    # prototypes (mean cos 0.99996) and shrinks σ (0.37 → 0.23), so the random images' raw votes (~1e-8) tie to
    # float noise and the label order compared below would mean nothing
    code, _, err = cli("fit", "--classes", classes_file(["cat", "dog", "car", "bird"]), "-K", "2", "--steps", "3",
                       "--templates", "single", "--model", "svgen-tiny", *ckpt, "--out", tmp_path / "zs.svgen")
    assert code == 0, err
    clf = SVGClassifier.load(tmp_path / "zs.svgen")
    clf.set_temperatures({"kernel": 0.02}, method="test", kernel_logits="score")
    art = clf.save(tmp_path / "raw.svgen")

    def rows(text):
        return list(csv.DictReader(io.StringIO(text)))

    code, out, err = cli("classify", art, images, "--head", "kernel", "--probs", "--top-k", 4, *ckpt)
    assert code == 0, err
    ours = rows(out)
    head = tmp_path / "kernel.safetensors"
    assert cli("export", art, "--head", "kernel", "--out", head)[0] == 0
    main = runpy.run_path(str(SCRIPT))["main"]

    def script(path):
        capsys.readouterr()
        assert main([str(path), str(images), "--probs", "--top-k", "4", *ckpt]) == 0
        return rows(capsys.readouterr().out)

    theirs = script(head)
    assert [r["path"] for r in theirs] == [r["path"] for r in ours]
    for a, b in zip(ours, theirs):
        assert [a[f"label_{i}"] for i in range(1, 5)] == [b[f"label_{i}"] for i in range(1, 5)]
        np.testing.assert_allclose([float(b[f"prob_{i}"]) for i in range(1, 5)],
                                   [float(a[f"prob_{i}"]) for i in range(1, 5)], rtol=1e-4, atol=1e-6)
        assert sum(float(a[f"prob_{i}"]) for i in range(1, 5)) == pytest.approx(1.0, abs=1e-5)
    # the same head read as log scores gives other numbers (the comparison above can fail)
    from safetensors.numpy import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(head), framework="numpy") as f:
        meta = dict(f.metadata())
    meta.pop("kernel_logits")
    save_file(load_file(str(head)), str(tmp_path / "as_log.safetensors"), metadata=meta)
    as_log = script(tmp_path / "as_log.safetensors")
    assert max(abs(float(a["prob_1"]) - float(b["prob_1"])) for a, b in zip(as_log, theirs)) > 1e-3


# ----------------------------------------------------------------------------- the floored kind

def test_floored_logits_keep_the_argmax_and_bound_the_tail():
    rng = np.random.default_rng(4)
    s = 0.3 * rng.normal(size=(60, 9)) + 0.05                 # residual-corrected scores, many ≤ 0
    p0 = rng.dirichlet(np.full(9, 0.2), size=60)              # confident zero-shot rows
    for eps in DEFAULT.kernel_floors:
        z = logit_kinds.floored_log(torch.as_tensor(s), torch.as_tensor(p0), eps).numpy()
        assert (z.argmax(1) == s.argmax(1)).all()               # the floor never reaches the top score
        want = np.log(np.maximum(np.maximum(s, eps * p0 * s.max(1, keepdims=True) / p0.max(1, keepdims=True)), 1e-30))
        np.testing.assert_allclose(z, want, rtol=1e-12)
        assert z.min() > np.log(1e-30)                          # never the bare 1e-30 floor here
    with pytest.raises(SvgenError, match="prior"):
        logit_kinds.kernel_logits(torch.as_tensor(s), "floored")
    with pytest.raises(SvgenError, match="kernel_floor"):
        logit_kinds.kernel_logits(torch.as_tensor(s), "floored", torch.as_tensor(p0), 1.0)


def test_choice_with_a_prior_scores_every_floor_and_keeps_the_lowest_nll():
    rng = np.random.default_rng(1)
    N, k = 90, 5
    y = rng.integers(0, k, N)
    p0 = rng.dirichlet(np.full(k, 0.5), size=N)
    p0[np.arange(N), y] += 0.3
    p0 /= p0.sum(1, keepdims=True)
    s = p0 + 0.4 * (np.eye(k)[y] - p0) + 0.2 * rng.normal(size=(N, k))   # a correction, noisy, often ≤ 0
    out = held_temperatures.choose_kernel_logits(torch.as_tensor(s), y, fallback=0.3, prior=torch.as_tensor(p0))
    c = out["candidates"]["floored"]
    nlls = {}
    for eps in DEFAULT.kernel_floors:    # brute force: each ε's own NLL-minimising T
        z = np.log(np.maximum(np.maximum(s, eps * p0 * s.max(1, keepdims=True) / p0.max(1, keepdims=True)), 1e-30))
        T = calibration.fit_temperature(torch.as_tensor(z), y)
        nlls[eps] = _nll(z, y, T)
        assert c["by_floor"][f"{eps:g}"] == pytest.approx(nlls[eps], rel=1e-6)
    assert c["floor"] == min(nlls, key=nlls.get) and c["nll"] == pytest.approx(min(nlls.values()), rel=1e-6)
    charged = {"log": out["candidates"]["log"]["nll"] + out["log_tail_guard"]["charge"],
               "score": out["candidates"]["score"]["nll"], "floored": c["nll"]}
    assert out["kind"] == min(charged, key=charged.get)
    assert (out["floor"] == c["floor"]) == (out["kind"] == "floored")
    # without a prior term there is no floored candidate (the zero-shot kernel head)
    assert "floored" not in held_temperatures.choose_kernel_logits(torch.as_tensor(s), y, fallback=0.3)["candidates"]


def test_the_floors_tried_are_the_configs():
    """``AdaptConfig.kernel_floors`` is the ε grid of the floored kind (no module constant): one ε, one candidate."""
    from dataclasses import replace

    rng = np.random.default_rng(1)
    y = rng.integers(0, 5, 90)
    p0 = rng.dirichlet(np.full(5, 0.5), size=90)
    s = p0 + 0.4 * (np.eye(5)[y] - p0) + 0.2 * rng.normal(size=(90, 5))
    out = held_temperatures.choose_kernel_logits(torch.as_tensor(s), y, fallback=0.3, prior=torch.as_tensor(p0),
                                           config=replace(DEFAULT, kernel_floors=(0.2,)))
    assert list(out["candidates"]["floored"]["by_floor"]) == ["0.2"] and out["candidates"]["floored"]["floor"] == 0.2
    assert not hasattr(calibration, "KERNEL_FLOORS")


def test_floored_round_trip_and_its_errors(raw_votes, tmp_path):
    clf = _with_kind(raw_votes, "floored")
    x = _queries()
    art = clf.save(tmp_path / "f.svgen")
    meta = json.loads((art / "svgen.json").read_text())
    assert meta["calibration"]["kernel_logits"] == "floored"
    assert meta["calibration"]["kernel_floor"] == clf.heads_.calibration.kernel_floor
    back = SVGClassifier.load(art)
    np.testing.assert_allclose(back.predict_proba(x, "kernel"), clf.predict_proba(x, "kernel"), rtol=1e-6)
    np.testing.assert_array_equal(back.predict_proba(x, "kernel").argmax(1), back.decision_function(x, "kernel").argmax(1))
    meta["calibration"].pop("kernel_floor")
    (art / "svgen.json").write_text(json.dumps(meta))
    with pytest.raises(SvgenError, match="kernel_floor"):
        SVGClassifier.load(art)
    protos, _, _ = _problem(1)
    zs = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)      # no prior term: no floored logits
    with pytest.raises(SvgenError, match="prior term"):
        zs.set_temperatures({"kernel": 0.5}, method="manual", kernel_logits="floored", kernel_floor=0.5)
    with pytest.raises(SvgenError, match="kernel_floor"):
        copy.deepcopy(raw_votes).set_temperatures({"kernel": 0.5}, method="manual", kernel_logits="floored")

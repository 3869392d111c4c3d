"""Probabilities of every head: the text-side temperature rule, the LOO-NLL temperature fit, NLL/ECE
against independent computations, readable (M·λ-scaled) kernel votes, and where temperatures travel
(artifact, exports, the deploy script, ``classify --probs``, ``eval``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from svgen import SVGClassifier
from svgen.core import logits as logit_kinds
from svgen.heads import calibration
from svgen.core.kernels import kernel
from svgen.core.ridge import one_hot_blocks

sklearn_metrics = pytest.importorskip("sklearn.metrics")


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(12, 1, 32))
    emb = (centres + 0.3 * rng.normal(size=(12, 3, 32))).astype(np.float32)
    return SVGClassifier(n_support=4).fit(emb, classes=[f"c{i}" for i in range(12)]), emb, centres


def _images(centres, n=60, noise=1.2, seed=1):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, centres.shape[0], n)
    return (centres[y, 0] + noise * rng.normal(size=(n, centres.shape[-1]))).astype(np.float32), y


# ----------------------------------------------------------------------------- judging probabilities

def _random_probs(n=500, c=7, seed=0):
    rng = np.random.default_rng(seed)
    z = 3 * rng.normal(size=(n, c))
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return p, rng.integers(0, c, n)


def test_ece_matches_a_direct_loop():
    p, y = _random_probs()
    total = 0.0
    for b in range(15):  # bin b holds b/15 < confidence <= (b+1)/15, sample by sample
        members = [i for i in range(len(y)) if b / 15 < p[i].max() <= (b + 1) / 15]
        if members:
            acc = sum(int(np.argmax(p[i]) == y[i]) for i in members) / len(members)
            conf = sum(p[i].max() for i in members) / len(members)
            total += len(members) / len(y) * abs(acc - conf)
    assert calibration.ece(p, y) == pytest.approx(total, abs=1e-12)
    assert total > 0.01  # random probabilities are not calibrated: the check is not vacuous
    one_hot = np.eye(7)[y]
    assert calibration.ece(one_hot, y) == pytest.approx(0.0)  # confident and right
    # from confidences and correctness (what pooled runs keep): the same number
    assert calibration.ece_of(p.max(1), p.argmax(1) == y) == pytest.approx(total, abs=1e-12)


def test_nll_matches_sklearn_log_loss():
    from svgen.evaluation.metrics import nll

    p, y = _random_probs()
    assert nll(p, y) == pytest.approx(sklearn_metrics.log_loss(y, p, labels=range(7)), rel=1e-9)


def test_reliability_bins_sum_to_the_ece_and_match_eval_streaming():
    """The reliability bins (evaluation) and the ECE (calibration) come from one binning, as eval's blocks do."""
    from svgen.evaluation.metrics import HeadTally, reliability

    p, y = _random_probs()
    r = reliability(p, y)
    used = r["count"] > 0
    assert r["count"].sum() == len(y) and np.allclose(r["edges"], np.linspace(0, 1, 16))
    assert (r["count"][used] / len(y) * np.abs(r["accuracy"][used] - r["confidence"][used])).sum() == calibration.ece(p, y)
    tally = HeadTally(7)
    for rows in (slice(0, 100), slice(100, None)):   # two blocks
        tally.add_ranking(p[rows], y[rows])
        tally.add_probabilities(np.log(p[rows]), 1.0, y[rows])
    got = tally.reliability()
    np.testing.assert_array_equal(got["count"], r["count"])
    np.testing.assert_allclose(got["confidence"][used], r["confidence"][used], rtol=1e-12)
    assert tally.result()["ece"] == pytest.approx(calibration.ece(p, y), abs=1e-12)


def test_fit_temperature_minimises_the_nll():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 5, 400)
    z = rng.normal(size=(400, 5))
    z[np.arange(400), y] += 1.0  # informative logits, on the wrong scale
    z *= 7.0
    T = calibration.fit_temperature(z, y)
    grid = np.exp(np.linspace(np.log(T) - 1, np.log(T) + 1, 401))
    losses = [sklearn_metrics.log_loss(y, calibration.softmax(z, t).numpy(), labels=range(5)) for t in grid]
    assert grid[int(np.argmin(losses))] == pytest.approx(T, rel=0.01)
    assert 1 < T  # over-confident logits are cooled


def test_match_confidence_hits_its_target_in_log_odds():
    p, _ = _random_probs()
    z = np.log(p)
    for target in (-1.0, 0.5, 4.0, 40.0):  # floor: log(1/(C−1)) = −1.79 as T → ∞; 40: p_max = 1 − 4e-18, where probabilities cannot tell T apart
        T = calibration.match_confidence(z, target)
        assert calibration.mean_log_odds(z, T) == pytest.approx(target, abs=1e-6)
        assert _log_odds(z / T) == pytest.approx(target, abs=1e-6)
        if target < 10:  # where p_max is not 1 to float precision: log p_max − log(1 − p_max) directly
            top = calibration.softmax(z, T).numpy().max(1)
            assert np.mean(np.log(top) - np.log1p(-top)) == pytest.approx(target, abs=1e-6)


# ----------------------------------------------------------------------------- the text-side rule

def _log_odds(z):
    """mean_i [z_max − log Σ_{j≠max} exp z_j], row by row with numpy (an independent form of the log-odds)."""
    out = []
    for row in np.asarray(z, dtype=np.float64):
        srt = np.sort(row)
        rest = srt[:-1]
        out.append(srt[-1] - (rest.max() + np.log(np.exp(rest - rest.max()).sum())))
    return float(np.mean(out))


def test_the_text_queries_are_sized_by_the_config():
    """``AdaptConfig.max_queries`` and ``max_logits`` bound the text queries (256 at least), seeded and sorted."""
    from dataclasses import replace

    from svgen.adapt.config import DEFAULT

    per_template = torch.arange(600 * 2 * 3, dtype=torch.float64).reshape(600, 2, 3)
    assert calibration.query_rows(per_template).shape == (1200, 3)                 # 1200 ≤ 2048 and 4e6 / 600
    few = calibration.query_rows(per_template, config=replace(DEFAULT, max_queries=300))
    assert few.shape == (300, 3) and bool((few[1:, 0] > few[:-1, 0]).all())
    assert calibration.query_rows(per_template, config=replace(DEFAULT, max_logits=1000)).shape == (256, 3)
    assert calibration.query_rows(per_template, config=replace(DEFAULT, max_logits=600 * 500)).shape == (500, 3)


@pytest.mark.parametrize("spread", [0.3, 1.5])  # well separated (cosine all but certain on text) and confusable
def test_text_rule_every_head_as_confident_as_cosine_on_the_text_queries(spread):
    rng = np.random.default_rng(2)
    emb = (rng.normal(size=(12, 1, 32)) + spread * rng.normal(size=(12, 3, 32))).astype(np.float32)
    clf = SVGClassifier(n_support=4).fit(emb)
    Q = torch.as_tensor(emb).reshape(-1, emb.shape[-1])
    cos = clf.predict_proba(Q, "cosine")
    assert clf.temperatures_["cosine"] == 1.0 and clf.calibration_["method"] == "text"
    assert clf.calibration_["cosine_mean_max_prob"] == pytest.approx(float(cos.max(dim=1).values.mean()), abs=1e-9)
    target = clf.calibration_["cosine_mean_log_odds"]
    assert target == pytest.approx(_log_odds(clf.logits(Q, "cosine")), rel=1e-6)
    for head in ("kernel", "linear"):
        T = clf.temperatures_[head]
        assert 1e-6 < T < 1e3, head  # never the bisection bracket's end
        assert _log_odds(clf.logits(Q, head) / T) == pytest.approx(target, rel=1e-6), head


def test_predict_proba_formulas(fitted):
    clf, _, centres = fitted
    x, _ = _images(centres)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    P = clf.prototypes_.numpy()
    clip = torch.softmax(torch.as_tensor(100 * xn @ (P / np.linalg.norm(P, axis=1, keepdims=True)).T), dim=1)
    np.testing.assert_allclose(np.asarray(clf.predict_proba(x, "cosine")), clip.numpy(), atol=1e-5)  # open_clip's own
    s = np.asarray(clf.decision_function(x, "kernel"), dtype=np.float64)
    assert (s > 0).all()
    powered = (s / s.max(1, keepdims=True)) ** (1 / clf.temperatures_["kernel"])
    powered /= powered.sum(1, keepdims=True)
    np.testing.assert_allclose(np.asarray(clf.predict_proba(x, "kernel")), powered, atol=1e-5)  # ∝ score^(1/T)
    for head in ("kernel", "linear", "cosine"):
        p = clf.predict_proba(x, head)
        assert isinstance(p, np.ndarray) and isinstance(clf.predict_proba(torch.as_tensor(x), head), torch.Tensor)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
        assert np.array_equal(p.argmax(1), clf.decision_function(x, head).argmax(1))


# ----------------------------------------------------------------------------- readable kernel votes

def test_votes_scaled_by_m_lambda_read_as_own_class_kernel_mass(fitted):
    clf, _, _ = fitted
    C, K, D = clf.support_vectors_.shape
    S = clf.support_vectors_.reshape(-1, D).double()
    lam, M = clf.ridge_lambda_, C * K
    Kss = kernel(S, S, clf.bandwidth_, "rbf")
    A = torch.linalg.solve(Kss + M * lam * torch.eye(M, dtype=torch.float64), one_hot_blocks(C, K).double())
    assert clf.vote_scale_["factor"] == pytest.approx(M * lam)
    np.testing.assert_allclose(clf.vote_weights_.double().numpy(), (M * lam * A).numpy(), rtol=1e-3, atol=1e-6)
    # at a support vector of class c the score is about the kernel mass of c's own K support vectors
    x = S[::K].float()
    mass = kernel(x.double(), S, clf.bandwidth_, "rbf").reshape(C, C, K).sum(-1)
    np.testing.assert_allclose(np.diag(np.asarray(clf.decision_function(x, "kernel"))), np.diag(mass.numpy()), rtol=0.1)


def test_older_artifacts_are_scaled_once_and_get_temperatures(fitted, tmp_path):
    clf, _, centres = fitted
    x, _ = _images(centres)
    art = tmp_path / "old.svgen"
    clf.save(art)
    meta = json.loads((art / "svgen.json").read_text())
    factor = meta.pop("vote_weights_scale")["factor"]
    meta.pop("calibration")
    (art / "svgen.json").write_text(json.dumps(meta))
    t = load_file(str(art / "weights.safetensors"))
    t = {k: v for k, v in t.items() if not k.startswith("temperature.")}
    t["vote_weights"] = t["vote_weights"] / factor  # as written before the scaling existed
    save_file(t, str(art / "weights.safetensors"))

    old = SVGClassifier.load(art)
    assert old.vote_scale_.get("applied_on_load") is True
    np.testing.assert_allclose(np.asarray(old.decision_function(x, "kernel")), np.asarray(clf.decision_function(x, "kernel")),
                               rtol=1e-4)
    assert old.temperatures_ == pytest.approx(clf.temperatures_, rel=1e-3)
    old.save(tmp_path / "resaved.svgen")
    again = SVGClassifier.load(tmp_path / "resaved.svgen")  # recorded as scaled: not scaled a second time
    np.testing.assert_allclose(np.asarray(again.decision_function(x, "kernel")), np.asarray(clf.decision_function(x, "kernel")),
                               rtol=1e-4)


# ----------------------------------------------------------------------------- the few-shot hook and persistence

def test_set_temperatures_hook_persists(fitted, tmp_path):
    clf, emb, centres = fitted
    x, y = _images(centres, seed=5)
    clf2 = SVGClassifier.load(clf.save(tmp_path / "a.svgen"))
    T = calibration.fit_temperature(logit_kinds.head_logits(clf2.decision_function(x, "linear"), "linear"), y)
    clf2.set_temperatures({"linear": T}, method="loo-nll", shots=len(y))
    back = SVGClassifier.load(clf2.save(tmp_path / "b.svgen"))
    assert back.temperatures_["linear"] == pytest.approx(T, rel=1e-6)
    assert back.calibration_["method"] == "loo-nll" and back.calibration_["shots"] == len(y)
    from svgen.errors import SvgenError

    with pytest.raises(SvgenError, match="positive"):
        clf2.set_temperatures({"kernel": -1.0}, method="x")
    with pytest.raises(SvgenError, match="unknown head"):
        clf2.set_temperatures({"knn": 1.0}, method="x")


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "onnx"])
def test_exports_carry_the_temperature(fitted, tmp_path, fmt):
    from svgen.io.export import export_head, load_head

    clf, _, centres = fitted
    x, _ = _images(centres)
    for head in ("kernel", "linear", "cosine"):
        path = tmp_path / f"{head}.{fmt}"
        if fmt == "onnx":
            ort = pytest.importorskip("onnxruntime")
            export_head(clf, path, fmt, head=head)
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            probs = sess.run(["probs"], {"embeddings": x})[0]
        else:
            export_head(clf, path, fmt, head=head)
            h = load_head(path)
            assert float(h["temperature"]) == pytest.approx(clf.temperatures_[head], rel=1e-6)
            assert "softmax" in h["probabilities"]
            continue
        np.testing.assert_allclose(probs, np.asarray(clf.predict_proba(x, head)), atol=1e-4)


def test_cli_probs_and_eval_calibration(fitted, tmp_path, cli):
    clf, _, centres = fitted
    x, y = _images(centres)
    art = clf.save(tmp_path / "a.svgen")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    code, out, err = cli("classify", art, "--features", tmp_path / "x.npy", "--probs", "--head", "linear",
                         "--top-k", 12, "--format", "jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert all(abs(sum(r["probs"]) - 1) < 1e-4 for r in rows)
    np.testing.assert_allclose(rows[0]["probs"][0], float(clf.predict_proba(x[:1], "linear").max()), rtol=1e-5)

    code, out, err = cli("eval", art, "--features", tmp_path / "x.npy", "--labels", tmp_path / "y.npy", "--json")
    assert code == 0, err
    res = json.loads(out)
    for head in ("cosine", "kernel", "linear"):
        p = np.asarray(clf.predict_proba(x, head))
        z = np.asarray(clf.logits(x, head), dtype=np.float64) / clf.temperatures_[head]
        log_p = z - z.max(1, keepdims=True) - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))
        assert res[head]["nll"] == pytest.approx(-log_p[np.arange(len(y)), y].mean(), rel=1e-6)
        assert res[head]["ece"] == pytest.approx(calibration.ece(p, y), abs=1e-9)
        assert res[head]["temperature"] == pytest.approx(clf.temperatures_[head])
    code, out, err = cli("eval", art, "--features", tmp_path / "x.npy", "--labels", tmp_path / "y.npy")
    assert code == 0 and "nll" in out.splitlines()[0] and "ece" in out.splitlines()[0]


def test_eval_plot_writes_a_png(fitted, tmp_path, cli):
    pytest.importorskip("matplotlib")
    clf, _, centres = fitted
    x, y = _images(centres)
    art = clf.save(tmp_path / "a.svgen")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    code, out, err = cli("eval", art, "--features", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                         "--plot", tmp_path / "rel.png")
    assert code == 0 and "ece" in out, err
    assert (tmp_path / "rel.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / 'rel.png'}: reliability diagrams" in err  # as every written file is said
    code, out, err = cli("eval", art, "--features", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                         "--plot", tmp_path / "rel.png")  # exists, no --force
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1


def test_plot_without_matplotlib_is_one_line(fitted, tmp_path, cli, monkeypatch):
    import builtins

    clf, _, centres = fitted
    x, y = _images(centres)
    art = clf.save(tmp_path / "a.svgen")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    code, out, err = cli("eval", art, "--features", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                         "--plot", tmp_path / "rel.png")
    assert code == 2 and out == "" and "svgen[plot]" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "rel.png").exists()


def test_adapted_scores_stay_on_the_probability_scale(fitted, tmp_path):
    """Shots (format 3): the kernel head is p₀ + a correction fitted to the residual Y − p₀, so on the shots
    its scores are about one for the true class and about zero elsewhere (svgen.adapt.residual), and the
    temperatures are fitted on the shots."""
    clf, emb, centres = fitted
    x, y = _images(centres, n=48, noise=1.0, seed=7)
    a = SVGClassifier.load(clf.save(tmp_path / "z.svgen")).adapt(x, y)
    if a.kernel_prior_ is not None:
        s = np.asarray(a.decision_function(x, "kernel"), dtype=np.float64)
        assert np.abs(s.sum(axis=1) - 1).max() < 0.5                  # rows of p₀ sum to one; V's rows to ~0
        assert s[np.arange(len(y)), y].mean() > s.mean() * 2
    assert a.calibration_["method"] == "loo-nll" and a.temperatures_["kernel"] > 1e-6   # fitted on the shots (issue 13)
    back = SVGClassifier.load(a.save(tmp_path / "v2.svgen"))
    np.testing.assert_allclose(back.predict_proba(x, "kernel"), a.predict_proba(x, "kernel"), atol=1e-6)

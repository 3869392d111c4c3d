"""Unlabelled images as support vectors (issue 12): the transductive solve against an independent
numpy computation of its formulas, the limits that make it safe (infinite prior strength is the
inductive prediction; a pool smaller than the classes changes nothing; rounds that never settle
fall back), the API, the artifact and the CLI."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from svgen import SVGClassifier

from svgen.heads import calibration, predictor
from svgen.adapt.config import DEFAULT
from svgen.adapt.solvers import transduction as td
from svgen.adapt.transduce import score, settings, settle, too_small, transduce

C, D = 4, 12


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _clusters(seed, proto_noise, per_class, pool_noise):
    """(rng, C unit centres, prototypes that far off them, a pool of per_class images per centre, its labels)."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(C, D)))
    protos = (centres + proto_noise * rng.normal(size=(C, D)) / np.sqrt(D)).astype(np.float32)
    yu = np.repeat(np.arange(C), per_class)
    U = _unit(centres[yu] + pool_noise * rng.normal(size=(len(yu), D)) / np.sqrt(D)).astype(np.float32)
    return rng, centres, protos, U, yu


@pytest.fixture(scope="module")
def data():
    rng, centres, protos, U, yu = _clusters(0, 0.5, 10, 0.9)
    ys = np.repeat(np.arange(C), 2)
    X = _unit(centres[ys] + 0.9 * rng.normal(size=(len(ys), D)) / np.sqrt(D)).astype(np.float32)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    return {"protos": protos, "U": U, "yu": yu, "X": X, "ys": ys, "clf": clf}


def _never_settle(clf):
    """The default settings with a stability no pool reaches (150% of itself): the rounds never settle."""
    clf.adapt_config = replace(DEFAULT, stable=1.5)


@pytest.fixture
def gate_open(monkeypatch):
    """The pool check (svgen.adapt.gate) always adopts: for tests of the transduction itself, which the
    check's own tests (tests/transductive/test_pool_gate.py) do not need to pass through. With shots the default head
    and the linear head are then multiplied by the pool's likelihood to the power 1."""
    from svgen.adapt import gate as pool_gate
    from svgen.adapt.select import Paired
    from svgen.adapt.gate import Check, Gate
    from svgen.state import Evidence

    same = Paired(0.5, 0.5, 0.0, 0.0, 10)
    shots = Gate(same, same, DEFAULT.level, same, 5, 0)

    def with_shots(stage, *a, **k):
        return Check(Evidence.SHOTS, stage.default_head, shots, powers={stage.default_head: 1.0, "linear": 1.0})

    monkeypatch.setattr(pool_gate, "check_without_shots", lambda stage, *a, **k: Check(
        Evidence.HALVES, stage.default_head, Gate(same, same, DEFAULT.level, None, 5, 0)))
    monkeypatch.setattr(pool_gate, "check_with_shots", with_shots)


def _transduce(clf, U, **kw):
    """The stage's transduction on the unit pool ``U`` at the default settings, without any check."""
    stage, side = clf._stage(), clf._side()
    return transduce(stage, side, U, score(stage, side, U), clf.adapt_config_, **kw)


def _softmax(a):
    a = a - a.max(axis=1, keepdims=True)
    e = np.exp(a)
    return e / e.sum(axis=1, keepdims=True)


def _brute_force(U, L0, M, X, y, beta, rounds, steps, k, precision=None, T=1.0):
    """The module docstring's formulas, in float64 numpy, with a dense N×N affinity (T: the posterior's
    temperature, which divides every step's argument and the starting prior)."""
    U, L0, M = (np.asarray(a, dtype=np.float64) for a in (U, L0, M))
    N, Dm = U.shape
    Cn = L0.shape[1]
    logp0 = L0 - np.log(np.exp(L0 - L0.max(1, keepdims=True)).sum(1, keepdims=True)) - L0.max(1, keepdims=True)
    G = U @ U.T
    np.fill_diagonal(G, -np.inf)
    Wd = np.zeros((N, N))
    for i in range(N):
        nb = np.argsort(-G[i])[:k]
        Wd[i, nb] = np.maximum(G[i, nb], 0)
    Z = _softmax(logp0 / T)

    def model(Z):
        mu, var = np.zeros((Cn, Dm)), np.zeros(Dm)
        for c in range(Cn):
            num = (Z[:, c:c + 1] * U).sum(0) + X[y == c].sum(0) + 1.0 * M[c]
            mu[c] = num / (Z[:, c].sum() + (y == c).sum() + 1.0)
        for c in range(Cn):
            var += (Z[:, c:c + 1] * (U - mu[c]) ** 2).sum(0)
        var += ((X - mu[y]) ** 2).sum(0)
        var /= N + len(y)
        if precision is None:
            ll = np.stack([-0.5 * (((U - mu[c]) ** 2) / var).sum(1) for c in range(Cn)], 1)
        else:
            ll = np.stack([-0.5 * np.einsum("nd,de,ne->n", U - mu[c], precision, U - mu[c]) for c in range(Cn)], 1)
        return mu, var, ll

    for _ in range(rounds):
        _, _, ll = model(Z)
        for _ in range(steps):
            Z = _softmax((beta * logp0 + ll + Wd @ Z) / T)
    return Z, model(Z)


@pytest.mark.parametrize("with_precision, T", [(False, 1.0), (True, 1.0), (True, 6.5)])
def test_transduce_matches_brute_force(data, with_precision, T):
    rng = np.random.default_rng(1)
    U = data["U"]
    L0 = 3 * rng.normal(size=(len(U), C))
    M = _unit(data["protos"])
    P = None
    if with_precision:
        A = rng.normal(size=(D, D))
        P = A @ A.T / D + np.eye(D)
    res = td.transduce(torch.as_tensor(U), torch.as_tensor(L0), torch.as_tensor(M).float(),
                       settings(replace(DEFAULT, rounds=2, steps=3)), shots_x=torch.as_tensor(data["X"]),
                       shots_y=torch.as_tensor(data["ys"]), strength=0.7,
                       precision=None if P is None else torch.as_tensor(P).float(), temperature=T)
    Z, (mu, var, ll) = _brute_force(U, L0, M, data["X"], data["ys"], 0.7, res.info["rounds"], 3, DEFAULT.neighbours,
                                     P, T)
    assert res.info["posterior_temperature"] == T
    assert np.allclose(res.labels.numpy(), Z, atol=2e-4)
    # the returned linear head is the class log-likelihood up to a per-row constant
    lin = U @ res.weight.numpy().T + res.bias.numpy()
    diff = lin - ll
    assert np.allclose(diff, diff[:, :1], atol=1e-2 * np.abs(ll).max())


def test_infinite_prior_strength_is_the_inductive_prediction(data):
    rng = np.random.default_rng(2)
    L0 = torch.as_tensor(rng.normal(size=(len(data["U"]), C)))
    res = td.transduce(torch.as_tensor(data["U"]), L0, torch.as_tensor(data["protos"]), settings(DEFAULT), strength=1e7)
    assert torch.equal(res.labels.argmax(1), L0.argmax(1))
    assert res.info["changed_from_prior"] == 0
    # and in the classifier's transduction (before the pool check decides what is kept): the posterior linear
    # head predicts as the linear head the solve continued (the LDA part of the inductive one), and the pool's
    # labels are the prior's, the inductive default head's prediction
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"]).adapt(data["X"], data["ys"])
    q = data["U"]
    pool = _transduce(clf, torch.nn.functional.normalize(torch.as_tensor(q), dim=-1), strength=1e7)
    qn = torch.nn.functional.normalize(torch.as_tensor(q), dim=-1)
    before = (qn @ pool.prior_linear.weight.T + pool.prior_linear.bias).argmax(1).numpy()
    after = predictor.scores(pool.heads, clf.prototypes_, "rbf", torch.as_tensor(q), "linear")
    assert np.array_equal(after.argmax(1).numpy(), before)
    assert np.array_equal(pool.labels.argmax(1).numpy(), clf.predict_proba(q).argmax(1))


def test_zero_strength_and_no_graph_is_plain_soft_gmm(data):
    """β = 0, no neighbours: Z is the posterior of the fitted Gaussian model alone (EM fixed point)."""
    U = torch.as_tensor(data["U"])
    res = td.transduce(U, torch.zeros(len(U), C), torch.as_tensor(data["protos"]),
                       settings(replace(DEFAULT, neighbours=0, rounds=1, steps=1)), strength=0.0)
    mu, var = td.class_model(U, torch.full((len(U), C), 1.0 / C), None, None, torch.as_tensor(data["protos"]),
                             DEFAULT.prior_pseudo_images)
    W, b = td.gmm_head(mu, var)
    assert torch.allclose(res.labels, torch.softmax(U @ W.T + b, dim=1), atol=1e-5)


def test_knn_graph_matches_sorting():
    g = torch.Generator().manual_seed(0)
    U = torch.nn.functional.normalize(torch.randn(50, 8, generator=g), dim=-1)
    idx, w = td.knn_graph(U, k=4, block=7)
    G = (U @ U.T).fill_diagonal_(-2)
    want = G.argsort(dim=1, descending=True)[:, :4]
    assert torch.equal(idx.sort(dim=1).values, want.sort(dim=1).values)
    assert torch.allclose(w, G.gather(1, idx).clamp_min(0))


def test_match_entropy_hits_the_target():
    g = torch.Generator().manual_seed(0)
    S = torch.randn(30, 6, generator=g)
    for target in (0.3, 1.0, 1.6):
        t = calibration.match_entropy(S, target)
        assert abs(calibration.entropy(S.double() * t) - target) < 1e-4


def test_settle_raises_the_strength_then_gives_up(data, monkeypatch):
    never = replace(DEFAULT, stable=1.5, rounds=2)   # no pool can agree on 150% of itself: never settles
    res, tries = settle(torch.as_tensor(data["U"]), torch.zeros(len(data["U"]), C), torch.as_tensor(data["protos"]),
                        0.5, settings(never))
    assert res is None
    assert [t["prior_strength"] for t in tries] == [0.5 * 4.0 ** i for i in range(4 + 1)]


def test_prior_strength_rule():
    assert td.prior_strength(200, 100) == 1.5
    assert td.prior_strength(1000, 100, n_shots=400) == 0.4


# ----------------------------------------------------------------------------- classifier

def test_pool_smaller_than_classes_changes_nothing(data, tmp_path):
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    W, b = clf.linear_weight_.clone(), clf.linear_bias_.clone()
    clf.adapt(unlabelled=data["U"][:C - 1])
    assert "smaller than the 4 classes" in clf.transductive_["fallback"]
    assert torch.equal(clf.linear_weight_, W) and torch.equal(clf.linear_bias_, b)
    assert np.array_equal(clf.transductive_labels_.argmax(1), clf.decision_function(data["U"][:C - 1]).argmax(1))
    clf.save(tmp_path / "a.svgen")
    meta = json.loads((tmp_path / "a.svgen" / "svgen.json").read_text())
    assert meta["transductive"]["fallback"] and meta["format_version"] == 1


def test_fit_with_unlabelled_equals_fit_then_adapt(data, tmp_path, gate_open):
    a = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"], unlabelled=data["U"])
    b = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"]).adapt(unlabelled=data["U"])
    assert a.transductive_["fallback"] is None and a.transductive_["prior_head"] == "kernel"
    for head in ("kernel", "linear"):
        assert np.array_equal(a.decision_function(data["U"], head), b.decision_function(data["U"], head))
    # adapting again to the same pool starts from the inductive heads: the same result
    W = b.linear_weight_.clone()
    b.adapt(unlabelled=data["U"])
    assert torch.allclose(b.linear_weight_, W)
    # save/load: the transductive linear head, the inductive one and the record travel
    b.save(tmp_path / "t.svgen")
    c = SVGClassifier.load(tmp_path / "t.svgen")
    assert torch.equal(c.linear_weight_, b.linear_weight_)
    assert torch.equal(c.inductive_.linear.weight, b.inductive_.linear.weight)
    assert c.transductive_["prior_strength"] == b.transductive_["prior_strength"]
    zs = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    c.adapt(unlabelled=data["U"][:2])   # falls back: the inductive linear head comes back
    assert torch.equal(c.linear_weight_, zs.linear_weight_)


def test_posterior_temperature_is_the_lda_heads_loo_temperature(gate_open):
    """With shots that have a within-class scatter the solve runs at the inductive LDA head's leave-one-out
    temperature (its Z is that head's calibrated posterior); with one shot per class (Σ = I, nothing fitted on
    labels) and zero-shot at 1. The inductive T is used even when adapting an adapted artifact again."""
    rng, centres, protos, U, yu = _clusters(5, 0.6, 12, 1.6)
    ys = np.repeat(np.arange(C), 4)
    X = _unit(centres[ys] + 1.6 * rng.normal(size=(len(ys), D)) / np.sqrt(D)).astype(np.float32)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    # the linear head is zero-shot logits + α·s·LDA logits; the solve continues its LDA part, at that part's own
    # leave-one-out temperature (recorded with the head)
    lin = clf.fewshot_["linear"]
    assert lin["form"] != "lda" and lin["lda_temperature_fitted"]   # the shots do not all rank first when left out
    T = lin["lda_temperature"]
    assert T != 1.0
    seen = []
    real = td.transduce
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(td, "transduce", lambda *a, **kw: seen.append(kw["temperature"]) or real(*a, **kw))
        clf.adapt(unlabelled=U)
        clf.adapt(unlabelled=U[::-1].copy())                     # again: from the inductive heads and T
        assert seen and all(t == pytest.approx(T) for t in seen)
        assert clf.transductive_["posterior_temperature"] == pytest.approx(T)
        assert "leave-one-out" in clf.transductive_["posterior_temperature_source"]
        seen.clear()
        one = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X[::4], ys[::4])
        one.adapt(unlabelled=U)
        zero = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
        zero.adapt(unlabelled=U)
        assert seen and all(t == 1.0 for t in seen)
    with pytest.raises(Exception, match="posterior temperature"):
        td.transduce(torch.as_tensor(U), torch.zeros(len(U), C), torch.as_tensor(protos), settings(DEFAULT),
                     temperature=0.0)


def test_shots_then_pool(data, gate_open):
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    clf.adapt(data["X"], data["ys"], unlabelled=data["U"])
    t = clf.transductive_
    assert t["prior_head"] == clf.fewshot_["default_head"] and t["covariance"].startswith("fixed")
    assert t["tries"][0]["prior_strength"] == pytest.approx(len(data["ys"]) / len(data["U"]))
    assert clf.fewshot_["shots"] == len(data["ys"])
    # more shots re-solve the heads from the shots: the pool must be given again
    clf.adapt(data["X"][:2], data["ys"][:2])
    assert clf.transductive_ is None and clf.inductive_ is None


@pytest.mark.parametrize("pool, msg", [
    (np.ones((5, D + 1), np.float32), "dimension 13"),
    (np.zeros((5, D), np.float32), "all-zero"),
    (np.full((5, D), np.nan, np.float32), "NaN"),
    (np.ones((1, D), np.float32), "at least 2"),
])
def test_bad_pools(data, pool, msg):
    from svgen.errors import SvgenError

    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    with pytest.raises(SvgenError, match=msg):
        clf.adapt(unlabelled=pool)
    with pytest.raises(SvgenError, match=msg):
        SVGClassifier(n_support=2, steps=5).fit(data["protos"], unlabelled=pool)
    with pytest.raises(SvgenError, match="nothing to adapt"):
        clf.adapt()


# ----------------------------------------------------------------------------- CLI

@pytest.fixture
def files(tmp_path, data):
    from conftest import write_inputs

    return write_inputs(tmp_path, data["protos"], U=data["U"], X=data["X"], y=data["ys"], Udim=data["U"][:, :5])


def test_cli_fit_adapt_classify_transductive(cli, files, gate_open):
    base = ("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2", "--steps", "5")
    assert cli(*base, "--out", files / "zs.svgen")[0] == 0
    code, out, err = cli(*base, "--out", files / "tf.svgen", "--unlabelled-features", files / "U.npy")
    assert code == 0, err
    assert json.loads(out)["transductive"]["pool"] == 40
    code, out, err = cli("adapt", files / "zs.svgen", "--unlabelled-features", files / "U.npy", "--out",
                         files / "ta.svgen")
    assert code == 0, err
    assert "unlabelled pool of 40 images" in err
    assert "the pool was kept (halves of the pool say it is better): the linear head is the default head" in err
    assert json.loads(out)["transductive"]["default_head"] == "linear"
    a, b = SVGClassifier.load(files / "tf.svgen"), SVGClassifier.load(files / "ta.svgen")
    assert torch.equal(a.linear_weight_, b.linear_weight_)
    code, out, err = cli("adapt", files / "zs.svgen", "--shot-features", files / "X.npy", "--shot-labels",
                         files / "y.npy", "--unlabelled-features", files / "U.npy", "--out", files / "fa.svgen")
    assert code == 0, err
    assert "8 shots" in err and "unlabelled pool" in err
    fa = SVGClassifier.load(files / "fa.svgen")
    assert fa.transductive_["prior_head"] == fa.fewshot_["default_head"]   # the inductive predictor as deployed
    # svgen.json records the posterior's temperature and where it came from (1 for the zero-shot pool)
    meta = json.loads((files / "fa.svgen" / "svgen.json").read_text())["transductive"]
    ind = meta["inductive_calibration"]
    fitted = ind["calibration"]["loo"]["linear"]["fitted"]
    assert meta["posterior_temperature"] == pytest.approx(ind["temperatures"]["linear"] if fitted else 1.0)
    assert ("leave-one-out NLL temperature" in meta["posterior_temperature_source"]) == fitted
    assert json.loads((files / "ta.svgen" / "svgen.json").read_text())["transductive"]["posterior_temperature"] == 1.0
    # classify --transductive: the pool's own soft labels, as the library computes them
    code, out, err = cli("classify", files / "zs.svgen", "--features", files / "U.npy", "--transductive",
                         "--format", "jsonl", "-k", "1")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    clf = SVGClassifier.load(files / "zs.svgen").adapt(unlabelled=np.load(files / "U.npy"))
    want = clf.transductive_labels_.argmax(1).tolist()
    assert [r["labels"][0] for r in rows] == [f"c{i}" for i in want]
    assert all(0 < r["probs"][0] <= 1 for r in rows)


@pytest.mark.parametrize("args, msg", [
    (("--unlabelled-features", "Udim.npy"), "dimension 5"),
    (("--unlabelled-features", "missing.npy"), "not found"),
    (("--unlabelled", "nowhere"), "not a folder"),
])
@pytest.mark.parametrize("command", ["adapt", "fit"])
def test_cli_bad_pools_write_nothing(refused_cleanly, files, args, msg, command):
    refused_cleanly(files, command, args, msg)


def test_cli_image_folder_pool_is_embedded_with_the_artifacts_encoder(cli, tiny_model, tmp_path, gate_open):
    from PIL import Image

    names = ["red", "green", "blue"]
    (tmp_path / "classes.txt").write_text("\n".join(names) + "\n")
    rng = np.random.default_rng(0)
    (tmp_path / "pool").mkdir()
    for i in range(9):
        img = np.clip(rng.normal(60 + 70 * (i % 3), 30, size=(40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(tmp_path / "pool" / f"{i}.png")
    (tmp_path / "pool" / "notes.txt").write_text("not an image")
    enc = ("--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"])
    code, out, err = cli("fit", "--classes", tmp_path / "classes.txt", *enc, "-K", "2", "--steps", "3",
                         "--out", tmp_path / "zs.svgen")
    assert code == 0, err
    code, out, err = cli("adapt", tmp_path / "zs.svgen", "--unlabelled", tmp_path / "pool", *enc,
                         "--out", tmp_path / "t.svgen")
    assert code == 0, err
    assert "unlabelled pool of 9 images" in err
    code, out, err = cli("fit", "--classes", tmp_path / "classes.txt", *enc, "-K", "2", "--steps", "3",
                         "--unlabelled", tmp_path / "pool", "--out", tmp_path / "tf.svgen")
    assert code == 0, err
    a, b = SVGClassifier.load(tmp_path / "t.svgen"), SVGClassifier.load(tmp_path / "tf.svgen")
    # the same solve; the artifact round trip (float32 kernel scores) moves the calibration in the 7th digit
    assert b.transductive_["pool"] == 9
    assert float((a.linear_weight_ - b.linear_weight_).abs().max()) <= 1e-4 * float(a.linear_weight_.abs().max())
    code, out, err = cli("classify", tmp_path / "zs.svgen", tmp_path / "pool", "--transductive", *enc,
                         "--format", "jsonl", "-k", "3")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 9 and all(abs(sum(r["probs"]) - 1) < 1e-4 for r in rows)   # 3 of 3 classes: probabilities
    # the same as adapting to the encoder's own embeddings of those files
    from svgen.encoders.clip import ClipEncoder

    encoder = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"])
    paths = [r["path"] for r in rows]
    feats, ok, _ = encoder.encode_images(paths)
    clf = SVGClassifier.load(tmp_path / "zs.svgen").adapt(unlabelled=np.asarray(feats))
    want = clf.transductive_labels_.argmax(1).tolist()
    assert [r["labels"][0] for r in rows] == [names[i] for i in want]


def test_classifier_keeps_the_inductive_heads_when_the_rounds_never_settle(data, gate_open):
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    _never_settle(clf)
    W, b = clf.linear_weight_.clone(), clf.linear_bias_.clone()
    clf.adapt(unlabelled=data["U"])
    t = clf.transductive_
    assert "did not settle" in t["fallback"] and len(t["tries"]) == DEFAULT.max_escalations + 1
    assert torch.equal(clf.linear_weight_, W) and torch.equal(clf.linear_bias_, b)
    assert clf.inductive_ is None


# ----------------------------------------------------------------------------- the kernel head after a pool

@pytest.fixture(scope="module")
def hard():
    """Prototypes far off their clusters (the inductive heads err) and a pool with tight clusters."""
    _, _, protos, U, yu = _clusters(7, 1.6, 30, 0.5)
    return {"protos": protos, "U": U, "yu": yu}


def _kernel_factor(clf):
    kh = clf.transductive_["kernel_head"]
    assert not kh["replaced"] and kh["factor"], kh
    return clf.transductive_["pool_factor"]["powers"]["kernel"]


def test_pool_kernel_head_in_the_classifier(hard, tmp_path, gate_open):
    """Zero-shot, a kept pool leaves the kernel vote's rows and weights as they were (listed one by one) and
    multiplies its probabilities by the pool's likelihood (format 6, no shots); the factor travels through save, load
    and export; adapting again gives the same head, a refused pool the zero-shot head, new classes drop it."""
    from svgen.core.support import TEXT

    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(hard["protos"])
    K0, P0 = clf.decision_function(hard["U"], "kernel"), clf.predict_proba(hard["U"], "kernel")
    acc0 = (P0.argmax(1) == hard["yu"]).mean()
    clf.adapt(unlabelled=hard["U"])
    a = _kernel_factor(clf)
    assert a > 0 and clf.kernel_logits_ == "score"
    assert (clf.support_source_.numpy() == TEXT).all() and len(clf.support_source_) == C * 2
    assert torch.equal(clf.vote_weights_, SVGClassifier(n_support=2, steps=5, seed=0).fit(hard["protos"]).vote_weights_)
    assert (clf.predict_proba(hard["U"], "kernel").argmax(1) == hard["yu"]).mean() > acc0
    clf.save(tmp_path / "t.svgen")
    meta = json.loads((tmp_path / "t.svgen" / "svgen.json").read_text())
    assert meta["format_version"] == 6 and meta["fewshot"] is None
    assert meta["calibration"]["pool_factor_powers"] == {"kernel": pytest.approx(a)}
    b = SVGClassifier.load(tmp_path / "t.svgen")
    assert b.fewshot_ is None and _kernel_factor(b) == pytest.approx(a)
    np.testing.assert_allclose(b.predict_proba(hard["U"], "kernel"), clf.predict_proba(hard["U"], "kernel"),
                               rtol=1e-5, atol=1e-7)
    from svgen.io.export import head_tensors

    ex = head_tensors(b, "kernel")
    assert float(ex["pool_factor.power"]) == pytest.approx(a, rel=1e-6) and (ex["support_source"] == TEXT).all()
    # adapting the loaded artifact again starts from the inductive heads: the same result
    b.adapt(unlabelled=hard["U"])
    np.testing.assert_allclose(b.predict_proba(hard["U"], "kernel"), clf.predict_proba(hard["U"], "kernel"),
                               rtol=1e-4, atol=1e-6)
    # a pool that falls back restores the zero-shot kernel head's probabilities
    b.adapt(unlabelled=hard["U"][:2])
    assert b.heads_.pool_factor is None
    np.testing.assert_allclose(b.decision_function(hard["U"], "kernel"), K0, atol=1e-6)
    np.testing.assert_allclose(b.predict_proba(hard["U"], "kernel"), P0, rtol=1e-4, atol=1e-6)
    # classes can still be added (the pool's factor is dropped)
    clf.add_classes(hard["protos"][:1] * -1, ["new"])
    assert clf.transductive_ is None and clf.heads_.pool_factor is None and clf.support_vectors_.dim() == 3


def test_pool_with_local_votes_keeps_the_kernel_head(hard, tmp_path, gate_open):
    """Sparse (local) vote weights: a kept zero-shot pool adapts the linear head only (the layout that carries a
    factor stores dense votes); the kernel head is the inductive one, and the artifact round-trips."""
    clf = SVGClassifier(n_support=2, steps=5, seed=0, vote_solver="local", vote_neighbours=4).fit(hard["protos"])
    P0 = clf.predict_proba(hard["U"], "kernel")
    clf.adapt(unlabelled=hard["U"])
    kh = clf.transductive_["kernel_head"]
    assert clf.transductive_["fallback"] is None and not kh["factor"] and "sparse" in kh["reason"]
    assert clf.heads_.pool_factor is None and clf.heads_.kernel.votes.is_sparse
    np.testing.assert_array_equal(clf.predict_proba(hard["U"], "kernel"), P0)
    b = SVGClassifier.load(clf.save(tmp_path / "l.svgen"))
    for h in ("kernel", "linear", None):
        np.testing.assert_allclose(b.predict_proba(hard["U"], h), clf.predict_proba(hard["U"], h), rtol=1e-5, atol=1e-7)


def test_pool_after_shots_keeps_the_shots(data, gate_open):
    """With shots the kernel vote is never re-solved; a refused pool gives the few-shot kernel head back, and more
    shots drop the pool."""
    from svgen.core.support import IMAGE

    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"]).adapt(data["X"], data["ys"])
    K0, M0 = clf.decision_function(data["U"], "kernel"), len(clf.support_source_)
    clf.adapt(unlabelled=data["U"])
    assert not (clf.transductive_.get("kernel_head") or {}).get("replaced")
    assert len(clf.support_source_) == M0 and (clf.support_source_.numpy() == IMAGE).sum() == len(data["ys"])
    clf.adapt(unlabelled=data["U"][:2])   # falls back: the few-shot kernel head again
    assert np.allclose(clf.decision_function(data["U"], "kernel"), K0, atol=1e-6)
    clf.adapt(unlabelled=data["U"])
    clf.adapt(data["X"][:2], data["ys"][:2])   # more shots: the pool is dropped, the shots kept
    assert clf.transductive_ is None and clf.heads_.pool_factor is None
    assert clf.fewshot_["shots"] == len(data["ys"]) + 2


def test_cli_classify_transductive_kernel_head(cli, hard, tmp_path, gate_open):
    files = tmp_path
    np.save(files / "P.npy", hard["protos"])
    np.save(files / "U.npy", hard["U"])
    (files / "classes.txt").write_text("".join(f"c{i}\n" for i in range(C)))
    base = ("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2", "--steps", "5")
    assert cli(*base, "--out", files / "zs.svgen")[0] == 0
    code, out, err = cli("classify", files / "zs.svgen", "--features", files / "U.npy", "--transductive",
                         "--head", "kernel", "--format", "jsonl", "-k", "1")
    assert code == 0, err
    clf = SVGClassifier.load(files / "zs.svgen").adapt(unlabelled=np.load(files / "U.npy"))
    _kernel_factor(clf)
    want = clf.decision_function(np.load(files / "U.npy"), "kernel")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["labels"][0] for r in rows] == [f"c{i}" for i in want.argmax(1)]
    assert np.allclose([r["scores"][0] for r in rows], want.max(1), rtol=1e-5)


def _kernel_probs_by_hand(clf, U):
    """p = score^(1/T) / Σ score^(1/T) of the kernel vote, from its raw scores (independent of svgen.adapt.temperatures)."""
    s = np.asarray(clf.decision_function(U, "kernel"), dtype=np.float64)
    return _softmax(np.log(np.maximum(s, 1e-30)) / clf.temperatures_["kernel"])


def test_fallback_labels_are_the_calibrated_probabilities(data, gate_open):
    """Issue 13: when the inductive heads are kept, the pool's soft labels are the prior head's
    predict_proba (softmax(log score / T)), not a softmax of raw kernel scores (nearly uniform)."""
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    small = data["U"][:C - 1]
    clf.adapt(unlabelled=small)                                      # fall-back: pool smaller than the classes
    got = clf.transductive_labels_
    assert np.allclose(got, _kernel_probs_by_hand(clf, small), atol=1e-9)
    assert np.allclose(got, clf.predict_proba(small, "kernel"), atol=1e-12)
    raw = _softmax(np.asarray(clf.decision_function(small, "kernel"), dtype=np.float64))
    assert got.max(axis=1).mean() > raw.max(axis=1).mean()          # sharper than the raw-score softmax
    _never_settle(clf)                                               # fall-back: the rounds never settle
    clf.adapt(unlabelled=data["U"])
    assert "did not settle" in clf.transductive_["fallback"]
    assert np.allclose(clf.transductive_labels_, _kernel_probs_by_hand(clf, data["U"]), atol=1e-9)


def test_pool_probabilities_are_the_deployed_heads(hard, gate_open):
    """The pool's probabilities (what ``classify --transductive`` prints) are the adapted default head's on the pool
    (issue 40, item 6): what the adapted artifact gives those images through ``predict_proba``, not the solve's
    own, sharper posterior (whose argmax the k-NN term can move)."""
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(hard["protos"])
    clf.adapt(unlabelled=hard["U"])
    assert clf.transductive_["fallback"] is None and clf.default_head_ == "linear"
    P = np.asarray(clf.transductive_labels_, dtype=np.float64)
    np.testing.assert_allclose(P, clf.predict_proba(hard["U"]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-5)


def test_adapting_again_restores_the_inductive_probabilities(tmp_path, gate_open):
    """A pool with shots multiplies heads by its likelihood (a pool factor); adapting again — here to a pool that
    falls back — restores the inductive heads *with* the temperatures they had, also after a save/load round trip
    (format 6: the factor travels in the artifact, and adapting again drops it)."""
    rng, centres, protos, U, _ = _clusters(7, 1.6, 30, 0.5)
    ys = np.repeat(np.arange(C), 3)
    X = _unit(centres[ys] + 1.5 * rng.normal(size=(len(ys), D)) / np.sqrt(D)).astype(np.float32)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    before = (dict(clf.temperatures_), clf.kernel_logits_, clf.calibration_["method"])
    p_before = clf.predict_proba(U, "kernel"), clf.predict_proba(U, "linear")
    clf.adapt(unlabelled=U)
    assert clf.transductive_["fallback"] is None and clf.heads_.pool_factor is not None
    assert not np.allclose(clf.predict_proba(U, "linear"), p_before[1], atol=1e-3)   # the pool did change it
    for c in (clf, SVGClassifier.load(clf.save(tmp_path / "t.svgen"))):
        c.adapt(unlabelled=U[:C - 1])              # falls back: the inductive heads come back
        assert c.transductive_["fallback"]
        assert (dict(c.temperatures_), c.kernel_logits_, c.calibration_["method"]) == before
        np.testing.assert_allclose(c.predict_proba(U, "kernel"), p_before[0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(c.predict_proba(U, "linear"), p_before[1], rtol=1e-5, atol=1e-7)


def test_the_config_reaches_every_setting_of_the_pool_stage(data, gate_open):
    """AdaptConfig is threaded from transductive.adapt.adapt down (issue 38): the escalation settings shape the tries,
    the smallest pool per class decides what is too small, and the level is the check's."""
    from svgen.adapt.config import AdaptConfig
    from svgen.adapt import pool as pool_adapt

    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    U = torch.nn.functional.normalize(torch.as_tensor(data["U"]), dim=-1)
    never = AdaptConfig(stable=1.5, escalate=2.0, max_escalations=1, rounds=2)
    fit = pool_adapt.adapt(clf._stage(), clf._side(), U, strength=0.5, config=never)
    assert "did not settle" in fit.record["fallback"]
    assert [t["prior_strength"] for t in fit.record["tries"]] == [0.5, 1.0]
    assert all(t["rounds"] == 2 for t in fit.record["tries"])
    assert "smaller than" in pool_adapt.adapt(clf._stage(), clf._side(), U[:C - 1], config=DEFAULT).record["fallback"]
    assert too_small(C - 1, C, DEFAULT) is not None and too_small(C - 1, C, AdaptConfig(min_pool_per_class=0.5)) is None


def test_the_pool_is_scored_once_by_the_inductive_kernel_head(data, monkeypatch):
    """Zero-shot, the inductive default head is the kernel head: the check's halves, each half's and the final
    transduction's prior, the entropy target and the kept kernel head's posterior all reuse one scoring of the pool
    (kernel scores of the N pool rows, once), and the pool is kept with the probabilities of scoring it afresh."""
    from svgen.heads import predictor as pred
    from svgen.adapt import pool as pool_adapt

    rng, centres, protos, U, _ = _clusters(7, 1.6, 30, 0.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    U = torch.nn.functional.normalize(torch.as_tensor(U), dim=-1)
    rows, real = [], pred.kernel_scores   # per kernel scoring, how many of its rows are pool images

    def spy(x, *a, **k):
        rows.append(int(((x.float() @ U.float().T).max(dim=1).values > 1 - 1e-5).sum()))
        return real(x, *a, **k)

    monkeypatch.setattr(pred, "kernel_scores", spy)
    stage = clf._stage()
    assert stage.default_head == "kernel"
    fit = pool_adapt.adapt(stage, clf._side(), U, config=DEFAULT)
    assert fit.decision.kept and fit.record["kernel_head"]["factor"]
    assert sum(rows) == len(U)   # the text queries the linear head's temperature is matched on are no pool images
    monkeypatch.setattr(pred, "kernel_scores", real)
    fresh = pred.proba(stage.heads, clf.prototypes_, "rbf", U, "kernel")
    assert torch.allclose(score(stage, clf._side(), U).proba(), fresh, atol=1e-12)


def test_the_level_is_the_configs(data):
    """The pool check's one level comes from the config: a pool kept at 1 SE is refused at a level no data reaches."""
    from svgen.adapt.config import AdaptConfig
    from svgen.adapt import pool as pool_adapt

    rng, centres, protos, U, _ = _clusters(7, 1.6, 30, 0.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    U = torch.nn.functional.normalize(torch.as_tensor(U), dim=-1)
    assert pool_adapt.adapt(clf._stage(), clf._side(), U, config=DEFAULT).decision.kept
    strict = pool_adapt.adapt(clf._stage(), clf._side(), U, config=AdaptConfig(level=1e6))
    assert not strict.decision.kept and "by more than 1e+06 SE" in strict.record["fallback"]
    assert "by more than 1e+06 SE" in strict.record["check"]["rule"]


def test_the_checks_fold_refits_use_the_config():
    """With shots the check refits the shots stage without each fold: those refits get the user's AdaptConfig too,
    not the defaults, and the check reads each fold's default head and Gaussian part from the typed fits."""
    from unittest import mock

    from svgen.adapt import shots as shot_adapt
    from svgen.adapt.config import AdaptConfig
    from svgen.adapt import pool as pool_adapt

    rng, centres, protos, U, _ = _clusters(7, 1.6, 30, 0.5)
    ys = np.repeat(np.arange(C), 4)
    X = _unit(centres[ys] + 1.5 * rng.normal(size=(len(ys), D)) / np.sqrt(D)).astype(np.float32)
    cfg = AdaptConfig(alphas=(0.0, 1.0))
    clf = SVGClassifier(n_support=2, steps=5, seed=0, adapt_config=cfg).fit(protos).adapt(X, ys)
    seen = []
    real = shot_adapt.adapt

    def spy(*a, **k):
        seen.append(k.get("config"))
        return real(*a, **k)

    with mock.patch.object(shot_adapt, "adapt", spy):
        fit = pool_adapt.adapt(clf._stage(), clf._side(), torch.nn.functional.normalize(torch.as_tensor(U), dim=-1),
                               config=cfg)
    assert len(seen) >= 2 and all(c is cfg for c in seen), seen   # one refit per fold, each with the config
    assert fit.record["check"]["evidence"] == "held-out shots as pool members"


def test_a_stage_with_shots_needs_their_lda_part():
    """The solve continues the shots' Gaussian class model from the state; a stage without it is a caller's error,
    not a silent fall-back to the label-free scales."""
    import dataclasses

    rng, centres, protos, U, _ = _clusters(7, 1.6, 30, 0.5)
    ys = np.repeat(np.arange(C), 3)
    X = _unit(centres[ys] + 1.5 * rng.normal(size=(len(ys), D)) / np.sqrt(D)).astype(np.float32)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    stage = clf._stage()
    assert stage.lda is clf.lda_ is not None
    with pytest.raises(ValueError, match="LDA part"):
        U = torch.nn.functional.normalize(torch.as_tensor(U), dim=-1)
        transduce(dataclasses.replace(stage, lda=None), clf._side(), U, score(stage, clf._side(), U), DEFAULT)

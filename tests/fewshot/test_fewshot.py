"""Labelled images as support vectors (issue 11): the LOO identities, the heads, artifact format 2,
the API and the CLI. Every number is checked against an independent computation (brute-force
refits with one shot left out, numpy formulas straight from the stored tensors)."""

import math
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from svgen import SVGClassifier
from svgen.io.export import export_head, load_head
from svgen.adapt import heldout
from svgen.adapt.config import DEFAULT
from svgen.adapt.lda import fit_lda_head, lda_head_weights, lda_loo_scores, lda_setting, prior_means
from svgen.core.support import IMAGE, TEXT, image_rows
from conftest import write_png_shots

ROOT = Path(__file__).resolve().parents[2]
C, D = 5, 16


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(C, 3, D)).astype(np.float32)
    centres = _unit(protos.mean(1))
    y = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4])
    X = (centres[y] + 0.8 * rng.normal(size=(len(y), D)) / np.sqrt(D)).astype(np.float32) * 2.0
    q = (centres[np.repeat(np.arange(C), 4)] + 0.8 * rng.normal(size=(4 * C, D)) / np.sqrt(D)).astype(np.float32)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    return {"protos": protos, "X": X, "y": y, "q": q, "clf": clf}


# ----------------------------------------------------------------------------- LOO identities

@pytest.mark.parametrize("gamma, kappa", [(0.1, 0.0), (0.3, 2.0), (0.7, 0.5), (1.0, 1.0)])
def test_lda_loo_matches_refits_without_each_shot(gamma, kappa):
    g = torch.Generator().manual_seed(0)
    # class 4 has one shot (left out, its mean is the prior mean m_4), class 5 has none
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 0, 1, 2, 3, 4])
    X = torch.nn.functional.normalize(torch.randn(len(y), 6, generator=g, dtype=torch.float64), dim=-1)
    X = X + 0.5 * torch.eye(6, 6, dtype=torch.float64)[y]
    m = torch.randn(6, 6, generator=g, dtype=torch.float64)
    (_, loo), = lda_loo_scores(X, y, m, [gamma], [kappa])
    correct = (loo.argmax(dim=1) == y).numpy()
    # LOO holds the shrinkage target τ = tr(S_w)/(df·D) and the centre x̄ of all shots fixed (no labels in either)
    means = torch.stack([X[y == c].mean(0) for c in range(5)])
    tau = float(((X - means[y]) ** 2).sum()) / ((len(y) - 5) * 6)
    for i in range(len(y)):
        keep = torch.arange(len(y)) != i
        W, b = lda_head_weights(X[keep], y[keep], m, gamma, kappa, tau=tau, equal_radius=True, centre=X.mean(0))
        s = X[i] @ W.T + b
        assert bool(correct[i]) == bool(s.argmax() == y[i])
        torch.testing.assert_close(loo[i], s, rtol=1e-7, atol=1e-9)
    # scoring a subset of the shots gives exactly their rows of the full leave-one-out
    sub = torch.tensor([0, 3, 7, 12, 22])
    (_, full), = lda_loo_scores(X, y, m, [gamma], [kappa])
    (_, part), = lda_loo_scores(X, y, m, [gamma], [kappa], score_rows=sub)
    torch.testing.assert_close(part, full[sub])


# ----------------------------------------------------------------------------- heads

def test_lda_head_matches_sklearn_without_prior():
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(4), 8)
    X = _unit(rng.normal(size=(4, 10))[y] * 2 + rng.normal(size=(32, 10)))
    W, b = lda_head_weights(torch.tensor(X), torch.tensor(y), torch.zeros(4, 10, dtype=torch.float64), 0.0, 0.0)
    ref = LinearDiscriminantAnalysis(solver="lsqr", priors=np.full(4, 0.25)).fit(X, y)
    Q = _unit(rng.normal(size=(20, 10)))
    ours = Q @ W.numpy().T + b.numpy()
    theirs = ref.decision_function(Q)
    # the same classifier up to a per-row constant (sklearn adds log priors) and the covariance's
    # normalisation (sklearn divides the within-class scatter by N = 32, svgen by N − C = 28)
    ours = ours * 32 / 28
    np.testing.assert_allclose(ours - ours.mean(1, keepdims=True), theirs - theirs.mean(1, keepdims=True), atol=1e-6)


def test_equal_radius_with_one_shot_is_centred_renormalised_nearest_mean():
    """Σ ∝ I, one shot per class, κ = 0: the head is SimpleShot's CL2N nearest mean, computed here by hand."""
    rng = np.random.default_rng(5)
    X = _unit(rng.normal(size=(6, 12)) + 1.0)
    y = np.arange(6)
    W, b = lda_head_weights(torch.tensor(X), torch.tensor(y), torch.zeros(6, 12, dtype=torch.float64), 1.0, 0.0,
                            equal_radius=True)
    Q = _unit(rng.normal(size=(40, 12)) + 1.0)
    c = X.mean(0)
    cl2n = (Q - c) @ _unit(X - c).T
    ours = Q @ W.numpy().T + b.numpy()
    assert (ours.argmax(1) == cl2n.argmax(1)).all()
    # exactly a positive multiple: r (x − x̄)ᵀ d_c/||d_c|| with Σ = τI
    ratio = ours / cl2n
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-9)
    assert ratio.flat[0] > 0


def test_prior_means_keep_the_prototype_geometry():
    P = torch.nn.functional.normalize(torch.randn(4, 8, dtype=torch.float64), dim=-1)
    X = torch.randn(10, 8, dtype=torch.float64)
    m = prior_means(P, X)
    assert torch.allclose(m.mean(0), X.mean(0)) and torch.allclose(m[1] - m[0], P[1] - P[0])


# ----------------------------------------------------------------------------- API and artifact

def test_no_shots_is_the_zero_shot_artifact(data, tmp_path):
    clf = data["clf"]
    assert clf.fewshot_ is None and clf.support_set_.source.eq(TEXT).all()
    clf.save(tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "svgen.json").read_text())
    t = load_file(str(tmp_path / "a" / "weights.safetensors"))
    assert meta["format_version"] == 1 and "fewshot" not in meta
    assert not any(k.startswith("text.") or k in ("support_labels", "support_source") for k in t)
    assert t["support_vectors"].dim() == 3


def test_fit_with_shots_equals_fit_then_adapt(data):
    a = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"], shots=(data["X"], data["y"]))
    b = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"]).adapt(data["X"], data["y"])
    for head in ("kernel", "linear", "cosine"):
        assert np.array_equal(a.decision_function(data["q"], head), b.decision_function(data["q"], head))


def test_format_2_round_trip_and_formula(data, tmp_path):
    clf = SVGClassifier.load(_saved(data["clf"], tmp_path / "zs")).adapt(data["X"], data["y"])
    art = clf.save(tmp_path / "fs")
    meta = json.loads((art / "svgen.json").read_text())
    t = {k: v.double().numpy() for k, v in load_file(str(art / "weights.safetensors")).items()}
    assert meta["format_version"] == 3 and meta["support_source"] == {"0": "text", "1": "image", "2": "pool"}
    fs = meta["fewshot"]
    assert fs["shots"] == len(data["y"]) and fs["default_head"] == "kernel"
    counts = np.bincount(data["y"], minlength=C)
    assert fs["shots_by_class"] == {f"class_{c}": int(counts[c]) for c in range(C)}
    assert {"sigma", "ridge_c", "decision", "selection"} <= set(fs["kernel"])
    assert {"shrinkage", "prior_shots", "loo_error"} <= set(fs["linear"])
    M = len(data["y"])   # the adapted kernel head's rows are the shots (svgen.adapt.residual)
    assert t["support_vectors"].shape == (M, D) and t["vote_weights"].shape == (M, C)
    assert t["support_labels"].tolist() == data["y"].tolist()
    assert t["support_source"].tolist() == [1] * len(data["y"])
    # DESIGN.md §2 with the format-3 prior: softmax(τ x̂ P̂ᵀ) + exp(-||x̂ - s||²/2σ²) @ vote_weights, from the files
    xh = _unit(data["q"])
    d2 = ((xh[:, None] - _unit(t["support_vectors"])[None]) ** 2).sum(-1)
    z = float(t["kernel_prior.logit_scale"]) * xh @ _unit(t["prototypes"]).T
    prior = np.exp(z - z.max(1, keepdims=True))
    ref = prior / prior.sum(1, keepdims=True) + np.exp(-d2 / (2 * float(t["bandwidth"]) ** 2)) @ t["vote_weights"]
    loaded = SVGClassifier.load(art)
    np.testing.assert_allclose(loaded.decision_function(data["q"]), ref, rtol=1e-4, atol=1e-5)
    lin = xh @ t["linear_head.weight"].T + t["linear_head.bias"]
    np.testing.assert_allclose(loaded.decision_function(data["q"], "linear"), lin, rtol=1e-4, atol=1e-5)


def _saved(clf, path):
    clf.save(path)
    return path


def test_adapt_accumulates_and_add_classes_keeps_the_shots(data):
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    clf.adapt(data["X"][:9], data["y"][:9]).adapt(data["X"][9:], data["y"][9:])
    assert clf.fewshot_["shots"] == len(data["y"])
    assert torch.equal(clf.support_set_.part(IMAGE).labels, torch.as_tensor(data["y"]))
    new = np.random.default_rng(5).normal(size=(2, D)).astype(np.float32)
    clf.add_classes(new, ["new a", "new b"])
    assert len(clf.classes_) == C + 2 and clf.fewshot_["shots"] == len(data["y"])
    assert clf.vote_weights_.shape == (len(data["y"]), C + 2)   # the adapted head's rows are the shots
    # the new classes have no shots: their zero-shot probability (the head's prior term) still wins on them
    assert clf.kernel_prior_ is not None
    assert set(clf.predict(new)) <= set(clf.classes_) and clf.decision_function(new).argmax(1).tolist() == [C, C + 1]


def test_classes_without_shots_keep_their_zero_shot_probability(data):
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    keep = data["y"] != 4
    clf.adapt(data["X"][keep], data["y"][keep])
    assert clf.fewshot_["classes_with_shots"] == C - 1 and "class_4" not in clf.fewshot_["shots_by_class"]
    assert not (clf.support_labels_ == 4).any()          # no row of class 4 …
    p4 = np.asarray(data["protos"]).reshape(C, -1, D)[4].mean(axis=0, keepdims=True) * 3.0
    assert clf.decision_function(p4).argmax(1).tolist() == [4]   # … and its own prototype is still class 4


@pytest.mark.parametrize("X, y, msg", [
    (np.zeros((0, D)), np.zeros(0, int), "empty"),
    (np.ones((3, D + 1)), np.zeros(3, int), "dimension 17"),
    (np.vstack([np.ones((2, D)), np.full((1, D), np.nan)]), np.zeros(3, int), "NaN"),
    (np.ones((3, D)), np.array([0, 1, 9]), "label 9 at row 2 is not a class"),
    (np.ones((3, D)), np.array([0, 1]), "labels of shape"),
    (np.ones((3, D)), np.array([0.5, 1, 2]), "integer"),
])
def test_bad_shots_are_one_line_errors(data, X, y, msg):
    from svgen.errors import SvgenError

    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"])
    before = clf.decision_function(data["q"]).copy()
    with pytest.raises(SvgenError, match=msg) as e:
        clf.adapt(X, y)
    assert "\n" not in str(e.value) and clf.fewshot_ is None
    assert np.array_equal(clf.decision_function(data["q"]), before)


# ----------------------------------------------------------------------------- exports

@pytest.mark.parametrize("fmt", ["safetensors", "npz", "onnx"])
@pytest.mark.parametrize("head", ["kernel", "linear"])
def test_format_2_exports_reproduce_scores(data, tmp_path, fmt, head):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(ROOT / "scripts"))
    import zero_shot_classify

    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(data["protos"]).adapt(data["X"], data["y"])
    out = tmp_path / f"h.{fmt}"
    export_head(clf, out, fmt, head=head)
    got = zero_shot_classify.load_head(str(out))["score"](data["q"] * 3.0)
    ref = clf.decision_function(data["q"], head)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    if fmt != "onnx" and head == "kernel":
        h = load_head(out)
        assert h["support_vectors"].shape == (len(data["y"]), D) and "prior_prototypes" in h
        assert h["support_labels"].tolist() == data["y"].tolist()
        assert h["support_source"].tolist() == [1] * len(data["y"])


# ----------------------------------------------------------------------------- CLI

@pytest.fixture
def files(tmp_path, data):
    from conftest import write_inputs

    Xn = data["X"].copy()
    Xn[3, 0] = np.nan
    return write_inputs(tmp_path, data["protos"], X=data["X"], y=data["y"], ybad=np.r_[data["y"][:-1], 7], Xnan=Xn,
                        Xdim=data["X"][:, :8], Xempty=np.zeros((0, D), np.float32), yempty=np.zeros(0, np.int64))


def test_cli_fit_and_adapt_with_shot_features(cli, files):
    base = ("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2", "--steps", "5")
    code, out, err = cli(*base, "--out", files / "zs.svgen")
    assert code == 0, err
    code, out, err = cli(*base, "--out", files / "fs.svgen", "--shot-features", files / "X.npy",
                         "--shot-labels", files / "y.npy")
    assert code == 0, err
    fit_summary = json.loads(out)["fewshot"]
    assert fit_summary["shots"] == 17
    code, out, err = cli("adapt", files / "zs.svgen", "--shot-features", files / "X.npy", "--shot-labels",
                         files / "y.npy", "--out", files / "ad.svgen")
    assert code == 0, err
    assert "17 shots over 5 of 5 classes" in err and json.loads(out)["default_head"] == "kernel"
    # both summaries say the mixture's weight (1 here: the kernel head alone), as the artifact records it
    assert fit_summary["mixture_weight"] == json.loads(out)["mixture_weight"] == 1.0
    assert json.loads(out)["temperature_method"] == "loo-nll" and json.loads(out)["temperatures"]["cosine"] == 1.0
    a, b = SVGClassifier.load(files / "fs.svgen"), SVGClassifier.load(files / "ad.svgen")
    q = np.load(files / "X.npy")
    for head in ("kernel", "linear"):
        assert np.array_equal(a.decision_function(q, head), b.decision_function(q, head))
    assert cli("adapt", files / "zs.svgen", "--shot-features", files / "X.npy", "--shot-labels", files / "y.npy",
               "--out", files / "ad.svgen")[0] == 2  # exists, no --force
    assert cli("adapt", files / "zs.svgen", "--shot-features", files / "X.npy", "--shot-labels", files / "y.npy",
               "--out", files / "ad.svgen", "--force")[0] == 0


BAD_SHOTS = [
    (("--shot-features", "X.npy", "--shot-labels", "ybad.npy"), "label 7 at row 16 is not a class"),
    (("--shot-features", "Xnan.npy", "--shot-labels", "y.npy"), "NaN"),
    (("--shot-features", "Xdim.npy", "--shot-labels", "y.npy"), "dimension 8"),
    (("--shot-features", "Xempty.npy", "--shot-labels", "yempty.npy"), "empty"),
    (("--shot-features", "X.npy"), "go together"),
    (("--shots", "nowhere"), "nowhere"),
]


@pytest.mark.parametrize("command, args, msg", [("adapt", a, m) for a, m in BAD_SHOTS + [((), "no labelled images")]]
                         + [("fit", a, m) for a, m in BAD_SHOTS])
def test_cli_bad_shots_write_nothing(refused_cleanly, files, command, args, msg):
    refused_cleanly(files, command, args, msg)


def test_cli_shots_folder_is_embedded_with_the_artifacts_encoder(cli, tiny_model, tmp_path):
    names = ["red square", "green circle", "blue line"]
    write_png_shots(tmp_path, names)
    enc = ("--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"])
    code, out, err = cli("fit", "--classes", tmp_path / "classes.txt", *enc, "-K", "2", "--steps", "3",
                         "--out", tmp_path / "zs.svgen")
    assert code == 0, err
    code, out, err = cli("adapt", tmp_path / "zs.svgen", "--shots", tmp_path / "shots", "--checkpoint",
                         tiny_model["safetensors"], "--model", tiny_model["config"], "--out", tmp_path / "fs.svgen")
    assert code == 0, err
    clf = SVGClassifier.load(tmp_path / "fs.svgen")
    assert clf.fewshot_["shots_by_class"] == {n: 3 for n in names}
    # the image rows are the encoder's own embeddings of those files
    from svgen.encoders.clip import ClipEncoder

    encoder = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"])
    paths = sorted(str(p) for p in (tmp_path / "shots").rglob("*.png"))
    feats, ok, _ = encoder.encode_images(paths)
    rows = clf.support_set_.part(IMAGE).rows
    want = torch.nn.functional.normalize(torch.as_tensor(np.asarray(feats), dtype=torch.float32), dim=-1)
    assert rows.shape == want.shape
    assert torch.allclose(rows.sort(dim=0).values, want.sort(dim=0).values, atol=1e-5)


# ----------------------------------------------------------------------------- real features

def test_real_few_shot_features(shared_data):
    """Oxford-Pets, 4 shots per class (stand-in prototypes = class means of the shots)."""
    d = shared_data / "clip-vit-b32" / "coop-fewshot" / "oxford_pets"
    if not d.is_dir():
        pytest.skip("coop-fewshot features absent")
    Xtr, ytr = np.load(d / "train16_features.npy").astype(np.float32), np.load(d / "train16_labels.npy")
    Xv, yv = np.load(d / "val_features.npy").astype(np.float32), np.load(d / "val_labels.npy")
    rng = np.random.default_rng(0)
    idx = np.concatenate([rng.permutation(np.flatnonzero(ytr == c))[:4] for c in range(37)])
    X, y = Xtr[idx], ytr[idx]
    P = _unit(np.stack([X[y == c].mean(0) for c in range(37)]))
    shots = image_rows(X, y, 37, 512)
    W, b, choice = fit_lda_head(torch.tensor(P), shots, 37, heldout.evidence(y, 37, DEFAULT, 0), DEFAULT)
    ncm = (( _unit(Xv) @ P.T).argmax(1) == yv).mean()
    lda = ((_unit(Xv) @ W.numpy().T + b.numpy()).argmax(1) == yv).mean()
    assert lda > ncm + 0.05, (lda, ncm)   # measured: 0.76 vs 0.66


def test_one_shot_linear_head_keeps_the_text_prior():
    """One shot per class: LOO cannot judge κ (the left-out class keeps only its prior while the others keep
    their shot, which favours κ = 0 and throws the prototypes away). The head uses κ = AdaptConfig.lda_prior_one_shot;
    with good prototypes independent of the shots it must stay near the zero-shot head and far above κ = 0."""
    from svgen.adapt.lda import lda_head_weights, prior_means
    from svgen.adapt.config import DEFAULT

    rng = np.random.default_rng(0)
    C, D = 20, 64
    centres = _unit(rng.normal(size=(C, D)))
    protos = _unit(centres + 0.2 * rng.normal(size=(C, D)) / np.sqrt(D)).astype(np.float32)   # good text

    def draw(n):
        y = np.repeat(np.arange(C), n)
        return _unit(centres[y] + 1.3 * rng.normal(size=(len(y), D)) / np.sqrt(D)).astype(np.float32), y

    def _acc(clf, Xq, yq, head):
        return float((np.asarray(clf.decision_function(Xq, head)).argmax(1) == yq).mean())

    X, y = draw(1)
    Xq, yq = draw(50)
    clf = SVGClassifier(seed=0).fit(protos)
    zero = _acc(clf, Xq, yq, "linear")
    clf.adapt(X, y)
    lin = clf.fewshot_["linear"]
    assert lin["prior_shots"] == DEFAULT.lda_prior_one_shot and lin["shrinkage"] == 1.0
    Xd, yt = torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y)
    W0, b0 = lda_head_weights(Xd, yt, prior_means(torch.as_tensor(protos, dtype=torch.float64), Xd), 1.0, 0.0,
                              equal_radius=True)
    kappa0 = float(((torch.as_tensor(Xq, dtype=torch.float64) @ W0.T + b0).argmax(1).numpy() == yq).mean())
    adapted = _acc(clf, Xq, yq, "linear")
    assert adapted >= zero - 0.05 and adapted > kappa0 + 0.1, (zero, adapted, kappa0)


def test_lda_choice_is_the_most_shrinkage_not_behind_the_best_by_the_paired_test():
    """(γ, κ): the best setting is the lowest LOO error; a setting is eligible unless its per-shot LOO correctness is
    behind the best's by more than ``level`` paired SE; then the most shrinkage, then the lowest error. Checked against
    the paired SE computed by hand: (γ₁, κ₁) has 2 more errors and 1 fewer on 10 shots, d̄ = −0.1, SE = 0.1795: not
    behind at level 1 (the old binomial 1-SE rule, best + √(0.1·0.9/10) = 0.195 < 0.2, refused it), behind at 0.5."""
    best = np.array([1] * 9 + [0], dtype=bool)
    correct = np.stack([np.stack([best, np.array([1] * 7 + [0] * 3, dtype=bool)]),
                        np.stack([np.array([1] * 6 + [0] * 4, dtype=bool),
                                  np.array([1] * 7 + [0, 0, 1], dtype=bool)])])
    err = 1.0 - correct.mean(axis=2)
    d = correct[1, 1].astype(float) - best
    n = d.size
    mean = d.sum() / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
    assert mean == pytest.approx(-0.1) and se == pytest.approx(0.17951, abs=1e-5)
    assert err[1, 1] > err.min() + math.sqrt(err.min() * (1 - err.min()) / n)   # outside the old 1-SE band
    hits = {(g, k): correct[a, b] for a, g in enumerate((0.1, 0.5)) for b, k in enumerate((1.0, 2.0))}
    assert lda_setting(hits, 1.0) == (0.5, 2.0)        # mean ≥ −1·SE: eligible, the most shrinkage
    assert lda_setting(hits, 0.5) == (0.1, 1.0)        # mean < −0.5·SE: behind; the best itself
    assert lda_setting(hits, 0.0) == (0.1, 1.0)

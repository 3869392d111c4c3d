"""Fitting: the estimator, the artifact, determinism, stability by measurement, bad input."""

import json

import numpy as np
import pytest
import torch

from svgen import SVGClassifier, SvgenError
from svgen.io.artifacts import REQUIRED, load_artifact


def _protos(C=12, D=16, T=1, seed=0):
    g = np.random.default_rng(seed)
    base = g.normal(size=(C, 1, D))
    emb = base + 0.3 * g.normal(size=(C, T, D))
    return emb[:, 0] if T == 1 else emb


def _fit(emb, **kw):
    kw = {"steps": 10, "batch_classes": 8, **kw}
    return SVGClassifier(**kw).fit(emb, classes=[f"c{i}" for i in range(len(emb))])


def test_support_vectors_unit_norm_and_contract_shapes():
    clf = _fit(_protos(T=3), n_support=4)
    C, K, D = 12, 4, 16
    assert clf.support_vectors_.shape == (C, K, D)
    np.testing.assert_allclose(clf.support_vectors_.norm(dim=-1).numpy(), 1.0, atol=1e-5)
    assert clf.vote_weights_.shape == (C * K, C)
    assert clf.linear_weight_.shape == (C, D) and clf.linear_bias_.shape == (C,)
    np.testing.assert_allclose(clf.prototypes_.norm(dim=-1).numpy(), 1.0, atol=1e-5)
    assert clf.bandwidth_ > 0
    m = clf.fit_metrics_
    for key in ("alignment_start", "alignment_end", "hinge", "condition_number", "mean_cos_support_prototype",
                "ridge_lambda", "sigma", "wall_time_s"):
        assert key in m


def test_same_seed_same_tensors_and_other_seed_differs():
    a = _fit(_protos(), seed=3)
    b = _fit(_protos(), seed=3)
    for name, t in a.tensors().items():
        assert torch.equal(t, b.tensors()[name]), name
    c = _fit(_protos(), seed=4)
    assert not torch.equal(a.support_vectors_, c.support_vectors_)


def test_save_load_round_trip_is_exact(tmp_path):
    clf = _fit(_protos(T=2), n_support=3)
    clf.save(tmp_path / "a.svgen")
    meta, t = load_artifact(tmp_path / "a.svgen")
    for name in REQUIRED:
        assert torch.equal(t[name], clf.tensors()[name].float()), name
    back = SVGClassifier.load(tmp_path / "a.svgen")
    x = torch.randn(20, 16)
    for head in ("kernel", "linear", "cosine"):
        assert torch.equal(back.decision_function(x, head), clf.decision_function(x, head)), head
    assert meta["classes"] == clf.classes_ and meta["n_support"] == 3
    # the contract's formulas, from the file's tensors alone
    S = t["support_vectors"].reshape(-1, 16)
    xh = x / x.norm(dim=1, keepdim=True)
    d2 = ((xh[:, None] - S[None]) ** 2).sum(-1)
    kern = torch.exp(-d2 / (2 * t["bandwidth"] ** 2)) @ t["vote_weights"]
    torch.testing.assert_close(clf.decision_function(x, "kernel"), kern, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(clf.decision_function(x, "linear"), xh @ t["linear_head.weight"].T + t["linear_head.bias"])


def test_artifact_is_never_overwritten_without_force(tmp_path):
    clf = _fit(_protos())
    clf.save(tmp_path / "a.svgen")
    before = (tmp_path / "a.svgen" / "weights.safetensors").read_bytes()
    with pytest.raises(SvgenError, match="already exists"):
        clf.save(tmp_path / "a.svgen")
    assert (tmp_path / "a.svgen" / "weights.safetensors").read_bytes() == before
    _fit(_protos(seed=1)).save(tmp_path / "a.svgen", force=True)
    assert (tmp_path / "a.svgen" / "weights.safetensors").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.svgen"]  # no temporary leftovers


def test_divergence_guard_restores_last_good_state(monkeypatch):
    import svgen.zeroshot.training as training

    real = training._batch_loss
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        loss, parts = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan"), parts) if calls["n"] == 4 else (loss, parts)

    monkeypatch.setattr(training, "_batch_loss", flaky)
    clf = _fit(_protos(), steps=10)
    assert clf.fit_metrics_["diverged_at_step"] == 3
    assert clf.fit_metrics_["steps_done"] == 3
    assert torch.isfinite(clf.support_vectors_).all()


def test_add_classes_extends_without_retraining():
    emb = _protos(C=14)
    clf = _fit(emb[:12])
    gen_before = {k: v.clone() for k, v in clf.generator_.state_dict().items()}
    x = torch.randn(5, 16)
    clf.add_classes(emb[12:], ["new0", "new1"])
    assert clf.classes_[-2:] == ["new0", "new1"]
    assert clf.support_vectors_.shape[0] == 14 and clf.vote_weights_.shape == (14 * 4, 14)
    for k, v in clf.generator_.state_dict().items():
        assert torch.equal(v, gen_before[k])
    assert clf.decision_function(x, "kernel").shape == (5, 14)
    # a prototype-like query of a new class is recognised as that class
    q = torch.as_tensor(emb[12:], dtype=torch.float32)
    assert list(clf.predict(q, "linear")) == ["new0", "new1"]
    with pytest.raises(SvgenError, match="already in the artifact"):
        clf.add_classes(emb[12:13], ["c0"])


@pytest.mark.parametrize("bad, match", [
    (dict(n_support=0), "must be >= 1"),
    (dict(kernel="poly"), "unknown kernel"),
    (dict(steps=-1), "steps"),
    (dict(ridge="magic"), "ridge"),
])
def test_bad_settings(bad, match):
    with pytest.raises(SvgenError, match=match):
        _fit(_protos(), **bad)


def test_bad_prototypes():
    emb = _protos()
    nan = emb.copy()
    nan[3, 2] = np.nan
    with pytest.raises(SvgenError, match="NaN or inf .*row 3"):
        _fit(nan)
    inf = emb.copy()
    inf[1, 0] = np.inf
    with pytest.raises(SvgenError, match="NaN or inf"):
        _fit(inf)
    with pytest.raises(SvgenError, match="12 rows but there are 11 class names"):
        SVGClassifier(steps=1).fit(emb, classes=[f"c{i}" for i in range(11)])
    with pytest.raises(SvgenError, match="at least 2"):
        SVGClassifier(steps=1).fit(emb[:1], classes=["only"])
    with pytest.raises(SvgenError, match="C×D or C×T×D"):
        SVGClassifier(steps=1).fit(np.zeros(5))


# ---------------------------------------------------------------------------------------- CLI

def _cli_files(tmp_path, emb, names):
    np.save(tmp_path / "emb.npy", emb.astype(np.float32))
    (tmp_path / "classes.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    return tmp_path / "emb.npy", tmp_path / "classes.txt"


def test_cli_fit_prototypes_writes_contract_artifact(tmp_path, cli):
    emb_path, classes = _cli_files(tmp_path, _protos(T=2), [f"class {i}" for i in range(12)])
    code, out, err = cli("fit", "--prototypes", emb_path, "--classes", classes, "--out", tmp_path / "a.svgen",
                         "--steps", "5", "-K", "2", "--seed", "1")
    assert code == 0, err
    meta, t = load_artifact(tmp_path / "a.svgen")
    assert meta["format_version"] == 1 and meta["n_support"] == 2 and meta["kernel"] == "rbf"
    assert meta["classes"][0] == "class 0" and meta["fit"]["seed"] == 1 and meta["fit"]["steps"] == 5
    assert t["support_vectors"].shape == (12, 2, 16) and t["per_template"].shape == (12, 2, 16)
    assert json.loads(out.splitlines()[-1])["alignment_end"] == meta["metrics"]["alignment_end"]


@pytest.mark.parametrize("args, match", [
    (["-K", "0"], "must be >= 1"),
    (["--ridge", "nope"], "--ridge must be"),
    (["--steps", "-3"], "steps"),
])
def test_cli_fit_bad_options_one_line_nothing_written(tmp_path, cli, args, match):
    emb_path, classes = _cli_files(tmp_path, _protos(), [f"c{i}" for i in range(12)])
    code, out, err = cli("fit", "--prototypes", emb_path, "--classes", classes, "--out", tmp_path / "a.svgen", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and match in err
    assert not (tmp_path / "a.svgen").exists()


def test_cli_fit_bad_prototype_files(tmp_path, cli):
    names = [f"c{i}" for i in range(12)]
    emb = _protos()
    cases = {}
    nan = emb.copy()
    nan[0, 0] = np.nan
    cases["nan"] = (nan, "NaN or inf")
    cases["count"] = (emb[:10], "10 rows but")
    cases["rank"] = (emb[0], "expected C×D or C×T×D")
    for name, (arr, match) in cases.items():
        emb_path, classes = _cli_files(tmp_path, arr, names)
        code, _, err = cli("fit", "--prototypes", emb_path, "--classes", classes, "--out", tmp_path / f"{name}.svgen")
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1, (name, err)
        assert not (tmp_path / f"{name}.svgen").exists()
    (tmp_path / "obj.npy").write_bytes(b"not a numpy file")
    code, _, err = cli("fit", "--prototypes", tmp_path / "obj.npy", "--classes", classes, "--out", tmp_path / "x")
    assert code == 2 and "npy" in err
    one = tmp_path / "one.txt"
    one.write_text("lonely\n")
    np.save(tmp_path / "one.npy", emb[:1].astype(np.float32))
    code, _, err = cli("fit", "--prototypes", tmp_path / "one.npy", "--classes", one, "--out", tmp_path / "y")
    assert code == 2 and "at least 2" in err


def test_cli_fit_through_a_checkpoint_end_to_end(tmp_path, cli, tiny_model, classes_file):
    classes = classes_file(["cat", "dog", "bird", "fish"])
    code, out, err = cli("fit", "--classes", classes, "--model", tiny_model["config"], "--checkpoint",
                         tiny_model["safetensors"], "--templates", "compact", "--steps", "5", "--out", tmp_path / "t.svgen")
    assert code == 0, err
    meta, t = load_artifact(tmp_path / "t.svgen")
    assert meta["encoder"]["model"] == "svgen-tiny" and len(meta["encoder"]["checkpoint_sha256"]) == 64
    assert len(meta["templates"]) == 8 and t["per_template"].shape == (4, 8, tiny_model["dim"])
    code, out, err = cli("diagnose", tmp_path / "t.svgen", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["classes_measured"] == 4 and report["n_support"] == 4


# ---------------------------------------------------------------------------------------- stability

@pytest.fixture(scope="module")
def lvis_subset(shared_data):
    emb = np.load(shared_data / "clip-vit-b32" / "lvis_v1_clip_a+cname.npy").astype(np.float32)
    return emb[:40]


def _stability(emb, **kw):
    """Free dynamics (trust region ρ=1) so the objective's own effects show; returns measurements."""
    clf = SVGClassifier(steps=120, lr=3e-3, radius=1.0, seed=0, **kw).fit(emb)
    S = clf.support_vectors_
    K = S.shape[1]
    cos = torch.einsum("ckd,cjd->ckj", S, S)
    within = float(((cos.sum(dim=(1, 2)) - K) / (K * K - K)).mean())
    return within, clf.fit_metrics_["condition_number"]


def test_alignment_alone_clumps_margin_alone_ill_conditions_default_does_neither(lvis_subset):
    within_default, cond_default = _stability(lvis_subset)
    within_align, _ = _stability(lvis_subset, margin_weight=0.0, grounding_weight=0.0)
    _, cond_margin = _stability(lvis_subset, alignment_weight=0.0, grounding_weight=0.0, margin="ce")
    # alignment alone pulls each class's K support vectors onto one point
    assert within_align > 0.999 and within_align > within_default
    # the margin term alone (softmax CE never saturates) drives K_SS towards singular
    assert cond_margin > 100 * cond_default
    # the default keeps the support vectors apart and the kernel well away from singular
    assert within_default < 0.995
    assert cond_default < 1e6


def test_cli_add_classes_and_diagnose(tmp_path, cli):
    emb = _protos(C=14)
    emb_path, classes = _cli_files(tmp_path, emb[:12], [f"c{i}" for i in range(12)])
    code, _, err = cli("fit", "--prototypes", emb_path, "--classes", classes, "--out", tmp_path / "a.svgen", "--steps", "3")
    assert code == 0, err
    np.save(tmp_path / "new.npy", emb[12:].astype(np.float32))
    (tmp_path / "new.txt").write_text("new0\nnew1\n")
    code, out, err = cli("add-classes", tmp_path / "a.svgen", "--classes", tmp_path / "new.txt",
                         "--prototypes", tmp_path / "new.npy")
    assert code == 0, err
    assert "12 → 14 classes" in err and out == ""
    meta, t = load_artifact(tmp_path / "a.svgen")
    assert meta["classes"][-2:] == ["new0", "new1"] and t["vote_weights"].shape == (14 * 4, 14)
    # adding a class that is already there is one line, exit 2, and the artifact is untouched
    before = (tmp_path / "a.svgen" / "weights.safetensors").read_bytes()
    (tmp_path / "dup.txt").write_text("c3\n")
    np.save(tmp_path / "dup.npy", emb[:1].astype(np.float32))
    code, _, err = cli("add-classes", tmp_path / "a.svgen", "--classes", tmp_path / "dup.txt", "--prototypes", tmp_path / "dup.npy")
    assert code == 2 and "already in the artifact" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "a.svgen" / "weights.safetensors").read_bytes() == before
    code, out, err = cli("diagnose", tmp_path / "a.svgen")
    assert code == 0 and "condition number" in out and "findings" in out
    code, _, err = cli("diagnose", tmp_path / "missing.svgen")
    assert code == 2 and "not an svgen artifact" in err


def test_metric_decision_is_recorded_shown_by_diagnose_and_kept_by_add_classes(tmp_path, cli):
    from svgen.core.metric import metric_strength, neighbour_pairs, whitened_cosine_head

    emb = _protos(C=14, D=16, T=3, seed=4)
    emb_path, classes = _cli_files(tmp_path, emb[:12], [f"c{i}" for i in range(12)])
    code, _, err = cli("fit", "--prototypes", emb_path, "--classes", classes, "--out", tmp_path / "a.svgen")
    assert code == 0, err
    meta, t = load_artifact(tmp_path / "a.svgen")
    geo = meta["metrics"]["geometry"]
    P = torch.nn.functional.normalize(torch.nn.functional.normalize(torch.tensor(emb[:12], dtype=torch.float32), dim=-1).mean(1), dim=-1)
    expected = metric_strength(1.3, 3, neighbour_pairs(P), 16)
    assert geo["kappa"] == pytest.approx(expected["kappa"]) and geo["templates_averaged"] == 3
    assert 1 < geo["kappa"] < 1.1  # three prompts averaged and 12 classes for a 16-d covariance: weak
    # the stored linear head is the whitened cosine under the recorded metric, up to its scale
    W, b = whitened_cosine_head(t["prototypes"], t["metric.precision"])
    np.testing.assert_allclose((t["linear_head.weight"] / t["linear_head.weight"].norm(dim=1, keepdim=True)).numpy(),
                               W.numpy(), atol=1e-5)
    assert (t["linear_head.bias"] == 0).all()
    code, out, err = cli("diagnose", tmp_path / "a.svgen")
    assert code == 0 and "text metric" in out and "prompts" in out
    code, out, err = cli("diagnose", tmp_path / "a.svgen", "--json")
    assert json.loads(out)["geometry"]["kappa"] == pytest.approx(geo["kappa"])
    # classes added later get rows of the same kind, on the same scale
    np.save(tmp_path / "new.npy", emb[12:].astype(np.float32))
    (tmp_path / "new.txt").write_text("n0\nn1\n")
    code, _, err = cli("add-classes", tmp_path / "a.svgen", "--classes", tmp_path / "new.txt", "--prototypes", tmp_path / "new.npy")
    assert code == 0, err
    _, t2 = load_artifact(tmp_path / "a.svgen")
    W_new, _ = whitened_cosine_head(t2["prototypes"][12:], t["metric.precision"])
    rows = t2["linear_head.weight"][12:]
    np.testing.assert_allclose((rows / rows.norm(dim=1, keepdim=True)).numpy(), W_new.numpy(), atol=1e-5)
    np.testing.assert_allclose(rows.norm(dim=1).numpy(), t["linear_head.weight"].norm(dim=1).mean().item(), rtol=1e-5)
    assert (t2["linear_head.bias"][12:] == 0).all()

"""`svgen classify`, `svgen eval`, `svgen export` on small synthetic artifacts.

Every number is checked against an independent numpy computation from the artifact's stored
tensors (the formulas of DESIGN.md §2), not against the code under test.
"""

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from svgen import SVGClassifier
from svgen.io.export import load_head

C, D = 7, 16


def _normalize(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def reference_scores(art: Path, x, head):
    """DESIGN.md §2 formulas straight from weights.safetensors, in float64 numpy."""
    t = {k: v.double().numpy() for k, v in load_file(str(art / "weights.safetensors")).items()}
    meta = json.loads((art / "svgen.json").read_text())
    xh = _normalize(x)
    if head == "cosine":
        return 100.0 * xh @ _normalize(t["prototypes"]).T
    if head == "linear":
        return xh @ t["linear_head.weight"].T + t["linear_head.bias"]
    S = t["support_vectors"].reshape(-1, t["support_vectors"].shape[-1])
    d2 = ((xh[:, None, :] - _normalize(S)[None]) ** 2).sum(-1)
    sigma = float(t["bandwidth"])
    k = np.exp(-d2 / (2 * sigma ** 2)) if meta["kernel"] == "rbf" else np.exp(-np.sqrt(d2) / sigma)
    return k @ t["vote_weights"]


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """A fitted 7-class artifact (rbf) and a laplacian one, plus features and labels near the prototypes."""
    root = tmp_path_factory.mktemp("synth")
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(C, 3, D)).astype(np.float32)
    classes = [f"class {c}" for c in range(C)]
    arts = {}
    for kind in ("rbf", "laplacian"):
        clf = SVGClassifier(n_support=3, steps=5, ridge=10.0, kernel=kind, seed=0).fit(protos, classes=classes)
        arts[kind] = clf.save(root / f"{kind}.svgen")
    centers = _normalize(protos.mean(1))
    y = np.repeat(np.arange(C), 6)
    x = (centers[y] + 0.6 * rng.normal(size=(len(y), D)) / np.sqrt(D)) * 3.0  # raw: not unit norm
    np.save(root / "feats.npy", x.astype(np.float32))
    np.save(root / "labels.npy", y.astype(np.int64))
    return {"root": root, "art": Path(arts["rbf"]), "lap": Path(arts["laplacian"]), "classes": classes,
            "x": x.astype(np.float32), "y": y, "feats": root / "feats.npy", "labels": root / "labels.npy"}


def parse_csv(text):
    return list(csv.DictReader(io.StringIO(text)))


# ----------------------------------------------------------------------------- classify

@pytest.mark.parametrize("head", ["kernel", "linear", "cosine"])
def test_classify_features_matches_the_formulas(cli, synth, head):
    code, out, err = cli("classify", synth["art"], "--features", synth["feats"], "--head", head, "--top-k", 3)
    assert code == 0, err
    rows = parse_csv(out)
    assert len(rows) == len(synth["x"])
    ref = reference_scores(synth["art"], synth["x"], head)
    order = np.argsort(-ref, axis=1)[:, :3]
    for i, row in enumerate(rows):
        assert row["index"] == str(i)
        assert [row[f"label_{r}"] for r in (1, 2, 3)] == [synth["classes"][j] for j in order[i]]
        assert float(row["score_1"]) == pytest.approx(ref[i, order[i, 0]], rel=1e-4, abs=1e-9)


def test_classify_jsonl_and_atomic_out(cli, synth, tmp_path):
    out = tmp_path / "preds.jsonl"
    code, stdout, err = cli("classify", synth["lap"], "--features", synth["feats"], "--format", "jsonl",
                            "-k", 2, "--out", out)
    assert code == 0, err and stdout == ""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ref = reference_scores(synth["lap"], synth["x"], "kernel")
    assert [r["index"] for r in rows] == list(range(len(ref)))
    assert [r["labels"][0] for r in rows] == [synth["classes"][j] for j in ref.argmax(1)]
    np.testing.assert_allclose([r["scores"][0] for r in rows], ref.max(1), rtol=1e-4)
    assert [p.name for p in tmp_path.iterdir()] == ["preds.jsonl"]  # no temp file left behind
    before = out.read_text()
    code, _, err = cli("classify", synth["lap"], "--features", synth["feats"], "--out", out)
    assert code == 2 and "already exists" in err and out.read_text() == before
    code, _, err = cli("classify", synth["lap"], "--features", synth["feats"], "--out", out, "--force", "-k", 1)
    assert code == 0 and out.read_text() != before


# ----------------------------------------------------------------------------- eval

def test_eval_json_matches_independent_metrics(cli, synth):
    code, out, err = cli("eval", synth["art"], "--features", synth["feats"], "--labels", synth["labels"], "--json")
    assert code == 0, err
    res = json.loads(out)
    assert set(res) == {"cosine", "kernel", "linear", "default_head"} and res["default_head"] == "kernel"
    y = synth["y"]
    for head in ("cosine", "kernel", "linear"):
        r = res[head]
        ref = reference_scores(synth["art"], synth["x"], head)
        pred = ref.argmax(1)
        top5 = np.argsort(-ref, axis=1)[:, :5]
        assert r["n"] == len(y)
        assert r["acc1"] == pytest.approx((pred == y).mean(), abs=1e-12)
        assert r["acc5"] == pytest.approx((top5 == y[:, None]).any(1).mean(), abs=1e-12)
        recall = np.mean([(pred[y == c] == c).mean() for c in np.unique(y)])
        assert r["mean_per_class_recall"] == pytest.approx(recall, abs=1e-12)
    code, table, _ = cli("eval", synth["art"], "--features", synth["feats"], "--labels", synth["labels"])
    assert code == 0
    lines = table.splitlines()
    assert lines[0].split() == ["head", "acc1", "acc5", "mean_per_class_recall", "nll", "ece", "T", "n"]
    assert [ln.split()[0] for ln in lines[1:]] == ["cosine", "kernel*", "linear"]   # * marks the default head
    assert lines[1].split()[1] == f"{100 * res['cosine']['acc1']:.2f}%"


# ----------------------------------------------------------------------------- bad input

def _tamper(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    meta = dst / "svgen.json"
    if how == "missing tensor":
        t = load_file(str(dst / "weights.safetensors"))
        del t["vote_weights"]
        save_file(t, str(dst / "weights.safetensors"))
    elif how == "bad json":
        meta.write_text(meta.read_text()[:-20])
    elif how == "format version":
        m = json.loads(meta.read_text())
        m["format_version"] = 99
        meta.write_text(json.dumps(m))
    elif how == "truncated weights":
        w = dst / "weights.safetensors"
        w.write_bytes(w.read_bytes()[:200])
    return dst


@pytest.mark.parametrize("how, msg", [
    ("missing tensor", "vote_weights"), ("bad json", "not valid JSON"),
    ("format version", "format_version 99"), ("truncated weights", "weights.safetensors"),
])
@pytest.mark.parametrize("command", ["classify", "eval", "export"])
def test_tampered_artifact_is_refused_and_nothing_written(cli, synth, tmp_path, how, msg, command):
    art = _tamper(synth["art"], tmp_path / "bad.svgen", how)
    out = tmp_path / ("out.csv" if command == "classify" else "out.safetensors")
    args = {
        "classify": ["--features", synth["feats"], "--out", out],
        "eval": ["--features", synth["feats"], "--labels", synth["labels"], "--out", out],
        "export": ["--format", "safetensors", "--out", out],
    }[command]
    code, stdout, err = cli(command, art, *args)
    assert code == 2 and stdout == ""
    assert msg in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_features_and_labels(cli, synth, tmp_path):
    np.save(tmp_path / "wrongdim.npy", np.ones((4, D + 1), np.float32))
    np.save(tmp_path / "range.npy", np.array([0] * (len(synth["y"]) - 1) + [C]))
    np.save(tmp_path / "short.npy", synth["y"][:-1])
    np.save(tmp_path / "float.npy", synth["y"].astype(np.float32) + 0.5)  # whole-number floats are accepted
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases = [
        (("classify", synth["art"], "--features", tmp_path / "wrongdim.npy"), f"dimension {D + 1} but the artifact expects {D}"),
        (("eval", synth["art"], "--features", tmp_path / "wrongdim.npy", "--labels", synth["labels"]), "dimension"),
        (("eval", synth["art"], "--features", synth["feats"], "--labels", tmp_path / "range.npy"), f"outside 0..{C - 1}"),
        (("eval", synth["art"], "--features", synth["feats"], "--labels", tmp_path / "short.npy"), "must match"),
        (("eval", synth["art"], "--features", synth["feats"], "--labels", tmp_path / "float.npy"), "not a whole number"),
        (("classify", synth["art"], "--features", tmp_path / "obj.npy"), "not a plain numeric"),
        (("classify", synth["art"], "--features", tmp_path / "missing.npy"), "not found"),
        (("classify", synth["art"]), "nothing to classify"),
        (("classify", synth["art"], tmp_path, "--features", synth["feats"]), "not both"),
        (("eval", synth["art"], "--features", synth["feats"]), "go together"),
        (("classify", synth["art"], "--features", synth["feats"], "--top-k", 0), "--top-k"),
        (("classify", tmp_path / "nope.svgen", "--features", synth["feats"]), "not an svgen artifact"),
    ]
    for argv, msg in cases:
        code, out, err = cli(*argv)
        assert code == 2 and out == "", argv
        assert msg in err and len(err.strip().splitlines()) == 1, (argv, err)


# ----------------------------------------------------------------------------- export

@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("head", ["linear", "cosine", "kernel"])
def test_exported_head_file_reproduces_scores(cli, synth, tmp_path, fmt, head):
    out = tmp_path / f"head.{fmt}"
    code, stdout, err = cli("export", synth["art"], "--head", head, "--out", out)  # format from the suffix
    assert code == 0, err
    h = load_head(out)
    assert h["classes"] == synth["classes"] and h["head"] == head
    xh = _normalize(synth["x"])
    if head == "kernel":
        S, A, sigma = h["support_vectors"], h["vote_weights"], float(h["bandwidth"])
        assert S.shape == (C * 3, D) and A.shape == (C * 3, C)
        got = np.exp(-((xh[:, None] - S[None]) ** 2).sum(-1) / (2 * sigma ** 2)) @ A
    else:
        W, b = h["weight"], h["bias"]
        assert W.shape == (D, C) and b.shape == (C,) and float(h["logit_scale"]) == 100.0
        got = float(h["logit_scale"]) * (xh @ W + b)  # the documented open_clip-style use
    ref = reference_scores(synth["art"], synth["x"], head)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_cosine_head_file_is_open_clips_zero_shot_classifier(cli, synth, tmp_path):
    out = tmp_path / "cos.safetensors"
    assert cli("export", synth["art"], "--head", "cosine", "--out", out)[0] == 0
    W = load_head(out)["weight"]
    P = load_file(str(synth["art"] / "weights.safetensors"))["prototypes"].numpy()
    np.testing.assert_allclose(W, _normalize(P).T, atol=1e-6)
    assert np.abs(load_head(out)["bias"]).max() == 0


@pytest.mark.parametrize("art_key, head", [("art", "linear"), ("art", "kernel"), ("lap", "kernel"), ("art", "cosine")])
def test_onnx_export_agrees_with_classify(cli, synth, tmp_path, art_key, head):
    ort = pytest.importorskip("onnx") and pytest.importorskip("onnxruntime")
    out = tmp_path / "head.onnx"
    code, stdout, err = cli("export", synth[art_key], "--format", "onnx", "--head", head, "--out", out)
    assert code == 0, err
    assert "onnxruntime matches svgen" in err and stdout == ""  # the wrote line is for people: stderr
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    assert json.loads(meta["classes"]) == synth["classes"] and meta["head"] == head
    x = np.concatenate([synth["x"], synth["x"][:1] * 1e-3])  # also a tiny-norm input
    got = sess.run(["scores"], {"embeddings": x})[0]
    ref = reference_scores(synth[art_key], x, head)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    code, csv_out, _ = cli("classify", synth[art_key], "--features", synth["feats"], "--head", head, "-k", 1)
    labels = [r["label_1"] for r in parse_csv(csv_out)]
    assert labels == [synth["classes"][j] for j in got[:-1].argmax(1)]


def test_export_bad_requests(cli, synth, tmp_path):
    code, _, err = cli("export", synth["art"], "--out", tmp_path / "head.bin")
    assert code == 2 and "--format" in err
    (tmp_path / "exists.npz").write_bytes(b"keep")
    code, _, err = cli("export", synth["art"], "--out", tmp_path / "exists.npz")
    assert code == 2 and "already exists" in err and (tmp_path / "exists.npz").read_bytes() == b"keep"
    code, _, err = cli("export", synth["art"], "--out", tmp_path / "no" / "dir.npz")
    assert code == 2 and "does not exist" in err


def test_help_texts_explain(capsys):
    from svgen.cli import main

    for command, words in [("classify", ["--head", "--top-k", "--features", "recursively", "--checkpoint"]),
                           ("eval", ["labels.csv", "ImageFolder", "mean per-class recall", "--json"]),
                           ("export", ["logit_scale", "onnx", "D×C", "--head"])]:
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        assert e.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        for w in words:
            assert w in text, (command, w)


def test_sparse_vote_weights_export(synth, tmp_path):
    """Large-C artifacts keep A sparse: head files store COO, ONNX densifies, both match svgen."""
    import runpy

    from svgen.io.export import export_head

    clf = SVGClassifier.load(synth["art"])
    A = clf.vote_weights_.clone()
    A[A.abs() < A.abs().median()] = 0  # a genuinely sparse A
    clf.vote_weights_ = A.to_sparse()
    ref = np.asarray(clf.decision_function(synth["x"], head="kernel"))
    dense = _normalize(synth["x"])
    d2 = np.maximum(2 - 2 * dense @ _normalize(clf.support_vectors_.reshape(-1, D).numpy()).T, 0)
    np.testing.assert_allclose(ref, np.exp(-d2 / (2 * clf.bandwidth_ ** 2)) @ A.numpy(), rtol=1e-4,
                               atol=1e-6 * np.abs(ref).max())
    script = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "zero_shot_classify.py"))
    for fmt in ("safetensors", "npz"):
        f = tmp_path / f"sparse.{fmt}"
        export_head(clf, f, fmt, head="kernel")
        h = load_head(f)
        assert "vote_weights" not in h and h["vote_weights.values"].size == int((A != 0).sum())
        got = script["load_head"](str(f))["score"](synth["x"])
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6 * np.abs(ref).max())
    if pytest.importorskip("onnx") and pytest.importorskip("onnxruntime"):
        export_head(clf, tmp_path / "sparse.onnx", "onnx", head="kernel")  # verified against svgen inside

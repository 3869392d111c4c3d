"""``svgen eval`` judges the predictions ``classify`` prints, block by block (issue 40, items 2 and 3).

* ties: with two identical prototype rows the true class can tie with another; ``acc1`` / ``acc5`` are the accuracy
  of ``classify``'s own top-1 / top-5 labels, not "no class scored strictly higher";
* streaming: the metrics of blocks of a few rows equal the whole matrix's, and no step scores more than one block
  of rows (memory does not grow with N: no N×C matrix is ever made).
"""

import json

import numpy as np
import pytest

from svgen import SVGClassifier

C, D = 6, 16


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _artifact(root, duplicate: bool):
    rng = np.random.default_rng(0)
    P = rng.normal(size=(C, D)).astype(np.float32)
    if duplicate:
        P[3] = P[1]
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(P, classes=[f"c{i}" for i in range(C)])
    art = clf.save(root / "tied.svgen")
    y = np.repeat(np.arange(C), 10)
    x = (_unit(P)[y] + 0.8 * rng.normal(size=(len(y), D)) / np.sqrt(D)).astype(np.float32)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    return {"art": art, "x": x, "y": y, "root": root}


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """An artifact whose classes c1 and c3 have the same prototype, and labelled features around every class."""
    return _artifact(tmp_path_factory.mktemp("tied"), True)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The same without the duplicate: no exact ties, whose floating-point rounding (the kernel head's scores of
    two identical classes) may differ with the number of rows scored at once."""
    return _artifact(tmp_path_factory.mktemp("plain"), False)


def test_eval_accuracy_is_the_accuracy_of_classifys_labels(cli, tied):
    code, out, err = cli("eval", tied["art"], "--features", tied["root"] / "x.npy", "--labels",
                         tied["root"] / "y.npy", "--json")
    assert code == 0, err
    results = json.loads(out)
    truth = [f"c{i}" for i in tied["y"]]
    for head in ("cosine", "kernel", "linear"):
        code, out, err = cli("classify", tied["art"], "--features", tied["root"] / "x.npy", "--head", head, "-k", 5,
                             "--format", "jsonl")
        assert code == 0, err
        labels = [json.loads(line)["labels"] for line in out.splitlines()]
        assert results[head]["acc1"] == pytest.approx(np.mean([l[0] == t for l, t in zip(labels, truth)]), abs=1e-12)
        assert results[head]["acc5"] == pytest.approx(np.mean([t in l for l, t in zip(labels, truth)]), abs=1e-12)
        # the cosine head ties c1 and c3 exactly: c3's images are all labelled c1 (the lower index, as argmax)
        if head == "cosine":
            c3 = [l[0] for l, t in zip(labels, truth) if t == "c3"]
            assert c3 and set(c3) == {"c1"}
            assert results[head]["acc1"] <= 5 / 6   # counting ties as right would give c3's images to both


def test_ties_go_to_the_lower_class_index_at_every_k():
    from svgen.evaluation.metrics import evaluate, top_classes

    scores = np.array([[1.0, 3.0, 3.0, 0.0, 2.0, 3.0], [0.0] * 6, [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    for k in (1, 2, 3, 6):
        want = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(top_classes(scores, k), want)
    r = evaluate(scores, [2, 0, 0])
    assert r["acc1"] == pytest.approx(2 / 3)   # row 0's class 2 ties with class 1, which classify lists first


def _independent(clf, x, y):
    """Every metric from whole N×C matrices, in numpy (argmax and a stable sort give the tie rule)."""
    from svgen.heads.calibration import ece
    from svgen.heads import predictor

    out = {}
    for head in ("cosine", "kernel", "linear"):
        s = np.asarray(clf.decision_function(x, head), dtype=np.float64)
        z = np.asarray(clf.logits(x, head), dtype=np.float64) / predictor.temperature(clf.heads_, head)
        logp = z - z.max(1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
        top5 = np.argsort(-s, axis=1, kind="stable")[:, :5]
        pred = s.argmax(1)
        recall = np.mean([(pred[y == c] == c).mean() for c in np.unique(y)])
        out[head] = {"acc1": float((pred == y).mean()), "acc5": float((top5 == y[:, None]).any(1).mean()),
                     "mean_per_class_recall": float(recall), "nll": float(-logp[np.arange(len(y)), y].mean()),
                     "ece": ece(np.exp(logp), y)}
    return out


def test_streamed_metrics_equal_the_whole_matrix(plain, monkeypatch):
    from svgen.evaluation.metrics import evaluate_heads

    clf = SVGClassifier.load(plain["art"])
    x, y = plain["x"], plain["y"]
    rows_seen = []
    real = {name: getattr(SVGClassifier, name)
            for name in ("decision_function", "logits", "predict_proba", "scores_and_logits")}

    def spy(name):
        def call(self, X, head=None):
            rows_seen.append(len(X))
            return real[name](self, X, head)
        return call

    for name in real:
        monkeypatch.setattr(SVGClassifier, name, spy(name))
    bins = {}
    streamed = evaluate_heads(clf, x, y, bins, block_rows=7)
    assert rows_seen and max(rows_seen) <= 7   # never more than one block of rows scored at a time
    assert len(rows_seen) == 3 * int(np.ceil(len(y) / 7))   # scores and logits at once, 3 heads, every block
    rows_seen.clear()
    whole = evaluate_heads(clf, x, y, block_rows=len(y))
    assert max(rows_seen) == len(y)
    want = _independent(clf, x, y)
    for head, w in want.items():
        for name, value in w.items():
            assert streamed[head][name] == pytest.approx(whole[head][name], abs=1e-12), (head, name)
            assert streamed[head][name] == pytest.approx(value, abs=1e-9), (head, name)
        assert streamed[head]["n"] == len(y)
        assert bins[head]["count"].sum() == len(y)


def test_cli_eval_scores_in_blocks_with_a_progress_bar(cli, tied, monkeypatch):
    from svgen.evaluation import metrics

    monkeypatch.setattr(metrics, "EVAL_BLOCK_ROWS", 8)
    monkeypatch.setenv("SVGEN_PROGRESS", "1")
    rows_seen = []
    real = SVGClassifier.scores_and_logits

    def spy(self, X, head=None):
        rows_seen.append(len(X))
        return real(self, X, head)

    monkeypatch.setattr(SVGClassifier, "scores_and_logits", spy)
    code, out, err = cli("eval", tied["art"], "--features", tied["root"] / "x.npy", "--labels",
                         tied["root"] / "y.npy", "--json")
    assert code == 0, err
    assert max(rows_seen) == 8 and len(rows_seen) == 3 * int(np.ceil(len(tied["y"]) / 8))
    assert "eval" in err and "60/60" in err   # the bar, on stderr
    assert json.loads(out)["cosine"]["n"] == 60


def test_eval_blocks_are_classifys_blocks():
    """The same rows are scored together in both, so a near-tie's float rounding (two identical classes' kernel
    scores) is the same in the labels classify prints and in what eval counts."""
    from svgen.evaluation.metrics import EVAL_BLOCK_ROWS
    from svgen.io.output import BLOCK_ROWS

    assert EVAL_BLOCK_ROWS == BLOCK_ROWS


def test_a_mmapped_features_file_is_read_block_by_block(tied, monkeypatch):
    """The features are not loaded whole: ``eval`` memory-maps them and copies one block at a time."""
    from svgen.commands import eval as eval_cmd

    seen = {}
    real = eval_cmd.load_features

    def spy(path, clf, mmap=False):
        seen["mmap"] = mmap
        return real(path, clf, mmap=mmap)

    monkeypatch.setattr(eval_cmd, "load_features", spy)
    from svgen.cli import main

    assert main(["eval", str(tied["art"]), "--features", str(tied["root"] / "x.npy"), "--labels",
                 str(tied["root"] / "y.npy"), "--json", "-q"]) == 0
    assert seen["mmap"] is True

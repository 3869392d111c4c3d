"""Confusable class pairs (issue 48, item 2): predicted from the support vectors (``svgen diagnose --confusions``)
and measured on labelled data (``svgen eval --confusions``), each against an independent computation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.evaluation.confusions import measured_pairs, predicted_pairs, support_confusion
from svgen.heads.predictor import head_names

GOLDEN = Path(__file__).resolve().parents[1] / "io" / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)
ALL_GOLDEN = make_golden.CASES + make_golden.LEGACY


def text_problem(C=7, T=3, D=16, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(C, D))
    centres[1] = centres[0] + 0.3 * rng.normal(size=D)   # two near classes, so the top pair is not a tie of zeros
    return (centres[:, None, :] + 0.4 * rng.normal(size=(C, T, D))).astype(np.float32)


def brute_table(clf, head=None) -> np.ndarray:
    """conf(a → b) from all support rows at once: ``head``'s probabilities (the default head's when None) of every
    kernel support row (one call), averaged over the rows of each class by a loop."""
    ss = clf.heads_.kernel.support_set()
    p = np.asarray(clf.predict_proba(ss.rows.numpy(), head=head), dtype=np.float64)
    labels = ss.labels.numpy()
    C = len(clf.classes_)
    return np.stack([p[labels == a].mean(axis=0) if (labels == a).any() else np.full(C, np.nan) for a in range(C)])


def same_ranking(got, table: np.ndarray, among=None, top=None) -> None:
    """``got`` (Pairs) is the ``top`` of :func:`ranked` up to float rounding (float32 rows scored in blocks of other
    sizes): each score is its pair's entry of ``table``, and the scores are the table's largest, in order."""
    want = ranked(table, among)[:top]
    assert len(got) == len(want) and len({(q.a, q.b) for q in got}) == len(got)
    assert all(q.a != q.b and (among is None or q.a in among) for q in got)
    np.testing.assert_allclose([q.score for q in got], [table[q.a, q.b] for q in got], rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose([q.score for q in got], [table[ab] for ab in want], rtol=1e-4, atol=1e-9)


def ranked(table: np.ndarray, among=None):
    """Every directed pair a → b, a ≠ b (a in ``among`` and with support rows: not NaN), by score, largest first;
    ties: lower (a, b) first."""
    C = table.shape[0]
    pairs = [(a, b) for a in range(C) for b in range(C)
             if a != b and (among is None or a in among) and not np.isnan(table[a, b])]
    return sorted(pairs, key=lambda ab: (-table[ab], ab))


def test_the_score_is_the_kernel_heads_mean_probability_computed_independently():
    """A zero-shot artifact (RBF, log-score logits): the kernel k(s, s') = exp(−‖s − s'‖²/2σ²), the vote s·A, the
    probabilities softmax(log(vote)/T) and their class means, all in numpy; the library's pairs, scored a few
    classes at a time, are the same pairs with the same scores."""
    clf = SVGClassifier(n_support=3, seed=0).fit(text_problem(), classes=[f"c{i}" for i in range(7)])
    kh, cal = clf.heads_.kernel, clf.heads_.calibration
    assert cal.kernel_logits == "log" and clf.kernel == "rbf" and kh.prior_scale is None and not kh.votes.is_sparse
    S = kh.rows.reshape(-1, kh.rows.shape[-1]).double().numpy()
    S /= np.linalg.norm(S, axis=1, keepdims=True)
    labels = np.repeat(np.arange(7), 3)
    d2 = ((S[:, None, :] - S[None, :, :]) ** 2).sum(-1)
    vote = np.exp(-d2 / (2 * kh.bandwidth ** 2)) @ kh.votes.double().numpy()
    z = np.log(np.maximum(vote, 1e-30)) / cal.temperatures["kernel"]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    table = np.stack([p[labels == a].mean(axis=0) for a in range(7)])

    got = predicted_pairs(clf, top=12, block_cells=2 * 3 * 7)   # two classes' rows per block: four blocks
    want = ranked(table)[:12]
    assert [(q.a, q.b) for q in got] == want
    np.testing.assert_allclose([q.score for q in got], [table[ab] for ab in want], rtol=1e-4, atol=1e-9)
    assert got[0].score > 1e-3   # the two near classes: a real confusion, not a tie of zeros
    np.testing.assert_allclose(support_confusion(clf).numpy(), table, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("case", ALL_GOLDEN)
def test_every_kind_of_artifact_ranks_its_pairs_as_all_rows_scored_at_once(case):
    """Every golden artifact (text only, shots, pool rows, a pool factor, sparse local votes, format 2 rows with
    labels): the pairs found a class at a time are the pairs of the whole table computed in one call."""
    clf = SVGClassifier.load(GOLDEN / case / "artifact")
    table = brute_table(clf)
    C = table.shape[0]
    same_ranking(predicted_pairs(clf, top=C * (C - 1), block_cells=C), table)   # one class per block
    same_ranking(predicted_pairs(clf, top=5, among=[0, 2, 5]), table, among=[0, 2, 5], top=5)


@pytest.mark.parametrize("case", ["v3_one_shot", "v4_shots", "v5_shots_for_some_classes", "v6_shots_pool_kept"])
def test_the_pairs_are_the_default_heads_and_any_head_can_be_named(case):
    """After shots the default head need not be the kernel head: by default the pairs are the default head's (the
    head eval measures), scored at the kernel head's support rows; each head the artifact has can be named, and the
    heads' rankings differ, so the test can tell them apart."""
    clf = SVGClassifier.load(GOLDEN / case / "artifact")
    C = len(clf.classes_)
    tables = {}
    for head in head_names(clf.heads_):
        tables[head] = brute_table(clf, head)
        same_ranking(predicted_pairs(clf, top=C * (C - 1), block_cells=C, head=head), tables[head])
        np.testing.assert_allclose(support_confusion(clf, head=head).numpy(), np.nan_to_num(tables[head]), rtol=1e-4,
                                   atol=1e-9)
    same_ranking(predicted_pairs(clf, top=C * (C - 1)), tables[clf.default_head_])
    assert len({tuple(ranked(t)) for t in tables.values()}) > 1


def test_with_class_sizes_the_pairs_rank_by_the_rows_they_expect():
    """Labelled data with 1, 0, 9, ... rows per class: the pairs rank by n_a·conf(a → b) (a class without rows is
    never an a), each pair's score stays conf(a → b); found a class at a time or two, the same pairs."""
    clf = SVGClassifier(n_support=3, seed=0).fit(text_problem(), classes=[f"c{i}" for i in range(7)])
    table = brute_table(clf)
    sizes = np.array([1, 0, 9, 2, 4, 1, 30])
    expected = table * sizes[:, None]
    want = [ab for ab in ranked(expected) if sizes[ab[0]] > 0][:15]
    for cells in (3 * 7, 2 * 3 * 7):
        got = predicted_pairs(clf, top=15, block_cells=cells, sizes=sizes)
        assert [(q.a, q.b) for q in got] == want
        np.testing.assert_allclose([q.score for q in got], [table[ab] for ab in want], rtol=1e-4, atol=1e-9)
    assert want != ranked(table)[:15]   # the sizes change the order here: the test can tell them apart
    got = predicted_pairs(clf, top=5, among=[0, 1, 2], sizes=sizes)
    assert [(q.a, q.b) for q in got] == [ab for ab in ranked(expected) if ab[0] in (0, 2)][:5]   # 1 has no rows


def test_sparse_votes_and_the_rff_solver_are_covered():
    assert SVGClassifier.load(GOLDEN / "v1_local_votes" / "artifact").heads_.kernel.votes.is_sparse
    clf = SVGClassifier(n_support=2, seed=0, solver="rff", rff_dim=64).fit(text_problem(), classes=list("abcdefg"))
    table = brute_table(clf)
    same_ranking(predicted_pairs(clf, top=10, block_cells=14), table, top=10)


def test_measured_pairs_count_errors_and_break_ties_by_confidence():
    y_true = [0, 0, 0, 1, 1, 2, 2, 2, 3]
    y_pred = [1, 1, 0, 2, 0, 1, 0, 2, 3]
    conf = [0.5, 0.6, 0.9, 0.8, 0.3, 0.7, 0.2, 0.9, 0.9]
    got = measured_pairs(y_true, y_pred, conf, top=10)
    assert [(m.a, m.b, m.count) for m in got] == [(0, 1, 2), (1, 2, 1), (2, 1, 1), (1, 0, 1), (2, 0, 1)]
    assert got[0].confidence == pytest.approx(1.1)
    assert [(m.a, m.b) for m in measured_pairs(y_true, y_pred, conf, top=2)] == [(0, 1), (1, 2)]
    assert measured_pairs([0, 1], [0, 1], [1.0, 1.0], top=3) == []


def test_top_must_be_positive():
    clf = SVGClassifier.load(GOLDEN / "v1_zero_shot" / "artifact")
    with pytest.raises(ValueError):
        predicted_pairs(clf, top=0)


# ----------------------------------------------------------------------------- the command line

@pytest.fixture
def art(tmp_path):
    clf = SVGClassifier(n_support=2, seed=0).fit(text_problem(), classes=[f"c{i}" for i in range(7)])
    clf.save(tmp_path / "a.svgen")
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(7), 4)
    x = (text_problem().mean(axis=1)[y] + 0.8 * rng.normal(size=(len(y), 16))).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    return tmp_path, clf, x, y


def test_diagnose_confusions_lists_the_librarys_pairs(cli, art):
    d, clf, _, _ = art
    code, out, err = cli("diagnose", d / "a.svgen", "--confusions", "--top", "5", "--json")
    assert code == 0, err
    r = json.loads(out)
    want = ranked(brute_table(clf))[:5]
    assert [(p["a"], p["b"]) for p in r["pairs"]] == want
    assert [p["true"] for p in r["pairs"]] == [f"c{a}" for a, _ in want] and r["classes"] == 7
    code, out, err = cli("diagnose", d / "a.svgen", "--confusions", "--top", "3")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 2 + 3 and lines[2].split()[:3] == ["1", f"c{want[0][0]}", f"c{want[0][1]}"]


def test_diagnose_confusions_names_the_head_it_predicts_for(cli):
    """An artifact with shots whose default head is not the kernel head: the pairs are the default head's unless
    --head names another, and the report says which."""
    path = GOLDEN / "v4_shots" / "artifact"
    clf = SVGClassifier.load(path)
    assert clf.default_head_ != "kernel"
    for args, head in (((), clf.default_head_), (("--head", "kernel"), "kernel")):
        code, out, err = cli("diagnose", path, "--confusions", "--top", "4", "--json", *args)
        assert code == 0, err
        r = json.loads(out)
        assert r["head"] == head and f"the {head} head gives b" in r["score"]
        assert [(p["a"], p["b"]) for p in r["pairs"]] == ranked(brute_table(clf, head))[:4]
    code, out, err = cli("diagnose", path, "--confusions", "--top", "2", "--head", "kernel")
    assert code == 0 and "pairs the kernel head is most likely to confuse" in out.splitlines()[0], err


def test_diagnose_confusions_plot_writes_a_png(cli, art):
    pytest.importorskip("matplotlib")
    d = art[0]
    code, _, err = cli("diagnose", d / "a.svgen", "--confusions", "--plot", d / "c.png")
    assert code == 0, err
    assert (d / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, msg", [
    (("--confusions", "--top", "0"), "--top must be at least 1"),
    (("--confusions", "--top", "-3"), "--top must be at least 1"),
    (("--top", "5"), "--top goes with --confusions"),
    (("--head", "kernel"), "--head goes with --confusions"),
    (("--confusions", "--head", "mixture"), "has no mixture head"),
    (("--confusions", "--plot", "c.jpg"), "ending in .png"),
])
def test_diagnose_confusions_refuses_bad_input_in_one_line(cli, art, args, msg):
    d = art[0]
    before = sorted(p.name for p in d.iterdir())
    code, out, err = cli("diagnose", d / "a.svgen", *(d / a if a.endswith(".jpg") else a for a in args))
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and out == "", err
    assert sorted(p.name for p in d.iterdir()) == before


def test_eval_confusions_are_the_measured_pairs_beside_the_predicted(cli, art):
    d, clf, x, y = art
    code, out, err = cli("eval", d / "a.svgen", "--features", d / "x.npy", "--labels", d / "y.npy", "--confusions",
                         "--json")
    assert code == 0, err
    r = json.loads(out)["confusions"]
    p = np.asarray(clf.predict_proba(x))   # the default head
    pred = p.argmax(axis=1)
    counts = {}
    for t, q, c in zip(y, pred, p.max(axis=1)):
        if t != q:
            n, m = counts.get((t, q), (0, 0.0))
            counts[(t, q)] = (n + 1, m + c)
    want = sorted(counts, key=lambda k: (-counts[k][0], -counts[k][1], k))[:20]
    assert [(m["a"], m["b"]) for m in r["measured"]] == [(int(a), int(b)) for a, b in want]
    assert [m["count"] for m in r["measured"]] == [counts[k][0] for k in want]
    assert r["errors"] == int((pred != y).sum()) > 0 and r["head"] == clf.default_head_
    top = ranked(brute_table(clf), set(y.tolist()))
    for m in r["measured"]:
        k = top.index((m["a"], m["b"])) + 1
        assert m["predicted_rank"] == (k if k <= 100 else None)
    assert r["measured_in_predicted"] == sum(m["predicted_rank"] is not None for m in r["measured"])
    assert [(q["a"], q["b"]) for q in r["predicted"]] == top[:20]
    code, out, err = cli("eval", d / "a.svgen", "--features", d / "x.npy", "--labels", d / "y.npy", "--confusions")
    assert code == 0, err
    assert "confusions of the kernel head" in out and "*" in out


def test_eval_ranks_the_predicted_pairs_by_the_rows_these_labels_expect(cli, art):
    """Unbalanced labels (one class with 12 rows, others with 1–4): ``predicted`` is ranked by ``expected`` =
    rows of a × conf(a → b), and every pair carries both."""
    d, clf, _, _ = art
    rng = np.random.default_rng(2)
    y = np.concatenate([np.full(12, 3), np.arange(7).repeat([1, 2, 4, 0, 1, 3, 2])])
    x = (text_problem().mean(axis=1)[y] + 0.8 * rng.normal(size=(len(y), 16))).astype(np.float32)
    np.save(d / "xu.npy", x)
    np.save(d / "yu.npy", y)
    code, out, err = cli("eval", d / "a.svgen", "--features", d / "xu.npy", "--labels", d / "yu.npy", "--confusions",
                         "--json")
    assert code == 0, err
    r = json.loads(out)["confusions"]
    table, sizes = brute_table(clf), np.bincount(y, minlength=7)
    want = [ab for ab in ranked(table * sizes[:, None]) if sizes[ab[0]] > 0][:20]
    assert [(q["a"], q["b"]) for q in r["predicted"]] == want
    assert want != [ab for ab in ranked(table) if sizes[ab[0]] > 0][:20]
    for q in r["predicted"] + r["measured"]:
        assert q["expected"] == pytest.approx(sizes[q["a"]] * q["score"], rel=1e-9)
    np.testing.assert_allclose([q["score"] for q in r["predicted"]], [table[ab] for ab in want], rtol=1e-4)


def test_eval_confusions_plot_writes_both_pngs_and_refuses_to_overwrite(cli, art):
    pytest.importorskip("matplotlib")
    d = art[0]
    base = ("eval", d / "a.svgen", "--features", d / "x.npy", "--labels", d / "y.npy", "--confusions")
    code, _, err = cli(*base, "--plot", d / "r.png")
    assert code == 0, err
    assert (d / "r.png").is_file() and (d / "r_confusions.png").read_bytes()[:4] == b"\x89PNG"
    (d / "r.png").unlink()
    stale = (d / "r_confusions.png").read_bytes()
    code, out, err = cli(*base, "--plot", d / "r.png")
    assert code == 2 and "r_confusions.png" in err and len(err.strip().splitlines()) == 1, err
    assert not (d / "r.png").exists() and (d / "r_confusions.png").read_bytes() == stale


def test_eval_confusions_without_labels_is_refused_in_one_line(cli, art):
    d = art[0]
    code, out, err = cli("eval", d / "a.svgen", "--features", d / "x.npy", "--confusions")
    assert code == 2 and "--labels" in err and len(err.strip().splitlines()) == 1, err


def test_blocks_hold_a_bounded_number_of_rows(monkeypatch):
    """The rows are scored a block of classes at a time: no call sees more than block_cells / C rows (or one
    class's), so memory does not hold the C×C table."""
    clf = SVGClassifier(n_support=3, seed=0).fit(text_problem(), classes=[f"c{i}" for i in range(7)])
    seen = []
    original = type(clf).predict_proba

    def spy(self, X, head=None):
        seen.append(int(X.shape[0]))
        return original(self, X, head)

    monkeypatch.setattr(type(clf), "predict_proba", spy)
    predicted_pairs(clf, top=3, block_cells=7 * 6)
    assert seen and max(seen) <= 6 and sum(seen) == 21
    assert torch.is_tensor(support_confusion(clf, [1, 4]))


def test_eval_confusions_score_the_rows_once(cli, art, monkeypatch):
    """eval counts the measured pairs from the default head's decisions as its own scoring made them: the rows are
    not scored a second time (measured_on is for callers without them)."""
    import svgen.evaluation.confusions as mod

    d = art[0]
    want = json.loads(cli("eval", d / "a.svgen", "--features", d / "x.npy", "--labels", d / "y.npy", "--confusions",
                          "--json")[1])["confusions"]

    def scored_again(*a, **kw):
        raise AssertionError("the rows were scored a second time")

    monkeypatch.setattr(mod, "measured_on", scored_again)
    code, out, err = cli("eval", d / "a.svgen", "--features", d / "x.npy", "--labels", d / "y.npy", "--confusions",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["confusions"] == want

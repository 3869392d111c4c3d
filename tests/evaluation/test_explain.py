"""``SVGClassifier.explain`` (issue 48): every explained score is the sum of its parts and equals the score
``classify`` prints (``decision_function``), on every golden artifact and head and on fresh fits (shots, a pool, the
RFF alignment path, sparse votes); the listed votes are exactly what zeroing them removes; the origins are recorded."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import svgen
from svgen.errors import SvgenError

GOLDEN = Path(__file__).resolve().parent.parent / "io" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "artifact").is_dir())
TOL = 1e-5


def tol(score: float) -> float:
    """1e-5, or the float32 resolution of the printed score where that is coarser (|score| > 128)."""
    return max(TOL, 2 * float(np.spacing(np.float32(abs(score)))))


def golden(case):
    return svgen.SVGClassifier.load(GOLDEN / case / "artifact"), np.load(GOLDEN / case / "queries.npy")


def check_parts(clf, X, head, top_k=3):
    """Every explained class: score == classify's score (decision_function) == the sum of its parts; the classes
    are the score matrix's top-k in order."""
    S = np.asarray(clf.decision_function(X, head=head), dtype=np.float64)
    ex = clf.explain(X, top_k=top_k, head=head)
    assert len(ex) == len(X) and ex.head == head
    for i, row in enumerate(ex):
        want = np.argsort(-S[i], kind="stable")[:top_k]
        assert [c.index for c in row.classes] == list(want)
        for c in row.classes:
            assert c.name == str(clf.classes_[c.index])
            assert abs(sum(c.parts.values()) - S[i, c.index]) <= tol(S[i, c.index]), (head, i, c.parts)
            assert abs(c.score - S[i, c.index]) <= tol(S[i, c.index])
            for parts in c.inner.values():   # a head inside (mixture, pooled): its own parts add up to its score
                assert all(np.isfinite(v) for v in parts.values())
        assert row.runner_up == str(clf.classes_[want[1]])
        assert abs(row.margin - (S[i, want[0]] - S[i, want[1]])) <= 2 * tol(S[i, want[0]])
    return ex


@pytest.mark.parametrize("case", CASES)
def test_parts_add_up_to_the_classify_score_on_every_golden_artifact_and_head(case):
    clf, Q = golden(case)
    for head in clf.head_names_:
        check_parts(clf, Q, head)


def test_inner_parts_are_the_inner_heads_scores():
    """A mixture's kernel and linear parts add up to those heads' own scores, and its details are their
    probabilities and weight; a pooled head's inner parts are the head's score before the pool."""
    clf, Q = golden("v5_shots_for_some_classes")
    ex = clf.explain(Q, head="mixture")
    Sk, Sl = clf.decision_function(Q, head="kernel"), clf.decision_function(Q, head="linear")
    Pk, Pl = clf.predict_proba(Q, head="kernel"), clf.predict_proba(Q, head="linear")
    for i, row in enumerate(ex):
        for c in row.classes:
            assert abs(sum(c.inner["kernel"].values()) - Sk[i, c.index]) <= TOL
            assert abs(sum(c.inner["linear"].values()) - Sl[i, c.index]) <= 1e-4
            assert c.details["weight"] == clf.heads_.calibration.mixture_weight
            assert abs(c.details["p_kernel"] - Pk[i, c.index]) <= 1e-6
            assert abs(c.details["p_linear"] - Pl[i, c.index]) <= 1e-6
            assert set(c.parts) == {"mixture", "tilt"}
    clf, Q = golden("v6_zero_shot_pool_kept")
    S0 = svgen.SVGClassifier.load(GOLDEN / "v6_zero_shot_pool_kept" / "artifact")
    S0.heads_.pool_factor = None
    base = S0.decision_function(Q, head="kernel")
    for i, row in enumerate(clf.explain(Q, head="kernel")):
        for c in row.classes:
            assert set(c.parts) == {"head", "pool"}
            assert abs(sum(c.inner["kernel"].values()) - base[i, c.index]) <= TOL


def _small(rng, C=6, T=2, D=24):
    P = rng.normal(size=(C, T, D)).astype(np.float32)
    centres = P.mean(1)
    y = np.tile(np.arange(C), 4)   # every class in every run of C rows
    X = (centres[y] + 0.5 * rng.normal(size=(len(y), D))).astype(np.float32)
    Q = (centres[rng.integers(0, C, 20)] + 0.6 * rng.normal(size=(20, D))).astype(np.float32)
    return P, X, y, Q


NAMES = [f"c{i}" for i in range(6)]


@pytest.fixture(scope="module")
def small():
    """(a zero-shot fit with K = 3 support vectors from T = 2 templates, shots X, y, queries Q); copy before use."""
    P, X, y, Q = _small(np.random.default_rng(2))
    clf = svgen.SVGClassifier(n_support=3, steps=5, seed=0).fit(P, classes=NAMES, templates=["a {}", "b {}"])
    return clf, P, X, y, Q


@pytest.mark.parametrize("settings", [dict(solver="rff", rff_dim=256), dict(vote_solver="local"),
                                      dict(kernel="laplacian")], ids=["rff", "sparse-votes", "laplacian"])
def test_parts_add_up_on_fresh_zero_shot_fits(settings):
    rng = np.random.default_rng(1)
    P, _, _, Q = _small(rng)
    clf = svgen.SVGClassifier(n_support=3, steps=5, seed=0, **settings).fit(P, classes=[f"c{i}" for i in range(6)])
    if settings.get("vote_solver") == "local":
        assert clf.vote_weights_.is_sparse
    for head in clf.head_names_:
        check_parts(clf, Q, head)


def test_parts_add_up_on_fresh_fits_with_shots_and_a_pool(small):
    clf, P, X, y, Q = small
    clf = copy.deepcopy(clf)
    clf.adapt(X, y, origins=[f"shots/{i}.jpg" for i in range(len(y))])
    for head in clf.head_names_:
        check_parts(clf, Q, head)
    clf.adapt(unlabelled=Q)
    for head in clf.head_names_:
        check_parts(clf, Q, head)


def _zeroed(clf, rows, column):
    """A copy of ``clf`` whose vote weights of ``rows`` for class ``column`` are zero (nothing refitted)."""
    out = copy.deepcopy(clf)
    A = out.heads_.kernel.votes
    A = A.to_dense().clone() if A.is_sparse else A.clone()
    A[torch.as_tensor(rows, dtype=torch.long), column] = 0
    out.heads_.kernel.votes = A
    return out


@pytest.mark.parametrize("case", ["v1_zero_shot", "v4_shots", "v1_local_votes"])
def test_zeroing_the_listed_votes_changes_the_score_by_exactly_their_contribution(case):
    clf, Q = golden(case)
    S = clf.decision_function(Q, head="kernel").astype(np.float64)
    ex = clf.explain(Q[:6], top_k=2, top_contributions=3, head="kernel")
    for i, row in enumerate(ex):
        for c in row.classes:
            for items in (c.support_for, c.support_against):
                if not items:
                    continue
                rows = [s.origin["row"] for s in items]
                after = _zeroed(clf, rows, c.index).decision_function(Q[i:i + 1], head="kernel").astype(np.float64)
                assert abs((S[i, c.index] - after[0, c.index]) - sum(s.value for s in items)) <= 1e-6
                others = np.delete(np.arange(S.shape[1]), c.index)
                assert np.allclose(after[0, others], S[i, others], atol=1e-6)   # only that class's votes moved
                for s in items:
                    assert s.value == pytest.approx(s.kernel * s.vote, rel=1e-6)
                    assert s.vote == pytest.approx(float(clf.heads_.kernel.votes.to_dense()[s.origin["row"], c.index]
                                                         if clf.heads_.kernel.votes.is_sparse else
                                                         clf.heads_.kernel.votes[s.origin["row"], c.index]), rel=1e-6)


def test_votes_to_flip_is_the_fewest_largest_votes_whose_removal_flips_the_decision():
    clf, Q = golden("v1_zero_shot")
    ex = clf.explain(Q, top_k=2, top_contributions=0, head="kernel")
    checked = 0
    for i, row in enumerate(ex):
        n, top = row.votes_to_flip, row.classes[0].index
        if n is None:
            continue
        A = clf.heads_.kernel.votes
        k = torch.exp(-((torch.nn.functional.normalize(torch.as_tensor(Q[i]), dim=0)
                         - clf.heads_.kernel.flat_rows()) ** 2).sum(1) / (2 * clf.bandwidth_ ** 2))
        order = torch.argsort(-(k.double() * A[:, top].double()))   # an independent ranking of the votes
        flipped = _zeroed(clf, order[:n].tolist(), top).decision_function(Q[i:i + 1], head="kernel")
        kept = _zeroed(clf, order[:n - 1].tolist(), top).decision_function(Q[i:i + 1], head="kernel")
        assert int(flipped.argmax()) != top and (n == 1 or int(kept.argmax()) == top)
        checked += 1
    assert checked > 0


def test_origins_are_recorded_saved_and_named(small, tmp_path):
    clf, P, X, y, Q = small
    clf = copy.deepcopy(clf)
    paths = [f"shots/{i}.jpg" for i in range(len(y))]
    clf.adapt(X[:12], y[:12], origins=paths[:12])
    clf.adapt(X[12:], y[12:], origins=[{"file": "more.npy", "row": r} for r in range(len(y) - 12)])
    want = [{"path": p} for p in paths[:12]] + [{"file": "more.npy", "row": r} for r in range(len(y) - 12)]
    assert clf.shot_origins_ == want
    clf.save(tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "svgen.json").read_text())
    assert meta["support_origin"]["image"] == want
    loaded = svgen.SVGClassifier.load(tmp_path / "a")
    assert loaded.shot_origins_ == want
    ex = loaded.explain(Q, top_k=1, head="kernel")
    assert ex.provenance == "recorded"
    image = loaded.support_set_.source == 1
    named = 0
    for r in ex:
        for s in r.classes[0].support_for + r.classes[0].support_against:
            m = s.origin["row"]
            assert s.origin["class"] == NAMES[int(loaded.support_set_.labels[m])]
            if bool(image[m]):
                j = int(image[:m].sum())   # its place among the image rows
                assert s.origin["kind"] == "labelled shot"
                assert s.origin["from"] == (want[j].get("path") or f"more.npy[{want[j]['row']}]")
                named += 1
    assert named > 0
    loaded.add_classes(P[:1] + 0.3, ["new"])   # the shots are solved in again: their origins stay
    assert loaded.shot_origins_ == want


def test_text_rows_are_named_by_template_group(small):
    clf = small[0]
    ex = clf.explainer("kernel")
    assert [ex.origin(m)["kind"] for m in range(3)] == ["template group"] * 2 + ["generated"]
    assert ex.origin(0)["from"] == "templates [0] ('a {}')" and ex.origin(2)["from"] == "slot 2"
    assert ex.origin(4)["class"] == "c1"


def test_an_old_artifact_explains_with_kinds_and_says_so(tmp_path):
    clf, Q = golden("legacy_v3_shots")
    ex = clf.explain(Q, head="kernel")
    assert clf.shot_origins_ is None and "no file path or row" in ex.provenance
    froms = [s.origin["from"] for r in ex for c in r.classes for s in c.support_for]
    assert froms and all(f.endswith("(path not recorded)") for f in froms)
    shutil.copytree(GOLDEN / "v4_shots" / "artifact", tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "svgen.json").read_text())
    meta["support_origin"] = {"image": [{"path": "x.jpg"}]}
    (tmp_path / "a" / "svgen.json").write_text(json.dumps(meta))
    with pytest.raises(SvgenError, match="support_origin.image has 1 entries"):
        svgen.SVGClassifier.load(tmp_path / "a")


def test_bad_origins_are_one_error(small):
    clf, P, X, y, _ = small
    clf = copy.deepcopy(clf)
    with pytest.raises(SvgenError, match="3 entries for 24 labelled images"):
        clf.adapt(X, y, origins=["a", "b", "c"])
    with pytest.raises(SvgenError, match=r"origins\[1\]"):
        clf.adapt(X, y, origins=["a", {"bad": 1}] + ["c"] * 22)
    assert clf.fewshot_ is None   # nothing was adapted


def test_records_add_up_and_to_frame_needs_pandas(monkeypatch):
    clf, Q = golden("v4_shots")
    ex = clf.explain(Q[:3], head="kernel")
    recs = ex.to_records()
    for i, row in enumerate(ex):
        for rank, c in enumerate(row.classes, 1):
            parts = [r["value"] for r in recs if r["input"] == i and r["rank"] == rank and r["what"] == "part"]
            assert abs(sum(parts) - c.score) <= tol(c.score)
            listed = [r for r in recs if r["input"] == i and r["rank"] == rank and r["what"] in ("for", "against")]
            assert len(listed) == len(c.support_for) + len(c.support_against)
    import builtins

    real = builtins.__import__

    def no_pandas(name, *a, **kw):
        if name == "pandas":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(SvgenError, match="needs pandas"):
        ex.to_frame()


def test_memory_is_one_batch_whatever_the_rows(monkeypatch):
    from svgen.evaluation import explain as mod

    clf, Q = golden("v1_zero_shot")
    seen = []
    real = mod.Explainer._kernel
    monkeypatch.setattr(mod.Explainer, "_kernel", lambda self, x: seen.append(x.shape[0]) or real(self, x))
    X = np.tile(Q, (5, 1))
    rows = clf.explainer("kernel").explain(torch.as_tensor(X), batch=16)
    first = next(rows)   # a generator: the first batch is explained before the others are read
    assert seen == [16] and first.classes
    rest = list(rows)
    assert len(rest) + 1 == len(X) and max(seen) == 16


def test_a_mixture_score_at_the_floor_has_a_floor_part():
    """Where a mixture probability is below 1e-30 its score is log 1e-30: the ``floor`` part makes up the rest."""
    clf, Q = golden("v4_shots")
    cal = clf.heads_.calibration
    clf.heads_.calibration = type(cal)({**cal.temperatures, "kernel": 1e-3, "linear": 1e-3}, cal.kernel_logits,
                                       cal.record, cal.kernel_floor, cal.mixture_weight, cal.shotless_offset)
    S = clf.decision_function(Q, head="mixture")
    assert (S <= np.log(1e-30) + 1e-4).any()
    ex = check_parts(clf, Q, "mixture", top_k=len(clf.classes_))
    floored = [c for r in ex for c in r.classes if "floor" in c.parts and c.parts["floor"] != 0]
    assert floored and all(abs(c.score - np.log(1e-30)) <= 1e-4 for c in floored)


def _same(got, want, path=""):
    """``got`` (parsed JSON) is ``want`` (``to_json``), numbers equal, or equal as float32 (the listed votes, which
    the JSON lines write with float32's nine digits)."""
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            _same(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(got, int):
        assert got == want or (path.rsplit("/", 1)[-1] in ("value", "kernel", "vote")
                               and np.float32(got) == np.float32(want)), (path, got, want)
    else:
        assert got == want, (path, got, want)


@pytest.mark.parametrize("case", CASES)
def test_json_lines_are_the_rows_to_json(case):
    """``explain --json`` writes a batch's lines from its arrays: each line parses to its row's ``to_json``."""
    clf, Q = golden(case)
    for head in clf.head_names_:
        for top_k, n in ((3, 5), (1, 0), (2, 40)):
            for b in clf.explainer(head).batches(torch.as_tensor(clf._features(Q)), top_k, n, batch=7):
                keys = [f'"row": {i}' if i % 2 else "" for i in range(len(b))]
                lines = b.json_lines(keys).splitlines()
                assert len(lines) == len(b)
                for i, (line, row) in enumerate(zip(lines, b.rows())):
                    _same(json.loads(line), {**({"row": i} if i % 2 else {}), **row.to_json()})


def test_float32_texts_read_back_to_the_same_float32():
    from svgen.evaluation.explanation import _float32_texts

    rng = np.random.default_rng(0)
    v = np.concatenate([rng.normal(size=5000) * 10.0 ** rng.integers(-44, 38, 5000),
                        [0.0, -0.0, 1.0, 0.5, -1.5, 1e-45, 3.4e38, 9.999999e-5, 123456789.0, np.nan, np.inf, -np.inf]])
    v = v.astype(np.float32)
    texts = [bytes(t).replace(b"\0", b"").decode() for t in _float32_texts(v)]   # NUL: padding
    assert texts[5000:5005] == ["0e+00", "0e+00", "1e+00", "5e-01", "-1.5e+00"] and texts[-3:] == ["null"] * 3
    back = np.array([json.loads(t) if t != "null" else np.nan for t in texts], dtype=np.float64).astype(np.float32)
    assert np.array_equal(back[:-3], v[:-3])


@pytest.mark.parametrize("shape, n", [((4, 3, 4812), 5), ((2, 3, 64 * 11 + 7), 9), ((3, 2, 100), 5), ((2, 1, 900), 0)])
def test_top_votes_are_torch_topk(shape, n):
    from svgen.evaluation.explain import top_votes

    v = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    v[0, 0, -3:] = 50.0   # the largest in the short last block
    for largest in (True, False):
        got, at = top_votes(v, n, largest)
        assert torch.equal(got, torch.topk(v, n, dim=-1, largest=largest).values)
        assert torch.equal(v.gather(-1, at), got)


def test_kernel_scores_keep_the_kernel_they_sum():
    """The explainer's one pass: ``kernel_out`` receives k(x̂, S), the scores are unchanged (dense and sparse votes,
    one block and several)."""
    from svgen.core.kernels import kernel
    from svgen.heads.scoring import kernel_scores

    g = torch.Generator().manual_seed(0)
    x, S, A = torch.randn(5, 8, generator=g), torch.randn(30, 8, generator=g), torch.randn(30, 4, generator=g)
    want_k = kernel(x, S, 0.9, "rbf")
    for votes in (A, A.to_sparse()):
        for block in (8192, 7):
            out = torch.full((5, 30), float("nan"))
            got = kernel_scores(x, S, 0.9, votes, "rbf", block_size=block, kernel_out=out)
            assert torch.allclose(got, kernel_scores(x, S, 0.9, votes, "rbf", block_size=block), atol=0, rtol=0)
            assert torch.allclose(out, want_k, atol=1e-6) and torch.allclose(got, want_k @ A, atol=1e-5)

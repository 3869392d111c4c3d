"""The calibration benchmark's rows and report on small synthetic inputs (the real run needs ../shared/data)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import load_script, write_coop_toy


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_calibration")


def test_bench_rows_and_report(bench):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(10, 32))
    emb = (centres[:, None] + 0.3 * rng.normal(size=(10, 2, 32))).astype(np.float32)
    y = rng.integers(0, 10, 80)
    x = (centres[y] + 1.5 * rng.normal(size=(80, 32))).astype(np.float32)
    bench.BOOT = 50
    rows, extra, fits = bench.run({"T=2": emb, "CxD": emb[:, 0]}, x, y)
    assert [(r["input"], r["head"]) for r in rows] == [(i, h) for i in ("T=2", "CxD") for h in bench.HEADS]
    for r in rows:
        assert 0 <= r["ece"] <= 1 and r["nll"] > 0 and r["temperature"] > 0
        if r["head"] != "cosine":
            lo, hi = r["ci95"]
            assert lo <= hi
    assert fits["CxD"]["temperatures"]["cosine"] == 1.0
    opt = [r for r in extra if "NLL-optimal T on dev labels" in r["head"]]
    used = {(r["input"], r["head"]): r for r in rows}
    for r in opt:  # the dev-label optimum is never worse in NLL than the text rule (it is the minimiser)
        assert r["nll"] <= used[(r["input"], r["head"].split(",")[0])]["nll"] + 1e-9
    text = bench.markdown(rows, extra, fits, {"date": "today", "machine": {"cpus": 2, "load_average_1m": 0.0}})
    assert "| CxD | kernel |" in text and ("met" in text or "missed" in text)
    for r in rows + extra:   # all bins under-confident ⇒ ECE = accuracy − confidence (the report's identity)
        if r["all_bins_under_confident"]:
            assert r["ece"] == pytest.approx(r["acc_minus_conf"], abs=1e-12)
    for r in rows:
        if r["head"] != "cosine":
            assert len(r["fold_ece_minus_cosine"]) == 4 and r["nll_ci95"][0] <= r["nll_minus_cosine"] <= r["nll_ci95"][1]
            # the paired NLL difference is the difference of the two heads' mean NLLs
            cos = next(c for c in rows if c["input"] == r["input"] and c["head"] == "cosine")
            assert r["nll_minus_cosine"] == pytest.approx(r["nll"] - cos["nll"], abs=1e-9)


def test_under_confident_identity_is_not_vacuous(bench):
    """Every bin under-confident ⇒ ECE = accuracy − mean confidence; one over-confident bin breaks it."""
    from svgen.heads import calibration

    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, 400)
    z = rng.normal(size=(400, 4))
    z[np.arange(400), y] += 4.0                 # right 90%+ of the time, at a temperature that is far too soft
    p = calibration.softmax(z, 8.0).numpy()
    gap, under = bench.under_confident_gap(p, y)
    assert under and calibration.ece(p, y) == pytest.approx(gap, abs=1e-12)
    q = calibration.softmax(z, 0.05).numpy()    # too sharp: over-confident somewhere
    gap_q, under_q = bench.under_confident_gap(q, y)
    assert not under_q and calibration.ece(q, y) > gap_q + 1e-6


def test_report_sections_are_kept(bench, tmp_path):
    out = tmp_path / "cal.md"
    bench.write_section(out, "fewshot", "## shots\nA")
    bench.write_section(out, "lvis", "## lvis\nB")
    bench.write_section(out, "fewshot", "## shots\nC")
    text = out.read_text()
    assert text.startswith(bench.TITLE) and text.index("## lvis") < text.index("## shots")
    assert "\nB\n" in text and "\nC\n" in text and "\nA\n" not in text


def test_report_keeps_the_sections_it_does_not_generate(bench, tmp_path):
    """The method (by hand) and the zero-shot pool's section survive a rerun that rewrites another section."""
    out = tmp_path / "cal.md"
    out.write_text(bench.TITLE + "<!-- section method: begin -->\n## method\nM\n<!-- section method: end -->\n\n"
                   "<!-- section zero-shot-pool: begin -->\n## pool\nP\n<!-- section zero-shot-pool: end -->\n")
    bench.write_section(out, "lvis", "## lvis\nB")
    text = out.read_text()
    assert text.index("## method") < text.index("## lvis") < text.index("## pool") and "\nM\n" in text and "\nP\n" in text


def test_fewshot_report_judges_the_deployed_head(bench):
    rows = []
    for name, better, ece in (("a", "linear", 0.04), ("b", "kernel", 0.08)):
        for head in bench.HEADS:
            r = {"dataset": name, "shots": 16, "seed": 0, "head": head, "better": head == better, "acc1": 80.0,
                 "nll": 0.5, "ece": ece if head == better else 0.3, "mean_conf": 0.8, "temperature": 1.0}
            if head != "cosine":
                r.update({"text_temperature": 2.0, "nll_text_T": 0.6, "ece_text_T": 0.1, "loo_nll": 0.1,
                          "loo_ece": 0.02, "loo_fitted": True, "loo_acc1": 99.0, "ece_ci95": (ece - 0.01, ece + 0.01)})
            rows.append(r)
    text = bench.fewshot_markdown(rows, {"date": "today", "machine": {"cpus": 2}})
    assert "- a: deployed head ECE 0.040 — met" in text and "- b: deployed head ECE 0.080 — missed" in text
    assert "- mean: deployed head ECE 0.060 — missed" in text
    assert "ECE ≤ 0.05 on 1 of 2 data sets at 16 shots" in text   # the linear head: 0.04 on a, 0.3 on b


def test_a_deployed_mixture_gets_its_own_row_and_is_what_the_report_judges(bench, tmp_path, monkeypatch):
    """Where the fit deploys the mixture of the two heads, the run adds a row for it (``predict_proba`` as shipped)
    and the report judges that row; before, no row was marked and the report raised IndexError."""
    data = write_coop_toy(tmp_path, "toy", C=4, noise=0.8, seed=3)
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    monkeypatch.setattr(bench, "BOOT", 20)
    deployed = {}

    class Mixed(bench.SVGClassifier):
        def adapt(self, *a, **kw):
            out = super().adapt(*a, **kw)
            self.shots_outcome_ = dataclasses.replace(self.shots_outcome_, default_head="mixture")   # as on the real sets
            deployed["clf"] = self
            return out

    monkeypatch.setattr(bench, "SVGClassifier", Mixed)
    rows = bench.fewshot_run(["toy"], [4], [0], log=lambda *a: None, prototypes="train16")
    mix = [r for r in rows if r["head"] == "mixture"]
    assert len(mix) == 1 and mix[0]["better"] and not any(r["better"] for r in rows if r["head"] != "mixture")
    Xv, yv = bench.unit(data["val"][0], np.float32), data["val"][1]          # the queries, recomputed: val minus the shots
    rest = np.setdiff1d(np.arange(len(yv)), bench.sample_shots(yv, 4, 0))
    p = np.asarray(deployed["clf"].predict_proba(Xv[rest]), dtype=np.float64)
    assert mix[0]["n_val"] == rest.size == 4 * (10 - 4)
    assert mix[0]["acc1"] == pytest.approx(100 * (p.argmax(1) == yv[rest]).mean())
    assert mix[0]["nll"] == pytest.approx(-np.log(p[np.arange(rest.size), yv[rest]]).mean(), rel=1e-6)
    assert 0 <= mix[0]["ece"] <= 1 and mix[0]["ece_ci95"][0] <= mix[0]["ece_ci95"][1]
    text = bench.fewshot_markdown(rows, {"date": "today", "machine": {"cpus": 2}})
    assert f"| mixture | {mix[0]['ece']:.3f} [" in text and "| – |" in text and "nan" not in text


def test_fewshot_report_shows_the_kernel_logit_kinds(bench, tmp_path, monkeypatch):
    """The few-shot run on small synthetic "CoOp" folders: each kernel row carries both kinds at their own
    LOO temperature, the chosen one is what the head gives, and the report's numbers are the rows'."""
    for seed, (name, noise) in enumerate((("easy", 0.6), ("hard", 1.8))):
        write_coop_toy(tmp_path, name, noise=noise, seed=seed)
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    monkeypatch.setattr(bench, "BOOT", 20)
    rows = bench.fewshot_run(["easy", "hard"], [4], [0], log=lambda *a: None)
    ker = [r for r in rows if r["head"] == "kernel"]
    assert len(ker) == 2
    for r in ker:
        chosen = r["kinds"][r["kernel_logits"]]
        assert r["nll"] == pytest.approx(chosen["nll"]) and r["ece"] == pytest.approx(chosen["ece"])
        assert r["temperature"] == pytest.approx(chosen["temperature"])
        assert 0 <= r["loo_true_vote_not_positive"] <= 1 and 0 <= r["val_true_vote_not_positive"] <= 1
    text = bench.fewshot_markdown(rows, {"date": "today", "machine": {"cpus": 2}})
    for r in ker:
        lg = r["kinds"]["log"]
        assert f"| {r['dataset']} | 4 | 0 | {r['kernel_logits']} |" in text
        assert f"{lg['nll']:.3f} / {lg['ece']:.3f}" in text
    before = np.mean([r["kinds"]["log"]["nll"] for r in ker])
    assert f"mean validation NLL {before:.3f} → {np.mean([r['nll'] for r in ker]):.3f}" in text


def test_single_image_shots_come_from_validation_and_never_score(bench, tmp_path, monkeypatch):
    """``--prototypes train16``: the shots are single validation rows, the queries the other validation rows,
    the prototypes the class means of all train16 rows; a shot count that would leave a class with fewer
    than two queries is skipped, and the report leaves it out rather than printing empty means."""
    C = 4
    data = write_coop_toy(tmp_path, "toy", C=C, noise=0.8, seed=3)
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    monkeypatch.setattr(bench, "BOOT", 20)
    seen = {}

    class Recording(bench.SVGClassifier):
        def fit(self, P, *a, **kw):
            seen["P"] = np.asarray(P)
            return super().fit(P, *a, **kw)

        def adapt(self, X=None, y=None, *a, **kw):
            seen["X"], seen["y"] = np.asarray(X), np.asarray(y)
            return super().adapt(X, y, *a, **kw)

    monkeypatch.setattr(bench, "SVGClassifier", Recording)
    logged = []
    rows = bench.fewshot_run(["toy"], [4, 16], [0], log=logged.append, prototypes="train16")
    assert {r["shots"] for r in rows} == {4} and any("16 shots: skipped" in m for m in logged)
    assert all(r["n_val"] == C * (10 - 4) for r in rows)            # the 16 shots are not queries
    val, tr = bench.unit(data["val"][0], np.float32), bench.unit(data["train16"][0], np.float32)
    for x, y in zip(seen["X"], seen["y"]):                            # every shot is one validation row of its class
        hit = np.flatnonzero(np.abs(val - x).max(axis=1) < 1e-6)
        assert len(hit) == 1 and data["val"][1][hit[0]] == y
    np.testing.assert_allclose(seen["P"], bench.class_means(tr, data["train16"][1], C), atol=1e-6)
    text = bench.fewshot_markdown(rows, {"date": "today", "machine": {"cpus": 2}})
    assert "Single-image shots" in text and "| toy | 16 |" not in text and "nan" not in text


def test_textlike_run_reports_the_deployed_head(bench, tmp_path, monkeypatch):
    """``--prototypes textlike``: bench_adapt's draws on text-like prototypes; the "default" rows are exactly the
    deployed head's predict_proba (the mixture where the fit chose one), and the report's cells pool the seeds'
    queries."""
    from conftest import write_textlike_val_toy

    common = load_script("bench_common")
    write_textlike_val_toy(tmp_path, "toy", C=4, n_val=9)
    monkeypatch.setattr(common, "FEWSHOT", tmp_path)
    monkeypatch.setattr(bench, "BOOT", 20)
    logged = []
    rows = bench.textlike_run(["toy"], [2, 9], [0, 1], log=logged.append)
    assert {r["shots"] for r in rows} == {2} and any("9 shots: skipped" in m for m in logged)
    assert [r["head"] for r in rows[:4]] == list(bench.TEXTLIKE_HEADS)
    X, y, P, C, base = common.load_dataset("toy")
    import copy

    for seed in (0, 1):
        s, q = common.sample(y, 2, seed)
        clf = copy.deepcopy(base).adapt(X[s].astype(np.float32), y[s])
        d = [r for r in rows if r["seed"] == seed and r["head"] == "default"][0]
        assert d["name"] == clf.default_head_
        p = np.asarray(clf.predict_proba(X[q].astype(np.float32)))
        np.testing.assert_allclose(d["p_true"], p[np.arange(len(q)), y[q]], rtol=1e-6)
        assert d["acc1"] == pytest.approx(100 * (p.argmax(1) == y[q]).mean())
    text = bench.textlike_markdown(rows, {"date": "today", "machine": {"cpus": 2}})
    sel = [r for r in rows if r["head"] == "cosine"]
    pooled = 100 * np.mean(np.concatenate([r["correct"] for r in sel]))
    nll = -np.log(np.concatenate([r["p_true"] for r in sel])).mean()
    assert f"| toy | 2 | {pooled:.1f} / {nll:.3f} /" in text and "**mean of 1** | 2 |" in text


def test_kernel_kinds_of_a_head_the_text_rule_set(bench):
    """Where the held-out shots refused the kernel correction, the text rule sets the kernel head and no kind was
    chosen: the row says so and carries no kinds (the tables skip it) instead of raising KeyError."""
    from types import SimpleNamespace
    from svgen.heads.predictor import TEXT_RULE_KERNEL_LOGITS
    clf = SimpleNamespace(calibration_={"kernel_logits_choice": {"reason": TEXT_RULE_KERNEL_LOGITS}}, kernel_logits_="log")
    out = bench.kernel_kinds(clf, np.zeros((2, 3)), np.zeros(2, dtype=np.int64))
    assert out == {"kernel_logits": "log", "kind_reason": TEXT_RULE_KERNEL_LOGITS}
    assert bench.kinds_table([{"head": "kernel", **out}]) == "" and bench.kernel_reading([{"head": "kernel", **out}]) == ""

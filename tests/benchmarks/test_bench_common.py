"""The benchmarks' shared harness (benchmarks/bench_common.py) against direct computations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def common():
    return load_script("bench_common")


def test_per_image_scores_against_ranks(common):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(8), size=50)
    y = rng.integers(0, 8, 50)
    m = common.per_image(p, y)
    rank = (p > p[np.arange(50), y][:, None]).sum(1)            # classes strictly above the true one
    assert np.array_equal(m["top1"], (rank == 0).astype(float))
    assert np.array_equal(m["top5"], (rank < 5).astype(float))
    np.testing.assert_allclose(m["nll"], -np.log(p[np.arange(50), y]))


def test_bootstrap_of_one_set_and_of_the_mean_over_sets(common):
    rng = np.random.default_rng(1)
    a, b = rng.normal(1.0, 1.0, 200), rng.normal(-0.5, 2.0, 80)
    one = common.bootstrap(a, reps=500, seed=3)
    # the same resamples drawn by hand: images with replacement, the mean of each resample, its 2.5 / 97.5 percentiles
    draws = np.random.default_rng(3).integers(0, 200, size=(500, 200))
    lo, hi = np.percentile(a[draws].mean(axis=1), [2.5, 97.5])
    assert one["diff"] == pytest.approx(a.mean()) and one["ci95"] == pytest.approx([lo, hi])
    assert common.bootstrap([a], reps=500, seed=3) == one
    both = common.bootstrap([a, b], reps=500, seed=3)
    assert both["diff"] == pytest.approx((a.mean() + b.mean()) / 2)        # sets weigh equally, not by size
    assert both["ci95"][0] < both["diff"] < both["ci95"][1]
    assert common.fmt_ci({"diff": 0.5, "ci95": [-0.25, 1.0]}) == "+0.50 [-0.25, +1.00]"
    assert common.fmt_ci({"diff": 0.5, "low": -0.25, "high": 1.0}, 3) == "+0.500 [-0.250, +1.000]"


def test_sample_draws_k_of_every_class_and_the_rest_are_queries(common):
    y = np.repeat(np.arange(5), 7)
    s, q = common.sample(y, 3, seed=2)
    assert np.bincount(y[s]).tolist() == [3] * 5 and np.intersect1d(s, q).size == 0 and s.size + q.size == y.size
    assert np.array_equal(common.sample(y, 3, seed=2)[0], s)
    s0, q0 = common.sample(y, 0, seed=2)
    assert s0.size == 0 and np.array_equal(q0, np.arange(y.size))


def test_tables_and_generated_blocks(common, tmp_path, monkeypatch):
    assert common.md_table(["set", "top-1:"], [["a", "1.0"]]) == ["| set | top-1 |", "|---|---:|", "| a | 1.0 |"]
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- b -->\nold\n<!-- e -->\nrest\n", encoding="utf-8")
    assert common.replace_between(doc, "<!-- b -->", "<!-- e -->", "new\n")
    assert doc.read_text(encoding="utf-8") == "intro\n<!-- b -->\nnew\n<!-- e -->\nrest\n"
    assert not common.replace_between(doc, "<!-- x -->", "<!-- e -->", "lost\n")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "res")
    path = common.save_result("r", {"a": np.float32(0.5)})
    assert json.loads(path.read_text()) == {"a": 0.5} and [p.name for p in (tmp_path / "res").iterdir()] == ["r.json"]

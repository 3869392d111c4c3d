"""The pool benchmark (benchmarks/bench_pool.py) on a small synthetic "CoOp" folder: its protocol (shots, the
pool, the small pool) and a whole run (the real run needs
../shared/data)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_script, write_coop_toy


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_pool")


def test_zero_shots_leave_every_image_a_query_and_the_small_pool_caps_each_class(bench):
    y = np.repeat(np.arange(4), 9)
    s, q = bench.sample(y, 0, seed=1)
    assert s.size == 0 and np.array_equal(q, np.arange(len(y)))
    s, q = bench.sample(y, 2, seed=1)
    assert np.bincount(y[s]).tolist() == [2] * 4 and np.intersect1d(s, q).size == 0
    p = bench.small_pool(q, y, 5, seed=1)
    assert np.isin(p, q).all() and np.bincount(y[p]).tolist() == [5] * 4
    assert np.array_equal(bench.small_pool(q, y, 5, seed=1), p)           # seeded


def test_run_scores_the_pool_and_refused_pools_change_nothing(bench, tmp_path, monkeypatch):
    C, D = 4, 16
    data = write_coop_toy(tmp_path, "toy", C=C, D=D, splits=(("val", 12),), centre_scale=3.0)
    X, y = data["val"]
    P = np.stack([X[y == c].mean(0) for c in range(C)]) + 0.8 * np.random.default_rng(1).normal(size=(C, D))
    np.save(tmp_path / "toy" / "textlike_prototypes.npy", (P / np.linalg.norm(P, axis=1, keepdims=True)).astype(np.float32))
    monkeypatch.setitem(bench.load_dataset.__globals__, "FEWSHOT", tmp_path)   # bench_common's loader
    out = bench.run_dataset("toy", [0, 2], seeds=2, pool_kind="all", per_class=5, log=lambda *a: None)
    assert set(out) == {0, 2}
    for k, r in out.items():
        for m in bench.METHODS:
            assert set(r["per_image"][m]) == set(bench.METRICS)
        for i in r["info"]:
            if i["fallback"]:     # a refused pool is exactly the inductive head
                for x in bench.METRICS:
                    assert np.allclose(r["per_image"]["pool"][x], r["per_image"]["inductive"][x])
    summary = bench.summarise({"toy": out}, [0, 2])
    d = summary[2]["pool-inductive top1"]["mean"]
    assert d["ci95"][0] <= d["diff"] <= d["ci95"][1]
    text = bench.markdown({"pool": "all", "per_class": 5, "seeds": [0, 1], "summary": summary,
                           "info": {"toy": {str(k): v["info"] for k, v in out.items()}}})
    assert "| 2 | 1 |" in text and "| toy | 2 |" in text

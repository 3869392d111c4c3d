"""The transductive benchmark's data protocols on small synthetic "CoOp" folders (the real run needs ../shared/data)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_script, write_coop_toy


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_transductive")


def _toy(tmp_path, name, n_val=10, train16=True):
    splits = (("train16", 16), ("val", n_val)) if train16 else (("val", n_val),)
    write_coop_toy(tmp_path, name, C=4, D=16, splits=splits, centre_scale=3.0)


def test_single_image_shots_are_never_pool_or_query(bench, tmp_path, monkeypatch):
    """``--shots-from val``: per seed the shots are validation rows of their class, the pool (= the queries)
    is exactly the other validation rows, and each image's correctness is averaged over the seeds in
    which it was a query. Runs without train16 rows (as DTD)."""
    _toy(tmp_path, "toy", train16=False)
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    val = bench.unit(np.load(tmp_path / "toy" / "val_features.npy"))
    yv = np.load(tmp_path / "toy" / "val_labels.npy")
    calls = []
    real = bench.evaluate

    def spy(clf, U, P, y):
        calls.append((U.copy(), y.copy()))
        return real(clf, U, P, y)

    monkeypatch.setattr(bench, "evaluate", spy)
    seeds = [0, 1, 2]
    out = bench.run_coop("toy", [2], seeds, log=lambda *a: None, shots_from="val")
    assert len(calls) == len(seeds)
    scored, total = np.zeros(len(yv)), np.zeros(len(yv))
    for seed, (U, y) in zip(seeds, calls):
        shots = bench.sample_shots(yv, 2, seed)
        q = np.setdiff1d(np.arange(len(yv)), shots)
        np.testing.assert_array_equal(U, val[q])          # the pool is every validation row but the shots …
        np.testing.assert_array_equal(y, yv[q])
        assert set(yv[shots]) == set(range(4)) and np.bincount(yv[shots]).tolist() == [2] * 4
        P = bench.class_means(val[shots], yv[shots], 4)   # the stand-in prototypes: the shots' class means
        total[q] += (U @ bench.unit(P).T).argmax(1) == y
        scored[q] += 1
    keep = scored > 0
    correct = out[2]["correct"]
    assert all(len(v) == int(keep.sum()) for v in correct.values())   # … and an image never a query is never scored
    # the reported correctness is each image's mean over the seeds in which it was a query
    np.testing.assert_allclose(correct["cosine"], total[keep] / scored[keep])


def test_train16_protocol_is_unchanged(bench, tmp_path, monkeypatch):
    """The default protocol still scores every validation row with train16 shots."""
    _toy(tmp_path, "toy")
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    out = bench.run_coop("toy", [1], [0], log=lambda *a: None)
    assert all(len(v) == 40 for v in out[1]["correct"].values())


def test_dtd_needs_val_shots_and_enough_images(bench, tmp_path, monkeypatch, capsys):
    _toy(tmp_path, "dtd", train16=False, n_val=5)
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    monkeypatch.setattr(load_script("bench_fewshot"), "FEWSHOT", tmp_path)   # its "is the data there?" check
    with pytest.raises(SystemExit) as e:
        bench.main(["--datasets", "dtd", "--no-lvis"])
    assert e.value.code == 2 and "--shots-from val" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:           # 4 shots + 2 queries > 5 images in a class
        bench.main(["--datasets", "dtd", "--no-lvis", "--shots-from", "val", "--shots", "4"])
    assert e.value.code == 2 and "smallest class 5" in capsys.readouterr().err

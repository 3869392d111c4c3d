"""What ``classify`` writes for a pool (issue 40, items 6 and 14).

* ``classify --transductive`` and ``adapt --unlabelled-features`` then ``classify --probs`` on the same pool are the
  same numbers: the adapted default head's probabilities;
* the ``head`` column says what produced the numbers: ``transductive`` where the pool was kept, the inductive
  default head's name where it was refused;
* every written value is a float32, in every path (inductive scores and probabilities, the transductive path,
  the Ray engine's part tables).
"""

import csv
import io
import json

import numpy as np
import pytest
from svgen.adapt.config import DEFAULT

C, D = 6, 16


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def files(tmp_path):
    from conftest import write_inputs

    rng = np.random.default_rng(0)
    centres = _unit(rng.normal(size=(C, D)))
    protos = (centres + 0.5 * rng.normal(size=(C, D)) / np.sqrt(D)).astype(np.float32)
    yu = np.repeat(np.arange(C), 10)
    U = _unit(centres[yu] + 0.9 * rng.normal(size=(len(yu), D)) / np.sqrt(D)).astype(np.float32)
    folder = write_inputs(tmp_path, protos, U=3.0 * U)   # raw rows: not unit norm
    return folder


def _gate(monkeypatch, adopt: bool):
    from svgen.adapt import gate as pool_gate
    from svgen.adapt.select import Paired
    from svgen.adapt.gate import Check, Gate
    from svgen.state import Evidence

    from dataclasses import replace

    gate = Gate(Paired(0.9, 0.5, 0.4, 0.01, 0), Paired(1.0, 1.0, 0.0, 0.0, 0), DEFAULT.level, None, 9, 0)
    monkeypatch.setattr(pool_gate, "check_without_shots", lambda stage, *a, **k: Check(
        Evidence.HALVES, stage.default_head, replace(gate, failed=() if adopt else ("the test refuses the pool",))))


def _jsonl(out):
    return [json.loads(line) for line in out.splitlines()]


def _fit(cli, files):
    code, _, err = cli("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2",
                       "--steps", "5", "--out", files / "zs.svgen")
    assert code == 0, err


def test_transductive_classify_equals_adapt_then_classify_probs(cli, files, monkeypatch):
    _gate(monkeypatch, adopt=True)
    _fit(cli, files)
    code, _, err = cli("adapt", files / "zs.svgen", "--unlabelled-features", files / "U.npy", "--out",
                       files / "ta.svgen")
    assert code == 0, err
    code, out, err = cli("classify", files / "ta.svgen", "--features", files / "U.npy", "--probs", "-k", C,
                         "--format", "jsonl")
    assert code == 0, err
    adapted = _jsonl(out)
    code, out, err = cli("classify", files / "zs.svgen", "--features", files / "U.npy", "--transductive", "-k", C,
                         "--format", "jsonl")
    assert code == 0, err
    pooled = _jsonl(out)
    assert len(adapted) == len(pooled) == 60
    assert all(r["head"] == "transductive" for r in pooled)

    def dense(rows):
        p = np.zeros((len(rows), C))
        for i, r in enumerate(rows):
            p[i, [int(name[1:]) for name in r["labels"]]] = r["probs"]
        return p

    a, b = dense(adapted), dense(pooled)
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-7)   # float32 rounding of the same probabilities
    assert [r["labels"][0] for r in adapted] == [r["labels"][0] for r in pooled]
    # the library's pool probabilities are the same numbers
    from svgen import SVGClassifier

    clf = SVGClassifier.load(files / "zs.svgen").adapt(unlabelled=np.load(files / "U.npy"))
    np.testing.assert_allclose(clf.transductive_labels_, a, rtol=0, atol=2e-7)


def test_refused_pool_is_labelled_with_the_head_that_produced_the_numbers(cli, files, monkeypatch, caplog):
    _gate(monkeypatch, adopt=False)
    _fit(cli, files)
    code, out, err = cli("classify", files / "zs.svgen", "--features", files / "U.npy", "--transductive", "-k", 3,
                         "--format", "jsonl")
    assert code == 0, err
    assert "the test refuses the pool" in caplog.text
    rows = _jsonl(out)
    assert {r["head"] for r in rows} == {"kernel"}   # the inductive default head gave these numbers
    code, out, err = cli("classify", files / "zs.svgen", "--features", files / "U.npy", "--probs", "-k", 3,
                         "--format", "jsonl")
    assert code == 0, err
    assert [r["probs"] for r in _jsonl(out)] == [r["probs"] for r in rows]


def _is_float32(text: str) -> bool:
    """``text`` is the shortest decimal of a float32 (a float64's digits would not survive the round trip)."""
    return str(np.float32(text)) == text


@pytest.mark.parametrize("how", [("--probs",), ("--head", "linear"), ("--transductive",),
                                 ("--transductive", "--head", "kernel", "--probs")])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_every_written_value_is_a_float32(cli, files, monkeypatch, how, fmt):
    _gate(monkeypatch, adopt=True)
    _fit(cli, files)
    code, out, err = cli("classify", files / "zs.svgen", "--features", files / "U.npy", *how, "-k", C,
                         "--format", fmt)
    assert code == 0, err
    if fmt == "jsonl":
        texts = [t.strip() for line in out.splitlines()
                 for t in line.split('"probs": [' if "--probs" in how or how == ("--transductive",)
                                     else '"scores": [')[1].split("]")[0].split(",")]
    else:
        rows = list(csv.DictReader(io.StringIO(out)))
        texts = [v for r in rows for k, v in r.items() if k.startswith(("prob_", "score_"))]
    assert len(texts) == 60 * C
    bad = [t for t in texts if not _is_float32(t)]
    assert not bad, bad[:5]


def test_parquet_and_ray_part_tables_hold_float32_values(files, cli, tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from svgen import SVGClassifier
    from svgen.engine.predictions import prediction_table, score

    _fit(cli, files)
    code, _, err = cli("classify", files / "zs.svgen", "--features", files / "U.npy", "--probs", "-k", C,
                       "--out", tmp_path / "p.parquet")
    assert code == 0, err
    local = pq.read_table(tmp_path / "p.parquet").column("probs").to_pylist()
    clf = SVGClassifier.load(files / "zs.svgen")
    U = np.load(files / "U.npy")
    ray = prediction_table({"index": list(range(len(U)))}, score(clf, U, "kernel", True), clf.classes_, C,
                           "kernel", True).column("probs").to_pylist()
    for values in (local, ray):
        v = np.asarray(values, dtype=np.float64)
        assert v.shape == (60, C)
        np.testing.assert_array_equal(v.astype(np.float32).astype(np.float64), v)
    np.testing.assert_array_equal(np.asarray(local), np.asarray(ray))

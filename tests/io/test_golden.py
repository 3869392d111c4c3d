"""Golden artifacts (``tests/io/golden/``): every format version and support source svgen writes, kept as files.

* Each committed artifact still loads, and ``predict_proba`` on its stored queries gives the stored
  probabilities for every head and for the default head (so moving code cannot change a prediction).
* Refitting each case from scratch writes the same tensors and the same ``svgen.json`` apart from timings, to
  float rounding (so moving code cannot change what is written; the last bits depend on the CPU).
* A loaded artifact saved again writes the same files (the codec loses nothing; a legacy one gains its linear
  head's LDA part where it had shots).

``python tests/io/golden/make_golden.py`` rewrites them when a format changes on purpose.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import svgen
from svgen.io.artifacts import FORMAT_VERSIONS

GOLDEN = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)
CASES = make_golden.CASES
LOADED = CASES + make_golden.LEGACY   # every committed artifact, the legacy ones (never refitted) included


def without_timings(obj):
    """``svgen.json`` with every timing removed: keys ending in ``_s`` with a number, and ``timings_s``."""
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items()
                if not (k == "timings_s" or (k.endswith("_s") and isinstance(v, (int, float))))}
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj


def same_files(a: Path, b: Path) -> None:
    """Byte for byte (what a loaded artifact saved again must write)."""
    assert (a / "weights.safetensors").read_bytes() == (b / "weights.safetensors").read_bytes(), \
        sorted(k for k, v in load_file(str(a / "weights.safetensors")).items()
               if k not in (other := load_file(str(b / "weights.safetensors"))) or not np.array_equal(v.numpy(), other[k].numpy()))
    ja, jb = (json.loads((p / "svgen.json").read_text()) for p in (a, b))
    assert without_timings(ja) == without_timings(jb)


def same_files_but_the_lda_part(a: Path, b: Path) -> None:
    """What a legacy artifact saved again writes: the same tensors and ``svgen.json``, plus the linear head's LDA
    part (``lda.*``, ``svgen.json`` ``lda``) where it had shots and did not store it."""
    ta, tb = (load_file(str(p / "weights.safetensors")) for p in (a, b))
    ja, jb = (without_timings(json.loads((p / "svgen.json").read_text())) for p in (a, b))
    shots = bool((ja.get("fewshot") or {}).get("linear"))
    assert sorted(set(tb) - set(ta)) == (["lda.bias", "lda.weight"] if shots else [])
    assert set(ta) <= set(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert ("lda" in jb) is shots and {k: v for k, v in jb.items() if k != "lda"} == ja


REFIT_RTOL = 1e-3   # floats of a refit, relative (a tensor's: to its largest magnitude); measured across two CPUs: ≤ 7e-5
# for tensors, ≤ 6e-4 for a fitted weight of the pool check (an iterative NLL fit), which sets it


def close_json(a, b, where: str = "svgen.json") -> None:
    """Equal apart from float rounding: every key, string, integer, boolean and list length exactly, floats to
    :data:`REFIT_RTOL`."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool), (where, a, b)
        assert abs(a - b) <= REFIT_RTOL * max(abs(a), abs(b)) + 1e-12, (where, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), (where, sorted(set(a) ^ set(b)))
        for k in a:
            close_json(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            close_json(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def same_refit(a: Path, b: Path) -> None:
    """The same tensors (names, dtypes, shapes; integers exactly, floats to :data:`REFIT_RTOL`) and the same
    ``svgen.json`` apart from timings and float rounding. A refit's floats depend on the CPU's BLAS kernels in their
    last bits (the committed files were written on another machine), so bytes are too strict a test."""
    ta, tb = (load_file(str(p / "weights.safetensors")) for p in (a, b))
    assert sorted(ta) == sorted(tb), sorted(set(ta) ^ set(tb))
    for k in ta:
        x, y = ta[k].numpy(), tb[k].numpy()
        assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, y.dtype, x.shape, y.shape)
        if np.issubdtype(x.dtype, np.floating):
            tol = REFIT_RTOL * max(float(np.abs(x).max(initial=0.0)), 1e-12)
            assert float(np.abs(x.astype(np.float64) - y).max(initial=0.0)) <= tol, k
        else:
            assert np.array_equal(x, y), k
    ja, jb = (json.loads((p / "svgen.json").read_text()) for p in (a, b))
    close_json(without_timings(ja), without_timings(jb))


def test_every_format_and_source_is_covered():
    """Every format version and support source has a committed artifact (the legacy ones included: pool rows are
    only in legacy artifacts), and the code of the day writes no pool rows."""
    seen = [json.loads((GOLDEN / c / "case.json").read_text()) for c in CASES]
    loaded = seen + [json.loads((GOLDEN / c / "case.json").read_text()) for c in make_golden.LEGACY]
    assert {s["format_version"] for s in loaded} == set(FORMAT_VERSIONS)
    assert {src for s in loaded for src in s["support_sources"]} == {0, 1, 2}   # text, image, pool
    assert {src for s in seen for src in s["support_sources"]} == {0, 1}
    verdicts = {(s["transductive"] or "none").split(":")[0] for s in seen}
    assert verdicts == {"none", "refused", "kept"}
    assert {s["default_head"] for s in seen} == {"kernel", "linear", "mixture"}


@pytest.mark.parametrize("case", LOADED)
def test_golden_artifact_loads_to_the_same_probabilities(case):
    d = GOLDEN / case
    want = json.loads((d / "case.json").read_text())
    clf = svgen.SVGClassifier.load(d / "artifact")
    q = np.load(d / "queries.npy", allow_pickle=False)
    assert clf.default_head_ == want["default_head"]
    assert json.loads((d / "artifact" / "svgen.json").read_text()).get("format_version") == want["format_version"]
    for head in ("kernel", "linear", "cosine", "default"):
        got = np.asarray(clf.predict_proba(q, head=None if head == "default" else head), dtype=np.float64)
        # float32 scores differ in the last bits with the BLAS thread count; a kernel T of 0.005 makes that 1e-5
        np.testing.assert_allclose(got, np.load(d / f"proba_{head}.npy", allow_pickle=False), rtol=1e-4, atol=1e-6,
                                   err_msg=f"{case}: {head}")
        assert (got.argmax(axis=1) == np.load(d / f"proba_{head}.npy").argmax(axis=1)).all(), (case, head)


@pytest.mark.parametrize("case", CASES)
def test_refitting_writes_the_same_files(case, tmp_path):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as make_golden.py wrote them
    try:
        make_golden.build(case).save(tmp_path / "a")
    finally:
        torch.set_num_threads(threads)
    same_refit(GOLDEN / case / "artifact", tmp_path / "a")


@pytest.mark.parametrize("case", LOADED)
def test_load_then_save_writes_the_same_files(case, tmp_path):
    svgen.SVGClassifier.load(GOLDEN / case / "artifact").save(tmp_path / "b")
    (same_files if case in CASES else same_files_but_the_lda_part)(GOLDEN / case / "artifact", tmp_path / "b")


def test_a_legacy_artifact_gets_the_lda_part_its_shots_fitted_and_adapts_a_pool_as_a_new_one(tmp_path):
    """An artifact from before the LDA part was stored gets it refitted on load, as the shots stage fitted it (the
    same case written today stores it), and a pool then adapts exactly as on today's artifact."""
    old = svgen.SVGClassifier.load(GOLDEN / "legacy_v6_shots_pool_kept" / "artifact")
    new = svgen.SVGClassifier.load(GOLDEN / "v6_shots_pool_kept" / "artifact")
    assert "lda.weight" not in load_file(str(GOLDEN / "legacy_v6_shots_pool_kept" / "artifact" / "weights.safetensors"))
    a, b = old.lda_, new.lda_
    scale = float(b.weight.abs().max())
    assert float((a.weight - b.weight).abs().max()) <= REFIT_RTOL * scale
    assert float((a.bias - b.bias).abs().max()) <= REFIT_RTOL * scale
    assert (a.shrinkage, a.temperature) == pytest.approx((b.shrinkage, b.temperature), rel=REFIT_RTOL)
    assert not torch.equal(a.weight, old.heads_.linear.weight)   # the part, not the linear head it is added to
    U = np.load(GOLDEN / "v6_shots_pool_kept" / "queries.npy", allow_pickle=False)
    U = np.concatenate([U + 0.01 * np.random.default_rng(i).normal(size=U.shape).astype(np.float32) for i in range(5)])
    old.adapt(unlabelled=U)
    new.adapt(unlabelled=U)
    close_json(without_timings(old.transductive_), without_timings(new.transductive_))
    np.testing.assert_allclose(old.predict_proba(U), new.predict_proba(U), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("case", make_golden.REAL_CASES)
def test_real_predictions_are_unchanged(case, shared_data):
    """Fixed-seed fits on real CLIP features of pets (text-like prototypes, val shots): each head's predicted
    classes hash to what ``make_golden.py`` recorded, with the same top-1 and mean NLL (4 decimals)."""
    import torch

    want = json.loads((GOLDEN / f"real_{make_golden.REAL_SET}.json").read_text())[case]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = make_golden.real_summary(*make_golden.real_case(shared_data, case))
    finally:
        torch.set_num_threads(threads)
    assert got["default_head"] == want["default_head"]
    for head in ("kernel", "linear", "cosine", "default"):
        assert got[head]["top1"] == want[head]["top1"], (case, head)
        assert abs(got[head]["nll"] - want[head]["nll"]) <= 2e-4, (case, head)
        assert got[head]["argmax_sha256"] == want[head]["argmax_sha256"], (case, head)

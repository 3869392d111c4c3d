"""The pool decision as typed values (issue 38): every exit that refuses a pool gives a
:class:`svgen.state.Decision` with its own :class:`~svgen.state.Reason` (its evidence the
:class:`~svgen.state.Check`); the record
(``svgen.json`` ``transductive``: ``fallback`` and ``check``) is written from it by :func:`svgen.records.decision`; and no module under
``svgen/transductive`` steers on a record's strings.

The golden artifacts were written under the exact sign test; the pool is now judged by :mod:`svgen.adapt.select`'s one
paired test (kept iff the inductive predictor is behind it on top-1 and it is not behind on top-5 and −NLL). Every
golden case decides the same way under the new test, for the same Reason, and every number that still exists (the
paired means, differences, SEs, gained/lost counts, powers) is the recorded one; what the new rule changed is left
out of the comparison: ``sign_test_p`` (no longer computed), the ``rule`` texts, and the wording of a refusal's
``reason``/``fallback`` (compared as present or not)."""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from svgen import SVGClassifier
from svgen.adapt import pool as pool_adapt
from svgen.adapt import gate as pool_gate
from svgen.adapt import transduce as pool_transduce
from svgen.state import KEPT, Check, Decision, Evidence, Gate, Paired, Reason, pool_outcome, refuse
from svgen.records import check as check_json, decision as to_json, fallback
from svgen.io import recorded
from svgen.state import PoolOutcome
from svgen.adapt.config import DEFAULT

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "io" / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)
_spec = importlib.util.spec_from_file_location("test_golden", ROOT / "tests" / "io" / "test_golden.py")
test_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_golden)
C = make_golden.C


@pytest.fixture
def decisions(monkeypatch):
    """The :class:`Decision` of every pool the classifier adapts to, in order (the stage's own return value)."""
    seen = []
    real = pool_adapt.adapt

    def spy(*a, **k):
        fit = real(*a, **k)
        seen.append(fit.decision)
        return fit

    monkeypatch.setattr(pool_adapt, "adapt", spy)
    return seen


def golden_record(case: str) -> dict:
    return json.loads((GOLDEN / case / "artifact" / "svgen.json").read_text())["transductive"]


def written(record: dict) -> dict:
    """The part of a ``transductive`` record that :func:`svgen.records.decision` writes, in the record's key order."""
    return {k: record[k] for k in record if k in ("fallback", "check")}


# ----------------------------------------------------------------------------- a typed decision from a record

def _paired(d: dict, n: int) -> Paired:
    return Paired(d["pool"], d["inductive"], d["difference"], d["standard_error"], n)


def _gate(c: dict) -> Gate:
    """The recorded numbers judged by the rule of the day (at the default level)."""
    n = c["images"]
    if "top1" in c:
        return pool_gate.judged(Gate(_paired(c["top1"], n), _paired(c["top5"], n), DEFAULT.level, _paired(c["nll"], n),
                                     c["top1"]["gained"], c["top1"]["lost"]))
    p5, i5 = c["top5_agreement_pool"], c["top5_agreement_inductive"]
    assert p5 == i5   # (the record has no top-5 SE: every golden halves case has equal top-5 agreements)
    return pool_gate.judged(Gate(Paired(c["agreement_pool"], c["agreement_inductive"], c["difference"],
                                        c["standard_error"], n), Paired(p5, i5, 0.0, 0.0, n), DEFAULT.level, None,
                                 c["gained"], c["lost"]))


def _decision(record: dict) -> Decision:
    """The typed values behind a golden record (written by the test from the record's numbers)."""
    c = record.get("check")
    if c is not None:
        check = Check(Evidence(c["evidence"]), c["head"], _gate(c), powers=c.get("powers", {}),
                      cross_fitted=tuple(c.get("cross_fitted", ())),
                      named_heads={h: _gate(g) for h, g in c.get("named_heads", {}).items()})
        return check.decision()
    return refuse(Reason.POOL_TOO_SMALL, record["fallback"].removesuffix("; kept the inductive heads"))


CHANGED = {"sign_test_p", "rule"}   # what the rule of the day no longer writes, or words differently
WORDED = {"reason", "fallback"}     # a refusal's cause in words: compared as present or not


def unchanged(obj):
    """A record without what the new rule changed."""
    if isinstance(obj, dict):
        return {k: (v is not None if k in WORDED else unchanged(v)) for k, v in obj.items() if k not in CHANGED}
    if isinstance(obj, list):
        return [unchanged(v) for v in obj]
    return obj


CASES = [("v1_pool_refused", Reason.POOL_TOO_SMALL), ("v4_shots_pool_refused", Reason.SHOTS_CHECK_FAILED),
         ("v6_shots_pool_kept", Reason.KEPT), ("v6_zero_shot_pool_kept", Reason.KEPT),
         ("v6_one_shot_pool_kept", Reason.KEPT)]


@pytest.mark.parametrize("case, reason", CASES)
def test_to_json_writes_the_recorded_numbers_byte_for_byte(case, reason):
    record = golden_record(case)
    decision = _decision(record)
    assert decision.reason is reason and decision.kept == (reason is Reason.KEPT)
    want = unchanged(written(record))
    assert unchanged(to_json(decision)) == want
    assert (json.dumps(unchanged(to_json(decision)), indent=2, ensure_ascii=False)
            == json.dumps(want, indent=2, ensure_ascii=False))   # the same keys in the same order
    text = json.dumps(to_json(decision), ensure_ascii=False)
    assert "sign_test_p" not in text and ("by more than 1 SE" in text) == ("check" in record)


def test_the_refused_golden_case_is_a_tie():
    """v4: 3 held-out shots gained, 1 lost of 24: top-1 exactly 1 SE above the inductive predictor, a tie, which is
    not ahead (the sign test refused it too, at p = 0.31)."""
    d = _decision(golden_record("v4_shots_pool_refused"))
    top1 = d.evidence.gate.top1
    assert top1.difference == pytest.approx(top1.standard_error, rel=1e-12)
    assert d.why.startswith("top-1 on held-out shots 91.7% is not above the inductive 83.3% by more than 1 SE")


@pytest.mark.parametrize("case, reason", CASES)
def test_refitting_a_golden_case_decides_the_same_way(case, reason, decisions):
    """Refitting each golden pool gives a Decision of the recorded kind, whose record's numbers are the golden ones
    (floats to a refit's rounding: the last bits depend on the CPU, tests/io/test_golden.py)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as make_golden.py wrote them
    try:
        clf = make_golden.build(case)
    finally:
        torch.set_num_threads(threads)
    (decision,) = decisions
    assert decision.reason is reason
    assert decision.kept == clf.pool_outcome_.kept
    test_golden.close_json(unchanged(to_json(decision)), unchanged(written(golden_record(case))))
    assert written(clf.transductive_) == to_json(decision)   # the record is the decision's, written once
    if decision.evidence is not None:
        assert clf.pool_outcome_.evidence is decision.evidence.evidence
    # the record read back (svgen.io.recorded, on load) gives the typed outcome the fit had
    assert recorded.pool(golden_record(case)) == recorded.pool(clf.transductive_) == clf.pool_outcome_


# ----------------------------------------------------------------------------- every refusal's reason

def _shots_and_pool(per_pool: int, n_shots: int = 4):
    text, images = make_golden.problem(0)
    X, y = images(n_shots)
    U, _ = images(per_pool)
    return SVGClassifier(n_support=2, seed=0).fit(text), X, y, U


def test_shots_for_only_some_classes(decisions):
    clf, X, y, U = _shots_and_pool(20)
    keep = y < 4
    clf.adapt(X[keep], y[keep], unlabelled=U)
    (d,) = decisions
    assert d.reason is Reason.CLASSES_WITHOUT_SHOTS and not d.kept and d.evidence is None
    assert clf.transductive_["fallback"] == fallback(d) and fallback(d).startswith(f"2 of the {C} classes have no")


def test_no_held_out_shots(decisions, monkeypatch):
    monkeypatch.setattr(pool_gate, "shot_folds", lambda y, n_classes, seed, **k: [np.arange(len(y))])
    clf, X, y, U = _shots_and_pool(20)
    clf.adapt(X, y, unlabelled=U)
    (d,) = decisions
    assert d.reason is Reason.NO_HELD_OUT_SHOTS and d.evidence.evidence is Evidence.SHOTS and d.evidence.gate is None
    assert clf.transductive_["check"] == {"evidence": "held-out shots as pool members", "head": d.evidence.head,
                                          "adopt": False,
                                          "reason": "one shot in all: no held-out shots to check a pool on"}


def _never_settles(monkeypatch):
    monkeypatch.setattr(pool_transduce, "settle", lambda *a, **k: (None, [{"prior_strength": 8.0}]))


def test_a_fold_that_does_not_adapt(decisions, monkeypatch):
    _never_settles(monkeypatch)
    clf, X, y, U = _shots_and_pool(20)
    clf.adapt(X, y, unlabelled=U)
    (d,) = decisions
    assert d.reason is Reason.FOLD_DID_NOT_ADAPT and d.evidence.stopped is Reason.FOLD_DID_NOT_ADAPT
    # the fold's own refusal, message and all, then the pool's (as svgen.json has always written it)
    assert clf.transductive_["fallback"] == ("without a fold of the shots the rounds did not settle at any prior "
                                             "strength up to 8; kept the inductive heads; kept the inductive heads")


def test_a_half_that_does_not_adapt(decisions):
    text, images = make_golden.problem(0)
    U, _ = images(2)                       # 12 images: each half (6) is enough, ...
    clf = SVGClassifier(n_support=2, seed=0).fit(text)
    clf.adapt(unlabelled=U[:C + 2])        # ... but halves of 8 (4) are not
    (d,) = decisions
    assert d.reason is Reason.HALF_DID_NOT_ADAPT and d.evidence.evidence is Evidence.HALVES
    assert d.why == f"half of the pool alone does not adapt (pool of 4 unlabelled images is smaller than the {C} classes)"
    assert clf.transductive_["fallback"] == d.why + "; kept the inductive heads"


def test_the_halves_say_no(decisions, monkeypatch):
    real = pool_gate.decided   # zero-shot: the halves' gate alone
    monkeypatch.setattr(pool_gate, "decided", lambda *a, **k: replace(real(*a, **k), failed=("said no",)))
    text, images = make_golden.problem(0)
    U, _ = images(10)
    SVGClassifier(n_support=2, seed=0).fit(text).adapt(unlabelled=U)
    (d,) = decisions
    assert d.reason is Reason.HALVES_CHECK_FAILED and fallback(d) == "said no; kept the inductive heads"
    assert check_json(d.evidence)["adopt"] is False and check_json(d.evidence)["evidence"] == "halves of the pool"


def test_the_final_solve_that_does_not_settle(decisions, monkeypatch):
    gate = Gate(Paired(0.9, 0.5, 0.4, 0.01, 0), Paired(1.0, 1.0, 0.0, 0.0, 0), DEFAULT.level, None, 9, 0)
    monkeypatch.setattr(pool_gate, "check_without_shots", lambda stage, *a, **k:
                        Check(Evidence.HALVES, stage.default_head, gate))
    _never_settles(monkeypatch)
    text, images = make_golden.problem(0)
    U, _ = images(10)
    clf = SVGClassifier(n_support=2, seed=0).fit(text).adapt(unlabelled=U)
    (d,) = decisions
    assert d.reason is Reason.DID_NOT_SETTLE and not clf.pool_outcome_.kept
    assert clf.transductive_["fallback"] == ("the rounds did not settle at any prior strength up to 8; kept the "
                                             "inductive heads")


def test_a_decision_is_consistent():
    with pytest.raises(ValueError):
        refuse(Reason.KEPT, "x")
    with pytest.raises(ValueError):
        refuse(Reason.DID_NOT_SETTLE, None)   # a refusal says why
    with pytest.raises(ValueError):
        Check(Evidence.SHOTS, "linear")          # neither a test nor a reason it stopped
    assert to_json(KEPT) == {"fallback": None} and fallback(KEPT) is None and isinstance(KEPT, Decision)
    refused = refuse(Reason.POOL_TOO_SMALL, "too few")
    assert to_json(refused) == {"fallback": "too few; kept the inductive heads"} and not refused.kept
    assert recorded.pool(None) is None and recorded.pool({"fallback": None}) == PoolOutcome(True)
    assert recorded.pool({"fallback": "x"}) == PoolOutcome(False)
    assert pool_outcome(refused, "linear") == PoolOutcome(False) and pool_outcome(KEPT, "linear").default_head == "linear"


# ----------------------------------------------------------------------------- no steering on record strings

KEYS = {"fallback", "evidence", "adopt", "reason", "check",
        # the shots' and calibration records: the pool takes the LDA part and its temperature from the state
        "shrinkage", "prior_shots", "form", "means", "lda_temperature", "lda_temperature_fitted", "method", "loo"}


def steering(path: Path) -> list:
    """Where a module compares with an English string (a constant with a space), calls ``.replace``, or reads one of
    the decision's or the shots' record keys (``x["fallback"]``, ``x.get("evidence")``, ``x["shrinkage"]``, …)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and isinstance(side.value, str) and " " in side.value:
                    found.append(f"{where} compares with {side.value!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "replace":
                found.append(f"{where} calls .replace(")
            elif (node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant)
                  and node.args[0].value in KEYS):
                found.append(f"{where} reads .get({node.args[0].value!r})")
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
              and isinstance(node.slice, ast.Constant) and node.slice.value in KEYS):
            found.append(f"{where} reads [{node.slice.value!r}]")
    return found


def test_no_transductive_module_steers_on_record_strings():
    stages = [ROOT / "svgen" / "adapt" / f"{name}.py" for name in ("pool", "gate", "transduce", "solvers/transduction")]
    assert all(p.exists() for p in stages)
    # a loaded record is read in svgen/io/recorded.py only (tests/test_records.py)
    assert [f for p in stages for f in steering(p)] == []


def test_no_adaptive_module_compares_with_a_sentence():
    """No module of the shots, the pool or the calibration branches on an English string (a record's wording):
    decisions travel as enums and typed fields."""
    found = [f for p in sorted((ROOT / "svgen" / "adapt").rglob("*.py")) for f in steering(p) if "compares" in f]
    assert found == []


def test_the_steering_check_finds_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('if check["evidence"] == "held-out shots as pool members":\n'
                   '    m = r.get("fallback").replace("; kept the inductive heads", "")\n'
                   'ok = head == "linear"\n')
    assert sorted(steering(bad)) == ["bad.py:1 compares with 'held-out shots as pool members'",
                                     "bad.py:1 reads ['evidence']", "bad.py:2 calls .replace(",
                                     "bad.py:2 reads .get('fallback')"]   # a head name is not a sentence


@pytest.mark.parametrize("case, halves", [("v6_zero_shot_pool_kept", True), ("v2_pool_rows", True),
                                          ("v6_shots_pool_kept", False)])
def test_diagnose_reads_the_pool_evidence_as_an_enum(case, halves):
    """``svgen diagnose`` tells a pool kept on halves (the posterior linear head; the kernel vote × the likelihood)
    from one kept on held-out shots (heads × the likelihood to a power) by :class:`Evidence`, not by its wording, and
    its steering check (the transductive modules') finds no compare with an English string there."""
    from svgen.evaluation import diagnostics
    from svgen.io.artifacts import load_artifact

    meta, t = load_artifact(GOLDEN / case / "artifact")
    d = diagnostics.deployed_kernel(meta, t)
    assert d["transductive"]["evidence"] == recorded.pool(meta["transductive"]).evidence.value
    lines = diagnostics.describe_deployed(d, recorded.shots(meta.get("fewshot")), recorded.pool(meta["transductive"]))
    (line,) = [x for x in lines if x.startswith("  transductive pool")]
    assert ("kernel vote" in line) is halves and ("to a power" in line) is not halves
    assert not [f for f in steering(Path(diagnostics.__file__)) if "compares" in f]

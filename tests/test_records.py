"""Typed state in, records out (issue 47 item 4): the ``svgen.json`` records are rendered from the decisions
(:mod:`svgen.records`) and never read to decide anything, except once, on load, in :mod:`svgen.io`
(:mod:`svgen.io.recorded`), which maps them to the typed fields of :mod:`svgen.state`.

* No module outside ``svgen/io/`` branches on or compares a value read from a record (an AST check).
* Nothing on the prediction path (the fitted classifier, the heads, the engine, the explainer) reads a record at
  all.
* Rewording every sentence of a golden artifact's records on disk changes no prediction, no default head and no
  explanation, and the typed fields a load gives are the same.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import svgen
from svgen.io import recorded
from svgen.state import CalibrationMethod, Evidence, LinearForm, PoolOutcome, ShotsOutcome

ROOT = Path(__file__).resolve().parents[1]
SVGEN = ROOT / "svgen"
GOLDEN = ROOT / "tests" / "io" / "golden"

# the keys of svgen.json's adaptation records that carry a decision (or the prose of one)
KEYS = {"default_head", "prior_head", "fallback", "evidence", "check", "adopt", "adopted", "decision", "method",
        "form", "means", "lda_temperature_fitted", "reason", "rule", "replaced", "kernel_head"}
# where a classifier, a calibration or a stage keeps its records
RECORDS = {"fewshot_", "transductive_", "calibration_", "record", "fewshot", "transductive"}
PREDICTION_PATH = ["fitted.py", "classifier.py", "state.py", "heads", "engine", "zeroshot", "core",
                   "evaluation/explain.py"]


def _key(node):
    """The constant key of ``x[k]`` or ``x.get(k, …)``, else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
        return node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant)):
        return node.args[0].value
    return None


def _base(node):
    """What a chain of reads starts from: ``(clf.fewshot_ or {}).get("linear")["form"]`` → ``clf.fewshot_``."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            node = node.func.value
        elif isinstance(node, ast.BoolOp):
            node = node.values[0]
        else:
            return node


def _of_a_record(node) -> bool:
    base = _base(node)
    return isinstance(base, ast.Attribute) and base.attr in RECORDS


def _empty(node) -> bool:
    return (isinstance(node, (ast.Dict, ast.List, ast.Tuple)) and not getattr(node, "keys", getattr(node, "elts", None))
            or isinstance(node, ast.Constant) and node.value is None)


def _deciding(tree) -> set:
    """The nodes whose value decides something: tests of if/while/conditional expressions, operands of comparisons,
    of ``and``/``or`` and of ``not``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            out.add(node.test)
        elif isinstance(node, ast.Compare):
            out.update([node.left, *node.comparators])
        elif isinstance(node, ast.BoolOp):   # ``x.get(k) or {}`` only defaults a read; ``… or "kernel"`` decides
            defaulting = isinstance(node.op, ast.Or) and _empty(node.values[-1])
            out.update(node.values if not defaulting else node.values[:-2])
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.add(node.operand)
    return out


def record_decisions(path: Path) -> list:
    """Where a module decides on a value read from a record: a read of a decision's key (:data:`KEYS`), or any
    read from a record (:data:`RECORDS`), that is (part of) a test, a comparison or an ``and``/``or``."""
    tree = ast.parse(path.read_text())
    found = []
    for top in _deciding(tree):
        for node in ast.walk(top):
            key = _key(node)
            if key is not None and (key in KEYS or _of_a_record(node)):
                found.append(f"{path.name}:{node.lineno} decides on [{key!r}]")
    return sorted(set(found))


def parsed_back(path: Path) -> list:
    """Where a module compares with a sentence (a string constant with a space: a record's wording) or makes a typed
    decision (:class:`~svgen.state.Evidence`, :class:`~svgen.state.CalibrationMethod`,
    :class:`~svgen.state.LinearForm`) from a value, as a record read back would."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            found += [f"{path.name}:{node.lineno} compares with {side.value!r}" for side in [node.left, *node.comparators]
                      if isinstance(side, ast.Constant) and isinstance(side.value, str) and " " in side.value]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in TYPED
              and node.args):
            found.append(f"{path.name}:{node.lineno} parses a {node.func.id}")
    return found


TYPED = {"Evidence", "CalibrationMethod", "LinearForm"}


def record_reads(path: Path) -> list:
    """Every read from a record (:data:`RECORDS`) in a module, deciding or not."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = _key(node)
        if key is not None and _of_a_record(node):
            found.append(f"{path.name}:{node.lineno} reads [{key!r}]")
    return sorted(found)


def _modules(parts) -> list:
    out = []
    for part in parts:
        p = SVGEN / part
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def test_no_module_outside_io_decides_on_a_record():
    outside = [p for p in sorted(SVGEN.rglob("*.py")) if "io" not in p.relative_to(SVGEN).parts[:1]]
    assert [f for p in outside for f in record_decisions(p)] == []


def test_no_module_outside_io_parses_a_record_back():
    """No typed decision is parsed from a value outside ``svgen/io/``, and where records are made or shown nothing
    compares with a sentence (elsewhere: error messages of other libraries, an explanation's own labels)."""
    outside = [p for p in sorted(SVGEN.rglob("*.py")) if "io" not in p.relative_to(SVGEN).parts[:1]]
    assert [f for p in outside for f in parsed_back(p) if "parses" in f] == []
    near = _modules([*PREDICTION_PATH, "adapt", "commands", "evaluation/diagnostics.py", "evaluation/heldout.py"])
    assert [f for p in near for f in parsed_back(p)] == []


def test_the_prediction_path_reads_no_record():
    paths = _modules(PREDICTION_PATH)
    assert all(p.exists() for p in paths) and len(paths) > 20
    assert [f for p in paths for f in record_reads(p)] == []


def test_the_checks_find_what_they_forbid(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('head = (clf.transductive_ or {}).get("default_head") or "kernel"\n'
                   'if meta["fallback"]:\n'
                   '    pass\n'
                   'equal = lin.get("means") == "equal Mahalanobis radius"\n'
                   'form = clf.fewshot_["linear"]["form"]\n'
                   'ok = cal.temperatures["linear"] > 0 and head == "linear"\n'
                   'shown = {"fallback": td.get("fallback")}\n'
                   'ev = Evidence(check.get("evidence"))\n')
    assert record_decisions(bad) == ["bad.py:1 decides on ['default_head']", "bad.py:2 decides on ['fallback']",
                                     "bad.py:4 decides on ['means']"]
    assert record_reads(bad) == ["bad.py:1 reads ['default_head']", "bad.py:5 reads ['form']",
                                 "bad.py:5 reads ['linear']"]
    assert parsed_back(bad) == ["bad.py:4 compares with 'equal Mahalanobis radius'", "bad.py:8 parses a Evidence"]


# ----------------------------------------------------------------------------- rewording the records on disk

def reworded(obj, path=()):
    """Every sentence (a string with a space) of a record replaced by other words; names and numbers kept."""
    if isinstance(obj, dict):
        return {k: reworded(v, (*path, k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [reworded(v, path) for v in obj]
    if isinstance(obj, str) and " " in obj:
        return f"reworded ({len(obj)} characters)"
    return obj


RECORD_BLOCKS = ("fewshot", "transductive", "calibration", "lda", "kernel_prior")


@pytest.mark.parametrize("case", ["v4_shots", "v2_shots_refused", "v3_one_shot", "v5_shots_for_some_classes",
                                  "v4_shots_pool_refused", "v6_shots_pool_kept", "v6_one_shot_pool_kept",
                                  "v6_zero_shot_pool_kept", "v2_pool_rows", "v1_pool_refused", "legacy_v3_shots",
                                  "legacy_v6_shots_pool_kept"])
def test_rewording_the_records_changes_no_prediction(case, tmp_path):
    src = GOLDEN / case / "artifact"
    art = tmp_path / "artifact"
    shutil.copytree(src, art)
    meta = json.loads((art / "svgen.json").read_text())
    changed = {k: reworded(v) for k, v in meta.items() if k in RECORD_BLOCKS}
    assert changed != {k: meta[k] for k in changed}   # there was prose to reword
    (art / "svgen.json").write_text(json.dumps({**meta, **changed}, ensure_ascii=False))
    a, b = svgen.SVGClassifier.load(src), svgen.SVGClassifier.load(art)
    q = np.load(GOLDEN / case / "queries.npy", allow_pickle=False)
    assert b.default_head_ == a.default_head_
    assert (b.shots_outcome_, b.pool_outcome_) == (a.shots_outcome_, a.pool_outcome_)
    assert b.heads_.calibration.method is a.heads_.calibration.method
    assert (b.lda_ is None) == (a.lda_ is None)
    if a.lda_ is not None:
        assert (b.lda_.form, b.lda_.equal_radius, b.lda_.temperature) == (a.lda_.form, a.lda_.equal_radius,
                                                                          a.lda_.temperature)
        np.testing.assert_array_equal(b.lda_.weight.numpy(), a.lda_.weight.numpy())
    for head in (None, *a.head_names_):
        np.testing.assert_array_equal(b.predict_proba(q, head=head), a.predict_proba(q, head=head))
    for head in ("linear", None):   # the linear head's parts follow the LDA part's form
        assert b.explain(q[:3], head=head).to_json() == a.explain(q[:3], head=head).to_json()


# ----------------------------------------------------------------------------- the mapping, once

def test_recorded_maps_names_and_structure_not_prose():
    assert recorded.method({"method": "loo-nll"}) is CalibrationMethod.HELD_OUT_NLL
    assert recorded.method(None) is CalibrationMethod.TEXT and recorded.method({"method": "mine"}) is CalibrationMethod.GIVEN
    assert recorded.shots(None) is None and recorded.shots({}) is None
    assert recorded.shots({"default_head": "mixture", "kernel": {"decision": {"adopted": False}}}) == \
        ShotsOutcome("mixture", False)
    assert recorded.pool({"fallback": "anything at all", "default_head": "linear"}) == PoolOutcome(False)
    assert recorded.pool({"fallback": None, "default_head": "linear", "check": {"evidence": "halves of the pool"}}) == \
        PoolOutcome(True, Evidence.HALVES, "linear")
    assert recorded.evidence({"evidence": "reworded", "nll": {}}) is Evidence.SHOTS
    assert recorded.evidence({"evidence": "reworded", "agreement_pool": 0.5}) is Evidence.HALVES
    assert recorded.linear_form({"form": "lda"}) is LinearForm.LDA and recorded.linear_form(None) is LinearForm.LDA
    assert recorded.linear_form({"form": "any other words"}) is LinearForm.ZERO_SHOT_PLUS_LDA
    assert recorded.equal_radius({"means": "reworded"}) and not recorded.equal_radius({})


def test_a_fit_saves_records_rendered_from_its_typed_state(tmp_path):
    """The saved default head is the typed one: changing the typed field changes the record written (and the load)."""
    from dataclasses import replace

    clf = svgen.SVGClassifier.load(GOLDEN / "v4_shots" / "artifact")
    assert clf.default_head_ == "mixture"
    clf.shots_outcome_ = replace(clf.shots_outcome_, default_head="linear")
    clf.fewshot_ = {**clf.fewshot_, "default_head": "kernel"}   # a record edited in memory steers nothing
    assert clf.default_head_ == "linear"
    meta = json.loads((clf.save(tmp_path / "a") / "svgen.json").read_text())
    assert meta["fewshot"]["default_head"] == "linear"
    assert svgen.SVGClassifier.load(tmp_path / "a").default_head_ == "linear"

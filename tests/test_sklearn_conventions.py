"""scikit-learn's conventions as a user relies on them (issue 49, items 5, 6, 8 and 14).

5. ``fit(X, y)`` is never a text fit: without prototypes in the constructor it is refused with one line, even when
   every label is distinct (37 oxford_pets images, one per class, were fitted as 37 text prototypes named '0' …).
6. ``classes_`` holds the labels as ``y`` gave them (indices stay indices, in y's dtype; the names are
   ``class_names_``), so ``accuracy_score(y, predict(X))`` and ``scoring="accuracy"`` work; ``score`` refuses an
   unknown name, names mixed with numbers and booleans instead of counting misses.
8. The README's ``GridSearchCV`` example runs and searches a setting that changes the adapted predictor.
14. A torch sparse tensor, a malformed setting (``n_support='x'``, ``strict='yes'``) are one SvgenError line; a
   big-endian array is converted to native byte order as the CLI does.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import oxford_pets_shots
from svgen import SVGClassifier
from svgen.errors import SvgenError
from svgen.evaluation.metrics import check_labels

pytest.importorskip("sklearn")
pytestmark = pytest.mark.filterwarnings("ignore:Estimator SVGClassifier does not inherit:UserWarning")

from sklearn.base import clone  # noqa: E402
from sklearn.metrics import accuracy_score  # noqa: E402
from sklearn.model_selection import StratifiedKFold, cross_val_score  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NAMES = ["cat", "dog", "fox", "owl", "elk", "yak"]
CV = StratifiedKFold(3, shuffle=True, random_state=0)


def _data(n_per=6, seed=0, C=6, D=16):
    """Text prototypes P and labelled images X, y (class c halfway between P[c] and P[c + 1])."""
    rng = np.random.default_rng(seed)
    P = rng.normal(size=(C, D)).astype(np.float32)
    y = np.repeat(np.arange(C), n_per)
    X = ((0.5 * P + 0.5 * np.roll(P, -1, axis=0))[y] + 0.3 * rng.normal(size=(len(y), D))).astype(np.float32)
    return P, X, y


# ----------------------------------------------------------------------------- 5: fit(X, y) is never a text fit

def test_fit_x_y_with_one_image_per_class_is_refused_not_fitted_as_text(shared_data):
    """37 pets images, one per class, all labels distinct: main fitted them as 37 prototypes named '0' … '36'."""
    P, X, y = oxford_pets_shots(shared_data, per_class=1)
    assert len(np.unique(y)) == len(y) == P.shape[0]
    for labels in (y, np.asarray([f"pet_{i}" for i in y])):
        with pytest.raises(SvgenError, match=r"SVGClassifier\(prototypes=P, classes=names\)\.fit\(X, y\)") as e:
            SVGClassifier().fit(X, labels)
        assert "\n" not in str(e.value) and "fit(prototypes, classes=names)" in str(e.value)
    # the two spellings: the few-shot fit with the text side in the constructor, the text fit with classes=
    few = SVGClassifier(prototypes=P).fit(X, y)
    assert few.fewshot_["shots"] == len(y) and few.class_names_.tolist() == [f"class_{i}" for i in range(len(y))]
    text = SVGClassifier().fit(P, classes=[f"pet_{i}" for i in range(P.shape[0])])
    assert text.fewshot_ is None and text.classes_.tolist() == [f"pet_{i}" for i in range(P.shape[0])]


def test_distinct_labels_without_prototypes_are_refused_for_small_data_too():
    P, X, y = _data(n_per=1)
    with pytest.raises(SvgenError, match="need the text side in the constructor"):
        SVGClassifier(n_support=2).fit(X, y)
    with pytest.raises(SvgenError, match="need the text side in the constructor"):
        SVGClassifier(n_support=2, classes=NAMES).fit(P, NAMES)   # names as y: refused, they go as classes=
    with pytest.raises(SvgenError, match="per-image labels"):
        SVGClassifier(n_support=2).fit(X, classes=np.repeat(np.arange(6), 2))   # labels as classes=: refused too
    assert SVGClassifier(n_support=2).fit(P, classes=NAMES).classes_.tolist() == NAMES


# ----------------------------------------------------------------------------- 6: classes_ as y gave them

@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, ">i4"])
def test_integer_labels_give_integer_classes_and_predictions(dtype):
    P, X, y = _data()
    y = y.astype(dtype)
    clf = SVGClassifier(n_support=2, prototypes=P, classes=NAMES).fit(X, y)
    assert clf.classes_.dtype == np.dtype(dtype).newbyteorder("=") and clf.classes_.tolist() == list(range(6))
    assert clf.class_names_.tolist() == NAMES
    pred = clf.predict(X)
    assert pred.dtype == clf.classes_.dtype and set(pred.tolist()) <= set(range(6))
    # the prediction is the argmax of the scores (an independent reading), and accuracy_score takes it as it is
    np.testing.assert_array_equal(pred, clf.decision_function(X).argmax(1))
    assert accuracy_score(y, pred) == pytest.approx(np.mean(clf.decision_function(X).argmax(1) == y))
    assert clf.score(X, y) == accuracy_score(y, pred) > 0.5


def test_name_labels_give_name_classes_and_unfitted_clones():
    P, X, y = _data()
    names = np.asarray(NAMES)[y]
    clf = SVGClassifier(n_support=2, prototypes=P, classes=NAMES).fit(X, names)
    assert clf.classes_.dtype.kind == "U" and clf.classes_.tolist() == NAMES
    pred = clf.predict(X)
    assert accuracy_score(names, pred) == clf.score(X, names) == clf.score(X, y) > 0.5
    # the text fit has no y: the names, as before
    text = SVGClassifier(n_support=2).fit(P, classes=NAMES)
    assert text.classes_.dtype == object and set(text.predict(X)) <= set(NAMES)
    # a pickle keeps the label type; a clone is unfitted
    by_index = SVGClassifier(n_support=2, prototypes=P, classes=NAMES).fit(X, y)
    again = pickle.loads(pickle.dumps(by_index))
    np.testing.assert_array_equal(again.predict(X), by_index.predict(X))
    assert again.classes_.dtype == by_index.classes_.dtype and not hasattr(clone(by_index), "classes_")


def test_cross_val_score_with_accuracy_scoring_on_integer_and_name_labels():
    """main: scoring="accuracy" compared class names with integer y: [nan nan nan]."""
    P, X, y = _data()
    est = SVGClassifier(n_support=2, prototypes=P, classes=NAMES)
    named = cross_val_score(est, X, y, cv=CV, scoring="accuracy")
    default = cross_val_score(est, X, y, cv=CV)
    assert np.all(np.isfinite(named)) and named.mean() > 0.5
    np.testing.assert_array_equal(named, default)
    np.testing.assert_array_equal(cross_val_score(est, X, np.asarray(NAMES)[y], cv=CV, scoring="accuracy"), named)


def test_accuracy_scoring_on_oxford_pets(shared_data):
    P, X, y = oxford_pets_shots(shared_data)
    est = SVGClassifier(prototypes=P)
    named = cross_val_score(est, X, y, cv=CV, scoring="accuracy")
    assert np.all(np.isfinite(named)) and named.mean() > 0.6, named
    clf = clone(est).fit(X, y)
    assert clf.classes_.dtype == y.dtype and accuracy_score(y, clf.predict(X)) == clf.score(X, y)


def test_adapt_and_add_classes_keep_the_label_type():
    P, X, y = _data()
    clf = SVGClassifier(n_support=2, prototypes=P[:5], classes=NAMES[:5]).fit(X[y < 5], y[y < 5].astype(np.int32))
    clf.add_classes(P[5:], NAMES[5:])
    assert clf.classes_.tolist() == list(range(6)) and clf.classes_.dtype == np.int32
    assert clf.class_names_.tolist() == NAMES and clf.metadata()["classes"] == NAMES   # the artifact keeps names
    clf.adapt(X, y)
    assert set(clf.predict(X).tolist()) <= set(range(6)) and clf.score(X, y) > 0.5


@pytest.mark.parametrize("bad, message", [
    (lambda y: np.r_[np.asarray(NAMES)[y[:-1]], ["zebra"]], "'zebra'"),                  # main: a miss
    (lambda y: np.asarray([int(y[0])] + list(np.asarray(NAMES)[y[1:]]), dtype=object), "not classes"),  # main: 0.0
    (lambda y: [int(y[0])] + list(np.asarray(NAMES)[y[1:]]), "not classes"),
    (lambda y: y == 1, "booleans"),
    (lambda y: torch.as_tensor(y == 1), "booleans"),
])
def test_score_refuses_unknown_names_mixed_labels_and_booleans(bad, message):
    P, X, y = _data()
    for fitted_on in (y, np.asarray(NAMES)[y]):
        clf = SVGClassifier(n_support=2, prototypes=P, classes=NAMES).fit(X, fitted_on)
        with pytest.raises(SvgenError, match=message) as e:
            clf.score(X, bad(y))
        assert "\n" not in str(e.value)


def test_boolean_labels_are_refused_by_fit_and_by_the_label_check():
    P, X, y = _data()
    with pytest.raises(SvgenError, match="booleans"):
        SVGClassifier(n_support=2, prototypes=P).fit(X, y % 2 == 0)
    with pytest.raises(SvgenError, match="booleans"):
        check_labels(np.array([True, False]), 2, 6)   # eval --labels and score share it


# ----------------------------------------------------------------------------- 8: the README's scikit-learn example

def _readme_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"one README python block with {marker!r}"
    return found[0]


def test_readme_grid_search_example_runs_and_its_grid_changes_the_predictor(shared_data):
    """main's example searched n_support, which every candidate scored the same once shots were given."""
    P, X, y = oxford_pets_shots(shared_data)
    names = [f"pet_{i}" for i in range(P.shape[0])]
    env = {"SVGClassifier": SVGClassifier, "emb": P, "names": names, "shot_features": X,
           "shot_labels": np.asarray(names)[y], "image_features": X[:5]}
    exec(compile(_readme_block("GridSearchCV("), "README.md", "exec"), env)   # as a user pastes it
    search = env["search"]
    scores = search.cv_results_["mean_test_score"]
    assert len(scores) >= 2 and np.all(np.isfinite(scores))
    assert np.ptp(scores) > 0, ("every candidate scores the same: the grid changes nothing", search.cv_results_)
    assert set(search.predict(X[:5])) <= set(names)


# ----------------------------------------------------------------------------- 14: one line for every bad input

def test_torch_sparse_features_are_one_line():
    P, X, y = _data()
    clf = SVGClassifier(n_support=2).fit(P)
    for sparse in (torch.from_numpy(X).to_sparse(), torch.from_numpy(X).to_sparse_csr()):
        for call in (clf.predict, clf.decision_function, clf.predict_proba):
            with pytest.raises(SvgenError, match="sparse input is not supported"):
                call(sparse)
        with pytest.raises(SvgenError, match="sparse input is not supported"):
            SVGClassifier(n_support=2, prototypes=P).fit(sparse, y)
    with pytest.raises(SvgenError, match="sparse input is not supported"):
        SVGClassifier(n_support=2).fit(torch.from_numpy(P).to_sparse())


@pytest.mark.parametrize("params, message", [
    ({"n_support": "x"}, "n_support must be a whole number, got 'x'"),
    ({"n_support": 2.5}, "n_support must be a whole number"),
    ({"seed": True}, "seed must be a whole number"),
    ({"lr": "fast"}, "lr must be a number"),
    ({"ridge": [1.0]}, "ridge must be a number or one of auto"),
    ({"rff_dim": "big"}, "rff_dim must be a whole number"),
    ({"strict": "yes"}, "strict must be True or False, got 'yes'"),
    ({"progress": 1}, "progress must be True or False"),
    ({"learn_sigma": "no"}, "learn_sigma must be True or False"),   # bool('no') was True
])
def test_malformed_settings_are_one_line_at_fit(params, message):
    P, X, y = _data()
    clf = SVGClassifier(n_support=2).set_params(**params)   # scikit-learn's set_params stores; fit checks
    with pytest.raises(SvgenError, match=re.escape(message)):
        clf.fit(P)
    with pytest.raises(SvgenError, match=re.escape(message)):
        SVGClassifier(n_support=2, prototypes=P).set_params(**params).fit(X, y)


def test_numpy_scalars_and_whole_floats_are_settings():
    P, X, y = _data()
    a = SVGClassifier(n_support=np.int64(2), seed=np.uint8(3), lr=np.float32(1e-3), strict=np.bool_(False),
                      learn_sigma=np.True_).fit(P, classes=NAMES)
    b = SVGClassifier(n_support=2.0, seed=3, lr=1e-3).fit(P, classes=NAMES)
    assert a.fit_config_.n_support == 2 and type(a.fit_config_.n_support) is int
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X))


def test_big_endian_arrays_are_converted_as_the_cli_converts_them():
    """main: the estimator refused what svgen.npy (the CLI's reader) converts."""
    P, X, y = _data()
    ref = SVGClassifier(n_support=2, prototypes=P, classes=NAMES).fit(X, y)
    big = SVGClassifier(n_support=2, prototypes=P.astype(">f4"), classes=NAMES).fit(X.astype(">f4"), y.astype(">i8"))
    np.testing.assert_array_equal(big.decision_function(X.astype(">f4")), ref.decision_function(X))
    np.testing.assert_array_equal(ref.predict(X.astype(">f8")), ref.predict(X))
    assert big.classes_.dtype.isnative and ref.score(X.astype(">f4"), y.astype(">i2")) == ref.score(X, y)
    pool = SVGClassifier(n_support=2).fit(P.astype(">f4"), unlabelled=X.astype(">f4"))
    assert pool.transductive_ is not None

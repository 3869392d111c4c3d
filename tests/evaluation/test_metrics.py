"""svgen.evaluation.metrics against scikit-learn on random scores (including missing classes and k ≥ C)."""

import numpy as np
import pytest

from svgen.errors import SvgenError
from svgen.evaluation.metrics import check_labels, evaluate, mean_per_class_recall, top_k_accuracy

sk = pytest.importorskip("sklearn.metrics")


# k = C and classes absent from y are edge cases checked on purpose; sklearn warns about both
@pytest.mark.filterwarnings("ignore:'k' .* greater than or equal to 'n_classes'")
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    N, C = 200, 9
    scores = rng.normal(size=(N, C))
    y = rng.integers(0, C - 2, size=N)  # the last two classes never occur
    for k in (1, 3, 5, C):
        assert top_k_accuracy(scores, y, k) == pytest.approx(
            sk.top_k_accuracy_score(y, scores, k=k, labels=np.arange(C)), abs=1e-12)
    pred = scores.argmax(1)
    assert mean_per_class_recall(pred, y) == pytest.approx(sk.balanced_accuracy_score(y, pred), abs=1e-12)
    r = evaluate(scores, y)
    assert r["n"] == N
    assert r["acc1"] == pytest.approx(sk.accuracy_score(y, pred), abs=1e-12)
    assert r["acc5"] == pytest.approx(sk.top_k_accuracy_score(y, scores, k=5, labels=np.arange(C)), abs=1e-12)
    assert r["mean_per_class_recall"] == pytest.approx(sk.balanced_accuracy_score(y, pred), abs=1e-12)


def test_mean_per_class_recall_differs_from_accuracy_on_imbalanced_data():
    y = np.array([0] * 8 + [1] * 2)
    pred = np.array([0] * 8 + [0, 1])  # class 0: 8/8, class 1: 1/2
    assert mean_per_class_recall(pred, y) == pytest.approx(0.75)
    assert (pred == y).mean() == pytest.approx(0.9)


def test_fewer_classes_than_k_counts_everything():
    scores = np.array([[0.1, 0.9, 0.0], [0.5, 0.2, 0.3]])
    assert evaluate(scores, [2, 1])["acc5"] == 1.0
    assert evaluate(scores, [2, 1])["acc1"] == 0.0


@pytest.mark.parametrize("labels, msg", [
    (np.array([0, 1, 7]), "outside 0..4"),
    (np.array([0, -1, 2]), "outside 0..4"),
    (np.array([0, 1]), "has 2 entries but there are 3"),
    (np.array([0.0, 1.5, 2.0]), "1.5 at position 1 is not a whole number"),  # 0.0, 1.0, … are accepted (issue 16)
    (np.array([0.0, np.nan, 2.0]), "integer class indices"),
    (np.zeros((3, 1), dtype=int), "1-D"),
])
def test_bad_labels_are_one_clear_error(labels, msg):
    with pytest.raises(SvgenError, match=msg):
        check_labels(labels, 3, 5)

"""The scikit-learn estimator protocol, once: constructor settings as parameters, a readable repr, and accuracy
as the score (``sklearn.base.clone``, ``GridSearchCV`` and friends work on any class built on it)."""

from __future__ import annotations

import inspect
from typing import List

import numpy as np
import torch

from svgen.errors import SvgenError


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # arrays and the like: shown
        return False


class Estimator:
    """``get_params``/``set_params`` over the constructor's arguments, ``__repr__`` naming the changed ones, and
    ``score`` as top-1 accuracy of ``predict`` (which the subclass provides, with ``classes_``)."""

    @classmethod
    def _param_names(cls) -> List[str]:
        return [n for n in inspect.signature(cls.__init__).parameters if n != "self"]

    def get_params(self, deep: bool = True) -> dict:
        """The constructor settings (scikit-learn's estimator protocol; ``sklearn.base.clone`` works)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params):
        """Change constructor settings; unknown names are refused. Returns ``self``."""
        valid = set(self._param_names())
        for name, value in params.items():
            if name not in valid:
                raise SvgenError(f"invalid parameter {name!r} for {type(self).__name__}; valid: {', '.join(sorted(valid))}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {n: p.default for n, p in inspect.signature(type(self).__init__).parameters.items() if n != "self"}
        changed = [f"{n}={v!r}" for n, v in self.get_params().items() if not _same(v, defaults.get(n))]
        return f"{type(self).__name__}({', '.join(changed)})"

    def score(self, X, y, head=None) -> float:
        """Top-1 accuracy on ``X`` (N×D image embeddings) against ``y``: class names, or integer
        class indices into ``classes_`` (scikit-learn's ``ClassifierMixin.score``)."""
        from svgen.evaluation.metrics import check_labels

        y = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
        pred = self.predict(X, head)
        if y.dtype.kind in "USO":
            if len(y) != len(pred):
                raise SvgenError(f"y has {len(y)} entries but there are {len(pred)} feature rows; they must match")
            return float(np.mean(pred == y.astype(object)))
        y = check_labels(y, len(pred), len(self.classes_), what="y")
        return float(np.mean(pred == np.asarray(self.classes_, dtype=object)[y]))

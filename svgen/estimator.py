"""The scikit-learn estimator protocol, once: constructor settings as parameters, a readable repr, and scikit-learn's
tags (``__sklearn_tags__``: a classifier), so ``sklearn.base.clone``, ``is_classifier``, ``Pipeline``,
``cross_val_score`` and ``GridSearchCV`` work on any class built on it.

scikit-learn is not needed to import or use svgen: the tags are built from it only when scikit-learn asks for them.
"""

from __future__ import annotations

import copy
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


def _is_array(v) -> bool:
    return isinstance(v, (np.ndarray, torch.Tensor))


def _shown(v) -> str:
    """A setting as the repr shows it: an array by its shape and dtype, a long list by its first entries."""
    if _is_array(v):
        return f"<{'×'.join(map(str, v.shape))} {str(v.dtype).replace('torch.', '')} {type(v).__name__}>"
    if isinstance(v, (list, tuple)) and len(v) > 4:
        return f"[{', '.join(map(repr, v[:3]))}, … {len(v)} items]"
    return repr(v)


class Estimator:
    """``get_params``/``set_params`` over the constructor's arguments, ``__repr__`` naming the changed ones, and
    scikit-learn's tags and clone hooks (the subclass provides ``predict``, ``score`` and ``classes_``)."""

    _estimator_type = "classifier"   # what scikit-learn before 1.6 reads instead of the tags

    def __sklearn_tags__(self):
        """scikit-learn's tags (only scikit-learn calls this, so it is importable here): a classifier of 2-D float
        features that needs ``y`` to fit, and no NaN."""
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                    classifier_tags=ClassifierTags(), input_tags=InputTags())

    def __sklearn_clone__(self):
        """``sklearn.base.clone``: an unfitted estimator with the same settings. Array settings (``prototypes``) are
        shared, not copied (no fit writes into them, and a grid search clones once per candidate and fold); the
        others are deep copies, as scikit-learn makes them."""
        return type(self)(**{k: v if _is_array(v) else copy.deepcopy(v) for k, v in self.get_params(deep=False).items()})

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
        changed = [f"{n}={_shown(v)}" for n, v in self.get_params().items() if not _same(v, defaults.get(n))]
        return f"{type(self).__name__}({', '.join(changed)})"

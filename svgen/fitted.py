"""A fitted svgen predictor: the state (:mod:`svgen.state`) and everything that reads it to predict.

:class:`FittedHeads` is what a loaded artifact needs for inference — its heads' scores, logits and probabilities,
the fitted attributes scikit-learn users read (``support_vectors_``, ``temperatures_`` …) and the default head.
:class:`svgen.SVGClassifier` adds fitting, adapting and saving on top of it.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import numpy as np
import torch

from svgen.errors import SvgenError
from svgen.estimator import Estimator
from svgen.heads import predictor
from svgen.core.support import SupportSet
from svgen.evaluation.metrics import check_labels
from svgen.validation import check_embeddings, label_indices, label_type


def _head_attribute(part: str, field: str, doc: str):
    """A fitted attribute (``support_vectors_`` …) read from and written to the deployed heads."""
    def get(self):
        if "heads_" not in vars(self):   # unfitted: no fitted attributes (scikit-learn's hasattr protocol)
            raise AttributeError(f"this SVGClassifier is not fitted yet, so it has no {field!r}; call fit() or load()")
        return getattr(getattr(self.heads_, part), field)

    def set_(self, value):
        setattr(getattr(self.heads_, part), field, value)

    return property(get, set_, doc=doc)


@functools.lru_cache(maxsize=None)
def _not_fitted_type(sklearn_error: type) -> type:
    return type("NotFittedError", (SvgenError, sklearn_error),
                {"__module__": __name__, "__reduce__": lambda self: (not_fitted, (str(self),))})  # joblib pickles it


def not_fitted(message: str) -> SvgenError:
    """The error of a method called before ``fit``: an :class:`SvgenError`, and where scikit-learn is loaded also
    its ``NotFittedError`` (what its ``check_is_fitted`` raises), without importing scikit-learn."""
    sk = sys.modules.get("sklearn.exceptions")
    return _not_fitted_type(sk.NotFittedError)(message) if sk is not None else SvgenError(message)


class FittedHeads(Estimator):
    """The deployed heads (``heads_``, :class:`svgen.state.Heads`), the zero-shot heads (``zero_shot_``), the inductive
    heads a pool replaced (``inductive_``), what the shots and a pool decided (``shots_outcome_``,
    ``pool_outcome_``: :class:`svgen.state.ShotsOutcome`, :class:`svgen.state.PoolOutcome`), their records
    (``fewshot_``, ``transductive_``: output only, never read to decide) and prediction from them."""

    # ------------------------------------------------------------------------------ the fitted state
    support_vectors_ = _head_attribute("kernel", "rows", "The kernel head's rows: C×K×D text support vectors, or M×D.")
    bandwidth_ = _head_attribute("kernel", "bandwidth", "The kernel head's σ.")
    vote_weights_ = _head_attribute("kernel", "votes", "The kernel head's M×C vote weights.")
    kernel_prior_ = _head_attribute("kernel", "prior_scale", "The logit scale of the kernel head's zero-shot prior term, or None.")
    support_labels_ = _head_attribute("kernel", "labels", "The class of each kernel row (M×D rows only).")
    support_source_ = _head_attribute("kernel", "source", "Where each kernel row came from (M×D rows only).")
    linear_weight_ = _head_attribute("linear", "weight", "The linear head's C×D weight (as the shots left it; after a "
                                     "pool with shots its probabilities may also carry the pool's factor, "
                                     "``heads_.pool_factor``, which ``export`` folds into one matrix).")
    linear_bias_ = _head_attribute("linear", "bias", "The linear head's C bias.")
    temperatures_ = _head_attribute("calibration", "temperatures", "Each head's temperature T: softmax(logits / T).")
    kernel_logits_ = _head_attribute("calibration", "kernel_logits", "The kind of the kernel head's logits: log or score.")
    calibration_ = _head_attribute("calibration", "record", "How the temperatures were fitted (svgen.json).")

    @property
    def support_set_(self) -> SupportSet:
        """The support set behind the kernel head: rows, class of each row, source of each row."""
        self._check_fitted()
        return self.heads_.kernel.support_set()

    @property
    def default_head_(self) -> str:
        """The head ``classify``, ``eval``, ``export`` and :meth:`predict` use when none is named: what the fit with
        shots decided (:func:`svgen.adapt.shots.choose_default_head`: the mixture of the kernel and linear heads, or
        one of them) or a kept pool (the linear head), else the kernel head."""
        head = self.decided_head()
        return head if head in predictor.head_names(self.heads_) else "kernel"

    def decided_head(self) -> str:
        """The default head as decided (a kept pool's, else the shots', else the kernel head), before
        :attr:`default_head_` checks that the deployed heads have it."""
        pool, shots = vars(self).get("pool_outcome_"), vars(self).get("shots_outcome_")
        if pool is not None and pool.kept and pool.default_head:
            return pool.default_head
        return shots.default_head if shots is not None else "kernel"

    @property
    def head_names_(self) -> tuple:
        """The heads this classifier can be read through: kernel, linear, cosine, and ``"mixture"`` where labelled
        shots fitted one (:mod:`svgen.adapt.temperatures`)."""
        self._check_fitted()
        return predictor.head_names(self.heads_)

    def _text_temperatures(self, only: Optional[str] = None) -> None:
        """Per-head temperatures from the text side (:func:`svgen.heads.predictor.text_calibration`)."""
        self.heads_.calibration = predictor.text_calibration(self.heads_, self.prototypes_, self.per_template_,
                                                             self.fit_config_.kernel, only=only,
                                                             config=getattr(self, "adapt_config", None))

    def set_temperatures(self, temperatures: dict, method: str, kernel_logits: Optional[str] = None,
                         kernel_floor: Optional[float] = None, **details) -> "FittedHeads":
        """Replace some heads' temperatures, e.g. fitted on labelled shots::

            clf.set_temperatures({"kernel": calibration.fit_temperature(z_loo, y)}, method="loo-nll")

        ``kernel_logits`` ("log", "score" or "floored", :data:`svgen.core.logits.KERNEL_LOGITS`) changes
        the kind of the kernel head's logits; a kernel temperature must come with it (T belongs to its kind), and
        ``kernel_floor`` (ε in (0, 1)) with "floored", which only a kernel head with a zero-shot prior term has.
        Without it the kind is kept. ``method`` and ``details`` are recorded in ``svgen.json`` under
        ``calibration``.
        """
        self._check_fitted()
        if kernel_logits == "floored" and self.kernel_prior_ is None:
            raise SvgenError("kernel_logits='floored' needs a kernel head with a zero-shot prior term (adapted to shots)")
        self.heads_.calibration = predictor.with_temperatures(self.heads_.calibration, temperatures, method,
                                                              kernel_logits, kernel_floor, **details)
        return self

    def predict_proba(self, X, head: Optional[str] = None):
        """N×C probabilities of one head: ``softmax(z / T_head)`` with z the head's logits (the kernel
        vote's are ``log score``, the raw vote where ``kernel_logits_ == "score"``, or the floored log score; see
        :mod:`svgen.adapt.temperatures`). Rows sum to one (float64; a torch
        tensor for a torch input, else numpy, as :meth:`decision_function`). ``head=None``: :attr:`default_head_`."""
        self._check_fitted()
        head = head or self.default_head_
        p = predictor.proba(self.heads_, self.prototypes_, self.fit_config_.kernel, self._features(X), head,
                            self.twins_)
        return p if isinstance(X, torch.Tensor) else p.numpy()

    def logits(self, X, head: Optional[str] = None):
        """N×C logits of one head, the input of :meth:`predict_proba`'s softmax (kernel: ``log score``, or
        the score itself where ``kernel_logits_ == "score"``);
        a torch tensor for a torch input, else numpy, as :meth:`decision_function`."""
        self._check_fitted()
        z = predictor.logits(self.heads_, self.prototypes_, self.fit_config_.kernel, self._features(X),
                             head or self.default_head_, self.twins_)
        return z if isinstance(X, torch.Tensor) else z.numpy()

    def scores_and_logits(self, X, head: Optional[str] = None) -> tuple:
        """(:meth:`decision_function`, :meth:`logits`) of torch features, the head evaluated once (``svgen eval``)."""
        self._check_fitted()
        return predictor.scores_and_logits(self.heads_, self.prototypes_, self.fit_config_.kernel, self._features(X),
                                           head or self.default_head_, self.twins_)

    @property
    def twins_(self) -> Optional[torch.Tensor]:
        """Each class's first twin (the same name listed again with a coinciding prototype), or None where no class
        has one (:func:`svgen.validation.twin_classes`): every head scores twins exactly alike
        (:func:`svgen.heads.predictor.tie`). Computed once per class list and prototypes."""
        if "heads_" not in vars(self):   # unfitted: no fitted attributes (scikit-learn's hasattr protocol)
            raise AttributeError("this SVGClassifier is not fitted yet, so it has no 'twins_'; call fit() or load()")
        from svgen.validation import twin_classes

        key = vars(self).get("_twins_of")
        if key is None or key[0] is not self.class_names_ or key[1] is not self.prototypes_:
            key = (self.class_names_, self.prototypes_, twin_classes(list(self.class_names_), self.prototypes_))
            self._twins_of = key
        return key[2]

    def __sklearn_is_fitted__(self) -> bool:
        """scikit-learn's ``check_is_fitted`` (``Pipeline.predict`` asks it of its last step)."""
        return "heads_" in vars(self)

    def _check_fitted(self):
        if "heads_" not in vars(self):
            raise not_fitted("this SVGClassifier is not fitted yet; call fit() or load() first")

    @property
    def transductive_labels_(self) -> Optional[np.ndarray]:
        """The pool's class probabilities (N×C numpy array) after ``adapt(unlabelled=…)``, else None."""
        t = vars(self).get("_transductive_labels")
        return None if t is None else np.asarray(t.detach().cpu() if isinstance(t, torch.Tensor) else t)

    @transductive_labels_.setter
    def transductive_labels_(self, value) -> None:
        self._transductive_labels = value

    @property
    def n_features_in_(self) -> int:
        return int(self.prototypes_.shape[1])

    def _features(self, X) -> torch.Tensor:
        self._check_fitted()
        x = check_embeddings(X, "features", ndims=(2,))
        if x.shape[1] != self.n_features_in_:
            raise SvgenError(f"features have dimension {x.shape[1]} but the artifact expects {self.n_features_in_}")
        return x

    def decision_function(self, X, head: Optional[str] = None):
        """N×C scores of one head: ``kernel`` (vote), ``linear`` or ``cosine`` (the CLIP baseline).

        A torch tensor for a torch input; a float32 numpy array for anything else (numpy, lists),
        as scikit-learn returns. ``head=None``: :attr:`default_head_` (what the fit decided).
        """
        self._check_fitted()
        head = head or self.default_head_
        scores = predictor.scores(self.heads_, self.prototypes_, self.fit_config_.kernel, self._features(X), head,
                                  self.twins_)
        return scores if isinstance(X, torch.Tensor) else scores.cpu().numpy()

    @property
    def classes_(self) -> np.ndarray:
        """scikit-learn's ``classes_``: the C labels :meth:`predict` returns, in class order, as ``y`` gave them to
        scikit-learn's ``fit(X, y)`` — class indices ``0 … C−1`` in ``y``'s dtype where ``y`` held indices, the names
        (``class_names_``) in ``y``'s dtype where it held names — and the names (an object array) after any other fit
        or a load."""
        names = self.class_names_   # unfitted: AttributeError (scikit-learn's hasattr protocol)
        kind = vars(self).get("_labels")
        if kind is None or kind.kind == "O":
            return np.asarray(names, dtype=object)
        if kind.kind == "U":
            return np.asarray([str(n) for n in names])
        if kind.kind in "iu" and len(names) - 1 > np.iinfo(kind).max:   # y's type cannot hold every class's index
            kind = np.dtype(np.int64)
        return np.arange(len(names)).astype(kind)

    def predict(self, X, head: Optional[str] = None) -> np.ndarray:
        """The predicted class of each row of ``X``, as an entry of :attr:`classes_` (class names unless
        scikit-learn's ``fit(X, y)`` had class indices)."""
        idx = self._predict_index(X, head)   # an unfitted classifier says so here
        return self.classes_[idx]

    def _predict_index(self, X, head: Optional[str] = None) -> np.ndarray:
        return np.asarray(self.decision_function(X, head).argmax(1))

    def score(self, X, y, head: Optional[str] = None) -> float:
        """Top-1 accuracy on ``X`` (N×D image embeddings) against ``y``: class names (of ``class_names_``) or
        integer class indices, whichever the fit had (scikit-learn's ``ClassifierMixin.score``). A name that is not
        a class, names mixed with numbers, an index out of range or booleans are one :class:`SvgenError` line, not
        counted as misses."""
        self._check_fitted()
        label_type(y)   # booleans refused
        idx = self._predict_index(X, head)
        y = check_labels(label_indices(y, self.class_names_), len(idx), len(self.class_names_), what="y")
        return float(np.mean(idx == y))

    # ------------------------------------------------------------------------------ explanations
    @property
    def shot_origins_(self) -> Optional[list]:
        """Where each labelled image row of the kernel head came from, in their order: ``{"path": …}`` (an image
        file), ``{"file": …, "row": …}`` (a row of a features file), ``{"row": …}`` or ``{}`` (not known); None where
        nothing was recorded (artifacts written before provenance, or shots given without ``origins``)."""
        return vars(self).get("_shot_origins")

    @shot_origins_.setter
    def shot_origins_(self, value) -> None:
        self._shot_origins = value

    def explainer(self, head: Optional[str] = None):
        """The :class:`svgen.evaluation.explain.Explainer` of one head (``None``: :attr:`default_head_`)."""
        from svgen.evaluation.explain import Explainer, Origins

        self._check_fitted()
        origins = Origins(list(self.class_names_), int(self.fit_config_.n_support), int(self.per_template_.shape[1]),
                          self.templates_, self.shot_origins_)
        form = None if self.lda_ is None else self.lda_.form
        return Explainer(self.heads_, self.prototypes_, self.fit_config_.kernel, head or self.default_head_, origins,
                         form)

    def explain(self, X, top_k: int = 3, top_contributions: int = 5, head: Optional[str] = None):
        """Why each row of ``X`` got its classes (:mod:`svgen.evaluation.explain`): an
        :class:`~svgen.evaluation.explanation.Explanation` with, per row, its ``top_k`` classes, each score split into
        exact parts that add up to :meth:`decision_function`'s, the ``top_contributions`` support vectors voting most
        for and against each class (named by their origin), the runner-up and the margin. ``.to_frame()`` gives a
        pandas DataFrame."""
        from svgen.evaluation.explanation import Explanation

        ex = self.explainer(head)
        rows = list(ex.explain(self._features(X), top_k, top_contributions))
        return Explanation(rows, ex.head, self.provenance_note())

    def provenance_note(self) -> str:
        """``"recorded"``, or what an explanation cannot name (labelled images without their paths or rows)."""
        k = self.heads_.kernel
        if k.source is None or not bool((k.source == 1).any()) or self.shot_origins_ is not None:
            return "recorded"
        return ("the artifact records no file path or row for its labelled images (written before provenance, "
                "or shots given without origins): they are named by kind and order only")

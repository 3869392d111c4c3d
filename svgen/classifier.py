"""``SVGClassifier``: the scikit-learn-style face of svgen.

>>> clf = SVGClassifier(n_support=4).fit(prototypes, classes=names)   # C×D or C×T×D, text only
>>> clf.decision_function(image_features, head="kernel")              # N×C scores
>>> clf.predict(image_features)                                       # class names
>>> clf.predict_proba(image_features, head="linear")                 # N×C, softmax with the head's temperature
>>> clf.save("lvis.svgen"); SVGClassifier.load("lvis.svgen")
>>> clf.adapt(shot_features, shot_labels)                             # labelled images join (format 2)

The fitted state is plain objects (:mod:`svgen.state`): the deployed :class:`~svgen.state.Heads` (``heads_``),
the zero-shot heads the shots were added to (``zero_shot_``), and the inductive heads a pool replaced
(``inductive_``). Each stage is computed elsewhere — the zero-shot fit by :mod:`svgen.training`, the shots by
:mod:`svgen.shot_adapt`, a pool by :mod:`svgen.pool_adapt` — and the artifact codec is :mod:`svgen.codec`; this
class validates input, keeps the state and delegates.
"""

from __future__ import annotations

import logging
import time
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import codec, pool_adapt, predictor, shot_adapt
from .errors import SvgenError
from .generator import template_anchors
from .heads import HEADS
from .metric import lda_head, whiten_directions, whitened_cosine_head
from .pool_solve import Stage
from .prompts import validate_classes, validate_new_classes
from .prototypes import prototypes_from_embeddings
from .state import Heads, KernelHead, LinearHead, TextSide
from .support import IMAGE, SupportSet, image_rows
from .training import (FitConfig, config_dict, fit_metrics, generate_all, solve_vote_weights, spread_anchors,
                       train_generator)
from .validation import (DUPLICATE_COS, SAFE_PEAK, check_distinct, check_embeddings, check_pool,  # noqa: F401
                         check_vocabulary, duplicate_prototypes, label_indices, looks_like_labels, safe_rows)

log = logging.getLogger(__name__)


def prior_head_of(clf) -> str:
    """The head whose prediction is the transductive prior (:attr:`svgen.pool_solve.Stage.prior_head`)."""
    return "kernel" if clf.fewshot_ is None else "linear"


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # arrays and the like: shown
        return False


def _head_attribute(part: str, field: str, doc: str):
    """A fitted attribute (``support_vectors_`` …) read from and written to the deployed heads."""
    def get(self):
        if "heads_" not in vars(self):   # unfitted: no fitted attributes (scikit-learn's hasattr protocol)
            raise AttributeError(f"this SVGClassifier is not fitted yet, so it has no {field!r}; call fit() or load()")
        return getattr(getattr(self.heads_, part), field)

    def set_(self, value):
        setattr(getattr(self.heads_, part), field, value)

    return property(get, set_, doc=doc)


class SVGClassifier:
    """Support vector generation over text prototypes, with kernel-vote, linear and cosine heads.

    Parameters mirror :class:`svgen.training.FitConfig`; ``progress`` shows the fit's progress bars;
    ``strict`` refuses repeated class names and coinciding
    prototypes (by default they are fitted, with one warning: :func:`check_vocabulary`). The fit runs
    on the CPU (the default zero-shot fit is a few seconds of dense linear algebra); the encoder that
    makes the prototypes and embeds images takes a device (:class:`svgen.encoders.ClipEncoder`,
    ``--device``). Fitted attributes end in ``_``.
    """

    def __init__(
        self,
        n_support: int = 4,
        kernel: str = "rbf",
        steps: int = 0,
        lr: float = 1e-3,
        margin: str = "hinge",
        alignment_weight: float = 1.0,
        margin_weight: float = 0.1,
        grounding_weight: float = 1.0,
        query_weight: float = 0.0,
        radius: float = 0.25,
        head_lr: float = 0.0,
        batch_classes: int = 256,
        learn_sigma: bool = True,
        ridge="auto",
        metric: str = "neighbour",
        metric_condition: float = 1.3,
        linear_head: str = "whitened",
        rff_dim: Optional[int] = None,
        solver: str = "auto",
        vote_solver: str = "auto",
        vote_neighbours: int = 32,
        seed: int = 0,
        progress: bool = False,
        strict: bool = False,
    ):
        self.n_support = n_support
        self.kernel = kernel
        self.steps = steps
        self.lr = lr
        self.margin = margin
        self.alignment_weight = alignment_weight
        self.margin_weight = margin_weight
        self.grounding_weight = grounding_weight
        self.query_weight = query_weight
        self.radius = radius
        self.head_lr = head_lr
        self.batch_classes = batch_classes
        self.learn_sigma = learn_sigma
        self.ridge = ridge
        self.metric = metric
        self.metric_condition = metric_condition
        self.linear_head = linear_head
        self.rff_dim = rff_dim
        self.solver = solver
        self.vote_solver = vote_solver
        self.vote_neighbours = vote_neighbours
        self.seed = seed
        self.progress = progress
        self.strict = strict

    # ------------------------------------------------------------------------------ fitting
    def _config(self) -> FitConfig:
        cfg = FitConfig(
            n_support=int(self.n_support), kernel=self.kernel, steps=int(self.steps), lr=float(self.lr),
            margin=self.margin, alignment_weight=float(self.alignment_weight),
            margin_weight=float(self.margin_weight), grounding_weight=float(self.grounding_weight),
            query_weight=float(self.query_weight), radius=float(self.radius), head_lr=float(self.head_lr),
            batch_classes=int(self.batch_classes), learn_sigma=bool(self.learn_sigma), ridge=self.ridge,
            metric=self.metric, metric_condition=float(self.metric_condition),
            linear_head=self.linear_head, rff_dim=self.rff_dim,
            solver=self.solver, vote_solver=self.vote_solver,
            vote_neighbours=int(self.vote_neighbours), seed=int(self.seed),
        )
        cfg.validate()
        return cfg

    def fit(self, prototypes, classes: Optional[Sequence[str]] = None, templates: Optional[Sequence[str]] = None,
            encoder: Optional[dict] = None, shots=None, unlabelled=None):
        """Fit from text embeddings: ``prototypes`` is C×D or C×T×D (raw or normalised).

        ``classes`` names the rows (default ``class_0`` …); ``templates`` and ``encoder`` are
        recorded in the artifact. ``shots=(X, y)`` (N×D image embeddings, N class indices) adds
        labelled images after the zero-shot fit, exactly as :meth:`adapt`; ``unlabelled=U`` (N×D
        image embeddings without labels) then adapts transductively to that pool. Returns ``self``.
        """
        if unlabelled is not None:
            emb = check_embeddings(prototypes, "prototypes")
            check_pool(unlabelled, emb.shape[-1])  # fail before the zero-shot fit, not after
            self.fit(prototypes, classes, templates, encoder, shots=shots)
            return self.adapt(unlabelled=unlabelled)
        if shots is not None:
            try:
                X, y = shots
            except (TypeError, ValueError):
                raise SvgenError("shots must be a pair (X, y): N×D image embeddings and N class indices or "
                                 "names") from None
            emb = check_embeddings(prototypes, "prototypes")
            y = label_indices(y, [str(c).strip() for c in classes] if classes is not None
                              else [f"class_{i}" for i in range(emb.shape[0])])
            image_rows(X, y, emb.shape[0], emb.shape[-1])  # fail before the zero-shot fit, not after
            return self.fit(prototypes, classes, templates, encoder).adapt(X, y)
        t0 = time.perf_counter()  # wall_time_s covers the whole fit: checks, solve, metrics, temperatures
        cfg = self._config()
        if classes is not None and looks_like_labels(classes):
            values = [str(v) for v in np.asarray(classes, dtype=object).ravel()]
            raise SvgenError(f"fit(prototypes, classes) takes C text prototypes and their C class names, but classes "
                             f"has {len(values)} entries with {len(set(values))} distinct: per-image labels? "
                             "svgen fits from text; labelled images join as shots: "
                             "SVGClassifier().fit(prototypes, classes=names, shots=(X, y)), or clf.adapt(X, y) "
                             "on a fitted classifier (y: class indices or names)")
        emb = check_embeddings(prototypes, "prototypes")
        C = emb.shape[0]
        if classes is None:
            classes = [f"class_{i}" for i in range(C)]
        classes = validate_classes(classes, source="class list", duplicates="allow")
        if len(classes) != C:
            raise SvgenError(f"prototypes have {C} rows but there are {len(classes)} class names; they must match")
        E, P = prototypes_from_embeddings(emb)
        check_vocabulary(P, classes, strict=bool(self.strict))
        state = train_generator(P, E, cfg, progress=self.progress)
        S = generate_all(state.generator, P, state.anchors)
        sigma = float(state.log_sigma.detach().exp())
        A, lam, K_ss, path = solve_vote_weights(S, sigma, cfg, C)
        wall = time.perf_counter() - t0
        self.fit_config_ = cfg
        self.classes_ = list(classes)
        self.templates_ = list(templates) if templates is not None else None
        self.encoder_ = dict(encoder) if encoder else None
        self.per_template_ = E
        self.prototypes_ = P
        self.heads_ = Heads(KernelHead(S, sigma, A), LinearHead(state.weight.detach().clone(),
                                                                state.bias.detach().clone()))
        self.zero_shot_, self.inductive_ = self.heads_, None
        self.ridge_lambda_ = lam
        self.generator_ = state.generator.eval().requires_grad_(False)
        self.metric_precision_ = state.precision
        self.history_ = state.history
        self.fit_metrics_ = fit_metrics(state, S, P, K_ss, lam, cfg, wall, vote_weights=A)
        self.fit_metrics_["ridge_selection"] = path
        self.fewshot_ = None
        self.transductive_ = None
        self.transductive_labels_ = None
        self._scale_votes(lam)
        self._text_temperatures()
        self.fit_metrics_["wall_time_s"] = time.perf_counter() - t0
        return self

    # ------------------------------------------------------------------------------ the fitted state
    support_vectors_ = _head_attribute("kernel", "rows", "The kernel head's rows: C×K×D text support vectors, or M×D.")
    bandwidth_ = _head_attribute("kernel", "bandwidth", "The kernel head's σ.")
    vote_weights_ = _head_attribute("kernel", "votes", "The kernel head's M×C vote weights.")
    kernel_prior_ = _head_attribute("kernel", "prior_scale", "The logit scale of the kernel head's zero-shot prior term, or None.")
    support_labels_ = _head_attribute("kernel", "labels", "The class of each kernel row (M×D rows only).")
    support_source_ = _head_attribute("kernel", "source", "Where each kernel row came from (M×D rows only).")
    linear_weight_ = _head_attribute("linear", "weight", "The linear head's C×D weight.")
    linear_bias_ = _head_attribute("linear", "bias", "The linear head's C bias.")
    temperatures_ = _head_attribute("calibration", "temperatures", "Each head's temperature T: softmax(logits / T).")
    kernel_logits_ = _head_attribute("calibration", "kernel_logits", "The kind of the kernel head's logits: log or score.")
    calibration_ = _head_attribute("calibration", "record", "How the temperatures were fitted (svgen.json).")

    def _side(self) -> TextSide:
        return TextSide(self.classes_, self.prototypes_, self.per_template_, self.fit_config_,
                        self.vote_scale_.get("rule"))

    @property
    def support_set_(self) -> SupportSet:
        """The support set behind the kernel head: rows, class of each row, source of each row."""
        self._check_fitted()
        return self.heads_.kernel.support_set()

    @property
    def default_head_(self) -> str:
        """The head ``classify``, ``eval``, ``export`` and :meth:`predict` use when none is named: what the fit with
        shots decided (:func:`svgen.shot_adapt.choose_default_head`) or a kept pool (the linear head), else the
        kernel head."""
        head = (self.transductive_ or {}).get("default_head") or (self.fewshot_ or {}).get("default_head", "kernel")
        return head if head in HEADS else "kernel"

    def _stage(self) -> Stage:
        shots = self.support_set_.part(IMAGE) if self.fewshot_ is not None else None
        return Stage(self.heads_, self.zero_shot_, self.fewshot_, shots, self.default_head_)

    # ------------------------------------------------------------------------------ adapting
    def adapt(self, X=None, y=None, unlabelled=None):
        """Add labelled images (``X``, ``y``) and/or an unlabelled pool (``unlabelled``); see
        :meth:`adapt_shots` and :meth:`adapt_pool` (shots first, then the pool). Returns ``self``."""
        if X is None and y is None and unlabelled is None:
            raise SvgenError("nothing to adapt to: give labelled images (X, y) and/or unlabelled images")
        if (X is None) != (y is None):
            raise SvgenError("labelled images need both X (embeddings) and y (class indices)")
        if unlabelled is not None:
            self._check_fitted()
            check_pool(unlabelled, self.n_features_in_)  # fail before the shots are solved in, not after
        if X is not None:
            self._check_fitted()
            self.adapt_shots(X, label_indices(y, self.classes_))  # class names or indices
        if unlabelled is not None:
            self.adapt_pool(unlabelled)
        return self

    def adapt_shots(self, X, y):
        """Add labelled images ("shots"); no text is re-encoded (:mod:`svgen.shot_adapt`).

        ``X`` is N×D raw image embeddings from the artifact's encoder, ``y`` N class indices (rows of
        ``classes_``). Shots added earlier are kept and joined by the new ones. The kernel head becomes zero-shot
        probabilities plus kernel ridge on their residual, the linear head shared-covariance LDA with the
        prototypes as prior means; the default head is the one with the higher held-out accuracy. Temperatures
        are fitted on held-out scores of the shots (``calibration_`` records them). Returns ``self``.
        """
        self._check_fitted()
        C = len(self.classes_)
        new = image_rows(X, y, C, self.n_features_in_)
        if self.zero_shot_.kernel.votes.is_sparse:
            raise SvgenError(f"this artifact's {C} classes have sparse (local) vote weights; adding images needs "
                             "dense ones (fit with --vote-solver dense)")
        shots = new if self.fewshot_ is None else self.support_set_.part(IMAGE).join(new)
        self._restore_inductive()   # the heads are re-solved from the zero-shot heads and the shots
        self.transductive_ = None
        fit = shot_adapt.adapt(self.zero_shot_, shots, self._side())
        self.heads_, self.fewshot_ = fit.heads, fit.record
        return self

    def adapt_pool(self, unlabelled, strength: Optional[float] = None, progress: Optional[bool] = None):
        """Transductive adaptation to unlabelled images, kept only on held-out evidence (:mod:`svgen.pool_adapt`,
        the check :mod:`svgen.pool_gate`).

        A kept pool replaces the default (linear) head, and zero-shot may re-solve the kernel vote with pool rows;
        otherwise every head stays exactly the inductive one and ``transductive_["fallback"]`` says why
        (``transductive_["check"]`` holds the evidence). :attr:`transductive_labels_` holds the pool's
        probabilities (what ``svgen classify --transductive`` prints): the kept predictor's, or the inductive
        default head's. Adapting again starts from the inductive heads. Returns ``self``.
        """
        self._check_fitted()
        U = F.normalize(check_pool(unlabelled, self.n_features_in_), dim=-1)
        self._restore_inductive()   # adapting again starts from the inductive heads
        self.transductive_ = None
        fit = pool_adapt.adapt(self._stage(), self._side(), U, strength,
                               progress=self.progress if progress is None else progress)
        self.heads_, self.inductive_, self.transductive_ = fit.heads, fit.inductive, fit.record
        self.transductive_labels_ = fit.labels
        return self

    def _restore_inductive(self) -> None:
        """Back to the inductive heads after a pool (whichever it changed), with the temperatures, kernel logit
        kind and calibration record they had."""
        if self.inductive_ is not None:
            ind = self.inductive_
            self.heads_ = Heads(ind.kernel, ind.linear,
                                self.heads_.calibration if ind.calibration is None else ind.calibration)
            self.inductive_ = None

    # ------------------------------------------------------------------------------ readable votes
    def _scale_votes(self, lam) -> None:
        """Store the vote weights times M·λ (M support vectors): in the Parzen regime
        ``(K + M·λ·I)⁻¹ ≈ I/(M·λ)``, so a score ≈ the summed kernel mass of the class's own support
        vectors instead of a number like 2e-05. A positive factor: no ranking changes."""
        M = self.support_vectors_.reshape(-1, self.support_vectors_.shape[-1]).shape[0]
        factor = float(M * lam) if lam else 1.0
        self.vote_weights_ = self.vote_weights_ * factor
        self.vote_scale_ = {"factor": factor, "rule": "M·λ"}

    # ------------------------------------------------------------------------------ probabilities
    def _text_temperatures(self, only: Optional[str] = None) -> None:
        """Per-head temperatures from the text side (:func:`svgen.predictor.text_calibration`)."""
        self.heads_.calibration = predictor.text_calibration(self.heads_, self.prototypes_, self.per_template_,
                                                             self.fit_config_.kernel, only=only)

    def set_temperatures(self, temperatures: dict, method: str, kernel_logits: Optional[str] = None,
                         **details) -> "SVGClassifier":
        """Replace some heads' temperatures, e.g. fitted on labelled shots::

            clf.set_temperatures({"kernel": calibration.fit_temperature(z_loo, y)}, method="loo-nll")

        ``kernel_logits`` ("log" or "score", :data:`svgen.calibration.KERNEL_LOGITS`) changes the kind
        of the kernel head's logits; a kernel temperature must come with it (T belongs to its kind).
        Without it the kind is kept. ``method`` and ``details`` are recorded in ``svgen.json`` under
        ``calibration``.
        """
        self._check_fitted()
        self.heads_.calibration = predictor.with_temperatures(self.heads_.calibration, temperatures, method,
                                                              kernel_logits, **details)
        return self

    def predict_proba(self, X, head: Optional[str] = None):
        """N×C probabilities of one head: ``softmax(z / T_head)`` with z the head's logits (the kernel
        vote's are ``log score`` or, where ``kernel_logits_ == "score"``, the raw vote; see
        :mod:`svgen.calibration`). Rows sum to one (float64; a torch
        tensor for a torch input, else numpy, as :meth:`decision_function`). ``head=None``: :attr:`default_head_`."""
        head = head or self.default_head_
        p = predictor.proba(self.heads_, self.prototypes_, self.fit_config_.kernel, self._features(X), head)
        return p if isinstance(X, torch.Tensor) else p.numpy()

    def logits(self, X, head: Optional[str] = None):
        """N×C logits of one head, the input of :meth:`predict_proba`'s softmax (kernel: ``log score``, or
        the score itself where ``kernel_logits_ == "score"``);
        a torch tensor for a torch input, else numpy, as :meth:`decision_function`."""
        z = predictor.logits(self.heads_, self.prototypes_, self.fit_config_.kernel, self._features(X),
                             head or self.default_head_)
        return z if isinstance(X, torch.Tensor) else z.numpy()

    # ------------------------------------------------------------------------------ inference
    def _check_fitted(self):
        if "heads_" not in vars(self):
            raise SvgenError("this SVGClassifier is not fitted yet; call fit() or load() first")

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
        head = head or self.default_head_
        scores = predictor.scores(self.heads_, self.prototypes_, self.fit_config_.kernel, self._features(X), head)
        return scores if isinstance(X, torch.Tensor) else scores.cpu().numpy()

    def predict(self, X, head: Optional[str] = None) -> np.ndarray:
        """Predicted class names (array of str)."""
        idx = np.asarray(self.decision_function(X, head).argmax(1))
        return np.asarray(self.classes_, dtype=object)[idx]

    def score(self, X, y, head: Optional[str] = None) -> float:
        """Top-1 accuracy on ``X`` (N×D image embeddings) against ``y``: class names, or integer
        class indices into ``classes_`` (scikit-learn's ``ClassifierMixin.score``)."""
        from .metrics import check_labels

        y = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
        pred = self.predict(X, head)
        if y.dtype.kind in "USO":
            if len(y) != len(pred):
                raise SvgenError(f"y has {len(y)} entries but there are {len(pred)} feature rows; they must match")
            return float(np.mean(pred == y.astype(object)))
        y = check_labels(y, len(pred), len(self.classes_), what="y")
        return float(np.mean(pred == np.asarray(self.classes_, dtype=object)[y]))

    # ------------------------------------------------------------------------------ scikit-learn protocol
    @classmethod
    def _param_names(cls) -> List[str]:
        import inspect

        return [n for n in inspect.signature(cls.__init__).parameters if n != "self"]

    def get_params(self, deep: bool = True) -> dict:
        """The constructor settings (scikit-learn's estimator protocol; ``sklearn.base.clone`` works)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params) -> "SVGClassifier":
        """Change constructor settings; unknown names are refused. Returns ``self``."""
        valid = set(self._param_names())
        for name, value in params.items():
            if name not in valid:
                raise SvgenError(f"invalid parameter {name!r} for SVGClassifier; valid: {', '.join(sorted(valid))}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        import inspect

        defaults = {n: p.default for n, p in inspect.signature(type(self).__init__).parameters.items() if n != "self"}
        changed = [f"{n}={v!r}" for n, v in self.get_params().items() if not _same(v, defaults.get(n))]
        return f"{type(self).__name__}({', '.join(changed)})"

    # ------------------------------------------------------------------------------ persistence
    def tensors(self) -> dict:
        self._check_fitted()
        return codec.tensors(self)

    def metadata(self) -> dict:
        self._check_fitted()
        return codec.metadata(self)

    def save(self, path, force: bool = False):
        """Write the artifact directory atomically (refuses to overwrite unless ``force``)."""
        from . import artifacts

        artifacts.save_artifact(path, self.tensors(), self.metadata(), force=force)
        return path

    @classmethod
    def load(cls, path) -> "SVGClassifier":
        """Read an artifact written by :meth:`save` (or ``svgen fit``)."""
        return codec.load(cls, path)

    # ------------------------------------------------------------------------------ open set
    def _new_head_rows(self, P_new: torch.Tensor, S_new: torch.Tensor):
        """Linear-head rows for new classes on the scale of the fitted ones.

        With the text metric: the fitted closed form (whitened cosine ``normalize(Σ⁻¹p)``, zero
        bias; or LDA ``β(2Σ⁻¹p, −pᵀΣ⁻¹p)``), β matching the mean row norm of the fitted head.
        Without: ``τ̄ · normalize(mean_k s_{c,k})`` and the mean bias.
        """
        scale = self.linear_weight_.norm(dim=1).mean()
        if self.metric_precision_ is not None:
            head = lda_head if self.fit_config_.linear_head == "lda" else whitened_cosine_head
            W, b = head(P_new, self.metric_precision_)
            W_old, _ = head(self.prototypes_, self.metric_precision_)
            beta = scale / W_old.norm(dim=1).mean()
            return beta * W, beta * b
        W = scale * F.normalize(S_new.mean(dim=1), dim=-1)
        return W, self.linear_bias_.mean().expand(P_new.shape[0])

    def add_classes(self, prototypes, classes: Sequence[str]):
        """Add classes without retraining: the shared generator expands their prototypes.

        New linear-head rows come from :meth:`_new_head_rows`; the vote weights are re-solved
        over all classes with the fitted λ. An artifact with shots has its zero-shot state
        extended, then its shots solved in again as by :meth:`adapt`. Returns ``self``.
        """
        self._check_fitted()
        if self.generator_ is None:
            raise SvgenError("this artifact carries no generator weights, so classes cannot be added")
        emb = check_embeddings(prototypes, "prototypes")
        if emb.shape[-1] != self.n_features_in_:
            raise SvgenError(f"new prototypes have dimension {emb.shape[-1]}, the artifact has {self.n_features_in_}")
        classes = list(classes)
        if len(classes) != emb.shape[0]:
            raise SvgenError(f"{emb.shape[0]} new prototypes but {len(classes)} new class names")
        classes = validate_new_classes(classes, self.classes_)  # new names distinct and new; old repeats stay
        shots = None
        if self.transductive_ and not self.transductive_.get("fallback"):  # the pool knew only the old classes
            log.warning("add_classes: the transductive heads are dropped; adapt to the pool again")
        self._restore_inductive()
        self.transductive_ = None
        if self.zero_shot_ is not self.heads_:  # back to the zero-shot state; the shots are solved in again below
            shots = self.support_set_.part(IMAGE) if self.fewshot_ is not None else None
            self.heads_ = Heads(self.zero_shot_.kernel, self.zero_shot_.linear, self.heads_.calibration)
            self.zero_shot_, self.fewshot_ = self.heads_, None
        E_new, P_new = prototypes_from_embeddings(emb)
        check_distinct(torch.cat([self.prototypes_, P_new]), self.classes_ + classes, new_from=len(self.classes_))
        T = self.per_template_.shape[1]
        if E_new.shape[1] != T:
            # keep one per-template tensor: pad/cycle the new templates to the artifact's T
            E_new = E_new[:, [t % E_new.shape[1] for t in range(T)]]
        anchors = spread_anchors(template_anchors(E_new, self.fit_config_.n_support),
                                 torch.cat([self.prototypes_, P_new]), n_templates=E_new.shape[1], centres=P_new)
        if self.metric_precision_ is not None:
            anchors = whiten_directions(anchors, self.metric_precision_)
        S_new = generate_all(self.generator_, P_new, anchors)
        W_new, b_new = self._new_head_rows(P_new, S_new)
        self.classes_ = self.classes_ + classes
        self.prototypes_ = torch.cat([self.prototypes_, P_new])
        self.per_template_ = torch.cat([self.per_template_, E_new])
        k = self.heads_.kernel
        S = torch.cat([k.rows, S_new])
        lam = self.ridge_lambda_ if self.ridge_lambda_ is not None else 1e-3
        cfg = FitConfig(**{**config_dict(self.fit_config_), "ridge": float(lam)})
        A, _, _, _ = solve_vote_weights(S, k.bandwidth, cfg, len(self.classes_))
        self.heads_ = Heads(KernelHead(S, k.bandwidth, A),
                            LinearHead(torch.cat([self.linear_weight_, W_new]), torch.cat([self.linear_bias_, b_new])),
                            self.heads_.calibration)
        self.zero_shot_ = self.heads_
        self._scale_votes(lam)
        if shots is not None:
            self.adapt(shots.rows, shots.labels)  # its temperatures follow the adapted heads
        elif self.calibration_.get("method") == "text":
            self._text_temperatures()
        else:
            log.warning("temperatures were fit by %s for the old classes; they are kept for the new ones",
                        self.calibration_.get("method"))
        return self

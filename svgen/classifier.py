"""``SVGClassifier``: the scikit-learn face of svgen.

>>> clf = SVGClassifier(n_support=4).fit(prototypes, classes=names)   # C×D or C×T×D, text only
>>> clf = SVGClassifier(prototypes=P, classes=names).fit(X, y)        # the same, then labelled images (few-shot)
>>> clf.decision_function(image_features, head="kernel")              # N×C scores
>>> clf.predict(image_features)                                       # entries of classes_: names, or y's labels
>>> clf.predict_proba(image_features, head="linear")                 # N×C, softmax with the head's temperature
>>> clf.save("lvis.svgen"); SVGClassifier.load("lvis.svgen")
>>> clf.adapt(shot_features, shot_labels)                             # labelled images join (format 2)

The fitted state is plain objects (:mod:`svgen.state`): the deployed :class:`~svgen.state.Heads` (``heads_``),
the zero-shot heads the shots were added to (``zero_shot_``), and the inductive heads a pool replaced
(``inductive_``), and the LDA part of the shots' linear head (``lda_``, :class:`~svgen.state.LdaPart`). Each stage
is computed elsewhere — the zero-shot fit by :mod:`svgen.zeroshot.training`, the shots by
:mod:`svgen.adapt.shots`, a pool by :mod:`svgen.adapt.pool` — and the artifact codec is :mod:`svgen.io.codec`; this
class validates input, keeps the state and delegates.
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

import numpy as np
import torch.nn.functional as F

from svgen.config import FitConfig, setting
from svgen.core.generator import prototypes_from_embeddings
from svgen.core.support import IMAGE, SupportSet, image_rows, joined_origins, origin_records
from svgen.encoders.prompts import validate_classes, validate_new_classes
from svgen.errors import SvgenError
from svgen.fitted import FittedHeads
from svgen.adapt import shots as shot_adapt
from svgen.io import codec
from svgen.adapt.config import DEFAULT, AdaptConfig
from svgen.state import CalibrationMethod, Heads, ShotsOutcome, TextSide, pool_outcome
from svgen.adapt import pool as pool_adapt
from svgen.adapt.transduce import Stage
from svgen.validation import (DUPLICATE_COS, SAFE_PEAK, check_distinct, check_embeddings, check_no_labels,  # noqa: F401
                              check_not_labels, check_pool, check_vocabulary, duplicate_prototypes, label_indices,
                              label_type, looks_like_labels, safe_rows)
from svgen.zeroshot.fit import fit_zero_shot
from svgen.zeroshot.open_set import extend

log = logging.getLogger(__name__)


def settings(clf) -> AdaptConfig:
    """The settings a stage of ``clf`` adapts with, and is given explicitly: its ``adapt_config`` parameter, None the
    defaults (:data:`svgen.adapt.config.DEFAULT`; the one place they are defaulted), anything but an
    :class:`AdaptConfig` one line. Recorded as ``clf.adapt_config_``, the settings its state was made with: ``save``
    writes the fields that differ from the defaults to ``svgen.json`` and ``load`` restores them (as the parameter
    too), so a reload, ``adapt`` and ``add_classes`` adapt with the settings of the fit."""
    config = DEFAULT if clf.adapt_config is None else clf.adapt_config
    if not isinstance(config, AdaptConfig):
        raise SvgenError(f"adapt_config must be an svgen.AdaptConfig, got {type(config).__name__}")
    clf.adapt_config_ = config
    return config


def split_shots(shots):
    """``(X, y, origins)`` of ``fit``'s ``shots=(X, y)`` or ``(X, y, origins)`` (origins None where not given)."""
    try:
        X, y, origins = (*shots, None) if len(shots) == 2 else shots
    except (TypeError, ValueError):
        raise SvgenError("shots must be a pair (X, y): N×D image embeddings and N class indices or "
                         "names (or (X, y, origins): where each image came from)") from None
    return X, y, origins


class SVGClassifier(FittedHeads):
    """Support vector generation over text prototypes, with kernel-vote, linear and cosine heads.

    Parameters mirror :class:`svgen.zeroshot.training.FitConfig`; ``adapt_config`` (an :class:`svgen.AdaptConfig`,
    None: the defaults) holds the grids and the one test level of every choice labelled shots or a pool make, and the
    text temperatures' query sizes (docs/adaptation.md; saved with the model: :attr:`adapt_config_`, :func:`settings`).
    ``progress`` shows the fit's progress bars; ``strict`` refuses repeated class names and coinciding prototypes (by
    default they are fitted, with one warning: :func:`check_vocabulary`). ``prototypes`` (C×D or C×T×D text
    embeddings) and ``classes`` (their C names) given here make ``fit(X, y)`` scikit-learn's fit: the zero-shot fit
    from them, then ``X``, ``y`` as labelled shots (:meth:`fit`). The fit runs on the CPU (the default zero-shot fit
    is a few seconds of dense linear algebra); the encoder that makes the prototypes and embeds images takes a device
    (:class:`svgen.encoders.clip.ClipEncoder`, ``--device``). Fitted attributes end in ``_``.
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
        prototypes=None,
        classes: Optional[Sequence[str]] = None,
        adapt_config: Optional[AdaptConfig] = None,
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
        self.prototypes = prototypes
        self.classes = classes
        self.adapt_config = adapt_config

    # ------------------------------------------------------------------------------ fitting
    def check_params(self) -> FitConfig:
        """The constructor settings, checked (one :class:`~svgen.errors.SvgenError` line for the first bad one),
        as the :class:`~svgen.config.FitConfig` a fit uses; nothing is fitted."""
        cfg = FitConfig.from_params(self.get_params())
        cfg.validate()
        for name in ("strict", "progress"):   # the estimator's own switches
            setting(name, getattr(self, name), "bool")
        return cfg

    def fit(self, X=None, y=None, templates: Optional[Sequence[str]] = None, encoder: Optional[dict] = None,
            shots=None, unlabelled=None, *, classes: Optional[Sequence[str]] = None):
        """Fit from text embeddings, then adapt to any images given. Two ways to call it:

        * ``SVGClassifier(prototypes=P, classes=names).fit(X, y)`` (scikit-learn's ``fit``, so ``cross_val_score``,
          ``GridSearchCV`` and ``Pipeline`` work): the zero-shot fit from the constructor's prototypes, then
          ``X`` (N×D image embeddings) and ``y`` (N class names or indices into ``classes``) as labelled shots,
          exactly as :meth:`adapt`; ``fit()`` alone is the zero-shot fit. :attr:`classes_` then holds the labels
          as ``y`` gave them (indices or names, in ``y``'s dtype), and ``class_names_`` the names.
        * ``SVGClassifier().fit(prototypes, classes=names)``, the text fit: ``X`` is the C×D or C×T×D text
          embeddings (raw or normalised), ``classes`` names their rows (default ``class_0`` …; never ``y``, which is
          refused here), and ``shots=(X, y)`` adds labelled images after it, exactly as :meth:`adapt`.

        ``templates`` and ``encoder`` are recorded in the artifact; ``unlabelled=U`` (N×D image embeddings without
        labels) then adapts transductively to that pool. Returns ``self``.
        """
        if self.prototypes is None:
            if X is None:
                raise SvgenError("fit needs text embeddings: fit(prototypes, classes=names), or "
                                 "SVGClassifier(prototypes=P, classes=names).fit(X, y) with labelled images")
            check_no_labels(y)   # fit(X, y) is never a text fit, however distinct the labels
            return self._fit(X, classes if classes is not None else self.classes, templates, encoder, shots,
                             unlabelled)
        if classes is not None or shots is not None:
            raise SvgenError("this SVGClassifier has its prototypes from the constructor, so fit(X, y) takes the "
                             "labelled images; give the class names as SVGClassifier(classes=…) and the shots as X, y")
        if X is not None and y is None:
            raise SvgenError("fit(X, y) requires y to be passed, but the target y is None: the labelled images need "
                             "their class names or indices (fit() alone is the zero-shot fit; fit(unlabelled=U) "
                             "adapts to images without labels)")
        if X is None and y is not None:
            raise SvgenError("fit(X, y): y was given without the image embeddings X")
        labels = None if y is None else label_type(y)   # classes_ and predict speak y's language
        self._fit(self.prototypes, self.classes, templates, encoder, None if X is None else (X, y), unlabelled)
        self._labels = labels
        return self

    def _fit(self, prototypes, classes, templates, encoder, shots, unlabelled):
        if unlabelled is not None:
            emb = check_embeddings(prototypes, "prototypes")
            check_pool(unlabelled, emb.shape[-1])  # fail before the zero-shot fit, not after
            self._fit(prototypes, classes, templates, encoder, shots, None)
            return self.adapt(unlabelled=unlabelled)
        if shots is not None:
            X, y, origins = split_shots(shots)
            emb = check_embeddings(prototypes, "prototypes")
            y = label_indices(y, [str(c).strip() for c in classes] if classes is not None
                              else [f"class_{i}" for i in range(emb.shape[0])])
            image_rows(X, y, emb.shape[0], emb.shape[-1])  # fail before the zero-shot fit, not after
            return self._fit(prototypes, classes, templates, encoder, None, None).adapt(X, y, origins=origins)
        t0 = time.perf_counter()  # wall_time_s covers the whole fit: checks, solve, metrics, temperatures
        cfg = self.check_params()
        check_not_labels(classes)
        emb = check_embeddings(prototypes, "prototypes")
        C = emb.shape[0]
        if classes is None:
            classes = [f"class_{i}" for i in range(C)]
        classes = validate_classes(classes, source="class list", duplicates="allow")
        if len(classes) != C:
            raise SvgenError(f"prototypes have {C} rows but there are {len(classes)} class names; they must match")
        E, P = prototypes_from_embeddings(emb)
        check_vocabulary(P, classes, strict=bool(self.strict))
        zs = fit_zero_shot(P, E, cfg, t0, settings(self), progress=self.progress)
        self.fit_config_, self.class_names_, self.per_template_, self.prototypes_ = cfg, np.asarray(classes, object), E, P
        self._labels = None   # classes_ is class_names_ unless scikit-learn's fit(X, y) says otherwise
        self.templates_ = list(templates) if templates is not None else None
        self.encoder_ = dict(encoder) if encoder else None
        self.heads_ = self.zero_shot_ = zs.heads
        self.inductive_ = self.fewshot_ = self.lda_ = self.transductive_ = self.transductive_labels_ = None
        self.shot_origins_ = self.shots_outcome_ = self.pool_outcome_ = None
        self.generator_, self.metric_precision_, self.history_ = zs.generator, zs.precision, zs.history
        self.fit_metrics_, self.ridge_lambda_, self.vote_scale_ = zs.metrics, zs.ridge_lambda, zs.vote_scale
        return self

    def _side(self) -> TextSide:
        return TextSide(list(self.class_names_), self.prototypes_, self.per_template_, self.fit_config_,
                        self.vote_scale_.get("rule"))

    def _stage(self) -> Stage:
        shots = self.support_set_.part(IMAGE) if self.fewshot_ is not None else None
        return Stage(self.heads_, self.zero_shot_, shots, self.default_head_, self.lda_)

    # ------------------------------------------------------------------------------ adapting
    def adapt(self, X=None, y=None, unlabelled=None, origins=None):
        """Add labelled images (``X``, ``y``; ``origins``: where each came from) and/or an unlabelled pool
        (``unlabelled``); see :meth:`adapt_shots` and :meth:`adapt_pool` (shots first, then the pool)."""
        if X is None and y is None and unlabelled is None:
            raise SvgenError("nothing to adapt to: give labelled images (X, y) and/or unlabelled images")
        if (X is None) != (y is None):
            raise SvgenError("labelled images need both X (embeddings) and y (class indices)")
        if unlabelled is not None:
            self._check_fitted()
            check_pool(unlabelled, self.n_features_in_)  # fail before the shots are solved in, not after
        if X is not None:
            self._check_fitted()
            self.adapt_shots(X, label_indices(y, self.class_names_), origins)  # class names or indices
        if unlabelled is not None:
            self.adapt_pool(unlabelled)
        return self

    def adapt_shots(self, X, y, origins=None):
        """Add labelled images ("shots"); no text is re-encoded (:mod:`svgen.adapt.shots`).

        ``X`` is N×D raw image embeddings from the artifact's encoder, ``y`` N class indices (rows of
        ``class_names_``). Shots added earlier are kept and joined by the new ones; how the heads and the default
        head are chosen: docs/adaptation.md. ``origins``: N file paths or rows
        (:func:`svgen.core.support.origin_records`), kept for :meth:`explain`. Returns ``self``.
        """
        self._check_fitted()
        C = len(self.class_names_)
        new = image_rows(X, y, C, self.n_features_in_)
        if self.twins_ is not None:   # a shot of a class's second listing is a shot of the class (its first listing)
            new = SupportSet(new.rows, self.twins_[new.labels.long()].to(new.labels.dtype), new.source)
        named = None if origins is None else origin_records(origins, len(new))   # checked before any change
        if self.zero_shot_.kernel.votes.is_sparse:
            why = f"this artifact's {C} classes have sparse (local) vote weights; adding images needs dense ones"
            raise SvgenError(f"{why} (fit with vote_solver='dense')", cli=f"{why} (fit with --vote-solver dense)")
        old = None if self.fewshot_ is None else self.support_set_.part(IMAGE)
        shots = new if old is None else old.join(new)
        if old is not None:   # the kernel's image rows: the earlier shots, then these
            named = joined_origins(self.shot_origins_, len(old), named, len(new))
        self._restore_inductive()   # the heads are re-solved from the zero-shot heads and the shots
        self.transductive_ = self.pool_outcome_ = None
        fit = shot_adapt.adapt(self.zero_shot_, shots, self._side(), progress=self.progress,
                               config=settings(self))
        self.heads_, self.fewshot_, self.lda_ = fit.heads, fit.record, fit.lda
        self.shot_origins_, self.shots_outcome_ = named, ShotsOutcome(fit.default_head, fit.kernel_kept)
        return self

    def adapt_pool(self, unlabelled, strength: Optional[float] = None, progress: Optional[bool] = None):
        """Transductive adaptation to unlabelled images, kept only on held-out evidence (:mod:`svgen.adapt.pool`,
        the check :mod:`svgen.adapt.gate`).

        A kept pool multiplies the default head by the pool's class likelihood (with shots), or replaces the linear
        head by the transduction's posterior and multiplies the kernel head's probabilities by the likelihood
        (zero-shot); otherwise every head stays exactly the inductive one: ``pool_outcome_`` says which (typed), the
        record ``transductive_`` why, in words, and on what evidence. :attr:`transductive_labels_` holds the pool's
        probabilities (what ``svgen classify --transductive`` prints): the kept predictor's, or the inductive
        default head's. Adapting again starts from the inductive heads. Returns ``self``.
        """
        self._check_fitted()
        U = F.normalize(check_pool(unlabelled, self.n_features_in_), dim=-1)
        self._restore_inductive()   # adapting again starts from the inductive heads
        self.transductive_ = self.pool_outcome_ = None
        fit = pool_adapt.adapt(self._stage(), self._side(), U, strength,
                               progress=self.progress if progress is None else progress,
                               config=settings(self))
        self.heads_, self.inductive_, self.transductive_ = fit.heads, fit.inductive, fit.record
        self.transductive_labels_, self.pool_outcome_ = fit.labels, pool_outcome(fit.decision, fit.default_head)
        return self

    def _restore_inductive(self) -> None:
        """Back to the inductive heads after a pool (whichever it changed, and without its factor), with the
        temperatures, kernel logit kind and calibration record they had."""
        if self.inductive_ is not None:
            ind = self.inductive_
            self.heads_ = Heads(ind.kernel, ind.linear,
                                self.heads_.calibration if ind.calibration is None else ind.calibration)
            self.inductive_ = None
        elif self.heads_.pool_factor is not None:   # a loaded artifact's factor: its heads are the inductive ones
            self.heads_ = Heads(self.heads_.kernel, self.heads_.linear, self.heads_.calibration)

    # ------------------------------------------------------------------------------ persistence
    def tensors(self) -> dict:
        self._check_fitted()
        return codec.tensors(self)

    def metadata(self) -> dict:
        self._check_fitted()
        return codec.metadata(self)

    def save(self, path, force: bool = False):
        """Write the artifact directory atomically under its writer lock (:mod:`svgen.locks`); an existing one is
        replaced only with ``force`` (an artifact or an empty folder), and nothing is ever written inside an artifact."""
        from svgen.io import artifacts

        artifacts.save_artifact(path, self.tensors(), self.metadata(), force=force)
        return path

    @classmethod
    def load(cls, path) -> "SVGClassifier":
        """Read an artifact written by :meth:`save` (or ``svgen fit``)."""
        return codec.load(cls, path)

    # ------------------------------------------------------------------------------ open set
    def add_classes(self, prototypes, classes: Sequence[str]):
        """Add classes without retraining: the shared generator expands their prototypes
        (:func:`svgen.zeroshot.open_set.extend`). An artifact with shots has its zero-shot state extended, then its
        shots solved in again as by :meth:`adapt`; a pool is dropped. Returns ``self``."""
        self._check_fitted()
        if self.generator_ is None:
            raise SvgenError("this artifact carries no generator weights, so classes cannot be added")
        emb = check_embeddings(prototypes, "prototypes")
        if emb.shape[-1] != self.n_features_in_:
            raise SvgenError(f"new prototypes have dimension {emb.shape[-1]}, the artifact has {self.n_features_in_}")
        classes = list(classes)
        if len(classes) != emb.shape[0]:
            raise SvgenError(f"{emb.shape[0]} new prototypes but {len(classes)} new class names")
        classes = validate_new_classes(classes, list(self.class_names_))  # new names distinct and new; old repeats stay
        if self.pool_outcome_ is not None and self.pool_outcome_.kept:  # the pool knew only the old classes
            log.warning("add_classes: the transductive heads are dropped; adapt to the pool again")
        self._restore_inductive()
        self.transductive_ = self.pool_outcome_ = None
        shots = self.support_set_.part(IMAGE) if self.fewshot_ is not None else None   # solved in again below
        zero = Heads(self.zero_shot_.kernel, self.zero_shot_.linear, self.heads_.calibration)
        names, self.prototypes_, self.per_template_, self.heads_, self.vote_scale_ = extend(
            zero, self._side(), self.generator_, self.metric_precision_, self.ridge_lambda_, emb, classes)
        self.class_names_ = np.asarray(names, dtype=object)
        self.zero_shot_, self.fewshot_, self.lda_, self.shots_outcome_ = self.heads_, None, None, None
        if shots is not None:
            self.adapt(shots.rows, shots.labels, origins=self.shot_origins_)  # temperatures follow the new heads
        elif self.heads_.calibration.method is CalibrationMethod.TEXT:
            self._text_temperatures(settings(self))
        else:
            log.warning("temperatures were fit by %s for the old classes; they are kept for the new ones",
                        self.heads_.calibration.method.value)
        return self

"""``SVGClassifier``: the scikit-learn-style face of svgen.

>>> clf = SVGClassifier(n_support=4).fit(prototypes, classes=names)   # C×D or C×T×D, text only
>>> clf.decision_function(image_features, head="kernel")              # N×C scores
>>> clf.predict(image_features)                                       # class names
>>> clf.predict_proba(image_features, head="linear")                 # N×C, softmax with the head's temperature
>>> clf.save("lvis.svgen"); SVGClassifier.load("lvis.svgen")
>>> clf.adapt(shot_features, shot_labels)                             # labelled images join (format 2)
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import artifacts, calibration, fewshot, residual
from .errors import SvgenError
from .generator import SupportVectorGenerator, template_anchors
from .metric import lda_head, whiten_directions, whitened_cosine_head
from .heads import HEADS, cosine_logits, kernel_scores, krr_vote_weights, linear_logits, prior_probs
from .kernels import kernel
from .prompts import validate_classes, validate_new_classes
from .prototypes import prototypes_from_embeddings
from .support import IMAGE, POOL, SOURCES, SupportSet, image_rows
from .training import (FitConfig, choose_ridge, config_dict, fit_metrics, generate_all, solve_vote_weights,
                       spread_anchors, train_generator)

log = logging.getLogger(__name__)

HEADS_FITTED_BY_POOL = ("kernel", "linear")   # the heads a pool re-solves (cosine stays CLIP's)


def prior_head_of(clf) -> str:
    """The head whose prediction is the transductive prior: the kernel vote zero-shot; with shots the
    linear (LDA) head, whose logits are the log-likelihood ratios of a Gaussian class model — the
    model the transduction continues to solve on the pool."""
    return "kernel" if clf.fewshot_ is None else "linear"


def check_pool(U, dim: int) -> torch.Tensor:
    """Validate an unlabelled pool (N×D image embeddings) against the artifact's dimension."""
    u = check_embeddings(U, "unlabelled images", ndims=(2,))
    if u.shape[1] != dim:
        raise SvgenError(f"unlabelled images have dimension {u.shape[1]} but the artifact expects {dim}")
    if u.shape[0] < 2:
        raise SvgenError(f"the unlabelled pool has {u.shape[0]} image(s); it needs at least 2")
    return u


def check_embeddings(x, what: str = "prototypes", ndims=(2, 3)) -> torch.Tensor:
    """Validate an embedding array once, at the boundary: real, right rank, finite, no zero rows.

    Every consumer L2-normalises the rows, so a row whose float32 norm would overflow (1e38) or
    underflow (1e-42) is divided by its largest |entry| first (:func:`safe_rows`): its direction is
    kept instead of being scored as a zero vector or refused as one. Only per-row vectors are
    allocated, never a second N×D array.
    """
    try:
        a = x.detach().cpu() if isinstance(x, torch.Tensor) else np.asarray(x)
        if a.dtype.is_complex if isinstance(a, torch.Tensor) else np.iscomplexobj(a):
            raise SvgenError(f"{what} holds complex numbers; expected real embeddings")
        t = torch.as_tensor(a if isinstance(a, torch.Tensor) else np.asarray(a), dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        if isinstance(e, SvgenError):
            raise
        raise SvgenError(f"{what} must be a numeric array ({e})") from None
    if t.dim() not in ndims:
        shapes = " or ".join({2: "N×D", 3: "C×T×D"}[n] if what != "prototypes" else {2: "C×D", 3: "C×T×D"}[n] for n in ndims)
        raise SvgenError(f"{what} must be a {shapes} array, got shape {tuple(t.shape)}")
    if t.numel() == 0 or t.shape[-1] == 0:
        raise SvgenError(f"{what} is empty (shape {tuple(t.shape)})")
    bad = ~torch.isfinite(t)
    if bad.any():
        row = int(bad.reshape(t.shape[0], -1).any(dim=1).nonzero()[0])
        raise SvgenError(f"{what} contains NaN or inf (first at row {row})")
    peak = torch.linalg.vector_norm(t, ord=float("inf"), dim=-1)  # max |entry| per row, no N×D temporary
    zero = peak == 0
    if zero.any():
        row = int(zero.reshape(t.shape[0], -1).any(dim=1).nonzero()[0])
        raise SvgenError(f"{what} has an all-zero vector at row {row}; cannot L2-normalise it")
    return safe_rows(t, peak)


SAFE_PEAK = (1e-18, 1e18)  # rows whose largest |entry| is in here square and sum without over/underflow


def safe_rows(t: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
    """``t`` with every row whose largest |entry| (``peak``) leaves :data:`SAFE_PEAK` divided by it, so
    its float32 norm neither overflows (1e38) nor underflows (1e-42). The row's direction, all that the
    heads use, is unchanged; other rows are left bit-identical."""
    bad = (peak < SAFE_PEAK[0]) | (peak > SAFE_PEAK[1])
    if not bad.any():
        return t
    t = t.clone()
    t[bad] = t[bad] / peak[bad].unsqueeze(-1)
    return t


DUPLICATE_COS = 0.9999  # prototypes at least this close are one class to the kernel (tied scores, a singular solve)


def duplicate_prototypes(P: torch.Tensor, threshold: float = DUPLICATE_COS, block: int = 1024) -> List[tuple]:
    """Pairs ``(i, j, cos)``, i < j, of unit rows of ``P`` (C×D) with ``cos(p_i, p_j) ≥ threshold``.

    Computed in row blocks, so memory stays ``block × C`` however many classes there are.
    """
    P = F.normalize(P.float(), dim=-1)
    pairs = []
    for s in range(0, P.shape[0], block):
        cos = P[s:s + block] @ P.T
        rows, cols = torch.nonzero(cos >= threshold, as_tuple=True)
        for r, c in zip(rows.tolist(), cols.tolist()):
            if s + r < c:
                pairs.append((s + r, c, float(cos[r, c])))
    return pairs


def check_distinct(P: torch.Tensor, classes: Sequence[str], new_from: int = 0) -> None:
    """Refuse classes whose prototypes coincide (cos ≥ 0.9999), naming them, before any solve; only
    pairs that involve a row from ``new_from`` on (classes being added) count."""
    from .prototypes import short_name

    pairs = [(i, j, c) for i, j, c in duplicate_prototypes(P) if j >= new_from]
    if pairs:
        shown = "; ".join(f"{short_name(classes[i])} and {short_name(classes[j])} (cos {c:.6f})"
                          for i, j, c in pairs[:5]) + (" …" if len(pairs) > 5 else "")
        raise SvgenError(f"{len(pairs)} pair(s) of classes have identical or near-identical prototypes, so no "
                         f"classifier can tell them apart: {shown}. Names that differ only in case or spacing "
                         "encode alike (CLIP's tokenizer lower-cases); remove or rename one of each pair")


def check_vocabulary(P: torch.Tensor, classes: Sequence[str], strict: bool = False) -> List[tuple]:
    """Repeated class names and coinciding prototypes: refused with ``strict``, else one warning
    naming them, and the fit goes on; returns the prototype pairs ``(i, j, cos)``.

    Published vocabularies repeat names (OpenAI's ImageNet list has 'missile' and 'sunglasses'
    twice; the LVIS ∪ Objects365 ∪ OpenImages union 539 pairs) and open_clip classifies with
    them. Coinciding classes tie under every head, and their support vectors coincide, so K_SS is
    singular; the vote solve ``(K_SS + M·λ·I)⁻¹ Y`` stays well-posed because λ > 0.
    """
    from .prompts import duplicate_names
    from .prototypes import short_name

    names = duplicate_names(classes)
    pairs = duplicate_prototypes(P)
    if strict and pairs:
        check_distinct(P, classes)
    if strict and names:
        validate_classes(classes, source="class list")
    if names or pairs:
        said = []
        if names:
            said.append(f"{len(names)} repeated class name(s) ({', '.join(map(repr, names[:5]))}"
                        f"{' …' if len(names) > 5 else ''})")
        if pairs:
            said.append(f"{len(pairs)} pair(s) of classes with identical or near-identical prototypes ("
                        + "; ".join(f"{short_name(classes[i])} [{i}] and {short_name(classes[j])} [{j}], cos {c:.6f}"
                                    for i, j, c in pairs[:5]) + (" …" if len(pairs) > 5 else "") + ")")
        log.warning("%s: fitting on; such classes tie (the ridge keeps the vote solve well-posed); "
                    "strict=True (svgen fit --strict) refuses them", " and ".join(said))
    return pairs


def looks_like_labels(classes) -> bool:
    """Whether ``classes`` passed to :meth:`SVGClassifier.fit` is rather a vector of per-image labels
    (scikit-learn's ``fit(X, y)`` reflex): repeated entries that are not all strings, or mostly repeats."""
    values = list(np.asarray(classes.cpu() if isinstance(classes, torch.Tensor) else classes, dtype=object).ravel())
    distinct = len(set(map(str, values)))
    return distinct < len(values) and (any(not isinstance(v, str) for v in values) or distinct <= len(values) // 2)


def label_indices(y, classes: Sequence[str]):
    """``y`` as class indices: class names are looked up in ``classes`` (a repeated name: its first
    row); integer indices pass through unchanged (checked where they are used)."""
    arr = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
    if arr.dtype.kind not in "USO":
        return y
    index = {}
    for i, name in enumerate(classes):
        index.setdefault(name, i)
    names = [str(v) for v in arr.ravel()]
    unknown = sorted({n for n in names if n not in index})
    if unknown:
        raise SvgenError(f"y holds {len(unknown)} name(s) that are not classes of the classifier: "
                         f"{', '.join(map(repr, unknown[:5]))}{' …' if len(unknown) > 5 else ''}")
    return np.asarray([index[n] for n in names], dtype=np.int64).reshape(arr.shape)


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # arrays and the like: shown
        return False


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
        self.support_vectors_ = S
        self.bandwidth_ = sigma
        self.vote_weights_ = A
        self.linear_weight_ = state.weight.detach().clone()
        self.linear_bias_ = state.bias.detach().clone()
        self.ridge_lambda_ = lam
        self.generator_ = state.generator.eval().requires_grad_(False)
        self.metric_precision_ = state.precision
        self.history_ = state.history
        self.fit_metrics_ = fit_metrics(state, S, P, K_ss, lam, cfg, wall, vote_weights=A)
        self.fit_metrics_["ridge_selection"] = path
        self.text_ = None
        self.fewshot_ = None
        self.transductive_ = None
        self.inductive_linear_ = None
        self.inductive_kernel_ = None
        self.transductive_labels_ = None
        self.kernel_prior_ = None
        self._scale_votes(lam)
        self._text_temperatures()
        self.fit_metrics_["wall_time_s"] = time.perf_counter() - t0
        return self

    # ------------------------------------------------------------------------------ few-shot
    @property
    def support_set_(self) -> SupportSet:
        """The support set behind the kernel head: rows, class of each row, source of each row."""
        self._check_fitted()
        if self.text_ is None:
            return SupportSet.from_text(self.support_vectors_)
        return SupportSet(self.support_vectors_, self.support_labels_, self.support_source_)

    def _text_state(self) -> dict:
        """The zero-shot head the images are added to (the current one before any :meth:`adapt`)."""
        if self.text_ is not None:
            return self.text_
        return {"support_vectors": self.support_vectors_, "bandwidth": float(self.bandwidth_),
                "vote_weights": self.vote_weights_, "linear_weight": self.linear_weight_,
                "linear_bias": self.linear_bias_}

    def _text_votes(self, text: dict, support: SupportSet):
        """``σ ↦`` the text rows' vote weights at σ: the stored ones at the text σ, else re-solved with
        the fit's own λ rule (``A_T = (K_TT + M_T·λ·I)⁻¹ Y_T``)."""
        cache = {}
        C = len(self.classes_)

        def votes(sigma: float) -> torch.Tensor:
            if sigma == text["bandwidth"]:
                return text["vote_weights"].double()
            if sigma not in cache:
                K_tt = kernel(support.rows.double(), support.rows.double(), sigma, self.fit_config_.kernel)
                Y = support.one_hot(C)
                lam, _ = choose_ridge(K_tt, Y, self.fit_config_.ridge, parzen_factor=self.fit_config_.parzen_factor)
                cache[sigma] = krr_vote_weights(K_tt, Y, lam)
                if self.vote_scale_.get("rule") == "M·λ":  # on the scale of the stored text votes
                    cache[sigma] = cache[sigma] * (K_tt.shape[0] * lam)
            return cache[sigma]

        return votes

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

    def adapt_pool(self, unlabelled, strength: Optional[float] = None, progress: Optional[bool] = None):
        """Transductive adaptation to unlabelled images (:mod:`svgen.transductive`), kept only on held-out evidence.

        The pool is pseudo-labelled by the current heads and the class model re-solved in closed form for a
        few rounds, with the inductive prediction kept as a prior (zero-shot: the kernel head, entropy-calibrated;
        with shots: the LDA head). Safety of the solve: a pool with fewer images than classes changes nothing;
        the prior strength starts at :func:`svgen.transductive.prior_strength` (``strength`` overrides it) and is
        raised while the rounds do not settle; if they never do, nothing changes.

        **What is kept** (:mod:`svgen.pool_gate`, decided before anything changes):

        * with labelled shots, half of them at a time join the pool unlabelled and the predictor is rebuilt
          without them; the stacked linear head ``a·(pool Gaussian log-likelihood) + b·(inductive LDA logits)``
          ((a, b) by held-out NLL, cross-fitted) must beat the inductive default head there (top-1 by more than
          1 SE, top-5 and NLL not worse by more than 1 SE). Kept, it is the default head at T = 1
          (:meth:`_adopt_stacked_pool`); the kernel head stays inductive;
        * without labels, a head adapted on one half of the pool must agree with the other half's own
          posterior more often than the inductive head (by more than 1 SE; top 5 not worse). Kept, the
          posterior ``β·t·(inductive linear logits) + Gaussian log-likelihood`` is the default linear head and
          the kernel vote is re-solved with pool rows of soft class (:meth:`_pool_kernel_head`), each at the
          inductive default head's mean entropy on the pool.

        Otherwise every head stays exactly the inductive one and ``transductive_["fallback"]`` says why
        (``transductive_["check"]`` holds the evidence). :attr:`transductive_labels_` holds the pool's
        probabilities (what ``svgen classify --transductive`` prints): the kept predictor's, or the inductive
        default head's. Adapting again starts from the inductive heads. Returns ``self``.
        """
        from . import pool_gate
        from . import transductive as td

        self._check_fitted()
        U = F.normalize(check_pool(unlabelled, self.n_features_in_), dim=-1)
        C, N = len(self.classes_), U.shape[0]
        self._restore_inductive()   # adapting again starts from the inductive heads
        self.transductive_ = None
        t0 = time.perf_counter()
        reason, check = td.fallback_reason(N, C), None
        if reason is None:
            shots = self.support_set_.part(IMAGE) if self.fewshot_ is not None else None
            bar = self.progress if progress is None else progress
            check = (pool_gate.check_with_shots(self, U, shots, strength, progress=bar) if shots is not None and len(shots)
                     else pool_gate.check_without_shots(self, U, strength, progress=bar))
            if not check["adopt"]:
                reason = check["reason"] + "; kept the inductive heads"
        if reason is not None:
            log.warning("transductive: %s", reason)
            self.transductive_ = {"pool": N, "fallback": reason, "prior_head": prior_head_of(self),
                                  **({"check": check} if check else {}), "wall_time_s": time.perf_counter() - t0}
            self._keep_inductive_labels(U)
            return self
        if check["evidence"] == "held-out shots as pool members":
            return self._adopt_stacked_pool(U, strength, progress, check, t0)
        head = self.default_head_
        with torch.no_grad():
            rows = td.calibration_rows(N)
            entropy_before = td._entropy(self._logits(U[rows], head).double() / self.temperatures_[head])
        self._transduce_pool(U, strength, progress, labels_entropy=entropy_before)
        if self._pool_fell_back(U):
            return self
        self._pool_temperatures(U[rows], entropy_before)
        self.transductive_.update({"check": check, "default_head": "linear", "wall_time_s": time.perf_counter() - t0})
        return self

    def _adopt_stacked_pool(self, U: torch.Tensor, strength, progress, check: dict, t0: float):
        """With shots, the pool changes the linear head only, into the stacked head the check chose:
        ``a·(x̂ W_Gᵀ + b_G) + b·(x̂ W0ᵀ + b0)`` (the pool's Gaussian log-likelihood and the inductive LDA head,
        (a, b) by held-out NLL, :func:`svgen.pool_gate.fit_stack`) at T = 1; it becomes the default head. The
        kernel head stays the inductive one."""
        from . import pool_gate

        W0, b0 = self.linear_weight_.clone(), self.linear_bias_.clone()
        self._transduce_pool(U, strength, progress)
        if self._pool_fell_back(U):
            return self
        WG, bG = pool_gate.pool_parts(self, W0, b0)
        a, b = check["stack"]["gaussian"], check["stack"]["inductive_linear"]
        if b is None:   # the transduction's own posterior weight β·t (a = 1: the posterior head itself)
            b = float(self.transductive_["prior_strength"]) * float(self.transductive_["linear_prior_temperature"])
        self.linear_weight_ = (a * WG + b * W0.double()).float()
        self.linear_bias_ = (a * bG + b * b0.double()).float()
        self.set_temperatures({"linear": 1.0}, method="held-out-nll",
                              rule="after a pool with shots: the stacked linear head's (a, b) by the NLL of held-out "
                                   "shots that were pool members (pool_gate.check_with_shots); its T is 1")
        with torch.no_grad():
            self.transductive_labels_ = self._scores(U, "linear").double().softmax(dim=1).float()
        self.transductive_.update({"check": check, "default_head": "linear", "wall_time_s": time.perf_counter() - t0,
                                   "heads": {"linear": f"stacked: {a:.4g}·(pool Gaussian log-likelihood) + "
                                                       f"{b:.4g}·(inductive LDA logits)",
                                             "kernel": "inductive (with shots a pool adapts the linear head only)"}})
        return self

    def _pool_temperatures(self, U_cal: torch.Tensor, entropy_before: float) -> None:
        """Without labels: the pool-adapted heads' temperatures are the scales at which each head's mean
        entropy on the pool is what the inductive default head's was (the ranking may move, the claimed
        certainty may not)."""
        from . import transductive as td

        temps = {}
        with torch.no_grad():
            for h in HEADS_FITTED_BY_POOL:
                z = self._logits(U_cal, h).double()
                if bool(torch.isfinite(z).all()):
                    temps[h] = 1.0 / td.match_entropy(z, entropy_before)
        if temps:
            self.set_temperatures(temps, method="entropy-matched",
                                  rule="after a pool without labels: T giving each adapted head the inductive "
                                       "default head's mean entropy on the pool")

    def _transduce_pool(self, U: torch.Tensor, strength: Optional[float] = None, progress: Optional[bool] = None,
                        labels_entropy: Optional[float] = None):
        """The transduction itself (no check): re-solves the linear head (and, zero-shot, the kernel vote) on
        the unit pool ``U``, from the inductive heads (the caller restores them). :meth:`adapt_pool` decides
        whether its result is kept. ``labels_entropy``: the pool probabilities' mean entropy (default: the
        linear head's at its text-rule temperature)."""
        from . import transductive as td

        C, N = len(self.classes_), U.shape[0]
        head = prior_head_of(self)
        reason = td.fallback_reason(N, C)
        if reason is not None:   # the caller says so (a half of the pool, in the check, is only recorded)
            log.info("transductive: %s", reason)
            self.transductive_ = {"pool": N, "fallback": reason, "prior_head": head}
            return self
        t0 = time.perf_counter()
        with torch.no_grad():
            prior = self._scores(U, head)
        timings = {"prior_scores": time.perf_counter() - t0}
        with torch.no_grad():
            cal = U[td.calibration_rows(N)]
            target = td._entropy(td.CLIP_LOGIT_SCALE * cal @ F.normalize(self.prototypes_.float(), dim=-1).T)
            lin = self._scores(U, "linear")
            shots = self.support_set_.part(IMAGE) if self.fewshot_ is not None else None
            # with a within-class scatter the LDA head's Σ is fitted on the shots and its logits are
            # log-likelihood ratios of that Gaussian model: both are used as they are; otherwise (zero-shot,
            # or one shot per class, Σ = I) the prior's scale is calibrated without labels
            fitted = shots is not None and bool((shots.counts(C) > 1).any())
            precision = None
            if fitted:
                Sigma = fewshot.lda_covariance(shots.rows.double(), shots.labels, C,
                                               float(self.fewshot_["linear"]["shrinkage"]))
                precision = torch.linalg.inv(Sigma).float()
                t_prior = t_lin = 1.0
                t_post, t_post_source = self._lda_loo_temperature()
            else:
                t_prior, t_lin = td.match_entropy(prior, target), td.match_entropy(lin, target)
                t_post, t_post_source = 1.0, "1 (no class model fitted on labels)"
            beta0 = td.prior_strength(N, C, len(shots) if fitted else 0) if strength is None else float(strength)
            timings["calibration"] = time.perf_counter() - t0 - timings["prior_scores"]
            t1 = time.perf_counter()
            res, tries = td.settle(U, t_prior * prior, fewshot.prior_means(self.prototypes_, U.double()).float(),
                                   beta0, shots_x=None if shots is None else shots.rows.float(),
                                   shots_y=None if shots is None else shots.labels, precision=precision,
                                   progress=self.progress if progress is None else progress, temperature=t_post)
        if res is None:
            reason = (f"the rounds did not settle at any prior strength up to {tries[-1]['prior_strength']:.3g}; "
                      "kept the inductive heads")
            log.info("transductive: %s", reason)
            self.transductive_ = {"pool": N, "fallback": reason, "prior_head": head, "tries": tries}
            return self
        timings["rounds"] = time.perf_counter() - t1
        beta = res.info["prior_strength"]
        # what the inductive heads' probabilities were, so adapting again (or a fall-back) restores them too
        inductive_calibration = {"temperatures": dict(self.temperatures_), "kernel_logits": self.kernel_logits_,
                                 "calibration": json.loads(json.dumps(self.calibration_))}
        self.inductive_linear_ = (self.linear_weight_, self.linear_bias_)
        self.linear_weight_ = res.weight + beta * t_lin * self.linear_weight_.float()
        self.linear_bias_ = res.bias + beta * t_lin * self.linear_bias_.float()
        t1 = time.perf_counter()
        with torch.no_grad():
            kinfo = (self._pool_kernel_head(U, res.labels) if shots is None else
                     {"replaced": False, "reason": "with shots a pool adapts the linear head only"})
        timings["kernel_head"] = time.perf_counter() - t1
        # the changed heads' temperatures follow the text rule (adapt_pool then replaces them); a kernel head kept
        # as it was keeps its own
        self._text_temperatures(only=None if kinfo.get("replaced") else "linear")
        # the pool's probabilities (what `classify --transductive` prints): the posterior's logits at the
        # temperature that gives them the mean entropy of the linear head — the head that carries the posterior
        # to new images, at its own T — on the pool; the solve's z_i are sharper (without a fitted class model a
        # 512-d Gaussian likelihood at its own scale; with one, at the LDA head's T but still plus the k-NN term).
        # A temperature: the argmax stays the posterior's.
        with torch.no_grad():
            rows = td.calibration_rows(N)
            target = (td._entropy(self._logits(U[rows], "linear").double() / self.temperatures_["linear"])
                      if labels_entropy is None else labels_entropy)
            t_labels = td.match_entropy(res.logits, target)
            self.transductive_labels_ = torch.softmax(t_labels * res.logits.float(), dim=1)
        self.transductive_ = {**res.info, "fallback": None, "prior_head": head, "tries": tries,
                              "prior_temperature": t_prior, "labels_temperature": 1.0 / t_labels,
                              "linear_prior_temperature": t_lin, "calibration": "entropy of softmax(100·cos)",
                              "posterior_temperature_source": t_post_source,
                              "heads": {"linear": "transductive posterior",
                                        "kernel": "transductive (pool rows, soft targets)" if kinfo["replaced"]
                                        else "inductive (kept: " + kinfo["reason"] + ")"},
                              "kernel_head": kinfo, "timings_s": timings, "wall_time_s": time.perf_counter() - t0,
                              "inductive_calibration": inductive_calibration}
        log.info("transductive: %d images, β=%.3g, %d rounds, %.1f%% of the pool relabelled from the prior, %.2fs",
                 N, beta, res.info["rounds"], 100 * res.info["changed_from_prior"], self.transductive_["wall_time_s"])
        return self

    def _lda_loo_temperature(self):
        """(T, why) for the transductive posterior with a class model fitted on shots: the inductive LDA
        head's temperature when the shots' leave-one-out NLL fitted it (``calibration_["loo"]["linear"]``),
        else 1 (the solve at the Gaussian's own scale, as before there was a fitted one)."""
        cal = self.calibration_ or {}
        loo = (cal.get("loo") or {}).get("linear") or {}
        if cal.get("method") == "loo-nll" and loo.get("fitted"):
            return float(self.temperatures_["linear"]), "the LDA head's leave-one-out NLL temperature on the shots"
        return 1.0, "1 (the LDA head's temperature was not fitted on the shots)"

    def _pool_kernel_head(self, U: torch.Tensor, Z: torch.Tensor) -> dict:
        """Zero-shot: re-solve the kernel vote with pool rows as support vectors of soft class (the posterior ``Z``).

        :func:`svgen.transductive.pool_support` picks the rows; :func:`svgen.fewshot.fit_kernel_head`
        solves ``[text; pool]`` towards the text head with targets ``Z_pool`` (σ, λ, the text weight α by
        exact LOO). The result replaces the inductive kernel head only if its argmax agrees with the
        posterior's on more held-out pool rows (not support rows) than the inductive head's does. Returns
        what was done (``svgen.json`` ``transductive.kernel_head``).
        """
        from . import transductive as td

        C, N = len(self.classes_), U.shape[0]
        t0 = time.perf_counter()
        text = self._text_state()
        if self.text_ is None and self.inductive_linear_ is not None:   # the zero-shot linear head, not the posterior
            text = {**text, "linear_weight": self.inductive_linear_[0].clone(),
                    "linear_bias": self.inductive_linear_[1].clone()}
        if text["vote_weights"].is_sparse:
            return {"replaced": False, "reason": "the text vote weights are sparse (local); the re-solve needs dense ones"}
        picks = td.pool_support(Z)
        held = td.held_out_rows(N, picks)
        info = {"pool_rows": int(picks.numel()), "held_out_rows": int(held.numel())}
        if held.numel() == 0:
            return {**info, "replaced": False, "reason": "no held-out pool rows to check a re-solved head on"}
        Zp = Z[picks].double()
        rows = SupportSet(U[picks], Zp.argmax(dim=1), torch.full((picks.numel(),), POOL, dtype=torch.uint8))
        data, targets = rows, Zp
        text_rows = SupportSet.from_text(text["support_vectors"])
        # many text rows: each σ of the grid would re-solve the text head (an M_T×M_T system); keep the current σ
        sigmas = None if len(text_rows) <= td.SIGMA_GRID_MAX_TEXT_ROWS else [float(self.bandwidth_)]
        support, sigma, A, choice = fewshot.fit_kernel_head(text_rows, self._text_votes(text, text_rows), data, C,
                                                            kind=self.fit_config_.kernel, sigmas=sigmas,
                                                            seed=self.fit_config_.seed, targets=targets,
                                                            one_se=td.POOL_ONE_SE,
                                                            loo_max=int(math.sqrt(td.POOL_LOO_BUDGET / C)))
        Uh, Zh = U[held], Z[held]
        new = kernel_scores(Uh, support.rows.float(), sigma, A, self.fit_config_.kernel)
        agree, agree0 = td.kernel_agreement(new, Zh), td.kernel_agreement(self._scores(Uh, "kernel"), Zh)
        info.update({"agreement": agree, "inductive_agreement": agree0, **choice.as_dict(),
                     "wall_time_s": time.perf_counter() - t0})
        if not agree > agree0:
            return {**info, "replaced": False,
                    "reason": f"held-out agreement with the posterior {agree:.4f} is not above the inductive {agree0:.4f}"}
        self.inductive_kernel_ = {"bandwidth": float(self.bandwidth_), "vote_weights": self.vote_weights_}
        self.text_ = text
        self.support_vectors_, self.support_labels_, self.support_source_ = (support.rows.float(), support.labels,
                                                                             support.source)
        self.bandwidth_, self.vote_weights_ = sigma, A
        return {**info, "replaced": True, "reason": None}

    def _restore_inductive(self) -> None:
        """Back to the inductive heads after a transductive adaptation (both, whichever it changed), with the
        temperatures, kernel logit kind and calibration record they had (``transductive.inductive_calibration``)."""
        snap = (getattr(self, "transductive_", None) or {}).get("inductive_calibration")
        if snap is not None:
            temps = snap.get("temperatures") if isinstance(snap, dict) else None
            if not (isinstance(temps, dict) and set(temps) == set(self.temperatures_)
                    and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in temps.values())
                    and isinstance(snap.get("calibration"), dict)):
                raise SvgenError("transductive.inductive_calibration is not a record of the inductive heads' "
                                 "temperatures; refit or adapt from the original artifact")
            self.temperatures_ = {h: float(v) for h, v in temps.items()}
            self.kernel_logits_ = calibration.check_kernel_logits(snap.get("kernel_logits", "log"),
                                                                  "transductive.inductive_calibration.kernel_logits")
            self.calibration_ = snap["calibration"]
        if getattr(self, "inductive_linear_", None) is not None:
            self.linear_weight_, self.linear_bias_ = self.inductive_linear_
        ik = getattr(self, "inductive_kernel_", None)
        if ik is not None:
            if self.fewshot_ is None:   # a zero-shot artifact: back to its version-1 state
                text, self.text_ = self.text_, None
                self.support_vectors_, self.bandwidth_, self.vote_weights_ = (text["support_vectors"], text["bandwidth"],
                                                                              text["vote_weights"])
            elif "support_vectors" in ik:  # the whole inductive head was kept
                self.support_vectors_, self.support_labels_ = ik["support_vectors"], ik["support_labels"]
                self.support_source_, self.kernel_prior_ = ik["support_source"], ik.get("kernel_prior")
                self.bandwidth_, self.vote_weights_ = ik["bandwidth"], ik["vote_weights"]
            else:                       # drop the pool rows (they come last) and their votes
                M0 = ik["vote_weights"].shape[0]
                self.support_vectors_ = self.support_vectors_[:M0]
                self.support_labels_, self.support_source_ = self.support_labels_[:M0], self.support_source_[:M0]
                self.bandwidth_, self.vote_weights_ = ik["bandwidth"], ik["vote_weights"]
        self.inductive_linear_ = self.inductive_kernel_ = None

    def _pool_fell_back(self, U: torch.Tensor) -> bool:
        """After the whole-pool solve: when it fell back (the rounds never settled), say so and keep the
        inductive default head's probabilities for the pool."""
        reason = self.transductive_.get("fallback")
        if reason:
            log.warning("transductive: %s", reason)
            self._keep_inductive_labels(U)
        return bool(reason)

    def _keep_inductive_labels(self, U: torch.Tensor) -> None:
        """A pool that changed nothing: its probabilities are the inductive default head's (what ``classify``
        without ``--transductive`` prints), not the transduction's prior head's."""
        head = self.default_head_
        with torch.no_grad():
            self.transductive_labels_ = self._fallback_labels(self._scores(U, head), head)

    def _fallback_labels(self, scores: torch.Tensor, head: str) -> torch.Tensor:
        """The pool's soft labels when the inductive heads are kept: that head's :meth:`predict_proba`
        (``softmax(logits / T)``; the kernel vote's logits are ``log score``), not a softmax of raw
        scores, which is almost uniform for the kernel vote (issue 13)."""
        return calibration.softmax(calibration.head_logits(scores, head, self.kernel_logits_), self.temperatures_[head])

    def _scores(self, U: torch.Tensor, head: str, block: int = 8192) -> torch.Tensor:
        """N×C float32 scores in row blocks (a kernel head's N×M kernel never whole)."""
        return torch.cat([self.decision_function(U[s:s + block], head).float() for s in range(0, U.shape[0], block)])

    def adapt_shots(self, X, y):
        """Add labelled images ("shots") as support vectors; no text is re-encoded.

        ``X`` is N×D raw image embeddings from the artifact's encoder, ``y`` N class indices
        (rows of ``classes_``). Shots added earlier are kept and joined by the new ones. The kernel
        head becomes zero-shot probabilities plus kernel ridge on their residual (:mod:`svgen.residual`:
        σ and c on balanced held-out folds, zero-shot kept where the correction is worse there), the
        linear head shared-covariance LDA with the prototypes as prior means (:mod:`svgen.fewshot`);
        the default head is the one with the higher held-out accuracy (:meth:`_choose_default_head`).
        Temperatures are fitted on held-out scores of the shots (``calibration_`` records them).
        Returns ``self``.
        """
        self._check_fitted()
        C = len(self.classes_)
        new = image_rows(X, y, C, self.n_features_in_)
        text = self._text_state()
        if text["vote_weights"].is_sparse:
            raise SvgenError(f"this artifact's {C} classes have sparse (local) vote weights; adding images needs "
                             "dense ones (fit with --vote-solver dense)")
        shots = new if self.fewshot_ is None else self.support_set_.part(IMAGE).join(new)
        self._restore_inductive()   # the heads are re-solved from the text state and the shots below
        self.transductive_ = None
        t0 = time.perf_counter()
        res = residual.fit_residual_head(shots.rows.numpy(), shots.labels.numpy(), self.prototypes_.numpy(), C,
                                         seed=self.fit_config_.seed)
        W, b, lchoice = fewshot.fit_lda_head(self.prototypes_, shots, C)
        wall = time.perf_counter() - t0
        self.text_ = text
        self._set_kernel_head(res, text, shots)
        self.linear_weight_, self.linear_bias_ = W, b
        default, head_choice = self._choose_default_head(res, shots, lchoice)
        counts = shots.counts(C)
        self.fewshot_ = {
            "shots": int(counts.sum()), "classes_with_shots": int((counts > 0).sum()),
            "shots_per_class": {"min": int(counts.min()), "max": int(counts.max()), "mean": float(counts.mean())},
            "shots_by_class": {name: int(n) for name, n in zip(self.classes_, counts) if n},
            "kernel": {"head": "zero-shot probabilities + kernel ridge on their residual" if res.adopted
                       else "zero-shot (the shots' correction was refused)", **res.record},
            "linear": lchoice.as_dict(), "default_head": default, "head_choice": head_choice,
            "text_bandwidth": float(text["bandwidth"]), "wall_time_s": wall,
        }
        log.info("adapted to %d shots in %.2fs: kernel %s (σ=%.3g, c=%.3g), linear LDA γ=%g κ=%g (LOO error %.3f)",
                 len(shots), wall, "adapted" if res.adopted else "kept zero-shot", res.sigma, res.record["ridge_c"],
                 lchoice.settings["shrinkage"], lchoice.settings["prior_shots"], lchoice.loo_error)
        self._shot_temperatures(shots, res, lchoice)
        return self

    def _choose_default_head(self, res, shots: SupportSet, lchoice) -> tuple:
        """("kernel" | "linear", record): the head ``classify``, ``eval``, ``export`` and :meth:`predict` use.

        Both heads are compared on the same held-out shots (the balanced folds of :mod:`svgen.residual`,
        each head refitted without the fold at its chosen settings, as it will be deployed) and the higher
        held-out accuracy wins; a tie keeps the kernel head (which is the zero-shot head when the correction
        was refused). Where the kernel head's settings were chosen on a subset of whole classes
        (:data:`svgen.residual.SELECT_MAX`), the LDA head is refitted on the same subset's shots, so both
        are scored on the same problem (the other classes without shots in both). With one shot per class
        there are no folds: the kernel head."""
        if res.folds is None:
            return "kernel", {"rule": "one shot per class: no held-out shots to compare the heads on; kernel"}
        X, y = shots.rows.double(), shots.labels
        m = fewshot.prior_means(self.prototypes_, X)
        rows = np.concatenate(res.folds)
        pool = np.arange(len(y)) if res.loo_rows is None else np.asarray(res.loo_rows)
        lin_ok, ker_ok = [], []
        kernel_held = dict(zip(res.held_rows.tolist(), res.held_scores.argmax(axis=1).tolist()))
        eq = lchoice.settings.get("means") == "equal Mahalanobis radius"
        for held in res.folds:
            keep = torch.from_numpy(np.setdiff1d(pool, held))
            W, b = fewshot.lda_head_weights(X[keep], y[keep], m, lchoice.settings["shrinkage"],
                                            lchoice.settings["prior_shots"], equal_radius=eq)
            lin_ok.append(((X[held] @ W.T + b).argmax(dim=1) == y[held]).numpy())
        lin_ok = np.concatenate(lin_ok).astype(float)
        truth = y.numpy()[rows]
        if res.adopted:
            ker_ok = np.array([kernel_held[r] for r in rows.tolist()]) == truth
        else:   # the kernel head is the zero-shot one: its predictions need no refit
            ker_ok = np.asarray(self.decision_function(shots.rows[rows], "kernel")).argmax(axis=1) == truth
        d = lin_ok - ker_ok.astype(float)
        se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
        head = "linear" if d.mean() > 0 else "kernel"
        return head, {"kernel_held_out_accuracy": float(ker_ok.mean()), "linear_held_out_accuracy": float(lin_ok.mean()),
                      "linear_minus_kernel": float(d.mean()), "standard_error": se, "shots_compared": int(len(d)),
                      "classes_compared": "all" if res.loo_rows is None else int(np.unique(y.numpy()[pool]).size),
                      "rule": "the higher accuracy on the held-out shots (balanced folds, both heads refitted without "
                              "each fold on the same classes' shots); a tie keeps the kernel head"}

    def _set_kernel_head(self, res, text: dict, shots: SupportSet) -> None:
        """The kernel head from a :class:`svgen.residual.ResidualFit`: its rows and votes with the zero-shot
        prior term when it was adopted, else the zero-shot kernel vote over the text rows exactly (the shots
        follow as rows with zero votes, so adapting again or adding classes still has them)."""
        if res.adopted:
            self.support_vectors_ = torch.from_numpy(res.rows).float()
            self.support_labels_ = torch.from_numpy(res.labels).to(torch.int64)
            self.support_source_ = torch.full((res.rows.shape[0],), IMAGE, dtype=torch.uint8)
            self.bandwidth_ = float(res.sigma)
            self.vote_weights_ = torch.from_numpy(res.votes).float()
            self.kernel_prior_ = float(res.logit_scale)
            return
        rows = SupportSet.from_text(text["support_vectors"]).join(shots)   # the shots kept as rows with zero votes
        self.support_vectors_, self.support_labels_, self.support_source_ = rows.rows.float(), rows.labels, rows.source
        self.bandwidth_ = float(text["bandwidth"])
        self.vote_weights_ = torch.cat([text["vote_weights"].float(), torch.zeros(len(shots), len(self.classes_))])
        self.kernel_prior_ = None

    def _shot_temperatures(self, shots: SupportSet, res, lchoice) -> None:
        """The kernel and linear heads' temperatures fitted by leave-one-out NLL on the shots
        (:func:`svgen.calibration.loo_temperatures`); the cosine head keeps CLIP's scale (T = 1).
        An adapted kernel head's kind of logits and T come from its balanced folds' held-out scores (the
        predictor as deployed, refitted without each fold at the chosen settings: the evidence its settings
        were chosen on), through :func:`svgen.calibration.choose_kernel_logits`. Exact LOO scores
        (:func:`svgen.residual.loo_scores`) leave the held-out image's class one shot short of every other
        class; at 2 shots a class with one shot against classes with two, a softer T than the deployed head
        needs (dev data, 2 shots: query NLL 0.01–0.07 lower with the folds' T). With one shot per class there are no folds: the LOO scores, which describe images of a
        class without shots. A refused correction keeps the zero-shot kernel head with the text rule.
        The text rule's temperatures are recorded next to them for comparison."""
        C = len(self.classes_)
        self._text_temperatures()
        text_temps = dict(self.temperatures_)
        y = shots.labels.numpy()
        sub = residual.class_subset(y, fewshot.LDA_LOO_MAX, self.fit_config_.seed)   # T from whole classes' shots
        lin = calibration.lda_loo_logits(self.prototypes_, shots, C, lchoice.settings["shrinkage"],
                                         lchoice.settings["prior_shots"],
                                         equal_radius=lchoice.settings.get("means") == "equal Mahalanobis radius",
                                         rows=sub)
        fit = calibration.loo_temperatures({"linear": lin}, y if sub is None else y[sub], fallback=text_temps)
        temps, loo, kind, choice, evidence = dict(fit["temperatures"]), dict(fit["loo"]), None, None, {}
        if res.adopted and (res.held_scores is not None or res.loo_scores is not None):
            # the kind and T by the guarded NLL (both kinds) on the balanced folds' held-out scores (the deployed
            # predictor, each class one shot short at once); with one shot per class, on the exact LOO scores
            if res.held_scores is not None:
                zk, yk = res.held_scores, y[res.held_rows]
            else:
                zk, yk = res.loo_scores, (y if res.loo_rows is None else y[res.loo_rows])
            kfit = calibration.choose_kernel_logits(torch.from_numpy(zk), yk, fallback=text_temps["kernel"],
                                                    signed_votes=True)
            kind, temps["kernel"], loo["kernel"] = kfit["kind"], kfit["temperature"], kfit["loo"]
            choice = {k: v for k, v in kfit.items() if k not in ("temperature", "loo")}
            evidence = {"kernel_evidence": "balanced folds" if res.held_scores is not None else "leave-one-out"}
        self.set_temperatures(temps, method="loo-nll", kernel_logits=kind, shots=len(shots), loo=loo,
                              text_temperatures=text_temps,
                              **({"kernel_logits_choice": choice} if choice is not None else {}), **evidence,
                              rule="linear: T minimising the leave-one-out NLL of the shots; an adapted kernel head: "
                                   "T minimising the NLL of its balanced folds' held-out scores (one shot per class: "
                                   "leave-one-out), for log scores and raw scores, the lower NLL kept, log charged "
                                   "for unseen scores ≤ 0; cosine: CLIP's logit scale 100")

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
        """Per-head temperatures from the text side (:func:`svgen.calibration.text_temperatures`).
        ``only``: re-set that head's alone when the others were fitted on shots (``loo-nll``) and are unchanged.
        The text rule matches log scores, so a kernel head it sets has ``kernel_logits_ = "log"``."""
        restrict = only is not None and getattr(self, "calibration_", {}).get("method") == "loo-nll"
        info = calibration.text_temperatures(lambda q, head: self.decision_function(q, head), self.per_template_,
                                             **({"heads": (only,)} if restrict else {}))
        temps = info.pop("temperatures")
        kernel = {"kernel_logits_choice": {"reason": calibration.TEXT_RULE_KERNEL_LOGITS}}
        if restrict:   # only that head's queries are scored: the others' temperatures are kept
            self.temperatures_ = {**self.temperatures_, only: temps[only]}
            self.calibration_ = {**self.calibration_, "text_rule_heads": [only], **(kernel if only == "kernel" else {})}
            if only == "kernel":
                self.kernel_logits_ = "log"
            return
        self.temperatures_ = temps
        self.calibration_ = {**info, **kernel}
        self.kernel_logits_ = "log"

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
        if kernel_logits is not None:
            calibration.check_kernel_logits(kernel_logits)
            if kernel_logits != self.kernel_logits_ and "kernel" not in temperatures:
                raise SvgenError(f"changing the kernel head's logits to {kernel_logits!r} needs its temperature "
                                 "for them too (temperatures={'kernel': T})")
        for head, t in temperatures.items():
            if head not in HEADS:
                raise SvgenError(f"unknown head {head!r}; expected one of {', '.join(HEADS)}")
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise SvgenError(f"temperature of the {head} head must be a positive number, got {t!r}")
        self.temperatures_ = {**self.temperatures_, **{h: float(t) for h, t in temperatures.items()}}
        self.calibration_ = {**self.calibration_, "method": method, **details}
        if kernel_logits is not None:
            self.kernel_logits_ = kernel_logits
        return self

    def predict_proba(self, X, head: Optional[str] = None):
        """N×C probabilities of one head: ``softmax(z / T_head)`` with z the head's logits (the kernel
        vote's are ``log score`` or, where ``kernel_logits_ == "score"``, the raw vote; see
        :mod:`svgen.calibration`). Rows sum to one (float64; a torch
        tensor for a torch input, else numpy, as :meth:`decision_function`). ``head=None``: :attr:`default_head_`."""
        head = head or self.default_head_
        p = calibration.softmax(self._logits(X, head), self.temperatures_[head])
        return p if isinstance(X, torch.Tensor) else p.numpy()

    def logits(self, X, head: Optional[str] = None):
        """N×C logits of one head, the input of :meth:`predict_proba`'s softmax (kernel: ``log score``, or
        the score itself where ``kernel_logits_ == "score"``);
        a torch tensor for a torch input, else numpy, as :meth:`decision_function`."""
        z = self._logits(X, head)
        return z if isinstance(X, torch.Tensor) else z.numpy()

    def _logits(self, X, head: Optional[str]) -> torch.Tensor:
        head = head or self.default_head_
        return calibration.head_logits(torch.as_tensor(self.decision_function(X, head)), head, self.kernel_logits_)

    # ------------------------------------------------------------------------------ inference
    def _check_fitted(self):
        if not hasattr(self, "support_vectors_"):
            raise SvgenError("this SVGClassifier is not fitted yet; call fit() or load() first")

    @property
    def transductive_labels_(self) -> Optional[np.ndarray]:
        """The pool's class probabilities (N×C numpy array) after ``adapt(unlabelled=…)``, else None."""
        t = getattr(self, "_transductive_labels", None)
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
        x = self._features(X)
        with torch.no_grad():
            if head == "kernel":
                scores = kernel_scores(x, self.support_vectors_, self.bandwidth_, self.vote_weights_,
                                       self.fit_config_.kernel)
                if self.kernel_prior_ is not None:
                    scores = scores + prior_probs(x, self.prototypes_, self.kernel_prior_)
            elif head == "linear":
                scores = linear_logits(x, self.linear_weight_, self.linear_bias_)
            elif head == "cosine":
                scores = cosine_logits(x, self.prototypes_)
            else:
                raise SvgenError(f"unknown head {head!r}; expected one of {', '.join(HEADS)}")
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
        t = {
            "support_vectors": self.support_vectors_,
            "bandwidth": torch.tensor(float(self.bandwidth_)),
            "vote_weights": self.vote_weights_,
            "linear_head.weight": self.linear_weight_,
            "linear_head.bias": self.linear_bias_,
            "prototypes": self.prototypes_,
            "per_template": self.per_template_,
        }
        t.update({f"temperature.{h}": torch.tensor(float(v)) for h, v in self.temperatures_.items()})
        if self.metric_precision_ is not None:
            t["metric.precision"] = self.metric_precision_
        if getattr(self, "inductive_linear_", None) is not None:
            t["inductive.linear_head.weight"], t["inductive.linear_head.bias"] = self.inductive_linear_
        if getattr(self, "inductive_kernel_", None) is not None:
            t["inductive.vote_weights"] = self.inductive_kernel_["vote_weights"]
            t["inductive.bandwidth"] = torch.tensor(float(self.inductive_kernel_["bandwidth"]))
        if self.generator_ is not None:
            t.update({f"generator.{k}": v for k, v in self.generator_.state_dict().items()})
        if self.kernel_prior_ is not None:
            t["kernel_prior.logit_scale"] = torch.tensor(float(self.kernel_prior_))
        if getattr(self, "inductive_kernel_", None) is not None and "support_vectors" in self.inductive_kernel_:
            ik = self.inductive_kernel_
            t.update({"inductive.support_vectors": ik["support_vectors"], "inductive.support_labels": ik["support_labels"],
                      "inductive.support_source": ik["support_source"]})
            if ik.get("kernel_prior") is not None:
                t["inductive.kernel_prior.logit_scale"] = torch.tensor(float(ik["kernel_prior"]))
        if self.text_ is not None:
            t.update({"support_labels": self.support_labels_.to(torch.int64),
                      "support_source": self.support_source_.to(torch.uint8),
                      "text.support_vectors": self.text_["support_vectors"],
                      "text.bandwidth": torch.tensor(float(self.text_["bandwidth"])),
                      "text.vote_weights": self.text_["vote_weights"],
                      "text.linear_head.weight": self.text_["linear_weight"],
                      "text.linear_head.bias": self.text_["linear_bias"]})
        return t

    def metadata(self) -> dict:
        self._check_fitted()
        extra = {}
        if self.text_ is not None:
            extra = {"format_version": artifacts.FORMAT_VERSION_PRIOR if self._has_prior_term()
                     else artifacts.FORMAT_VERSION_SHOTS,
                     "support_source": {str(i): name for i, name in enumerate(SOURCES)},
                     "fewshot": self.fewshot_}
        if getattr(self, "transductive_", None):
            extra["transductive"] = self.transductive_
        if self.kernel_prior_ is not None:
            extra["kernel_prior"] = {"kind": "cosine-softmax", "logit_scale": float(self.kernel_prior_),
                                     "scores": "softmax(logit_scale · x̂ P̂ᵀ) + exp(-||x̂ - s||²/(2σ²)) @ vote_weights"}
        return {
            **extra,
            "classes": self.classes_,
            "n_support": self.fit_config_.n_support,
            "kernel": self.fit_config_.kernel,
            "dim": self.n_features_in_,
            "encoder": self.encoder_,
            "templates": self.templates_,
            "fit": config_dict(self.fit_config_),
            "metrics": self.fit_metrics_,
            "vote_weights_scale": self.vote_scale_,
            "calibration": {**self.calibration_, "temperatures": self.temperatures_,
                            "kernel_logits": self.kernel_logits_,
                            "probabilities": "softmax(logits / temperature); logits: kernel "
                                             + ("log(max(score, 1e-30))" if self.kernel_logits_ == "log" else "score")
                                             + ", linear and cosine their scores"},
        }

    def _has_prior_term(self) -> bool:
        ik = getattr(self, "inductive_kernel_", None) or {}
        return self.kernel_prior_ is not None or ik.get("kernel_prior") is not None

    @property
    def default_head_(self) -> str:
        """The head ``classify``, ``eval``, ``export`` and :meth:`predict` use when none is named: what the fit
        with shots decided (:meth:`_choose_default_head`) or a pool adapted with shots (the stacked linear head,
        :meth:`_adopt_stacked_pool`), else the kernel head."""
        pool = getattr(self, "transductive_", None) or {}
        head = pool.get("default_head") or (getattr(self, "fewshot_", None) or {}).get("default_head", "kernel")
        return head if head in HEADS else "kernel"

    def save(self, path, force: bool = False):
        """Write the artifact directory atomically (refuses to overwrite unless ``force``)."""
        artifacts.save_artifact(path, self.tensors(), self.metadata(), force=force)
        return path

    @classmethod
    def load(cls, path) -> "SVGClassifier":
        """Read an artifact written by :meth:`save` (or ``svgen fit``)."""
        meta, t = artifacts.load_artifact(path)
        fit = dict(meta.get("fit") or {})
        cfg = FitConfig(**{k: v for k, v in fit.items() if k in FitConfig.__dataclass_fields__})
        if fit and "linear_head" not in fit:
            cfg.linear_head = "lda"  # artifacts written before the whitened-cosine head carry an LDA head
        v2 = meta.get("format_version") in (artifacts.FORMAT_VERSION_SHOTS, artifacts.FORMAT_VERSION_PRIOR)
        text_sv = t["text.support_vectors"] if v2 else t["support_vectors"]
        cfg.n_support = int(text_sv.shape[1])
        cfg.kernel = meta.get("kernel", cfg.kernel)
        self = cls(**{k: getattr(cfg, k) for k in ("n_support", "kernel", "steps", "lr", "margin", "alignment_weight",
                                                   "margin_weight", "grounding_weight", "query_weight", "radius", "head_lr",
                                                   "batch_classes", "learn_sigma", "ridge", "metric", "metric_condition", "linear_head",
                                                   "rff_dim", "solver", "vote_solver", "vote_neighbours", "seed")})
        C, K, D = text_sv.shape
        self.fit_config_ = cfg
        self.classes_ = list(meta["classes"])
        self.templates_ = meta.get("templates")
        self.encoder_ = meta.get("encoder")
        self.prototypes_ = t["prototypes"]
        self.per_template_ = t.get("per_template", t["prototypes"][:, None, :])
        self.support_vectors_ = t["support_vectors"]
        self.bandwidth_ = float(t["bandwidth"])
        self.vote_weights_ = t["vote_weights"]
        self.linear_weight_ = t["linear_head.weight"]
        self.linear_bias_ = t["linear_head.bias"]
        self.ridge_lambda_ = (meta.get("metrics") or {}).get("ridge_lambda")
        self.fit_metrics_ = meta.get("metrics") or {}
        self.metric_precision_ = t.get("metric.precision")
        self.text_, self.fewshot_ = None, None
        self.kernel_prior_ = artifacts.kernel_prior(meta, t, "kernel_prior.logit_scale", path)
        self.transductive_ = meta.get("transductive")
        self.inductive_linear_ = self.inductive_kernel_ = None
        self.transductive_labels_ = None   # the pool's soft labels are not stored; adapt again to get them
        if "inductive.linear_head.weight" in t and "inductive.linear_head.bias" in t:
            W0, b0 = t["inductive.linear_head.weight"], t["inductive.linear_head.bias"]
            if W0.shape != self.linear_weight_.shape or b0.shape != self.linear_bias_.shape:
                raise SvgenError(f"{path}: inductive.linear_head has shape {tuple(W0.shape)}, expected "
                                 f"{tuple(self.linear_weight_.shape)}")
            self.inductive_linear_ = (W0, b0)
        if v2:
            self.support_labels_ = t["support_labels"].to(torch.int64)
            self.support_source_ = t["support_source"].to(torch.uint8)
            self.text_ = {"support_vectors": text_sv, "bandwidth": float(t["text.bandwidth"]),
                          "vote_weights": t["text.vote_weights"], "linear_weight": t["text.linear_head.weight"],
                          "linear_bias": t["text.linear_head.bias"]}
            # null: a zero-shot artifact whose kernel head has pool rows (no shots); absent: older files
            self.fewshot_ = None if "fewshot" in meta and meta["fewshot"] is None else (meta.get("fewshot") or {})
            if "inductive.vote_weights" in t and "inductive.bandwidth" in t:
                A0 = t["inductive.vote_weights"]
                if A0.dim() != 2 or A0.shape[0] > self.support_vectors_.shape[0] or A0.shape[1] != C:
                    raise SvgenError(f"{path}: inductive.vote_weights has shape {tuple(A0.shape)}, expected "
                                     f"(M0 ≤ {self.support_vectors_.shape[0]}, {C})")
                self.inductive_kernel_ = {"bandwidth": float(t["inductive.bandwidth"]), "vote_weights": A0}
                if "inductive.support_vectors" in t:
                    self.inductive_kernel_.update({
                        "support_vectors": t["inductive.support_vectors"],
                        "support_labels": t["inductive.support_labels"].to(torch.int64),
                        "support_source": t["inductive.support_source"].to(torch.uint8),
                        "kernel_prior": artifacts.kernel_prior(meta, t, "inductive.kernel_prior.logit_scale", path)})
        gen_state = {k[len("generator."):]: v for k, v in t.items() if k.startswith("generator.")}
        self.generator_ = None
        if gen_state:
            gen = SupportVectorGenerator(D, K, radius=cfg.radius)
            try:
                gen.load_state_dict(gen_state)
            except RuntimeError:
                raise SvgenError(f"{path}: generator tensors do not match K={K}, D={D}") from None
            self.generator_ = gen.eval().requires_grad_(False)
        self._load_votes_and_temperatures(meta, t)
        return self

    def _load_votes_and_temperatures(self, meta: dict, t: dict) -> None:
        """Vote scaling and temperatures as recorded; artifacts from before either existed get them now
        (votes times M·λ, text-side temperatures), so every loaded classifier reads the same."""
        scale = meta.get("vote_weights_scale")
        if isinstance(scale, dict) and "factor" in scale:
            self.vote_scale_ = dict(scale)  # already stored scaled: never again
        elif self.text_ is not None:  # format 2 from before the scaling: its text and image votes stay as they are
            self.vote_scale_ = {"factor": 1.0, "rule": "none (format 2 written before the M·λ scaling)"}
        else:
            self._scale_votes(self.ridge_lambda_)
            self.vote_scale_["applied_on_load"] = True
        temps = {h: float(t[f"temperature.{h}"]) for h in HEADS if f"temperature.{h}" in t}
        if len(temps) == len(HEADS):
            cal = meta.get("calibration") or {}
            # svgen.json holds each T exactly (float64); the tensor is its float32 copy. The exact one is used
            # where it agrees with the tensor, so a loaded classifier predicts what the saved one did
            exact = cal.get("temperatures") if isinstance(cal.get("temperatures"), dict) else {}
            for h, v in exact.items():
                if (h in temps and isinstance(v, float) and math.isfinite(v) and v > 0
                        and float(torch.tensor(v, dtype=torch.float32)) == temps[h]):
                    temps[h] = v
            self.temperatures_ = temps
            self.kernel_logits_ = cal.get("kernel_logits", "log")   # absent: written before the choice existed
            self.calibration_ = {k: v for k, v in cal.items() if k not in ("temperatures", "probabilities",
                                                                          "kernel_logits")}
        else:
            self._text_temperatures()

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
        if self.text_ is not None:  # back to the zero-shot state; the shots are solved in again below
            shots = self.support_set_.part(IMAGE)
            text = self.text_
            self.support_vectors_, self.bandwidth_, self.vote_weights_ = (text["support_vectors"], text["bandwidth"],
                                                                          text["vote_weights"])
            self.linear_weight_, self.linear_bias_ = text["linear_weight"], text["linear_bias"]
            self.text_ = self.fewshot_ = None
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
        self.support_vectors_ = torch.cat([self.support_vectors_, S_new])
        self.linear_weight_ = torch.cat([self.linear_weight_, W_new])
        self.linear_bias_ = torch.cat([self.linear_bias_, b_new])
        lam = self.ridge_lambda_ if self.ridge_lambda_ is not None else 1e-3
        cfg = FitConfig(**{**config_dict(self.fit_config_), "ridge": float(lam)})
        self.vote_weights_, _, _, _ = solve_vote_weights(self.support_vectors_, self.bandwidth_, cfg, len(self.classes_))
        self._scale_votes(lam)
        if shots is not None:
            self.adapt(shots.rows, shots.labels)  # its temperatures follow the adapted heads
        elif self.calibration_.get("method") == "text":
            self._text_temperatures()
        else:
            log.warning("temperatures were fit by %s for the old classes; they are kept for the new ones",
                        self.calibration_.get("method"))
        return self

"""The artifact codec: a classifier's state (:mod:`svgen.state`) to an artifact's tensors and ``svgen.json``,
and back (:mod:`svgen.io.artifacts` writes and checks the files).

Tensors (float32 unless named; ``C`` classes, ``K`` support vectors per class, ``M`` kernel rows):

* the deployed heads: ``support_vectors`` (C×K×D text rows, or M×D with ``support_labels``/``support_source``),
  ``bandwidth``, ``vote_weights``, ``linear_head.{weight,bias}``, ``temperature.<head>``,
  ``kernel_prior.logit_scale`` (format 3);
* the zero-shot heads where the kernel has image or pool rows (formats 2–3): ``text.*``;
* the LDA part of the shots' linear head (:class:`~svgen.state.LdaPart`): ``lda.{weight,bias}``, its shrinkage and
  temperature in ``svgen.json`` ``lda``;
* the inductive heads a pool replaced: ``inductive.linear_head.*``; ``inductive.{vote_weights,bandwidth}`` where
  the kernel vote was replaced (its rows are the zero-shot text rows, or the first rows of the deployed
  kernel's), and ``inductive.support_*`` where they are neither;
* the fit: ``prototypes``, ``per_template``, ``metric.precision``, ``generator.*``.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from svgen.io import artifacts, recorded
from svgen.heads.calibration import check_weight
from svgen.core import logits as logit_kinds
from svgen.errors import SvgenError
from svgen.core.generator import SupportVectorGenerator
from svgen.adapt import shotless as coverage
from svgen.adapt import lda
from svgen import records
from svgen.adapt.config import AdaptConfig
from svgen.heads import predictor
from svgen.heads.scoring import HEADS, MIXTURE
from svgen.state import Calibration, Heads, KernelHead, LdaPart, LinearForm, LinearHead, PoolFactor
from svgen.core.support import IMAGE, SOURCES
from svgen.config import FitConfig, config_dict
from svgen.zeroshot.fit import scale_votes

def has_image_rows(heads: Heads) -> bool:
    """Whether the kernel head's rows are listed one by one (shots or pool rows: formats 2–3)."""
    return heads.kernel.labels is not None


def _is_prefix(inductive: KernelHead, deployed: KernelHead) -> bool:
    """Whether the inductive kernel's rows are the deployed kernel's first rows (the compact ``inductive.*`` form)."""
    rows, cur = inductive.flat_rows(), deployed.flat_rows()
    if rows.shape[0] > cur.shape[0] or inductive.prior_scale != deployed.prior_scale:
        return False
    if not torch.equal(rows, cur[: rows.shape[0]]):
        return False
    if inductive.labels is None:
        return True
    return (deployed.labels is not None and torch.equal(inductive.labels, deployed.labels[: rows.shape[0]])
            and torch.equal(inductive.source, deployed.source[: rows.shape[0]]))


def tensors(clf) -> dict:
    h, ind = clf.heads_, clf.inductive_
    t = {"support_vectors": h.kernel.rows, "bandwidth": torch.tensor(float(h.kernel.bandwidth)),
         "vote_weights": h.kernel.votes, "linear_head.weight": h.linear.weight, "linear_head.bias": h.linear.bias,
         "prototypes": clf.prototypes_, "per_template": clf.per_template_}
    t.update({f"temperature.{k}": torch.tensor(float(v)) for k, v in h.calibration.temperatures.items()})
    if clf.metric_precision_ is not None:
        t["metric.precision"] = clf.metric_precision_
    if h.pool_factor is not None:
        t["pool_factor.weight"], t["pool_factor.bias"] = h.pool_factor.weight, h.pool_factor.bias
    if ind is not None and ind.linear is not h.linear:
        t["inductive.linear_head.weight"], t["inductive.linear_head.bias"] = ind.linear.weight, ind.linear.bias
    if ind is not None and ind.kernel is not h.kernel:
        t["inductive.vote_weights"] = ind.kernel.votes
        t["inductive.bandwidth"] = torch.tensor(float(ind.kernel.bandwidth))
    if clf.lda_ is not None:
        t["lda.weight"], t["lda.bias"] = clf.lda_.weight, clf.lda_.bias
    if clf.generator_ is not None:
        t.update({f"generator.{k}": v for k, v in clf.generator_.state_dict().items()})
    if h.kernel.prior_scale is not None:
        t["kernel_prior.logit_scale"] = torch.tensor(float(h.kernel.prior_scale))
    if (ind is not None and ind.kernel is not h.kernel and ind.kernel is not clf.zero_shot_.kernel
            and not _is_prefix(ind.kernel, h.kernel)):
        ik = ind.kernel
        t.update({"inductive.support_vectors": ik.rows, "inductive.support_labels": ik.labels,
                  "inductive.support_source": ik.source})
        if ik.prior_scale is not None:
            t["inductive.kernel_prior.logit_scale"] = torch.tensor(float(ik.prior_scale))
    if has_image_rows(h):
        z = clf.zero_shot_
        t.update({"support_labels": h.kernel.labels.to(torch.int64), "support_source": h.kernel.source.to(torch.uint8),
                  "text.support_vectors": z.kernel.rows, "text.bandwidth": torch.tensor(float(z.kernel.bandwidth)),
                  "text.vote_weights": z.kernel.votes, "text.linear_head.weight": z.linear.weight,
                  "text.linear_head.bias": z.linear.bias})
    return t


def has_mixture(clf) -> bool:
    """Whether the deployed heads or the inductive heads a pool replaced have a mixture head (format 4)."""
    cals = [clf.heads_.calibration, *([clf.inductive_.calibration] if clf.inductive_ is not None else [])]
    return any(c is not None and c.mixture_weight is not None for c in cals)


def has_shotless_offset(clf) -> bool:
    """Whether the deployed mixture tilts the classes without shots (format 5)."""
    cal = clf.heads_.calibration
    return cal is not None and cal.shotless_offset is not None


def has_prior_term(clf) -> bool:
    ind = clf.inductive_
    return clf.heads_.kernel.prior_scale is not None or (ind is not None and ind.kernel.prior_scale is not None)


def metadata(clf) -> dict:
    h = clf.heads_
    extra = {}
    if has_image_rows(h):
        extra = {"format_version": artifacts.FORMAT_VERSION_POOL_FACTOR if h.pool_factor is not None
                 else artifacts.FORMAT_VERSION_SHOTLESS if has_shotless_offset(clf)
                 else artifacts.FORMAT_VERSION_MIXTURE if has_mixture(clf)
                 else artifacts.FORMAT_VERSION_PRIOR if has_prior_term(clf) else artifacts.FORMAT_VERSION_SHOTS,
                 "support_source": {str(i): name for i, name in enumerate(SOURCES)},
                 "fewshot": clf.fewshot_ and records.fewshot(clf.fewshot_, clf.shots_outcome_)}
        if clf.shot_origins_ is not None:   # where each image row came from (svgen explain names them)
            extra["support_origin"] = {"image": clf.shot_origins_}
    if clf.lda_ is not None:
        extra["lda"] = records.lda(clf.lda_)
    if clf.transductive_:
        extra["transductive"] = records.transductive(clf.transductive_, clf.pool_outcome_)
    if clf.adapt_config_.changed():   # the settings it was fitted with, restored on load (absent: the defaults)
        extra["adapt_config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in clf.adapt_config_.changed().items()}
    if h.kernel.prior_scale is not None:
        extra["kernel_prior"] = records.kernel_prior(h.kernel.prior_scale)
    return {
        **extra,
        "classes": [str(c) for c in clf.class_names_],
        "n_support": clf.fit_config_.n_support,
        "kernel": clf.fit_config_.kernel,
        "dim": clf.n_features_in_,
        "encoder": clf.encoder_,
        "templates": clf.templates_,
        "fit": config_dict(clf.fit_config_),
        "metrics": clf.fit_metrics_,
        "vote_weights_scale": clf.vote_scale_,
        "calibration": records.calibration(h.calibration, h.pool_factor),
    }


def load(cls, path):
    """A ``cls`` (:class:`svgen.SVGClassifier`) from the artifact at ``path``; artifacts of every earlier
    version load (votes scaled, temperatures set where they predate either)."""
    meta, t = artifacts.load_artifact(path)
    fit = dict(meta.get("fit") or {})
    cfg = FitConfig(**{k: v for k, v in fit.items() if k in FitConfig.__dataclass_fields__})
    if fit and "linear_head" not in fit:
        cfg.linear_head = "lda"  # artifacts written before the whitened-cosine head carry an LDA head
    v2 = meta.get("format_version") in artifacts.IMAGE_ROW_VERSIONS
    text_sv = t["text.support_vectors"] if v2 else t["support_vectors"]
    cfg.n_support = int(text_sv.shape[1])
    cfg.kernel = meta.get("kernel", cfg.kernel)
    adapt = AdaptConfig.from_dict(meta.get("adapt_config") or {}, f"{path}: svgen.json adapt_config")
    self = cls(**{k: getattr(cfg, k) for k in cls._param_names() if k in FitConfig.__dataclass_fields__},
               adapt_config=adapt if adapt.changed() else None)   # what adapt and add_classes adapt with
    self.adapt_config_ = adapt   # the settings it was fitted with
    C, K, D = text_sv.shape
    self.fit_config_ = cfg
    self.class_names_ = np.asarray(list(meta["classes"]), dtype=object)
    self.templates_ = meta.get("templates")
    self.encoder_ = meta.get("encoder")
    self.prototypes_ = t["prototypes"]
    self.per_template_ = t.get("per_template", t["prototypes"][:, None, :])
    self.ridge_lambda_ = (meta.get("metrics") or {}).get("ridge_lambda")
    self.fit_metrics_ = meta.get("metrics") or {}
    self.metric_precision_ = t.get("metric.precision")
    self.fewshot_ = None
    self.transductive_ = meta.get("transductive")
    self.pool_outcome_ = recorded.pool(self.transductive_)   # the records' decisions, typed once (svgen.io.recorded)
    self.transductive_labels_ = None   # the pool's soft labels are not stored; adapt again to get them
    linear = LinearHead(t["linear_head.weight"], t["linear_head.bias"])
    kernel = KernelHead(t["support_vectors"], float(t["bandwidth"]), t["vote_weights"],
                        prior_scale=artifacts.kernel_prior(meta, t, "kernel_prior.logit_scale", path))
    self.heads_ = Heads(kernel, linear)
    self.zero_shot_ = self.heads_
    if v2:
        kernel.labels, kernel.source = t["support_labels"].to(torch.int64), t["support_source"].to(torch.uint8)
        self.zero_shot_ = Heads(KernelHead(text_sv, float(t["text.bandwidth"]), t["text.vote_weights"]),
                                LinearHead(t["text.linear_head.weight"], t["text.linear_head.bias"]))
        # null: a zero-shot artifact whose kernel head has pool rows (no shots); absent: older files
        self.fewshot_ = None if "fewshot" in meta and meta["fewshot"] is None else (meta.get("fewshot") or {})
    self.shots_outcome_ = recorded.shots(self.fewshot_)
    self.shot_origins_ = _shot_origins(meta, kernel, path)
    self.inductive_ = _inductive(self, meta, t, path, C)
    gen_state = {k[len("generator."):]: v for k, v in t.items() if k.startswith("generator.")}
    self.generator_ = None
    if gen_state:
        gen = SupportVectorGenerator(D, K, radius=cfg.radius)
        try:
            gen.load_state_dict(gen_state)
        except RuntimeError:
            raise SvgenError(f"{path}: generator tensors do not match K={K}, D={D}") from None
        self.generator_ = gen.eval().requires_grad_(False)
    _votes_and_temperatures(self, meta, t)
    self.lda_ = _lda_part(self, meta, t, path)
    if self.decided_head() == MIXTURE and MIXTURE not in predictor.head_names(self.heads_):
        raise SvgenError(f"{path}: svgen.json names the mixture head as the default head, but its calibration has "
                         "no mixture_weight")
    return self


def _shot_origins(meta: dict, kernel: KernelHead, path) -> Optional[list]:
    """Where each image row of the kernel came from (``svgen.json`` ``support_origin.image``, one record per image
    row in order), checked against the rows; None where the artifact records none (written before provenance)."""
    rec = (meta.get("support_origin") or {}).get("image")
    if rec is None:
        return None
    n = 0 if kernel.source is None else int((kernel.source == IMAGE).sum())
    if len(rec) != n:
        raise SvgenError(f"{path}: svgen.json support_origin.image has {len(rec)} entries for {n} labelled image "
                         "rows")
    return [dict(r) for r in rec]


def _inductive(clf, meta: dict, t: dict, path, C: int):
    """The inductive heads a pool replaced (``inductive.*`` tensors, ``transductive.inductive_calibration``),
    or None."""
    h = clf.heads_
    linear, kernel = h.linear, h.kernel
    if "inductive.linear_head.weight" in t and "inductive.linear_head.bias" in t:
        W0, b0 = t["inductive.linear_head.weight"], t["inductive.linear_head.bias"]
        if W0.shape != h.linear.weight.shape or b0.shape != h.linear.bias.shape:
            raise SvgenError(f"{path}: inductive.linear_head has shape {tuple(W0.shape)}, expected "
                             f"{tuple(h.linear.weight.shape)}")
        linear = LinearHead(W0, b0)
    if has_image_rows(h) and "inductive.vote_weights" in t and "inductive.bandwidth" in t:
        A0, M = t["inductive.vote_weights"], h.kernel.rows.shape[0]
        if A0.dim() != 2 or A0.shape[0] > M or A0.shape[1] != C:
            raise SvgenError(f"{path}: inductive.vote_weights has shape {tuple(A0.shape)}, expected (M0 ≤ {M}, {C})")
        bandwidth = float(t["inductive.bandwidth"])
        if clf.fewshot_ is None:        # a zero-shot artifact: back to its version-1 state
            kernel = clf.zero_shot_.kernel
        elif "inductive.support_vectors" in t:   # the whole inductive head was kept
            kernel = KernelHead(t["inductive.support_vectors"], bandwidth, A0,
                                t["inductive.support_labels"].to(torch.int64),
                                t["inductive.support_source"].to(torch.uint8),
                                artifacts.kernel_prior(meta, t, "inductive.kernel_prior.logit_scale", path))
        else:                           # the pool rows come last: the inductive rows are the first ones
            M0 = A0.shape[0]
            kernel = KernelHead(h.kernel.rows[:M0], bandwidth, A0, h.kernel.labels[:M0], h.kernel.source[:M0],
                                h.kernel.prior_scale)
    if linear is h.linear and kernel is h.kernel:
        return None
    snap = (clf.transductive_ or {}).get("inductive_calibration")
    cal = None
    if snap is not None:
        temps = snap.get("temperatures") if isinstance(snap, dict) else None
        if not (isinstance(temps, dict) and set(temps) == set(HEADS)
                and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in temps.values())
                and isinstance(snap.get("calibration"), dict)):
            raise SvgenError(f"{path}: transductive.inductive_calibration is not a record of the inductive heads' "
                             "temperatures; refit or adapt from the original artifact")
        kind = logit_kinds.check_kernel_logits(snap.get("kernel_logits", "log"),
                                               "transductive.inductive_calibration.kernel_logits")
        cal = Calibration({k: float(v) for k, v in temps.items()}, kind, snap["calibration"],
                          _floor(snap, kind, f"{path}: transductive.inductive_calibration"),
                          _mixture_weight(snap, meta, f"{path}: transductive.inductive_calibration"),
                          method=recorded.method(snap["calibration"]))
    return Heads(kernel, linear, cal)


def _lda_part(clf, meta: dict, t: dict, path) -> Optional[LdaPart]:
    """The LDA part of the shots' linear head (``lda.*``, ``svgen.json`` ``lda``), checked; None without shots. An
    artifact written before it was stored gets it refitted from its shots as its ``fewshot.linear`` record says."""
    C, D = clf.heads_.linear.weight.shape
    lin = (clf.fewshot_ or {}).get("linear") or {}
    form, radius = recorded.linear_form(lin), recorded.equal_radius(lin)
    if "lda" in meta or "lda.weight" in t:
        W, b, rec = t.get("lda.weight"), t.get("lda.bias"), meta.get("lda")
        if W is None or b is None or tuple(W.shape) != (C, D) or tuple(b.shape) != (C,) or rec is None:
            raise SvgenError(f"{path}: lda.weight and lda.bias must have shapes ({C}, {D}) and ({C},), with "
                             "svgen.json 'lda'")
        return LdaPart(W.float(), b.float(), float(rec["shrinkage"]), rec.get("temperature"), form, radius)
    if "shrinkage" not in lin:
        return None
    if form is LinearForm.LDA:   # the linear head is the LDA head
        ind = clf.inductive_ if clf.inductive_ is not None and clf.inductive_.calibration is not None else clf.heads_
        fitted = recorded.lda_temperature_fitted(clf.fewshot_, ind.calibration.record)
        T = float(ind.calibration.temperatures["linear"]) if fitted else None
        return LdaPart(ind.linear.weight, ind.linear.bias, float(lin["shrinkage"]), T, form, radius)
    shots = clf.support_set_.part(IMAGE)
    X, y = shots.rows.double(), shots.labels
    W, b = lda.lda_head_weights(X, y, lda.prior_means(clf.prototypes_, X), lin["shrinkage"], lin["prior_shots"],
                                equal_radius=radius)
    T = float(lin["lda_temperature"]) if recorded.lda_temperature_fitted(clf.fewshot_, None) else None
    return LdaPart(W.float(), b.float(), float(lin["shrinkage"]), T, form, radius)


def _floor(cal: dict, kind: str, where) -> Optional[float]:
    """The ε of ``"floored"`` kernel logits from a calibration record (``kernel_floor``), checked; None otherwise."""
    if kind != "floored":
        return None
    try:
        return logit_kinds.check_floor(cal.get("kernel_floor"))
    except SvgenError as e:
        raise SvgenError(f"{where}: {e}") from None


def _mixture_weight(cal: dict, meta: dict, where) -> Optional[float]:
    """The mixture head's weight from a calibration record (``mixture_weight``), checked; None where there is none.
    Only formats 4 to 6 have one."""
    if cal.get("mixture_weight") is None:
        return None
    if meta.get("format_version") not in artifacts.MIXTURE_VERSIONS:
        raise SvgenError(f"{where}: mixture_weight is only valid in format version "
                         f"{', '.join(map(str, artifacts.MIXTURE_VERSIONS))} artifacts")
    return check_weight(cal["mixture_weight"], f"{where}: mixture_weight")


def _shotless_offset(cal: dict, meta: dict, where) -> Optional[float]:
    """The mixture's log-factor for classes without shots (``shotless_offset``, :mod:`svgen.adapt.shotless`),
    checked; None where there is none. Only format 5 has one, with a mixture weight."""
    v = cal.get("shotless_offset")
    if v is None:
        return None
    if meta.get("format_version") != artifacts.FORMAT_VERSION_SHOTLESS or cal.get("mixture_weight") is None:
        raise SvgenError(f"{where}: shotless_offset is only valid with a mixture_weight in format version "
                         f"{artifacts.FORMAT_VERSION_SHOTLESS} artifacts")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= coverage.MAX_OFFSET:
        raise SvgenError(f"{where}: shotless_offset must be a number in [0, {coverage.MAX_OFFSET:g}], got {v!r}")
    return float(v)


def _pool_factor(cal: dict, meta: dict, t: dict, heads: Heads) -> Optional[PoolFactor]:
    """A pool's factor on some heads (``pool_factor.*`` tensors and ``calibration.pool_factor_powers``), checked; None
    where there is none. Only format 6 has one, and every format 6 artifact does."""
    powers = cal.get("pool_factor_powers")
    v6 = meta.get("format_version") == artifacts.FORMAT_VERSION_POOL_FACTOR
    if powers is None and "pool_factor.weight" not in t and not v6:
        return None
    where = "svgen.json calibration.pool_factor_powers"
    if not v6:
        raise SvgenError(f"{where}: a pool factor is only valid in format version "
                         f"{artifacts.FORMAT_VERSION_POOL_FACTOR} artifacts")
    names = predictor.head_names(heads)
    if (not isinstance(powers, dict) or not powers
            or not all(h in names and h != "cosine" and not isinstance(a, bool) and isinstance(a, (int, float))
                       and math.isfinite(a) and a > 0 for h, a in powers.items())):
        raise SvgenError(f"{where} must map some of the heads {', '.join(n for n in names if n != 'cosine')} to "
                         f"positive numbers, got {powers!r}")
    W, b = t.get("pool_factor.weight"), t.get("pool_factor.bias")
    C, D = heads.linear.weight.shape
    if W is None or b is None or tuple(W.shape) != (C, D) or tuple(b.shape) != (C,):
        raise SvgenError(f"format {artifacts.FORMAT_VERSION_POOL_FACTOR} artifact: pool_factor.weight and "
                         f"pool_factor.bias must have shapes ({C}, {D}) and ({C},)")
    return PoolFactor(W.float(), b.float(), {h: float(a) for h, a in powers.items()})


def _votes_and_temperatures(clf, meta: dict, t: dict) -> None:
    """Vote scaling and temperatures as recorded; artifacts from before either existed get them now (votes times
    M·λ, text-side temperatures), so every loaded classifier reads the same."""
    scale = meta.get("vote_weights_scale")
    if isinstance(scale, dict) and "factor" in scale:
        clf.vote_scale_ = dict(scale)  # already stored scaled: never again
    elif has_image_rows(clf.heads_):  # format 2 from before the scaling: its text and image votes stay as they are
        clf.vote_scale_ = {"factor": 1.0, "rule": "none (format 2 written before the M·λ scaling)"}
    else:
        clf.vote_weights_, clf.vote_scale_ = scale_votes(clf.vote_weights_, clf.support_vectors_, clf.ridge_lambda_)
        clf.vote_scale_["applied_on_load"] = True
    temps = {h: float(t[f"temperature.{h}"]) for h in HEADS if f"temperature.{h}" in t}
    if len(temps) == len(HEADS):
        cal = meta.get("calibration") or {}
        # svgen.json holds each T exactly (float64); the tensor is its float32 copy. The exact one is used where
        # it agrees with the tensor, so a loaded classifier predicts what the saved one did
        exact = cal.get("temperatures") if isinstance(cal.get("temperatures"), dict) else {}
        for h, v in exact.items():
            if (h in temps and isinstance(v, float) and math.isfinite(v) and v > 0
                    and float(torch.tensor(v, dtype=torch.float32)) == temps[h]):
                temps[h] = v
        kind = cal.get("kernel_logits", "log")   # absent: before the choice
        clf.heads_.calibration = Calibration(temps, kind,
                                             {k: v for k, v in cal.items()
                                              if k not in ("temperatures", "probabilities", "kernel_logits",
                                                           "kernel_floor", "mixture_weight", "shotless_offset",
                                                           "pool_factor_powers")},
                                             _floor(cal, kind, "svgen.json calibration"),
                                             _mixture_weight(cal, meta, "svgen.json calibration"),
                                             _shotless_offset(cal, meta, "svgen.json calibration"),
                                             recorded.method(cal))
        clf.heads_.pool_factor = _pool_factor(cal, meta, t, clf.heads_)
        if kind == "floored" and clf.heads_.kernel.prior_scale is None:
            raise SvgenError("svgen.json calibration: kernel_logits 'floored' needs the kernel head's zero-shot prior "
                             "term (kernel_prior.logit_scale), and this artifact has none")
    else:
        clf._text_temperatures(clf.adapt_config_)

"""The arrays and strings of an exported head (:mod:`svgen.io.export` writes them; :mod:`svgen.io.onnx_graph` builds
the ONNX graph from them). The formulas are in :mod:`svgen.io.export`'s text."""

from __future__ import annotations

import json
from typing import Dict

import numpy as np
import torch
import torch.nn.functional as F

from svgen.errors import SvgenError
from svgen.core.logits import KERNEL_LOG_FLOOR
from svgen.heads.predictor import check_head, class_log_factor, pool_power
from svgen.heads.scoring import CLIP_LOGIT_SCALE, MIXTURE

HEAD_FORMAT = "svgen-head"
HEAD_FORMAT_VERSION = 1
EXPORT_FORMATS = ("safetensors", "npz", "onnx")
EXPORT_HEADS = ("linear", "kernel", "cosine", MIXTURE)
MIXTURE_PARTS = ("kernel", "linear")   # the mixture file's two heads, its tensors prefixed "kernel." and "linear."
LOGIT_SCALE = CLIP_LOGIT_SCALE  # 100, as in open_clip
PROBS_USAGE = {("kernel", "log"): f"probs = softmax(log(max(scores, {KERNEL_LOG_FLOOR:g})) / temperature)",
               ("kernel", "score"): "probs = softmax(scores / temperature)",
               ("kernel", "floored"): ("probs = softmax(log(max(scores, kernel_floor * prior * max(scores) / max(prior), "
                                       f"{KERNEL_LOG_FLOOR:g})) / temperature), maxima per row, prior = "
                                       "softmax(prior_logit_scale * x/||x|| @ prior_prototypes.T)"),
               "linear": "probs = softmax(logits / temperature)"}


def probs_usage(clf, head: str) -> str:
    """How an export's probabilities are computed (:data:`PROBS_USAGE` for the head and, for the kernel head, its kind
    of logits); a kernel or mixture head with a pool factor multiplies them by the factor."""
    power = pool_power(clf.heads_, head)
    if power is not None and head != "linear":
        return (f"p0 = {_probs_usage(clf, head)[len('probs = '):]}; probs = softmax(log(max(p0, {KERNEL_LOG_FLOOR:g})) "
                "+ pool_factor_power * (x/||x|| @ pool_factor.weight.T + pool_factor.bias)) (the pool's class "
                "likelihood to a power)")
    return _probs_usage(clf, head)


def _probs_usage(clf, head: str) -> str:
    if head == MIXTURE:
        tilt = "" if clf.heads_.calibration.shotless_offset is None else ", × exp(class_log_factor), renormalised"
        return (f"probs = mixture_weight * p_kernel + (1 - mixture_weight) * p_linear{tilt}; p_kernel: "
                f"{probs_usage(clf, 'kernel')} with the kernel.* tensors; p_linear: {PROBS_USAGE['linear']} with the "
                "linear.* tensors")
    return PROBS_USAGE[("kernel", clf.kernel_logits_)] if head == "kernel" else PROBS_USAGE["linear"]
NORM_EPS = 1e-12  # F.normalize's eps


# ----------------------------------------------------------------------------- head tensors

def head_tensors(clf, head: str = "linear") -> Dict[str, np.ndarray]:
    """The float32 arrays of one exported head (see module docstring for the formulas), with the
    head's softmax ``temperature``; the mixture's are both heads' arrays, prefixed ``kernel.`` and ``linear.``, and
    its ``mixture_weight`` (its own ``temperature`` is 1), and where the fit tilted the classes without shots
    (:mod:`svgen.adapt.shotless`) their log-factor per class, ``class_log_factor`` (C: δ for those classes, else 0)."""
    if head == MIXTURE:
        check_head(clf.heads_, MIXTURE)
        # the mixture's parts as the shots left them (a factor multiplies the mixture, not its parts)
        out = {f"{h}.{k}": v for h in MIXTURE_PARTS for k, v in _base_tensors(clf, h, fold=False).items()}
        out["mixture_weight"] = np.asarray(clf.heads_.calibration.mixture_weight, dtype=np.float32)
        if clf.heads_.calibration.shotless_offset is not None:
            out["class_log_factor"] = class_log_factor(clf.heads_).numpy().astype(np.float32)
        out["temperature"] = np.asarray(1.0, dtype=np.float32)
    else:
        out = _base_tensors(clf, head)
    power = pool_power(clf.heads_, head)
    if power is not None and head != "linear":   # the linear head's factor is folded into its matrix
        f = clf.heads_.pool_factor
        out.update({"pool_factor.weight": f.weight.float().contiguous().numpy(),
                    "pool_factor.bias": f.bias.float().numpy(),
                    "pool_factor.power": np.asarray(power, dtype=np.float32)})
    return out


def _base_tensors(clf, head: str, fold: bool = True) -> Dict[str, np.ndarray]:
    """One head's arrays and ``temperature`` without a kernel or mixture pool factor; the linear head's factor folded
    into its matrix (``fold``), or left out (a mixture's part)."""
    folded = fold and head == "linear" and pool_power(clf.heads_, head) is not None
    out = _head_arrays(clf, head, fold)
    out["temperature"] = np.asarray(1.0 if folded else clf.temperatures_[head], dtype=np.float32)
    return out


def linear_matrix(clf, fold: bool = True):
    """(C×D W, C b) of the linear head's logits ``x̂ Wᵀ + b``: with a pool factor (and ``fold``), folded into one
    matrix at T = 1, ``(W⁰/T + a·W_G, b⁰/T + a·b_G)`` (:func:`svgen.heads.predictor.proba`'s logits exactly)."""
    h = clf.heads_
    power = pool_power(h, "linear")
    if power is None or not fold:
        return h.linear.weight.float(), h.linear.bias.float()
    T, f = float(h.calibration.temperatures["linear"]), h.pool_factor
    return ((h.linear.weight.double() / T + power * f.weight.double()).float(),
            (h.linear.bias.double() / T + power * f.bias.double()).float())


def _head_arrays(clf, head: str, fold: bool = True) -> Dict[str, np.ndarray]:
    clf._check_fitted()
    if head == "linear":
        W, b = linear_matrix(clf, fold)
        return {
            "weight": (W.T / LOGIT_SCALE).contiguous().numpy(),
            "bias": (b / LOGIT_SCALE).numpy(),
            "logit_scale": np.asarray(LOGIT_SCALE, dtype=np.float32),
        }
    if head == "cosine":
        P = F.normalize(clf.prototypes_.float(), dim=-1)
        return {
            "weight": P.T.contiguous().numpy(),
            "bias": np.zeros(P.shape[0], dtype=np.float32),
            "logit_scale": np.asarray(LOGIT_SCALE, dtype=np.float32),
        }
    if head == "kernel":
        S = clf.support_vectors_.float()
        S = F.normalize(S.reshape(-1, S.shape[-1]), dim=-1)
        out = {
            "support_vectors": S.contiguous().numpy(),
            "bandwidth": np.asarray(clf.bandwidth_, dtype=np.float32),
        }
        A = clf.vote_weights_
        if A.is_sparse:  # large-C artifacts: keep A as COO (rows, columns, values) and its shape
            A = A.coalesce()
            out["vote_weights.indices"] = A.indices().to(torch.int64).contiguous().numpy()
            out["vote_weights.values"] = A.values().float().contiguous().numpy()
            out["vote_weights.shape"] = np.asarray(A.shape, dtype=np.int64)
        else:
            out["vote_weights"] = A.float().contiguous().numpy()
        if clf.support_labels_ is not None:  # formats 2-3: which rows are text, which are images
            out["support_labels"] = clf.support_labels_.to(torch.int64).numpy()
            out["support_source"] = clf.support_source_.to(torch.uint8).numpy()
        if clf.kernel_prior_ is not None:   # adapted to shots: + softmax(τ x̂ P̂ᵀ)
            out["prior_prototypes"] = F.normalize(clf.prototypes_.float(), dim=-1).contiguous().numpy()
            out["prior_logit_scale"] = np.asarray(clf.kernel_prior_, dtype=np.float32)
        if clf.kernel_logits_ == "floored":   # its probabilities' floor: ε × the prior, scaled to the top score
            out["kernel_floor"] = np.asarray(clf.heads_.calibration.kernel_floor, dtype=np.float32)
        return out
    raise SvgenError(f"unknown head {head!r}; expected one of {', '.join(EXPORT_HEADS)}")


def head_metadata(clf, head: str) -> Dict[str, str]:
    """String metadata stored with every export."""
    meta = {
        "format": HEAD_FORMAT,
        "format_version": str(HEAD_FORMAT_VERSION),
        "head": head,
        "classes": json.dumps(list(clf.class_names_), ensure_ascii=False),
        "encoder": json.dumps(clf.encoder_ or {}, ensure_ascii=False),
        "dim": str(clf.n_features_in_),
        "normalize_input": "true",
    }
    if head == MIXTURE:
        meta["kernel"] = clf.fit_config_.kernel
        meta["kernel_logits"] = clf.kernel_logits_
        meta["usage"] = ("scores = log(max(probs, 1e-30)); kernel.* and linear.* are the kernel and linear head "
                         "files' tensors, each with its own temperature")
    elif head == "kernel":
        meta["kernel"] = clf.fit_config_.kernel
        meta["usage"] = ("scores = k(x/||x||, support_vectors) @ vote_weights"
                         + (" + softmax(prior_logit_scale * x/||x|| @ prior_prototypes.T)"
                            if clf.kernel_prior_ is not None else "")
                         + "; rbf k = exp(-||a-b||^2/(2 bandwidth^2)), laplacian k = exp(-||a-b||/bandwidth)")
        meta["kernel_logits"] = clf.kernel_logits_
    else:
        meta["usage"] = "logits = logit_scale * (x/||x|| @ weight + bias)"
    if head != "linear" and pool_power(clf.heads_, head) is not None:
        meta["usage"] = (f"scores = log(max(p0, {KERNEL_LOG_FLOOR:g})) + pool_factor.power * (x/||x|| @ "
                         "pool_factor.weight.T + pool_factor.bias), p0 the head's probabilities without the pool's "
                         "factor (see probabilities); " + meta["usage"])
    meta["probabilities"] = probs_usage(clf, head)
    return meta

"""Export an artifact's heads as plain files that need neither svgen nor pickle.

Every export takes raw image embeddings ``x`` (N×D, as ``model.encode_image`` returns them), L2-normalises them,
``x̂ = x / max(||x||, 1e-12)``, and yields N×C scores equal to the artifact's head (to float rounding). Class names
travel inside the file.

**Head files** (``.safetensors`` or ``.npz``), ``format = "svgen-head"``, ``format_version = 1``:

* ``linear`` and ``cosine`` heads — an open_clip-style D×C classifier::

      logits = logit_scale * (x̂ @ weight + bias)        # weight D×C, bias C, logit_scale = 100

  ``weight`` and ``bias`` are the svgen linear head divided by 100, so the familiar
  ``100. * image_features @ weight`` is a drop-in (add ``100 * bias`` for the exact logits; for
  the cosine head ``bias`` is zero and ``weight`` is the normalised text prototypes, i.e. exactly
  open_clip's zero-shot classifier).
* every head file has ``temperature`` (scalar): probabilities are ``softmax(logits / temperature)``.
  A kernel head file says which logits its temperature belongs to in ``kernel_logits``: ``log``,
  ``log(max(scores, 1e-30))``; ``score``, the raw scores; or ``floored``, ``log(max(scores, kernel_floor·prior·
  max(scores)/max(prior), 1e-30))`` with the file's ``kernel_floor`` (see :mod:`svgen.calibration.temperatures`; files
  without the field are ``log``); ``probabilities`` spells the formula out.
* ``kernel`` head — ``scores = exp(-||x̂ - s||² / (2σ²)) @ vote_weights`` over the rows ``s`` of
  ``support_vectors`` (M×D unit rows, class-major), ``bandwidth`` σ, ``vote_weights`` M×C; with
  ``kernel = laplacian`` the kernel is ``exp(-||x̂ - s|| / σ)``. Large-C artifacts whose vote
  weights are sparse export them as COO: ``vote_weights.indices`` (2×nnz: row, column),
  ``vote_weights.values`` (nnz) and ``vote_weights.shape`` ([M, C]).
  Artifacts with labelled images (format 2) add ``support_labels`` (M, class of each row) and
  ``support_source`` (M, 0 = text, 1 = image, 2 = unlabelled pool image placed by the transductive
  kernel head); the formula is the same. Artifacts adapted to shots (format 3, :mod:`svgen.fewshot.residual`)
  add the zero-shot probabilities: ``scores = softmax(prior_logit_scale · x̂ @ prior_prototypesᵀ) + …``
  with ``prior_prototypes`` (C×D unit rows) and ``prior_logit_scale`` (CLIP's 100).

In ``.safetensors`` the strings (``format``, ``head``, ``classes`` as a JSON list, ``encoder`` as JSON, ``kernel``)
are in the header metadata; in ``.npz`` they are string arrays (readable with ``allow_pickle=False``).

The mixture head file (after shots) holds both heads' tensors, prefixed ``kernel.`` and ``linear.``, its
``mixture_weight`` and, where some classes have no shots, ``class_log_factor`` (C; ``probs`` × its exp, renormalised).

**ONNX** (``svgen[onnx]``): a graph from input ``embeddings`` (N×D float32, raw) to output ``scores`` (N×C float32)
and ``probs`` (N×C, the softmax with the head's temperature, of the log scores or the raw scores as the kernel head's
``kernel_logits`` says) for any head, built with ``onnx.helper`` (opset 17), with the same strings in
``metadata_props``. :func:`verify_onnx` runs it with onnxruntime and compares against the PyTorch heads.

All files are written atomically (temporary sibling + rename), with the permissions the umask gives.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

from svgen.io import safeio
from svgen.errors import SvgenError
from svgen.calibration.temperatures import KERNEL_LOG_FLOOR
from svgen.heads.predictor import check_head, class_log_factor
from svgen.heads.scoring import CLIP_LOGIT_SCALE, MIXTURE

log = logging.getLogger(__name__)

HEAD_FORMAT = "svgen-head"
HEAD_FORMAT_VERSION = 1
EXPORT_FORMATS = ("safetensors", "npz", "onnx")
EXPORT_HEADS = ("linear", "kernel", "cosine", MIXTURE)
MIXTURE_PARTS = ("kernel", "linear")   # the mixture file's two heads, its tensors prefixed "kernel." and "linear."
LOGIT_SCALE = CLIP_LOGIT_SCALE  # 100, as in open_clip
ONNX_OPSET = 17
PROBS_USAGE = {("kernel", "log"): f"probs = softmax(log(max(scores, {KERNEL_LOG_FLOOR:g})) / temperature)",
               ("kernel", "score"): "probs = softmax(scores / temperature)",
               ("kernel", "floored"): ("probs = softmax(log(max(scores, kernel_floor * prior * max(scores) / max(prior), "
                                       f"{KERNEL_LOG_FLOOR:g})) / temperature), maxima per row, prior = "
                                       "softmax(prior_logit_scale * x/||x|| @ prior_prototypes.T)"),
               "linear": "probs = softmax(logits / temperature)"}


def probs_usage(clf, head: str) -> str:
    """How an export's probabilities are computed (:data:`PROBS_USAGE` for the head and, for the kernel head, its kind
    of logits)."""
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
    (:mod:`svgen.fewshot.coverage`) their log-factor per class, ``class_log_factor`` (C: δ for those classes, else 0)."""
    if head == MIXTURE:
        check_head(clf.heads_, MIXTURE)
        out = {f"{h}.{k}": v for h in MIXTURE_PARTS for k, v in head_tensors(clf, h).items()}
        out["mixture_weight"] = np.asarray(clf.heads_.calibration.mixture_weight, dtype=np.float32)
        if clf.heads_.calibration.shotless_offset is not None:
            out["class_log_factor"] = class_log_factor(clf.heads_).numpy().astype(np.float32)
        out["temperature"] = np.asarray(1.0, dtype=np.float32)
        return out
    out = _head_arrays(clf, head)
    out["temperature"] = np.asarray(clf.temperatures_[head], dtype=np.float32)
    return out


def _head_arrays(clf, head: str) -> Dict[str, np.ndarray]:
    clf._check_fitted()
    if head == "linear":
        return {
            "weight": (clf.linear_weight_.float().T / LOGIT_SCALE).contiguous().numpy(),
            "bias": (clf.linear_bias_.float() / LOGIT_SCALE).numpy(),
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
        "classes": json.dumps(list(clf.classes_), ensure_ascii=False),
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
    meta["probabilities"] = probs_usage(clf, head)
    return meta


# ----------------------------------------------------------------------------- ONNX graph

ONNX_MAX_BYTES = 1 << 30  # protobuf caps a model at 2 GiB


def _dense_votes(t: dict) -> np.ndarray:
    """The M×C vote weights as a dense array (ONNX graphs carry them dense)."""
    if "vote_weights" in t:
        return t["vote_weights"]
    M, C = (int(v) for v in t["vote_weights.shape"])
    if M * C * 4 > ONNX_MAX_BYTES:
        why = f"the kernel head's {M}×{C} vote weights are too large for an ONNX graph"
        raise SvgenError(f"{why}; export as safetensors or npz (they keep them sparse)",
                         cli=f"{why}; export --format safetensors or npz (they keep them sparse)")
    A = np.zeros((M, C), dtype=np.float32)
    rows, cols = t["vote_weights.indices"]
    np.add.at(A, (rows, cols), t["vote_weights.values"])
    return A


def _branch(clf, head: str, t: dict, const, helper, p: str) -> list:
    """ONNX nodes from ``x_hat`` to ``{p}scores`` and ``{p}probs`` for one head (``t``: its exported tensors;
    every name it makes is prefixed ``p``)."""
    if head in ("linear", "cosine"):
        # exactly the svgen computation: x̂ Wᵀ + b (the 1/100 of the head file is not applied here)
        if head == "linear":
            W, b = clf.linear_weight_.float().T.contiguous().numpy(), clf.linear_bias_.float().numpy()
        else:
            W, b = LOGIT_SCALE * t["weight"], t["bias"]
        nodes = [helper.make_node("MatMul", ["x_hat", const(p + "weight", W)], [p + "xw"]),
                 helper.make_node("Add", [p + "xw", const(p + "bias", b)], [p + "scores"])]
    else:
        sigma = float(clf.bandwidth_)
        nodes = [
            helper.make_node("Transpose", [const(p + "support_vectors", t["support_vectors"])], [p + "s_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x_hat", p + "s_t"], [p + "dots"]),
            helper.make_node("Mul", [p + "dots", const(p + "two", 2.0)], [p + "two_dots"]),
            helper.make_node("Sub", [const(p + "two_", 2.0), p + "two_dots"], [p + "d2_raw"]),
            helper.make_node("Max", [p + "d2_raw", const(p + "zero", 0.0)], [p + "d2"]),
        ]
        if clf.fit_config_.kernel == "rbf":
            nodes += [helper.make_node("Div", [p + "d2", const(p + "two_sigma2", 2.0 * sigma * sigma)], [p + "expo"])]
        elif clf.fit_config_.kernel == "laplacian":
            nodes += [
                helper.make_node("Add", [p + "d2", const(p + "tiny", 1e-12)], [p + "d2e"]),
                helper.make_node("Sqrt", [p + "d2e"], [p + "dist"]),
                helper.make_node("Div", [p + "dist", const(p + "sigma", sigma)], [p + "expo"]),
            ]
        else:
            raise SvgenError(f"cannot export kernel {clf.fit_config_.kernel!r} to ONNX")
        prior = "prior_prototypes" in t
        nodes += [
            helper.make_node("Neg", [p + "expo"], [p + "neg"]),
            helper.make_node("Exp", [p + "neg"], [p + "k"]),
            helper.make_node("MatMul", [p + "k", const(p + "vote_weights", _dense_votes(t))],
                             [p + ("votes" if prior else "scores")]),
        ]
        if prior:   # + softmax(τ x̂ P̂ᵀ), the zero-shot probabilities the shots correct
            nodes += [
                helper.make_node("Transpose", [const(p + "prior_prototypes", t["prior_prototypes"])], [p + "p_t"],
                                 perm=[1, 0]),
                helper.make_node("MatMul", ["x_hat", p + "p_t"], [p + "cos"]),
                helper.make_node("Mul", [p + "cos", const(p + "prior_logit_scale", t["prior_logit_scale"])],
                                 [p + "prior_logits"]),
                helper.make_node("Softmax", [p + "prior_logits"], [p + "prior"], axis=1),
                helper.make_node("Add", [p + "votes", p + "prior"], [p + "scores"]),
            ]
    logits = p + "scores"
    if head == "kernel" and clf.kernel_logits_ == "log":   # "score": the scores are the logits
        nodes += [helper.make_node("Max", [p + "scores", const(p + "log_floor", KERNEL_LOG_FLOOR)], [p + "scores_pos"]),
                  helper.make_node("Log", [p + "scores_pos"], [p + "log_scores"])]
        logits = p + "log_scores"
    elif head == "kernel" and clf.kernel_logits_ == "floored":   # log max(s, ε·p₀·max s / max p₀, 1e-30)
        nodes += [helper.make_node("ReduceMax", [p + "scores"], [p + "s_max"], axes=[1], keepdims=1),
                  helper.make_node("ReduceMax", [p + "prior"], [p + "p_max"], axes=[1], keepdims=1),
                  helper.make_node("Div", [p + "s_max", p + "p_max"], [p + "ratio"]),
                  helper.make_node("Mul", [p + "prior", p + "ratio"], [p + "prior_scaled"]),
                  helper.make_node("Mul", [p + "prior_scaled", const(p + "kernel_floor", t["kernel_floor"])],
                                   [p + "floor"]),
                  helper.make_node("Max", [p + "scores", p + "floor"], [p + "scores_floored"]),
                  helper.make_node("Max", [p + "scores_floored", const(p + "log_floor", KERNEL_LOG_FLOOR)],
                                   [p + "scores_pos"]),
                  helper.make_node("Log", [p + "scores_pos"], [p + "log_scores"])]
        logits = p + "log_scores"
    return nodes + [helper.make_node("Div", [logits, const(p + "temperature", t["temperature"])], [p + "tempered"]),
                    helper.make_node("Softmax", [p + "tempered"], [p + "probs"], axis=1)]


def onnx_model(clf, head: str = "linear"):
    """An ``onnx.ModelProto``: ``embeddings`` (N×D, raw) → ``scores`` (N×C) for one head."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise SvgenError("ONNX export needs the onnx package: pip install 'svgen[onnx]'") from None
    t = head_tensors(clf, head)
    D, C = clf.n_features_in_, len(clf.classes_)
    init = []

    def const(name, value, dtype=np.float32):
        init.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    nodes = [  # x / max|x| first, so a row of 1e38 (or 1e-42) keeps its direction instead of overflowing
        helper.make_node("Abs", ["embeddings"], ["abs_x"]),
        helper.make_node("ReduceMax", ["abs_x"], ["max_abs"], axes=[1], keepdims=1),
        helper.make_node("Max", ["max_abs", const("tiny_scale", np.finfo(np.float32).tiny)], ["max_abs_eps"]),
        helper.make_node("Div", ["embeddings", "max_abs_eps"], ["x_scaled"]),
        helper.make_node("ReduceSumSquare", ["x_scaled"], ["sumsq"], axes=[1], keepdims=1),
        helper.make_node("Sqrt", ["sumsq"], ["norm"]),
        helper.make_node("Max", ["norm", const("eps", NORM_EPS)], ["norm_eps"]),
        helper.make_node("Div", ["x_scaled", "norm_eps"], ["x_hat"]),
    ]
    if head == MIXTURE:   # both heads' branches, their probabilities mixed: w·p_kernel + (1 − w)·p_linear
        w = float(t["mixture_weight"])
        for part in MIXTURE_PARTS:
            nodes += _branch(clf, part, {k[len(part) + 1:]: v for k, v in t.items() if k.startswith(part + ".")},
                             const, helper, f"{part}_")
        mixed = "probs" if "class_log_factor" not in t else "mixed"
        nodes += [helper.make_node("Mul", ["kernel_probs", const("mixture_weight", w)], ["kernel_part"]),
                  helper.make_node("Mul", ["linear_probs", const("one_minus_mixture_weight", 1.0 - w)], ["linear_part"]),
                  helper.make_node("Add", ["kernel_part", "linear_part"], [mixed])]
        if mixed != "probs":   # the classes without shots × e^δ, renormalised
            nodes += [helper.make_node("Mul", [mixed, const("class_factor", np.exp(t["class_log_factor"]))], ["tilted"]),
                      helper.make_node("ReduceSum", ["tilted", const("axis1", [1], np.int64)], ["total"], keepdims=1),
                      helper.make_node("Div", ["tilted", "total"], ["probs"])]
        nodes += [helper.make_node("Max", ["probs", const("log_floor", KERNEL_LOG_FLOOR)], ["probs_pos"]),
                  helper.make_node("Log", ["probs_pos"], ["scores"])]
    else:
        nodes += _branch(clf, head, t, const, helper, "")
    graph = helper.make_graph(
        nodes, f"svgen_{head}_head",
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["N", D])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", C]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", C])],
        initializer=init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="svgen", doc_string=f"svgen {head} head: raw N×D image embeddings → N×C scores")
    model.ir_version = 8
    meta = head_metadata(clf, head)
    meta["usage"] = ("scores, probs = session.run(['scores', 'probs'], {'embeddings': raw_image_embeddings}); "
                     "probs: " + probs_usage(clf, head))
    helper.set_model_props(model, meta)
    onnx.checker.check_model(model)
    return model


def torch_scores(clf, x, head: str) -> np.ndarray:
    """The library's own scores (the reference every export is checked against)."""
    return np.asarray(clf.decision_function(x, head=head))


def verify_onnx(model, clf, head: str, x: Optional[np.ndarray] = None, atol: float = 1e-4) -> float:
    """Run ``model`` with onnxruntime on ``x`` and compare with the PyTorch head.

    ``x`` defaults to the prototypes plus random directions (a test set that exercises every
    class). Returns the max absolute difference; raises :class:`SvgenError` above ``atol``
    (relative to the score range) or when the top-1 predictions disagree.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        raise SvgenError("checking an ONNX export needs onnxruntime: pip install 'svgen[onnx]'") from None
    if x is None:
        g = torch.Generator().manual_seed(0)
        noise = torch.randn(64, clf.n_features_in_, generator=g)
        x = torch.cat([clf.prototypes_.float(), noise]).numpy()
    x = np.ascontiguousarray(x, dtype=np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got, probs = sess.run(["scores", "probs"], {"embeddings": x})
    ref = torch_scores(clf, x, head)
    ref_probs = np.asarray(clf.predict_proba(x, head=head))
    for name, values in (("ONNX scores", got), ("ONNX probabilities", probs), ("svgen's scores", ref),
                         ("svgen's probabilities", ref_probs)):
        if not np.isfinite(values).all():  # NaN compares as no difference: never let it pass the check
            raise SvgenError(f"the {head} head's check failed: {name} contain NaN or inf")
    diff = float(np.abs(got - ref).max())
    pdiff = float(np.abs(probs - ref_probs).max())
    if not pdiff <= 1e-3:
        raise SvgenError(f"ONNX {head} head's probabilities disagree with svgen: max |difference| {pdiff:.3g}")
    scale = float(np.abs(ref).max()) or 1.0  # relative: kernel scores can be tiny
    if not diff <= atol * scale:
        raise SvgenError(f"ONNX {head} head disagrees with svgen: max |difference| {diff:.3g}")
    agree = got.argmax(1) == ref.argmax(1)
    if not agree.all():
        # only near-ties may differ: the true gap must be within rounding
        top = np.sort(ref, axis=1)[:, -2:]
        gaps = (top[:, 1] - top[:, 0])[~agree]
        if (gaps > 10 * atol * scale).any():
            raise SvgenError(f"ONNX {head} head predicts differently from svgen on {int((~agree).sum())} input(s)")
    return diff


# ----------------------------------------------------------------------------- files

def export_head(clf, path, fmt: str, head: str = "linear", force: bool = False, verify: bool = True) -> dict:
    """Write one head of a fitted classifier as ``fmt`` (safetensors, npz or onnx) to ``path``.

    Returns ``{"path", "format", "head", "checked"}`` where ``checked`` is the max absolute
    difference between onnxruntime and svgen (ONNX with ``verify`` and onnxruntime installed) or None.
    """
    info = {"path": str(path), "format": fmt, "head": head, "checked": None}
    if fmt not in EXPORT_FORMATS:
        raise SvgenError(f"unknown export format {fmt!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    if head not in EXPORT_HEADS:
        raise SvgenError(f"unknown head {head!r}; expected one of {', '.join(EXPORT_HEADS)}")
    if fmt == "onnx":
        model = onnx_model(clf, head)
        if verify:
            try:
                diff = info["checked"] = verify_onnx(model, clf, head)
                log.info("ONNX %s head checked with onnxruntime: max |difference| %.2g", head, diff)
            except SvgenError as e:
                if "needs onnxruntime" not in str(e):
                    raise
                log.warning("onnxruntime is not installed; the ONNX export was not checked")
        safeio.atomic_file(path, lambda p: p.write_bytes(model.SerializeToString()), force=force)
        return info
    arrays = head_tensors(clf, head)
    meta = head_metadata(clf, head)
    if fmt == "safetensors":
        from safetensors.numpy import save_file

        safeio.atomic_file(path, lambda p: save_file(arrays, str(p), metadata=meta), force=force)
        return info

    def write_npz(p):
        strings = {k: np.asarray(v) for k, v in meta.items() if k != "classes"}
        strings["classes"] = np.asarray(list(clf.classes_), dtype=str)
        with open(p, "wb") as f:
            np.savez(f, **arrays, **strings)

    safeio.atomic_file(path, write_npz, force=force)
    return info


def load_head(path) -> dict:
    """Read a head file written by :func:`export_head` (safetensors or npz) into a dict.

    Returns ``{"head", "classes", "encoder", "kernel"?, <arrays>}``; used by tests and by anyone
    who wants the arrays back. (``scripts/zero_shot_classify.py`` does the same without svgen.)
    """
    path = Path(path)
    if not path.is_file():
        raise SvgenError(f"head file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as f:
                meta = dict(f.metadata() or {})
                arrays = {k: f.get_tensor(k) for k in f.keys()}
            out = {**arrays, **{k: v for k, v in meta.items() if k not in ("classes", "encoder")}}
            out["classes"] = json.loads(meta["classes"])
            out["encoder"] = json.loads(meta.get("encoder") or "{}")
        else:
            with np.load(path, allow_pickle=False) as z:
                out = {k: z[k] for k in z.files}
            out = {k: (str(v) if v.dtype.kind == "U" and v.ndim == 0 else v) for k, v in out.items()}
            out["classes"] = [str(c) for c in out["classes"]]
            out["encoder"] = json.loads(out.get("encoder") or "{}")
    except (KeyError, ValueError, OSError) as e:
        raise SvgenError(f"{path} is not an svgen head file ({e})") from None
    if out.get("format") != HEAD_FORMAT:
        raise SvgenError(f"{path} is not an svgen head file (format {out.get('format')!r})")
    return out

"""The ONNX graph of an exported head (``svgen[onnx]``): input ``embeddings`` (N×D float32, raw) to outputs ``scores``
and ``probs`` (N×C), built with ``onnx.helper`` (opset 17); :func:`verify_onnx` runs it with onnxruntime against the
PyTorch heads. The formulas are in :mod:`svgen.io.export`'s text."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from svgen.errors import SvgenError
from svgen.core.logits import KERNEL_LOG_FLOOR
from svgen.io.head_tensors import (LOGIT_SCALE, MIXTURE_PARTS, NORM_EPS, head_metadata, head_tensors, linear_matrix,
                                   probs_usage)
from svgen.heads.scoring import MIXTURE

# ----------------------------------------------------------------------------- ONNX graph

ONNX_OPSET = 17
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


def _branch(clf, head: str, t: dict, const, helper, p: str, fold: bool = True) -> list:
    """ONNX nodes from ``x_hat`` to ``{p}scores`` and ``{p}probs`` for one head (``t``: its exported tensors;
    every name it makes is prefixed ``p``; ``fold``: a linear head's pool factor folded into its matrix, not for a
    mixture's part)."""
    if head in ("linear", "cosine"):
        # exactly the svgen computation: x̂ Wᵀ + b (the 1/100 of the head file is not applied here)
        if head == "linear":
            W, b = linear_matrix(clf, fold)
            W, b = W.T.contiguous().numpy(), b.numpy()
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
    D, C = clf.n_features_in_, len(clf.class_names_)
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
    factored = "pool_factor.power" in t   # the head's probabilities × the pool's likelihood^power, renormalised
    out = "base_" if factored else ""
    if head == MIXTURE:   # both heads' branches, their probabilities mixed: w·p_kernel + (1 − w)·p_linear
        w = float(t["mixture_weight"])
        for part in MIXTURE_PARTS:
            nodes += _branch(clf, part, {k[len(part) + 1:]: v for k, v in t.items() if k.startswith(part + ".")},
                             const, helper, f"{part}_", fold=False)
        tilt = "class_log_factor" in t
        mixed = "mixed" if tilt else out + "probs"
        nodes += [helper.make_node("Mul", ["kernel_probs", const("mixture_weight", w)], ["kernel_part"]),
                  helper.make_node("Mul", ["linear_probs", const("one_minus_mixture_weight", 1.0 - w)], ["linear_part"]),
                  helper.make_node("Add", ["kernel_part", "linear_part"], [mixed])]
        if tilt:   # the classes without shots × e^δ, renormalised
            nodes += [helper.make_node("Mul", [mixed, const("class_factor", np.exp(t["class_log_factor"]))], ["tilted"]),
                      helper.make_node("ReduceSum", ["tilted", const("axis1", [1], np.int64)], ["total"], keepdims=1),
                      helper.make_node("Div", ["tilted", "total"], [out + "probs"])]
        nodes += [helper.make_node("Max", [out + "probs", const("log_floor", KERNEL_LOG_FLOOR)], ["probs_pos"]),
                  helper.make_node("Log", ["probs_pos"], [out + "scores"])]
    else:
        nodes += _branch(clf, head, t, const, helper, out)
    if factored:   # scores = log max(p0, 1e-30) + a·(x̂ W_Gᵀ + b_G); probs = softmax(scores)
        nodes += [helper.make_node("Max", ["base_probs", const("factor_floor", KERNEL_LOG_FLOOR)], ["base_pos"]),
                  helper.make_node("Log", ["base_pos"], ["base_log"]),
                  helper.make_node("Transpose", [const("pool_factor_weight", t["pool_factor.weight"])], ["pf_t"],
                                   perm=[1, 0]),
                  helper.make_node("MatMul", ["x_hat", "pf_t"], ["pf_xw"]),
                  helper.make_node("Add", ["pf_xw", const("pool_factor_bias", t["pool_factor.bias"])], ["pf_ll"]),
                  helper.make_node("Mul", ["pf_ll", const("pool_factor_power", t["pool_factor.power"])], ["pf_term"]),
                  helper.make_node("Add", ["base_log", "pf_term"], ["scores"]),
                  helper.make_node("Softmax", ["scores"], ["probs"], axis=1)]
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

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
  max(scores)/max(prior), 1e-30))`` with the file's ``kernel_floor`` (see :mod:`svgen.adapt.temperatures`; files
  without the field are ``log``); ``probabilities`` spells the formula out.
* ``kernel`` head — ``scores = exp(-||x̂ - s||² / (2σ²)) @ vote_weights`` over the rows ``s`` of
  ``support_vectors`` (M×D unit rows, class-major), ``bandwidth`` σ, ``vote_weights`` M×C; with
  ``kernel = laplacian`` the kernel is ``exp(-||x̂ - s|| / σ)``. Large-C artifacts whose vote
  weights are sparse export them as COO: ``vote_weights.indices`` (2×nnz: row, column),
  ``vote_weights.values`` (nnz) and ``vote_weights.shape`` ([M, C]).
  Artifacts with labelled images (format 2) add ``support_labels`` (M, class of each row) and
  ``support_source`` (M, 0 = text, 1 = image, 2 = unlabelled pool image placed by the transductive
  kernel head); the formula is the same. Artifacts adapted to shots (format 3, :mod:`svgen.adapt.residual`)
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

import numpy as np

from svgen import safeio
from svgen.errors import SvgenError
from svgen.io.head_tensors import EXPORT_FORMATS, EXPORT_HEADS, HEAD_FORMAT, head_metadata, head_tensors
from svgen.io.onnx_graph import onnx_model, verify_onnx

__all__ = ["export_head", "load_head", "head_tensors", "head_metadata", "onnx_model", "verify_onnx"]

log = logging.getLogger(__name__)


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
        strings["classes"] = np.asarray(list(clf.class_names_), dtype=str)
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

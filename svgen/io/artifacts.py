"""The artifact: a directory with ``svgen.json`` and ``weights.safetensors``. No pickle anywhere.

``weights.safetensors`` holds at least (C classes, K support vectors each, dimension D):

=====================  ==========  ==============================================
``support_vectors``    C×K×D       unit rows, class-major
``bandwidth``          scalar      σ
``vote_weights``       CK×C        kernel-ridge vote weights A
``linear_head.weight`` C×D         W
``linear_head.bias``   C           b
``prototypes``         C×D         unit rows (the cosine baseline)
=====================  ==========  ==============================================

Large-C artifacts (where a dense CK×C ``vote_weights`` would not fit in memory, see
:mod:`svgen.core.scale`) store A as a sparse COO matrix instead: ``vote_weights.indices`` (2×nnz
int64: row, column) and ``vote_weights.values`` (nnz float32), with ``svgen.json`` saying so
under ``"vote_weights": {"layout": "coo", "shape": [CK, C], "nnz": …}``. Scores are still exactly
``k(x̂, S) @ A`` (e.g. ``scipy.sparse.coo_matrix((values, (rows, cols)), shape)``);
:func:`load_artifact` returns A as a torch sparse COO tensor under ``vote_weights``.

plus ``per_template`` (C×T×D) and the generator's parameters (``generator.*``) so classes can
be added later, and ``temperature.kernel`` / ``temperature.linear`` / ``temperature.cosine``
(scalars: ``predict_proba`` is ``softmax(logits / T)``, see :mod:`svgen.adapt.temperatures`; svgen.json
says how they were set under ``calibration``, and which logits the kernel head's T belongs to under
``calibration.kernel_logits``: ``"log"``, log max(score, 1e-30), or ``"score"``, the raw vote; absent
means ``"log"``, which is what artifacts written before the choice existed use). The vote weights are stored times M·λ
(``svgen.json``: ``"vote_weights_scale": {"factor": M·λ, ...}``) so scores read as kernel mass;
artifacts without that key are scaled when loaded, once.

**Format version 2** (labelled images as support vectors, :mod:`svgen.adapt.lda`): ``support_vectors``
is M×D (text rows first, class-major, then the image rows), with ``support_labels`` (M, int64:
the class of each row) and ``support_source`` (M, uint8: 0 = text, 1 = image, 2 = pool; the names are in
``svgen.json`` under ``"support_source"``); ``vote_weights`` is M×C and the scores keep the same
formula. The zero-shot state the images were added to travels as ``text.support_vectors``
(C×K×D), ``text.bandwidth``, ``text.vote_weights``, ``text.linear_head.weight`` and
``text.linear_head.bias``, so more shots can be added later without re-encoding any text.
Artifacts without images are written as version 1, exactly as before; both versions load.

An artifact adapted to unlabelled images (:mod:`svgen.adapt.solvers.transduction`) keeps its version; its
``linear_head.*`` is then the transductive posterior and the inductive linear head travels as
``inductive.linear_head.weight`` (C×D) and ``inductive.linear_head.bias`` (C), with
``svgen.json`` recording the solve under ``"transductive"``. A pool's factor on some heads' probabilities (with
shots, or the kernel head after a zero-shot pool) makes it version 6, its kernel rows listed one by one. Version 2
artifacts written by earlier releases may carry a kernel vote re-solved with unlabelled ``pool`` rows (source 2,
labelled by the argmax of their posterior) after the text and image rows, the inductive kernel head then travelling
as ``inductive.vote_weights`` (M₀×C, over the first M₀ = text + image rows) and ``inductive.bandwidth``; they load as
they were written. Writes are atomic: everything goes to a temporary sibling directory that is
renamed into place; an existing artifact is replaced only with ``force=True``, by an atomic exchange,
and only when it is an svgen artifact or an empty folder, never inside another artifact (docs/reliability.md). Each
write holds the artifact's writer lock (:func:`svgen.locks.artifact_lock`), which a load-to-replace holds throughout.
Reading follows no symbolic link inside the folder: ``svgen.json`` or ``weights.safetensors`` as a link is refused.
"""

from __future__ import annotations

import json
import math
import logging
import os
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from svgen import safeio
from svgen.io import schema
from svgen.errors import SvgenError
from svgen.locks import artifact_lock
from svgen.steps import timed

log = logging.getLogger(__name__)

FORMAT_VERSION = 1          # zero-shot artifacts (text support vectors only)
FORMAT_VERSION_SHOTS = 2    # artifacts with image support vectors
FORMAT_VERSION_PRIOR = 3    # format 2 whose kernel head adds the zero-shot probabilities (svgen.adapt.residual)
FORMAT_VERSION_MIXTURE = 4  # format 2 or 3 with a "mixture" head (calibration.mixture_weight; svgen.adapt.temperatures)
FORMAT_VERSION_SHOTLESS = 5  # format 4 whose mixture tilts the classes without shots (calibration.shotless_offset;
                             # svgen.adapt.shotless): a reader of format 4 would ignore the tilt, so it must refuse
FORMAT_VERSION_POOL_FACTOR = 6  # format 2–4 after a pool with shots: some heads × the pool's class likelihood to a power
                                # (pool_factor.* tensors, calibration.pool_factor_powers; svgen.state.PoolFactor): a
                                # reader of format 4 would ignore the factor, so it must refuse
FORMAT_VERSIONS = (FORMAT_VERSION, FORMAT_VERSION_SHOTS, FORMAT_VERSION_PRIOR, FORMAT_VERSION_MIXTURE,
                   FORMAT_VERSION_SHOTLESS, FORMAT_VERSION_POOL_FACTOR)
IMAGE_ROW_VERSIONS = FORMAT_VERSIONS[1:]   # kernel rows one by one
MIXTURE_VERSIONS = (FORMAT_VERSION_MIXTURE, FORMAT_VERSION_SHOTLESS, FORMAT_VERSION_POOL_FACTOR)
META_FILE = "svgen.json"
WEIGHTS_FILE = "weights.safetensors"
REQUIRED = ("support_vectors", "bandwidth", "vote_weights", "linear_head.weight", "linear_head.bias", "prototypes")


def _json_default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot serialise {type(o).__name__}")


def save_artifact(path, tensors: Dict[str, torch.Tensor], meta: dict, force: bool = False) -> Path:
    """Validate and write an artifact directory (see module docstring)."""
    missing = [k for k in REQUIRED if k not in tensors]
    if missing:
        raise ValueError(f"artifact is missing tensors: {missing}")
    meta = dict(meta)
    meta = {"format_version": meta.pop("format_version", FORMAT_VERSION), **meta}
    tensors = dict(tensors)
    A = tensors.get("vote_weights")
    if A is not None and A.is_sparse:
        A = A.detach().cpu().coalesce()
        tensors.pop("vote_weights")
        tensors["vote_weights.indices"] = A.indices().to(torch.int64)
        tensors["vote_weights.values"] = A.values()
        meta["vote_weights"] = {"layout": "coo", "shape": list(A.shape), "nnz": int(A._nnz()),
                                "tensors": ["vote_weights.indices", "vote_weights.values"]}
    else:
        meta.pop("vote_weights", None)
    tensors = {k: v.detach().cpu().contiguous().float() if v.is_floating_point() else v.detach().cpu().contiguous()
               for k, v in tensors.items()}
    seen = set()   # safetensors refuses two names over one storage (a state may hold one tensor twice: the zero-shot
    for k, v in tensors.items():   # votes are also the inductive ones after a zero-shot pool); each name gets its own
        if v.untyped_storage().data_ptr() in seen:
            tensors[k] = v.clone()
        seen.add(tensors[k].untyped_storage().data_ptr())

    with timed(log, f"artifact {path} checked and written"):
        text = _check_readable(path, tensors, meta, A)

        def write_meta(p):
            p.write_text(text + "\n", encoding="utf-8")

        safeio.check_dir_target(path, force)   # a refused target is one line before any lock file is made
        with artifact_lock(path):   # one writer at a time: add-classes holds it from its load to here
            return safeio.atomic_dir(path, {WEIGHTS_FILE: lambda p: save_file(tensors, str(p)),
                                            META_FILE: write_meta}, force=force)


def _check_readable(path, tensors: Dict[str, torch.Tensor], meta: dict, votes) -> str:
    """What :func:`load_artifact` checks, on what is about to be written: svgen never writes an artifact it would
    refuse to read (a temperature beyond its range once saved fine and then failed to load). ``votes``: the vote
    weights as given (a sparse one is checked as the loader rebuilds it). Returns the ``svgen.json`` text it checked,
    which is what gets written."""
    where = f"{path} (not written)"
    try:
        text = json.dumps(meta, indent=2, ensure_ascii=False, default=_json_default, allow_nan=False)
    except ValueError as e:
        raise SvgenError(f"{where}: svgen.json would hold a value JSON cannot ({e})") from None
    schema.validate_meta(json.loads(text), where, FORMAT_VERSIONS)
    check_dtypes(tensors, where)
    check_shapes(meta, {**tensors, **({"vote_weights": votes} if votes is not None and votes.is_sparse else {})},
                 where)
    return text


def load_artifact(path) -> Tuple[dict, Dict[str, torch.Tensor]]:
    """Read and check an artifact; every defect is one :class:`SvgenError` line."""
    path = Path(path)
    if not path.is_dir():
        raise SvgenError(f"{path} is not an svgen artifact directory (expected {META_FILE} and {WEIGHTS_FILE} inside)")
    if not os.path.lexists(path / META_FILE):
        raise SvgenError(f"{path} is not an svgen artifact: {META_FILE} is missing")
    # follow=False: a link inside the folder (svgen.json to any file, the weights to another artifact's) is refused
    meta = schema.validate_meta(schema.parse_meta(safeio.read_regular(path / META_FILE, what="artifact file",
                                                                      follow=False),
                                                  path / META_FILE), path / META_FILE, FORMAT_VERSIONS)
    if not os.path.lexists(path / WEIGHTS_FILE):
        raise SvgenError(f"{path} is incomplete: {WEIGHTS_FILE} is missing")
    safeio.check_regular(path / WEIGHTS_FILE, "artifact file", follow=False)  # a FIFO or device: hang or no end
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except PermissionError as e:
        raise safeio.os_error(e, f"cannot read {path / WEIGHTS_FILE}") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise SvgenError(f"{path / WEIGHTS_FILE} is unreadable or truncated ({str(e).splitlines()[0] if str(e) else 'bad file'})") from None
    check_dtypes(tensors, path / WEIGHTS_FILE)
    _sparse_vote_weights(meta, tensors, path)
    missing = [k for k in REQUIRED if k not in tensors]
    if missing:
        raise SvgenError(f"{path / WEIGHTS_FILE} lacks required tensor(s): {', '.join(missing)}")
    check_shapes(meta, tensors, path)
    _check_calibration(meta, path)
    return meta, tensors


def _check_calibration(meta: dict, path) -> None:
    """``calibration`` (optional) is an object; its ``kernel_logits`` (optional: absent means "log")
    is one of :data:`svgen.core.logits.KERNEL_LOGITS`."""
    from svgen.core.logits import check_kernel_logits

    cal = meta.get("calibration")
    if cal is None:
        return
    if not isinstance(cal, dict):
        raise SvgenError(f"{path / META_FILE}: 'calibration' must be a JSON object, got {type(cal).__name__}")
    if "kernel_logits" in cal:
        check_kernel_logits(cal["kernel_logits"], f"{path / META_FILE}: calibration.kernel_logits")


def _sparse_vote_weights(meta: dict, tensors: Dict[str, torch.Tensor], path) -> None:
    """Rebuild a sparse COO ``vote_weights`` from its two tensors when ``svgen.json`` says so."""
    info = meta.get("vote_weights")
    if info is None:
        return
    if not isinstance(info, dict) or info.get("layout") != "coo":
        raise SvgenError(f"{path / META_FILE}: 'vote_weights' must describe a 'coo' layout, got {info!r}")
    try:
        idx, val = tensors.pop("vote_weights.indices"), tensors.pop("vote_weights.values")
    except KeyError:
        raise SvgenError(f"{path / WEIGHTS_FILE} lacks vote_weights.indices / vote_weights.values "
                         "(svgen.json declares sparse vote weights)") from None
    shape = info.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(n, int) and n > 0 for n in shape)):
        raise SvgenError(f"{path / META_FILE}: vote_weights shape must be [rows, columns], got {shape!r}")
    if idx.dim() != 2 or idx.shape[0] != 2 or val.dim() != 1 or idx.shape[1] != val.shape[0]:
        raise SvgenError(f"{path}: sparse vote weights have indices {tuple(idx.shape)} and values "
                         f"{tuple(val.shape)}; expected (2, nnz) and (nnz,)")
    idx = idx.to(torch.int64)
    if idx.numel() and (int(idx.min()) < 0 or int(idx[0].max()) >= shape[0] or int(idx[1].max()) >= shape[1]):
        raise SvgenError(f"{path}: sparse vote-weight indices fall outside the declared shape {shape}")
    # the bounds were checked just above, so torch's own (warning, slower) check is opted out of
    tensors["vote_weights"] = torch.sparse_coo_tensor(idx, val, tuple(shape), check_invariants=False).coalesce()


def check_shapes(meta: dict, t: Dict[str, torch.Tensor], where="artifact") -> None:
    classes = meta.get("classes")
    if not isinstance(classes, list) or len(classes) < 2:
        raise SvgenError(f"{where}: svgen.json must list at least 2 class names under 'classes'")
    C = len(classes)
    _check_temperatures(t, where)
    _check_optional_shapes(C, t, where)
    if meta.get("format_version") in IMAGE_ROW_VERSIONS:
        _check_shapes_v2(C, t, where)
        return _check_recorded(meta, t, where)
    S = t["support_vectors"]
    if S.dim() != 3 or S.shape[0] != C:
        raise SvgenError(f"{where}: support_vectors has shape {tuple(S.shape)}, expected ({C}, K, D)")
    K, D = S.shape[1], S.shape[2]
    expected = {
        "bandwidth": (),
        "vote_weights": (C * K, C),
        "linear_head.weight": (C, D),
        "linear_head.bias": (C,),
        "prototypes": (C, D),
    }
    for name, shape in expected.items():
        if tuple(t[name].shape) != shape:
            raise SvgenError(f"{where}: {name} has shape {tuple(t[name].shape)}, expected {shape}")
    _check_bandwidths(t, REQUIRED, where)
    _check_recorded(meta, t, where)


def _check_recorded(meta: dict, t: Dict[str, torch.Tensor], where) -> None:
    """What ``svgen.json`` says about the tensors (``dim``, ``n_support``, the encoder's ``embed_dim``) matches
    them, and no prototype is a zero row (every head L2-normalises it: its class would score NaN or nothing)."""
    P = t["prototypes"]
    K = (t["text.support_vectors"] if "text.support_vectors" in t else t["support_vectors"]).shape[1]
    enc = meta.get("encoder") if isinstance(meta.get("encoder"), dict) else {}
    recorded = [("dim", meta.get("dim"), P.shape[1], "prototypes", tuple(P.shape)),
                ("n_support", meta.get("n_support"), K, "text support vectors",
                 tuple((t["text.support_vectors"] if "text.support_vectors" in t else t["support_vectors"]).shape)),
                ("encoder.embed_dim", enc.get("embed_dim"), P.shape[1], "prototypes", tuple(P.shape)),
                ("encoder.images.embed_dim", (enc.get("images") or {}).get("embed_dim"), P.shape[1], "prototypes",
                 tuple(P.shape))]
    for field, value, actual, tensor, shape in recorded:
        if value is not None and value != actual:
            raise SvgenError(f"{where}: svgen.json says {field} = {value!r}, but {tensor} has shape {shape} "
                             f"(so {actual}); the file and the weights do not belong together")
    zero = (P.abs().amax(dim=1) == 0).nonzero()
    if zero.numel():
        row = int(zero[0])
        raise SvgenError(f"{where}: prototypes row {row} (class {meta['classes'][row]!r}) is all zero; "
                         "a prototype is a unit vector, so the weights are damaged")


INTEGER_TENSORS = ("support_labels", "support_source", "vote_weights.indices", "inductive.support_labels",
                   "inductive.support_source")
MAX_ABS = 1e12               # any stored value: beyond this scores overflow float32 (svgen's are < 1e4)
BANDWIDTH_RANGE = (1e-6, 1e6)  # σ on unit vectors (distances ≤ 2); outside it the kernel is 0/0 or constant
TEMPERATURE_RANGE = (1e-8, 1e8)  # softmax temperatures: logits / T must not overflow


def check_dtypes(t: Dict[str, torch.Tensor], where) -> None:
    """svgen writes finite float32 tensors of moderate size and integer labels/indices; anything else (f16,
    f64, bool, int where floats belong, complex, NaN, inf or values above :data:`MAX_ABS` anywhere) is
    refused rather than silently converted."""
    for name, x in t.items():
        if name in INTEGER_TENSORS:
            if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
                raise SvgenError(f"{where}: {name} is stored as {str(x.dtype).replace('torch.', '')}; "
                                 "expected integers")
        elif x.dtype != torch.float32:
            raise SvgenError(f"{where}: {name} is stored as {str(x.dtype).replace('torch.', '')}; svgen writes float32")
        elif not torch.isfinite(x).all():
            raise SvgenError(f"{where}: {name} contains NaN or inf")
        elif x.numel() and float(x.abs().max()) > MAX_ABS:
            raise SvgenError(f"{where}: {name} holds values up to {float(x.abs().max()):.3g}; svgen's are far below "
                             f"{MAX_ABS:.0e}, and larger ones overflow the scores")


def _check_bandwidths(t: Dict[str, torch.Tensor], names, where) -> None:
    """The bandwidths' range (every float tensor is already known finite and bounded, :func:`check_dtypes`)."""
    lo, hi = BANDWIDTH_RANGE
    for name in names:
        if name.endswith("bandwidth") and not lo <= float(t[name]) <= hi:
            raise SvgenError(f"{where}: {name} must be in [{lo:g}, {hi:g}], got {float(t[name])}")


REQUIRED_V2 = ("support_labels", "support_source", "text.support_vectors", "text.bandwidth", "text.vote_weights",
               "text.linear_head.weight", "text.linear_head.bias")


def _check_shapes_v2(C: int, t: Dict[str, torch.Tensor], where) -> None:
    """Version 2: M×D support rows with a class and a source each, M×C vote weights, the text state."""
    missing = [k for k in REQUIRED_V2 if k not in t]
    if missing:
        raise SvgenError(f"{where}: a version-2 artifact needs tensor(s) {', '.join(missing)}")
    S, T = t["support_vectors"], t["text.support_vectors"]
    if S.dim() != 2 or T.dim() != 3 or T.shape[0] != C or T.shape[2] != S.shape[1]:
        raise SvgenError(f"{where}: support_vectors {tuple(S.shape)} / text.support_vectors {tuple(T.shape)} "
                         f"are not M×D / ({C}, K, D)")
    M, D = S.shape
    K = T.shape[1]
    if t["vote_weights"].is_sparse or t["text.vote_weights"].is_sparse:
        raise SvgenError(f"{where}: version-2 vote weights must be dense")
    expected = {
        "bandwidth": (), "text.bandwidth": (),
        "vote_weights": (M, C), "support_labels": (M,), "support_source": (M,),
        "text.vote_weights": (C * K, C), "text.linear_head.weight": (C, D), "text.linear_head.bias": (C,),
        "linear_head.weight": (C, D), "linear_head.bias": (C,), "prototypes": (C, D),
    }
    for name, shape in expected.items():
        if tuple(t[name].shape) != shape:
            raise SvgenError(f"{where}: {name} has shape {tuple(t[name].shape)}, expected {shape}")
    labels, source = t["support_labels"].to(torch.int64), t["support_source"].to(torch.int64)
    if M and (int(labels.min()) < 0 or int(labels.max()) >= C):
        raise SvgenError(f"{where}: support_labels must be class indices 0..{C - 1}")
    if not ((source >= 0) & (source <= 2)).all():
        raise SvgenError(f"{where}: support_source must be 0 (text), 1 (image) or 2 (pool)")
    _check_bandwidths(t, REQUIRED + ("text.support_vectors", "text.bandwidth", "text.vote_weights",
                                 "text.linear_head.weight", "text.linear_head.bias"), where)


def _check_optional_shapes(C: int, t: Dict[str, torch.Tensor], where) -> None:
    """``per_template`` is C×T×D and ``metric.precision`` D×D, D the prototypes' dimension."""
    D = t["prototypes"].shape[-1] if t["prototypes"].dim() == 2 else None
    E, M = t.get("per_template"), t.get("metric.precision")
    if E is not None and (E.dim() != 3 or E.shape[0] != C or E.shape[1] < 1 or E.shape[2] != D):
        raise SvgenError(f"{where}: per_template has shape {tuple(E.shape)}, expected ({C}, T, {D})")
    if M is not None and tuple(M.shape) != (D, D):
        raise SvgenError(f"{where}: metric.precision has shape {tuple(M.shape)}, expected ({D}, {D})")


def _check_temperatures(t: Dict[str, torch.Tensor], where) -> None:
    for name in (k for k in t if k.startswith("temperature.")):  # optional: per-head softmax temperatures
        if t[name].dim() != 0 or not (torch.isfinite(t[name]) and TEMPERATURE_RANGE[0] <= float(t[name])
                                      <= TEMPERATURE_RANGE[1]):
            raise SvgenError(f"{where}: {name} must be a scalar in [{TEMPERATURE_RANGE[0]:g}, "
                             f"{TEMPERATURE_RANGE[1]:g}], got " + (f"{float(t[name])}" if t[name].dim() == 0
                                                                    else f"shape {tuple(t[name].shape)}"))


def kernel_prior(meta: dict, t: Dict[str, torch.Tensor], name: str, where) -> Optional[float]:
    """The kernel head's zero-shot prior term (``softmax(τ · x̂ P̂ᵀ)`` added to the vote): its logit scale τ
    from tensor ``name``, or None where there is none. Only formats 3 to 6 have one; τ must be a positive number."""
    if name not in t:
        return None
    if meta.get("format_version") not in (FORMAT_VERSION_PRIOR, *MIXTURE_VERSIONS):
        raise SvgenError(f"{where}: {name} is only valid in format version {FORMAT_VERSION_PRIOR} to "
                         f"{FORMAT_VERSION_POOL_FACTOR} artifacts")
    v = t[name]
    if v.numel() != 1 or not v.is_floating_point() or not (math.isfinite(float(v)) and float(v) > 0):
        raise SvgenError(f"{where}: {name} must be one positive number")
    return float(v)

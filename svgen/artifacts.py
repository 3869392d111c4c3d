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

plus ``per_template`` (C×T×D) and the generator's parameters (``generator.*``) so classes can
be added later. Writes are atomic: everything goes to a temporary sibling directory that is
renamed into place; an existing artifact is replaced only with ``force=True``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import SvgenError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
META_FILE = "svgen.json"
WEIGHTS_FILE = "weights.safetensors"
REQUIRED = ("support_vectors", "bandwidth", "vote_weights", "linear_head.weight", "linear_head.bias", "prototypes")


def _json_default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot serialise {type(o).__name__}")


def write_atomic_dir(path, files: Dict[str, callable], force: bool = False) -> Path:
    """Create directory ``path`` from ``{name: writer(file_path)}`` atomically.

    Files are written into a temporary sibling directory which is then renamed into place, so a
    failure at any point leaves no half-written artifact and never harms an existing one.
    """
    path = Path(path)
    if path.exists() and not force:
        raise SvgenError(f"{path} already exists; pass --force to overwrite it")
    if path.exists() and not path.is_dir():
        raise SvgenError(f"{path} exists and is not a directory")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise SvgenError(f"cannot write {path}: folder {parent} does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=parent))
    try:
        for name, writer in files.items():
            writer(tmp / name)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=parent))
            os.replace(path, old / "artifact")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def save_artifact(path, tensors: Dict[str, torch.Tensor], meta: dict, force: bool = False) -> Path:
    """Validate and write an artifact directory (see module docstring)."""
    missing = [k for k in REQUIRED if k not in tensors]
    if missing:
        raise ValueError(f"artifact is missing tensors: {missing}")
    meta = {"format_version": FORMAT_VERSION, **meta}
    tensors = {k: v.detach().cpu().contiguous().float() if v.is_floating_point() else v.detach().cpu().contiguous()
               for k, v in tensors.items()}

    def write_meta(p):
        p.write_text(json.dumps(meta, indent=2, ensure_ascii=False, default=_json_default, allow_nan=False) + "\n",
                     encoding="utf-8")

    return write_atomic_dir(path, {WEIGHTS_FILE: lambda p: save_file(tensors, str(p)), META_FILE: write_meta},
                            force=force)


def load_artifact(path) -> Tuple[dict, Dict[str, torch.Tensor]]:
    """Read and check an artifact; every defect is one :class:`SvgenError` line."""
    path = Path(path)
    if not path.is_dir():
        raise SvgenError(f"{path} is not an svgen artifact directory (expected {META_FILE} and {WEIGHTS_FILE} inside)")
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SvgenError(f"{path} is not an svgen artifact: {META_FILE} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SvgenError(f"{path / META_FILE} is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise SvgenError(f"{path / META_FILE} must hold a JSON object")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise SvgenError(f"{path} has format_version {version!r}; this svgen reads version {FORMAT_VERSION}")
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except FileNotFoundError:
        raise SvgenError(f"{path} is incomplete: {WEIGHTS_FILE} is missing") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise SvgenError(f"{path / WEIGHTS_FILE} is unreadable or truncated ({str(e).splitlines()[0] if str(e) else 'bad file'})") from None
    missing = [k for k in REQUIRED if k not in tensors]
    if missing:
        raise SvgenError(f"{path / WEIGHTS_FILE} lacks required tensor(s): {', '.join(missing)}")
    check_shapes(meta, tensors, path)
    return meta, tensors


def check_shapes(meta: dict, t: Dict[str, torch.Tensor], where="artifact") -> None:
    classes = meta.get("classes")
    if not isinstance(classes, list) or len(classes) < 2:
        raise SvgenError(f"{where}: svgen.json must list at least 2 class names under 'classes'")
    C = len(classes)
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
    for name in REQUIRED:
        if not torch.isfinite(t[name]).all():
            raise SvgenError(f"{where}: {name} contains NaN or inf")
    if not float(t["bandwidth"]) > 0:
        raise SvgenError(f"{where}: bandwidth must be positive, got {float(t['bandwidth'])}")

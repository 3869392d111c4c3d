"""Which weights an encoder is: a checkpoint's sha256, and the identity an artifact records (and the prompt cache
is keyed by), known before the model is loaded where it can be."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Dict, Optional


from svgen.encoders.activation import decide_quick_gelu
from svgen.errors import SvgenError
from svgen.safeio import check_regular, os_error

log = logging.getLogger(__name__)

DISK_MEMO_BYTES = 64 << 20   # checkpoints from this size up remember their sha256 on disk across commands


def file_sha256(path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes (identifies a checkpoint in caches and artifacts).

    Memoised on (real path, size, modification and change times, inode): in the process (a command that checks
    the prompt cache and then loads the model hashes a 600 MB checkpoint once) and, for checkpoints of
    :data:`DISK_MEMO_BYTES` or more, on disk under the svgen cache folder (``sha256/``), so that every later
    command skips the hash (a second or more per command for large weights) until the file changes.
    """
    st = check_regular(path, "weights file")
    try:
        return _sha256_of(os.path.realpath(path), st.st_size, st.st_mtime_ns, chunk, st.st_ctime_ns, st.st_ino)
    except OSError as e:
        raise os_error(e, f"cannot read weights file {path}") from None


@functools.lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int, chunk: int, ctime_ns: int = 0, ino: int = 0) -> str:
    memo = None
    if size >= DISK_MEMO_BYTES:
        from svgen.encoders.prototypes import cache_dir

        stamp = hashlib.sha256(f"{path}\0{size}\0{mtime_ns}\0{ctime_ns}\0{ino}".encode()).hexdigest()
        memo = cache_dir() / "sha256" / stamp
        try:
            known = memo.read_text(encoding="ascii").strip()
            if len(known) == 64 and all(c in "0123456789abcdef" for c in known):
                return known
        except (OSError, UnicodeDecodeError):
            pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    digest = h.hexdigest()
    if memo is not None:
        try:
            from svgen.safeio import atomic_text

            memo.parent.mkdir(parents=True, exist_ok=True)
            atomic_text(memo, digest + "\n", force=True)
        except (OSError, SvgenError) as e:   # a read-only cache (or a link there) costs the hash next time, nothing else
            log.debug("could not remember the sha256 of %s: %s", path, e)
    return digest


def identity_key(identity: dict) -> str:
    """A short stable hash of an encoder identity (model, pretrained tag, checkpoint sha256, activation).

    ``quick_gelu`` joins the hash only when it is known, so prompt caches written before svgen
    recorded the activation are not reused by an encoder whose activation may differ.
    """
    text = f"{identity.get('model')}|{identity.get('pretrained')}|{identity.get('checkpoint_sha256')}"
    if identity.get("quick_gelu") is not None:
        text += f"|quick_gelu={bool(identity['quick_gelu'])}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# ----------------------------------------------------------------------------- activation


def local_dir_weights(folder: Path) -> Optional[str]:
    """The weights file open_clip picks in a ``local-dir:`` folder, or ``None`` if there is none."""
    try:
        from open_clip.factory import _find_checkpoint_in_dir

        return _find_checkpoint_in_dir(Path(folder))
    except ImportError:  # pragma: no cover - older/newer open_clip: same preference order by hand
        for name in ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                     "open_clip_pytorch_model.bin", "open_clip_pytorch_model.pth"):
            if (Path(folder) / name).is_file():
                return str(Path(folder) / name)
        found = sorted(p for ext in ("*.safetensors", "*.bin", "*.pth") for p in Path(folder).glob(ext))
        return str(found[0]) if found else None


def hf_hub_weights_sha256(model: str) -> Optional[str]:
    """sha256 of the weights file open_clip loaded for ``hf-hub:ORG/REPO`` (resolved from the local
    cache the way open_clip resolves it), so artifacts can check that the same weights embed images."""
    from open_clip.pretrained import download_pretrained_from_hf

    try:
        return file_sha256(download_pretrained_from_hf(model[len("hf-hub:"):]))
    except Exception as e:  # the model loaded, so this only fails if the cache changed underneath: not fatal
        log.warning("could not hash the weights of %s (%s)", model, (str(e).splitlines() or [""])[0][:200])
        return None


def encoder_identity(model: str, pretrained: Optional[str] = None, checkpoint: Optional[str] = None,
                     quick_gelu: Optional[bool] = None) -> Optional[Dict[str, object]]:
    """What ``ClipEncoder(model, pretrained, checkpoint, quick_gelu=…).identity()`` will be, without
    building the model.

    Lets a command look its prompts up in the cache (and compare against an artifact's encoder)
    before paying for a model load. ``None`` when it cannot be known without loading (a named file
    is missing, or an ``hf-hub:`` model decides its activation in a config that is not read here):
    the caller then builds the :class:`ClipEncoder`, which reports problems in its own words. The
    activation is :func:`decide_quick_gelu`'s decision; a model whose towers have no open_clip MLPs
    records ``None`` once built, so its key differs and the cache is simply not used.
    """
    name, sha = model, None
    if model.startswith("hf-hub:"):  # its weights' sha256 is known once open_clip has resolved them
        return None
    if model.endswith(".json"):
        if not os.path.isfile(model):
            return None
        import open_clip

        open_clip.add_model_config(model)  # as ClipEncoder does: the decision reads the registered config
        name = Path(model).stem
    elif model.startswith("local-dir:"):
        folder = Path(model[len("local-dir:"):])
        weights = local_dir_weights(folder) if (folder / "open_clip_config.json").is_file() else None
        if weights is None:
            return None
        sha = file_sha256(weights)
    if checkpoint:
        if not os.path.isfile(checkpoint):
            return None
        sha = file_sha256(checkpoint)
    act, _ = decide_quick_gelu(name, pretrained, checkpoint, quick_gelu)
    if act is None and name.startswith("local-dir:"):
        try:
            cfg = json.loads((Path(name[len("local-dir:"):]) / "open_clip_config.json").read_text(encoding="utf-8"))
            act = bool((cfg.get("model_cfg") or {}).get("quick_gelu", False))
        except (OSError, ValueError, AttributeError):
            return None
    if act is None:
        return None
    return {"model": name, "pretrained": pretrained,
            "checkpoint": os.path.basename(str(checkpoint)) if checkpoint else None, "checkpoint_sha256": sha,
            "quick_gelu": act}



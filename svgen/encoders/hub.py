"""Fail fast when pretrained weights are neither cached nor downloadable.

open_clip (through huggingface_hub) retries unreachable hosts for about a minute before it
fails with a traceback. :func:`check_weights_reachable` decides in well under a second whether
the weights a name/tag refers to are already in the local cache, and if not, probes the host
once with a short timeout. It reads open_clip's table of pretrained weights without importing
torch or the model code, so the whole check (and the CLI's error) comes within a few seconds.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys
import threading
import types
from typing import Optional, Sequence, Tuple
from urllib.parse import urlparse

from svgen.errors import EncoderUnavailableError

PROBE_TIMEOUT_S = float(os.environ.get("SVGEN_HUB_PROBE_TIMEOUT", "2.5"))
WEIGHT_NAMES = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin")


def _pretrained_module():
    """open_clip's ``pretrained`` module, loaded without running ``open_clip/__init__`` (no torch)."""
    if "open_clip" in sys.modules and hasattr(sys.modules["open_clip"], "get_pretrained_cfg"):
        return sys.modules["open_clip"]
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - open_clip is a dependency
        raise ImportError("open_clip is not installed")
    saved = {k: sys.modules.get(k) for k in ("open_clip", "open_clip.pretrained", "open_clip.constants",
                                             "open_clip.version", "safetensors.torch")}
    shell = types.ModuleType("open_clip")
    shell.__path__ = list(spec.submodule_search_locations)
    sys.modules["open_clip"] = shell
    sys.modules["safetensors.torch"] = None  # keeps torch out; only affects this throw-away copy
    try:
        return importlib.import_module("open_clip.pretrained")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def host_reachable(host: str, port: int = 443, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` seconds, DNS included."""
    result = {"ok": False}

    def probe():
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result["ok"] = True
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return result["ok"]


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hf_cached(repo_id: str, filenames: Sequence[str]) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub ships with open_clip
        return False
    for name in filenames:
        hit = try_to_load_from_cache(repo_id, name)
        if isinstance(hit, str) and os.path.isfile(hit):
            return True
    return False


def hub_host() -> str:
    """The Hugging Face endpoint as ``host`` or ``host:port`` (``$HF_ENDPOINT`` honoured)."""
    return _netloc(os.environ.get("HF_ENDPOINT", "https://huggingface.co")) or "huggingface.co"


def _netloc(url: str) -> str:
    """``host`` for a URL on its scheme's default port, else ``host:port``."""
    u = urlparse(url)
    try:
        port = u.port
    except ValueError:
        port = None
    if not u.hostname:
        return ""
    return f"{u.hostname}:{port}" if port and port != _default_port(u.scheme) else u.hostname


def _default_port(scheme: str) -> int:
    return 80 if scheme == "http" else 443


def _split_host(host: str) -> Tuple[str, int]:
    """``"host:port"`` → (host, port); a bare host gets its scheme's default port (https: 443)."""
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        return name, int(port)
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", ""))
    return host, _default_port(endpoint.scheme) if endpoint.hostname == host else 443


def download_plan(model: str, pretrained: Optional[str]) -> Optional[Tuple[str, str, bool]]:
    """(what would be fetched, from which host, already cached) — ``None`` if nothing is downloaded."""
    if model.startswith("hf-hub:"):
        repo = model[len("hf-hub:"):]
        cached = hf_cached(repo, ["open_clip_config.json"]) and hf_cached(repo, WEIGHT_NAMES)
        return f"hf-hub:{repo}", hub_host(), cached
    if model.startswith("local-dir:") or not pretrained or os.path.isfile(pretrained):
        return None
    cfg = _pretrained_module().get_pretrained_cfg(model, pretrained)
    if not cfg or cfg.get("file"):
        return None
    hub = cfg.get("hf_hub", "")
    if hub:
        if hub.endswith("/"):
            repo, names = hub.rstrip("/"), WEIGHT_NAMES
        else:
            repo, filename = os.path.split(hub)
            names = (filename, filename.rsplit(".", 1)[0] + ".safetensors")
        return f"{model} weights '{pretrained}' (hf-hub:{repo})", hub_host(), hf_cached(repo, names)
    url = cfg.get("url", "")
    if url:
        cached = os.path.isfile(os.path.join(os.path.expanduser("~/.cache/clip"), os.path.basename(url)))
        return f"{model} weights '{pretrained}' ({url})", _netloc(url) or url, cached
    return None


def unavailable(what: str, why: str, model: str, pretrained: Optional[str] = None) -> EncoderUnavailableError:
    """The one-line error for weights that cannot be had, with the local-weights command that is right for them.

    Weights trained with QuickGELU (the tag's pretrained config says so: OpenAI's, LAION-400M's…)
    get ``--quick-gelu`` in the suggestion: a bare checkpoint would otherwise be built with GELU.
    """
    arch = model if not model.startswith(("hf-hub:", "local-dir:")) else "ARCH"
    quick = False
    if pretrained and arch != "ARCH":
        try:
            quick = bool(_pretrained_module().get_pretrained_cfg(model, pretrained).get("quick_gelu", False))
        except ImportError:  # pragma: no cover - open_clip is a dependency
            quick = False
    flag = " --quick-gelu" if quick and not model.endswith("-quickgelu") else ""
    why_flag = f"; '{pretrained}' weights need QuickGELU" if quick else ""
    kwarg = ", quick_gelu=True" if flag else ""
    return EncoderUnavailableError(
        f"cannot load {what}: {why}. Pass local weights instead: ClipEncoder({arch!r}, checkpoint=FILE{kwarg}) "
        f"(safetensors or .pt{why_flag}), or ClipEncoder('local-dir:PATH')",
        cli=f"cannot load {what}: {why}. Pass local weights instead: "
            f"--model {arch} --checkpoint FILE{flag} (safetensors or .pt{why_flag}), or --model local-dir:PATH")


def check_weights_reachable(model: str, pretrained: Optional[str]) -> None:
    """Raise :class:`EncoderUnavailableError` (one line) unless the weights are cached or reachable."""
    plan = download_plan(model, pretrained)
    if plan is None:
        return
    what, host, cached = plan
    if cached:
        return
    if hf_offline() and "hf-hub:" in what:
        raise unavailable(what, "not in the local cache and HF_HUB_OFFLINE is set", model, pretrained)
    if not host_reachable(*_split_host(host)):
        raise unavailable(what, f"not in the local cache and {host} is unreachable (no network?)", model, pretrained)

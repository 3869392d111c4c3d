"""How the encoder runs on this machine: batch sizes and decoding workers from the cores, the device and
the memory; the arithmetic precision (mixed precision on a GPU); the device's name for logs and ``svgen.json``.

Nothing here changes what an encoder *is* (:meth:`svgen.encoders.clip.ClipEncoder.identity`): embeddings made
in bf16 on a GPU agree with fp32 ones to cosine ≥ 0.999 (``tests/encoders/test_image_speed.py``), so artifacts
and prompt caches written on one device are used on any other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from typing import Optional

import torch

from svgen.errors import SvgenError

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
IMAGE_BATCH = {"cuda": 256, "mps": 64}   # images per encoder batch by device type; any other device: 32
TEXT_BATCH = {"cuda": 1024, "mps": 512}  # prompts per batch; any other device: 256
MAX_WORKERS = 16                         # decoding processes at most (more rarely pays on one GPU)
PREFETCH = 4                             # batches each worker decodes ahead of the encoder


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as a container or ``taskset`` sets it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def available_memory() -> Optional[int]:
    """Bytes of memory available to new allocations (``MemAvailable``), or ``None`` where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        pass
    return None


DEVICES = "auto, cpu, cuda, cuda:N or mps"
DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(?::(\d+))?")


def auto_device() -> torch.device:
    """What ``--device auto`` picks: CUDA when present, then Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def _refused(device: str, rest: str, use: str) -> SvgenError:
    """One line for the library (``device='cuda:3' …; use device='cpu'``) and one for the CLI (``--device …``)."""
    return SvgenError(f"device={device!r} {rest}; use " + " or ".join(f"device={u!r}" for u in use),
                      cli=f"--device {device} {rest}; use " + " or ".join(f"--device {u}" for u in use))


def parse_device(device) -> str:
    """The text of a device name svgen takes (:data:`DEVICES`), or one line naming the choices; nothing is checked
    against this machine (:func:`resolve_device` does)."""
    text = str(device)
    if not DEVICE_NAME.fullmatch(text):
        raise SvgenError(f"device={text!r} is not a device: use {DEVICES}",
                         cli=f"--device {text!r} is not a device: use {DEVICES}")
    return text


def resolve_device(device=None) -> torch.device:
    """The device ``device`` names on this machine: the one parser and check of every command's ``--device`` (run
    before any work, :func:`svgen.commands._common.check_args`) and of ``ClipEncoder(device=...)``.

    ``None``/``"auto"`` picks CUDA, then MPS, else the CPU (:func:`auto_device`); a name (:data:`DEVICES`) or a
    ``torch.device`` is checked against what this machine has: no CUDA, a CUDA index past the last device, no MPS
    are each one line."""
    if device is None or device == "auto":
        return auto_device()
    text = str(device) if isinstance(device, torch.device) else parse_device(device)
    found = DEVICE_NAME.fullmatch(text)
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise _refused(text, "was requested but no CUDA device is available", ["cpu"])
        count = torch.cuda.device_count()
        index = found.group(1) if found else None
        if index is not None and int(index) >= count:
            have = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            raise _refused(text, f"names CUDA device {index}, but this machine has {count} ({have})",
                           ["cuda", "cpu"])
    elif text == "mps" and not mps_available():
        raise _refused(text, "was requested but MPS (an Apple-silicon GPU with PyTorch's MPS support) is not "
                             "available here", ["cpu"])
    return device if isinstance(device, torch.device) else torch.device(text)


def device_name(device: torch.device) -> str:
    """``cpu``, ``cuda:0 (NVIDIA H100 80GB HBM3)``: what ``-v`` and ``svgen.json`` say the encoder ran on."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def autocast_dtype(device: torch.device, precision: str = "auto") -> Optional[torch.dtype]:
    """The autocast dtype for ``precision`` on ``device``; ``None`` means plain fp32.

    ``auto``: bf16 on a CUDA device that supports it, else fp16 on CUDA; fp32 on every other device (a CPU's
    bf16 is no faster for these models and MPS autocast is still partial).
    """
    if precision not in PRECISIONS:
        raise SvgenError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}",
                         cli=f"--precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if precision == "bf16" else torch.float16


def precision_label(dtype: Optional[torch.dtype]) -> str:
    """``fp32``, ``bf16`` or ``fp16`` for an :func:`autocast_dtype` result."""
    return "fp32" if dtype is None else {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def autocast(device: torch.device, dtype: Optional[torch.dtype]):
    """``torch.autocast`` for ``dtype`` on ``device`` (a no-op context for fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@dataclass(frozen=True)
class LoaderPlan:
    """How images reach the encoder: ``batch_size`` images per batch, ``workers`` decoding processes,
    ``pin_memory`` (page-locked batches, copied to a CUDA device without blocking)."""

    batch_size: int
    workers: int
    pin_memory: bool
    prefetch: Optional[int]


def image_batch_size(device: torch.device) -> int:
    """Images per encoder batch: by device type, halved while a CUDA device has under 4 GB free per 128 images."""
    batch = IMAGE_BATCH.get(device.type, 32)
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
        except Exception:  # pragma: no cover - a device that cannot say
            return batch
        while batch > 32 and free < (batch // 128) * (4 << 30):
            batch //= 2
    return batch


def text_batch_size(device: torch.device) -> int:
    return TEXT_BATCH.get(device.type, 256)


def plan_loader(n_images: int, device: torch.device, batch_size: Optional[int] = None,
                workers: Optional[int] = None, image_bytes: int = 3 * 224 * 224 * 4) -> LoaderPlan:
    """The loader for ``n_images`` on ``device``; ``batch_size``/``workers`` given by the user are kept.

    Workers: none for a couple of batches (starting processes costs more than it saves); else on an
    accelerator every core but one (the one feeding the device), on the CPU every core (a worker whose
    prefetched batches are waiting sleeps, so the encoder's threads get the cores back), at most
    :data:`MAX_WORKERS`. The batches in flight (workers × prefetch) are kept within a quarter of the available
    memory.
    """
    batch = batch_size or image_batch_size(device)
    cores = usable_cores()
    if workers is None:
        if n_images <= 2 * batch:
            workers = 0
        else:
            workers = max(1, min(MAX_WORKERS, cores if device.type == "cpu" else cores - 1))
        memory = available_memory()
        if memory and workers:
            per_worker = PREFETCH * batch * image_bytes
            workers = max(1, min(workers, memory // 4 // max(per_worker, 1)))
    return LoaderPlan(batch, workers, device.type == "cuda", PREFETCH if workers else None)

"""``--decode gpu``: JPEGs decoded and preprocessed as tensors on the encoder's device.

Decoding-worker processes only read the files' bytes; the main process decodes a batch at once with
``torchvision.io.decode_jpeg`` (nvjpeg on CUDA, libjpeg on the CPU: the same code, which is how the tests run
it) and applies the model's own preprocessing constants as tensor operations (:class:`TensorPreprocess`):
shorter side resized (bicubic with antialiasing, as PIL does), centre crop, normalisation. Whatever that
path cannot decode — files that are not baseline JPEGs, CMYK JPEGs, a file nvjpeg refuses — goes through
:func:`svgen.encoders.images.load_image` (PIL) instead, one file at a time, so the set of readable images
is the same as without it. The pixels differ from PIL's by the tolerance in ``docs/performance.md``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from svgen.encoders.images import ImageFiles, load_image
from svgen.errors import SvgenError

log = logging.getLogger(__name__)

DECODES = ("cpu", "gpu")
_PASS = {"MaybeConvertMode", "MaybeToTensor", "ToTensor", "_convert_to_rgb", "ConvertImageDtype"}


@dataclass(frozen=True)
class TensorPreprocess:
    """open_clip's ``Resize(size) → CenterCrop → ToTensor → Normalize`` on uint8 image tensors."""

    resize: int
    crop: Tuple[int, int]
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    interpolation: str = "bicubic"

    @classmethod
    def from_preprocess(cls, preprocess) -> "TensorPreprocess":
        """The constants of an open_clip preprocessing pipeline, or an error naming what is not supported."""
        from torchvision.transforms import CenterCrop, InterpolationMode, Normalize

        from svgen.encoders.images import resize_target

        steps = list(getattr(preprocess, "transforms", []) or [])
        resize = resize_target(preprocess)
        crop = norm = None
        for step in steps[1:]:
            name = getattr(step, "__name__", type(step).__name__)
            if isinstance(step, CenterCrop) and crop is None and norm is None:
                crop = tuple(int(v) for v in step.size)
            elif isinstance(step, Normalize) and norm is None:
                norm = step
            elif name not in _PASS:
                crop = norm = None
                break
        if resize is None or crop is None or norm is None:
            what = (f"the standard open_clip preprocessing (resize the shorter side, centre crop, normalise); "
                    f"this model's is {type(preprocess).__name__}({', '.join(type(s).__name__ for s in steps)})")
            raise SvgenError(f"decoding on the device supports {what}; use decode='cpu'",
                             cli=f"--decode gpu supports {what}; use --decode cpu")
        mode = steps[0].interpolation
        interpolation = {InterpolationMode.BICUBIC: "bicubic", InterpolationMode.BILINEAR: "bilinear"}.get(mode)
        if interpolation is None:
            raise SvgenError(f"decoding on the device supports bicubic or bilinear resizing, not {mode}; use decode='cpu'",
                             cli=f"--decode gpu supports bicubic or bilinear resizing, not {mode}; use --decode cpu")
        return cls(resize, crop, tuple(float(v) for v in norm.mean), tuple(float(v) for v in norm.std), interpolation)

    def __call__(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """N×3×H×W float32 from uint8 3×h×w images (sizes may differ; those of one size are resized together)."""
        import torchvision.transforms.functional as F
        from torchvision.transforms import InterpolationMode

        mode = InterpolationMode.BICUBIC if self.interpolation == "bicubic" else InterpolationMode.BILINEAR
        out: List[Optional[torch.Tensor]] = [None] * len(images)
        groups: dict = {}
        for i, im in enumerate(images):
            groups.setdefault(tuple(im.shape), []).append(i)
        for members in groups.values():
            x = torch.stack([images[i] for i in members])
            x = F.resize(x, self.resize, interpolation=mode, antialias=True)  # uint8 in, rounded uint8 out (as PIL)
            x = F.center_crop(x, list(self.crop))
            x = x.float().div_(255)
            x = F.normalize(x, self.mean, self.std)
            for j, i in enumerate(members):
                out[i] = x[j]
        return torch.stack(out)


def jpeg_components(data: bytes) -> Optional[int]:
    """The number of colour components of a JPEG's first frame (3: YCbCr, 1: grey, 4: CMYK/YCCK), or ``None``
    when ``data`` is not a JPEG whose frame header is found."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return data[i + 9] if i + 9 < n else None
        i += 2 + length
    return None


class JpegBytes(ImageFiles):
    """Worker side of ``--decode gpu``: a JPEG's bytes, or (anything else) PIL's preprocessed tensor."""

    def __getitem__(self, i):
        from svgen.filekind import irregular

        data = b""
        if irregular(self.paths[i]) is None:   # a FIFO or a device is never opened: PIL's path below says why
            try:
                with open(self.paths[i], "rb") as f:
                    data = f.read()
            except OSError:
                pass
        if jpeg_components(data) in (1, 3):
            return i, torch.frombuffer(bytearray(data), dtype=torch.uint8), None, ""
        _, x, reason = super().__getitem__(i)   # PIL, as --decode cpu reads it
        return i, None, x, reason


def collate_bytes(batch):
    return batch


def decode_batches(loader, paths: Sequence[str], preprocess, spec: TensorPreprocess, device: torch.device):
    """``(indices, images on device, [(index, reason)])`` per loader batch, in order (as the PIL path yields)."""
    import warnings

    with warnings.catch_warnings():
        # torchvision 0.29 announces that torchcodec will take over its decoders; they are what runs here
        warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)
        from torchvision.io import ImageReadMode, decode_jpeg

    def decode(data, **kw):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The image decoding", category=DeprecationWarning)
            return decode_jpeg(data, **kw)

    for batch in loader:
        jpeg = [(i, data) for i, data, _, _ in batch if data is not None]
        decoded: dict = {}
        if jpeg:
            try:
                images = decode([d for _, d in jpeg], mode=ImageReadMode.RGB, device=device)
            except Exception:  # one bad file fails the batch: decode one at a time to find it
                images = []
                for _, d in jpeg:
                    try:
                        images.append(decode(d, mode=ImageReadMode.RGB, device=device))
                    except Exception:
                        images.append(None)
            good = [(i, im) for (i, _), im in zip(jpeg, images) if im is not None and im.dim() == 3 and im.shape[0] == 3]
            if good:
                for (i, _), x in zip(good, spec([im for _, im in good])):
                    decoded[i] = x
        ok, xs, bad = [], [], []
        for i, data, x, reason in batch:
            if data is not None and i not in decoded:   # nvjpeg / libjpeg refused it: PIL decides
                x, reason = load_image(paths[i], preprocess)
                if x is not None:
                    log.debug("%s: decoded by PIL (the tensor decoder refused it)", paths[i])
            elif data is not None:
                ok.append(i)
                xs.append(decoded[i])
                continue
            if x is None:
                bad.append((i, reason))
            else:
                ok.append(i)
                xs.append(x.to(device, non_blocking=True))
        yield ok, (torch.stack(xs) if xs else None), bad

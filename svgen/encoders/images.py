"""Image files in: finding them in folders and decoding them for an encoder, a bad file reported, not fatal."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from svgen.errors import SvgenError

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


class ImageFiles(torch.utils.data.Dataset):
    def __init__(self, paths: Sequence[str], preprocess):
        self.paths = list(paths)
        self.preprocess = preprocess

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        x, reason = load_image(self.paths[i], self.preprocess)
        return i, x, reason


def resize_target(preprocess) -> Optional[int]:
    """The shorter side ``preprocess`` resizes to first (open_clip's ``Resize(224)``), or ``None`` when its
    first step is anything else (then a JPEG is always decoded in full)."""
    steps = getattr(preprocess, "transforms", None)
    if not steps:
        return None
    from torchvision.transforms import Resize

    first = steps[0]
    if not isinstance(first, Resize) or getattr(first, "max_size", None) is not None:
        return None
    size = first.size
    if isinstance(size, (list, tuple)):
        if len(size) != 1:
            return None
        size = size[0]
    return int(size) if isinstance(size, int) else None


DRAFT_FLOOR = 224  # a draft decode never goes below this (CLIP's usual input), whatever the model's input


def _draft(im, target: Optional[int]) -> None:
    """Let libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale (DCT scaling) when that still leaves its shorter side
    at least ``max(target, DRAFT_FLOOR)``: the resize that follows then starts from fewer pixels. Only for JPEGs
    at least twice that size (PIL keeps both sides ≥ the size asked for), so photos of 224 to 447 pixels decode
    in full for every model; the preprocessed pixels stay within the tolerance that
    ``tests/encoders/test_image_speed.py`` states."""
    size = max(target or 0, DRAFT_FLOOR)
    if target and im.format == "JPEG" and min(im.size) >= 2 * size:
        im.draft("RGB", (size, size))


def load_image(source, preprocess, draft: bool = True) -> Tuple[Optional[torch.Tensor], str]:
    """``(preprocess(RGB image), "")`` for a path or binary file object, or ``(None, reason)``.

    The one place images are decoded: ``svgen classify`` in one process and its Ray engine's
    decoding tasks both call it, so both see the same pixels. ``draft``: large JPEGs are decoded
    at a reduced scale (:func:`_draft`).
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, (str, Path)):
        from svgen.filekind import irregular

        why = irregular(source)
        if why is not None:   # never opened: a FIFO blocks, /dev/zero never ends
            return None, why if why == "no such file" or why.endswith("does not exist") else f"{why}, not an image file"
    try:
        with Image.open(source) as im:
            if draft:
                _draft(im, resize_target(preprocess))
            im.load()
            return preprocess(im.convert("RGB")), ""
    except Exception as e:  # any one bad file (truncated, not an image, decompression bomb) is skipped
        reason = "not an image" if isinstance(e, UnidentifiedImageError) else (str(e).splitlines() or ["unreadable"])[0]
        return None, reason or type(e).__name__


def collate(batch):
    ok = [(i, x) for i, x, _ in batch if x is not None]
    bad = [(i, why) for i, x, why in batch if x is None]
    images = torch.stack([x for _, x in ok]) if ok else None
    return [i for i, _ in ok], images, bad


def find_images(inputs: Sequence[str]) -> List[str]:
    """Expand files and folders (searched recursively, sorted) into a list of candidate image paths, every input
    in the order given (one named twice is there twice).

    Files named explicitly are kept whatever their suffix (they are checked when read); one that is not a regular
    file (a FIFO, a device, a broken symbolic link) is one line saying which. Inside folders every entry with an
    image suffix that is not a folder is taken: one that is not a regular file is then reported as skipped, with
    why, when it is read (:func:`load_image`, which never opens it).
    """
    from svgen.filekind import irregular

    paths: List[str] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES and not f.is_dir())
            paths.extend(found)
            continue
        why = irregular(p)
        if why == "no such file":
            raise SvgenError(f"no such file or folder: {item}")
        if why is not None:
            raise SvgenError(f"{item} is {why}" + ("" if why.endswith("does not exist") else
                                                   ", not an image file or a folder"))
        paths.append(str(p))
    return paths



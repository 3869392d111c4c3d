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


def load_image(source, preprocess) -> Tuple[Optional[torch.Tensor], str]:
    """``(preprocess(RGB image), "")`` for a path or binary file object, or ``(None, reason)``.

    The one place images are decoded: ``svgen classify`` in one process and its Ray engine's
    decoding tasks both call it, so both see the same pixels.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as im:
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
    """Expand files and folders (searched recursively, sorted) into a list of candidate image paths.

    Files named explicitly are kept whatever their suffix (they are checked when read); inside
    folders only files with an image suffix are taken.
    """
    paths: List[str] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            paths.extend(found)
        elif p.is_file():
            paths.append(str(p))
        else:
            raise SvgenError(f"no such file or folder: {item}")
    return paths



"""Labelled image folders for ``svgen eval --data DIR``.

Two layouts, both matched against the artifact's class names:

* **labels.csv**: ``DIR/labels.csv`` holds ``file,class`` rows (UTF-8, comma-separated, an
  optional ``file,class`` header line); files are relative to ``DIR``. This is the layout of
  ``../shared/data/images-30class``.
* **ImageFolder** (torchvision): one sub-folder per class, named after the class, with the
  images of that class anywhere below it. A folder name matches a class name exactly, or with
  underscores standing for spaces (``brown_bear`` → ``brown bear``).

Every problem is one :class:`SvgenError` line: an empty folder, an unknown class name, a row
naming a missing file, a malformed row.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

from svgen.encoders.images import IMAGE_SUFFIXES
from svgen.errors import SvgenError, setting_error

LABELS_CSV = "labels.csv"
_HEADER_FILE = {"file", "filename", "file_name", "path", "image", "img"}
_HEADER_CLASS = {"class", "label", "category", "class_name", "classname", "name"}


@dataclass
class LabelledImages:
    """Image paths with their class indices (into the artifact's class list)."""

    paths: List[str]
    labels: List[int]
    layout: str  # "labels.csv" or "imagefolder"


def _class_lookup(classes: Sequence[str]) -> Dict[str, int]:
    return {name: i for i, name in enumerate(classes)}


def _match(name: str, lookup: Dict[str, int]):
    if name in lookup:
        return lookup[name]
    alt = name.replace("_", " ")
    return lookup.get(alt)


def _unknown(names: Sequence[str], where: str, classes: Sequence[str]) -> SvgenError:
    shown = ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
    return SvgenError(f"{where} names {len(names)} class(es) the artifact does not have: {shown} "
                      f"(the artifact has {len(classes)} classes, e.g. {classes[0]!r})")


def read_labels_csv(folder: Path, classes: Sequence[str]) -> LabelledImages:
    """Read ``folder/labels.csv`` (``file,class`` rows) into paths and class indices."""
    csv_path = folder / LABELS_CSV
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise SvgenError(f"{csv_path} is not valid UTF-8") from None
    except OSError as e:
        raise SvgenError(f"cannot read {csv_path}: {e.strerror}") from None
    lookup = _class_lookup(classes)
    paths, labels, unknown = [], [], []
    first = True
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        row = [c.strip() for c in row]
        if not row or all(not c for c in row) or row[0].startswith("#"):
            continue
        if first:
            first = False
            if len(row) == 2 and row[0].lower() in _HEADER_FILE and row[1].lower() in _HEADER_CLASS:
                continue  # header line
        if len(row) != 2 or not row[0] or not row[1]:
            raise SvgenError(f"{csv_path} line {number}: expected 'file,class', got {','.join(row)!r}")
        file, name = row
        path = folder / file
        if not path.is_file():
            raise SvgenError(f"{csv_path} line {number} names {file!r}, which is not a file in {folder}")
        idx = _match(name, lookup)
        if idx is None:
            if name not in unknown:
                unknown.append(name)
            continue
        paths.append(str(path))
        labels.append(idx)
    if unknown:
        raise _unknown(unknown, str(csv_path), classes)
    if not paths:
        raise SvgenError(f"{csv_path} lists no images")
    return LabelledImages(paths, labels, "labels.csv")


def read_image_folder(folder: Path, classes: Sequence[str]) -> LabelledImages:
    """torchvision ImageFolder layout: ``folder/<class name>/**/<image>``."""
    subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subdirs:
        loose = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
        if loose:
            raise SvgenError(f"{folder} holds images but no class sub-folders and no {LABELS_CSV}; "
                             f"put each class's images in a folder named after the class, or add {LABELS_CSV} "
                             "with file,class rows")
        raise SvgenError(f"{folder} is empty: expected class-named sub-folders of images or a {LABELS_CSV}")
    lookup = _class_lookup(classes)
    unknown = [d.name for d in subdirs if _match(d.name, lookup) is None]
    if unknown:
        raise _unknown(unknown, f"{folder} (ImageFolder layout)", classes)
    paths, labels = [], []
    for d in subdirs:
        idx = _match(d.name, lookup)
        for f in sorted(d.rglob("*")):
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES:
                paths.append(str(f))
                labels.append(idx)
    if not paths:
        raise SvgenError(f"no images found under {folder} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    return LabelledImages(paths, labels, "imagefolder")


def labelled_images(folder, classes: Sequence[str]) -> LabelledImages:
    """Paths and class indices of a labelled folder: ``labels.csv`` if present, else ImageFolder."""
    folder = Path(folder)
    if not folder.exists():
        raise SvgenError(f"no such folder: {folder}")
    if not folder.is_dir():
        raise setting_error("the labelled images", "--data", f"must be a folder, got a file: {folder}")
    if (folder / LABELS_CSV).is_file():
        return read_labels_csv(folder, classes)
    return read_image_folder(folder, classes)

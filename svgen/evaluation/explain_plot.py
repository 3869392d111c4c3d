"""``svgen explain --plot``: per input, a bar chart of the top contributions to each explained class (the parts and
the support vectors' votes), with a thumbnail of the input and of the contributing shot images that are files
(needs ``svgen[plot]``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from svgen.errors import SvgenError

THUMBS = 3    # shot thumbnails per input
COLOURS = {"for": "#55a868", "against": "#c44e52", "part": "#4c72b0"}


def _thumbnail(path) -> Optional[object]:
    """A small RGB array of the image at ``path``, or None where it is no readable file."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            im.thumbnail((128, 128))
            import numpy as np

            return np.asarray(im)
    except Exception:   # a missing or unreadable file only loses its thumbnail
        return None


def _bars(row) -> Tuple[list, list, list]:
    """(labels, values, colours) of one input's bars: per class its parts, then its votes for and against."""
    labels, values, colours = [], [], []
    for c in row.classes:
        for name, v in c.parts.items():
            labels.append(f"{c.name[:18]}: {name}")
            values.append(v)
            colours.append(COLOURS["part"])
        for what, items in (("for", c.support_for), ("against", c.support_against)):
            for s in items[:3]:
                o = s.origin
                labels.append(f"{c.name[:18]} ← {o['class'][:14]} {o['kind']} #{o['row']}")
                values.append(s.value)
                colours.append(COLOURS[what])
    return labels, values, colours


def _shot_paths(row) -> List[str]:
    seen = []
    for c in row.classes:
        for s in c.support_for:
            where = s.origin["from"]
            if s.origin["kind"] == "labelled shot" and where and Path(where).is_file() and where not in seen:
                seen.append(where)
    return seen[:THUMBS]


def plot_explanations(rows: list, path, force: bool = False) -> None:
    """One figure row per ``(RowExplanation, image path or None)`` in ``rows``, written atomically to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SvgenError("plotting needs matplotlib: pip install 'svgen[plot]'",
                         cli="--plot needs matplotlib: pip install 'svgen[plot]'") from None
    from svgen.safeio import atomic_file

    n = max(len(rows), 1)
    shots = [_shot_paths(row) for row, _ in rows]
    thumbs = THUMBS if any(shots) else 0   # no shot image is a file: no thumbnail columns
    fig = plt.figure(figsize=(8 + 1.7 * thumbs, 3.6 * n))
    grid = fig.add_gridspec(n, 2 + thumbs, width_ratios=[1, 5] + [1] * thumbs)
    for i, (row, image) in enumerate(rows):
        ax = fig.add_subplot(grid[i, 0])
        thumb = _thumbnail(image) if image else None
        if thumb is not None:
            ax.imshow(thumb)
        else:
            ax.text(0.5, 0.5, "features\n" + str(row.key.get("row", "")), ha="center", va="center")
        ax.set_axis_off()
        ax.set_title(Path(str(row.key.get("path", row.key.get("source", "")))).name[:24], fontsize=8)
        labels, values, colours = _bars(row)
        ax = fig.add_subplot(grid[i, 1])
        ax.barh(range(len(values))[::-1], values, color=colours)
        ax.set_yticks(range(len(values))[::-1])
        ax.set_yticklabels(labels, fontsize=6)
        ax.axvline(0, color="black", lw=0.5)
        top = row.classes[0]
        flip = "" if row.runner_up is None else f"; runner-up {row.runner_up} by {row.margin:.3g}"
        ax.set_title(f"{row.head} head: {top.name} (score {top.score:.3g}){flip}", fontsize=9)
        for j, shot in enumerate(shots[i]):
            ax = fig.add_subplot(grid[i, 2 + j])
            thumb = _thumbnail(shot)
            if thumb is not None:
                ax.imshow(thumb)
            ax.set_axis_off()
            ax.set_title(Path(shot).name[:18], fontsize=6)
    fig.tight_layout()
    atomic_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80), force=force)
    plt.close(fig)

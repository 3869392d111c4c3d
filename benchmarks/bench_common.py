"""Shared helpers of the benchmark scripts: synthetic prototypes with real geometry, timing, output.

Prototypes are tiled from the real CLIP ViT-B/32 text embeddings of LVIS, Objects365 and
OpenImages in ``../shared/data/clip-vit-b32`` (2,068 class names), each copy perturbed so it is
about as far from its source as real neighbouring classes are from each other. When the files are
absent, points are drawn uniformly on the sphere instead (and the output says so).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as svgen does: spinning OpenMP waits stall LAPACK on shared cores

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "clip-vit-b32"
SOURCES = ("lvis_v1_clip_a+cname.npy", "o365_clip_a+cnamefix.npy", "oid_clip_a+cname.npy")
RESULTS = ROOT / "bench-results"


def real_embeddings():
    """(N×512 unit rows, description) from the shared data, or (None, reason) when absent."""
    files = [DATA / f for f in SOURCES]
    if not all(f.is_file() for f in files):
        return None, "random points on the sphere (../shared/data/clip-vit-b32 absent)"
    base = np.concatenate([np.load(f, allow_pickle=False).astype(np.float32) for f in files])
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    return base, f"tiled+perturbed LVIS/O365/OID CLIP text embeddings ({base.shape[0]} real)"


def make_prototypes(n_classes: int, dim: int = 512, n_templates: int = 1, seed: int = 0, noise: float = 0.25):
    """(C×D or C×T×D float32 prototypes, description of their source)."""
    rng = np.random.default_rng(seed)
    base, source = real_embeddings()
    if base is None or base.shape[1] != dim:
        base = rng.standard_normal((max(n_classes, 1), dim)).astype(np.float32)
        base /= np.linalg.norm(base, axis=1, keepdims=True)
        if source.startswith("tiled"):
            source = f"random points on the sphere (real embeddings have D={base.shape[1]}, asked {dim})"
    idx = np.arange(n_classes) % base.shape[0]
    # the first copy of each real class stays exact; later copies move by ~noise (a near neighbour)
    scale = np.where(np.arange(n_classes) < base.shape[0], 0.0, noise)[:, None].astype(np.float32)
    shape = (n_classes, n_templates, dim) if n_templates > 1 else (n_classes, dim)
    centre = base[idx] + scale * rng.standard_normal((n_classes, dim)).astype(np.float32) / np.sqrt(dim)
    centre /= np.linalg.norm(centre, axis=1, keepdims=True)
    if n_templates == 1:
        return centre.astype(np.float32), source
    emb = centre[:, None, :] + 0.15 * rng.standard_normal(shape).astype(np.float32) / np.sqrt(dim)
    emb /= np.linalg.norm(emb, axis=-1, keepdims=True)
    return emb.astype(np.float32), source


def write_inputs(n_classes: int, folder, dim: int = 512, seed: int = 0):
    """Write ``protos-C.npy`` and ``classes-C.txt`` into ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    emb, source = make_prototypes(n_classes, dim, seed=seed)
    npy, txt = folder / f"protos-{n_classes}.npy", folder / f"classes-{n_classes}.txt"
    np.save(npy, emb)
    txt.write_text("".join(f"class_{i:05d}\n" for i in range(n_classes)), encoding="utf-8")
    return npy, txt, source


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed(fn, *args, repeat: int = 1, **kwargs):
    """(best wall seconds over ``repeat`` runs, last result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def machine() -> dict:
    import torch

    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            # other jobs on shared cores inflate absolute times (ratios are from the same run)
            "load_average_1m": round(os.getloadavg()[0], 2)}


def print_table(rows, columns, title=None, out=sys.stdout):
    """A plain fixed-width table of dict rows."""
    if title:
        print(title, file=out)
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)), file=out)
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)), file=out)


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 1000 or (abs(v) < 1e-3 and v != 0):
            return f"{v:.3g}"
        return f"{v:.3f}"
    return str(v)


def save_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=float) + "\n")
    return path

"""The benchmarks' one harness: data from ``../shared/data``, the paired bootstrap, timing, results and tables.

* **Data.** :func:`load_coop` reads a CoOp set's validation features and text-like prototypes (the protocol of every
  accuracy benchmark with shots or a pool), :func:`sample` draws the shots, :func:`per_image` scores probabilities
  image by image; :func:`make_prototypes` tiles real text embeddings for the speed benchmarks (below).
* **Statistics.** :func:`bootstrap`: the paired bootstrap of a per-image difference (one data set, or the mean over
  several with images resampled within each); :func:`fmt_ci` prints it.
* **Timing.** :func:`timed` (best of ``repeat``), :func:`clock` (wall, CPU and load of one call), :func:`run_command`
  (a command as users type it); each benchmark times the stock alternative in the same run.
* **Output.** :func:`save_result` writes ``bench-results/NAME.json``; :func:`print_table` and :func:`md_table` render
  rows; :func:`replace_between` rewrites a generated block of a doc between its markers; :func:`coop_parser` and
  :func:`render_or_missing` are the options and the ``--render`` path of the CoOp benchmarks.

Prototypes are tiled from the real CLIP ViT-B/32 text embeddings of LVIS, Objects365 and
OpenImages in ``../shared/data/clip-vit-b32`` (2,068 class names), each copy perturbed so it is
about as far from its source as real neighbouring classes are from each other. When the files are
absent, points are drawn uniformly on the sphere instead (and the output says so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as svgen does: spinning OpenMP waits stall LAPACK on shared cores

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "clip-vit-b32"
SOURCES = ("lvis_v1_clip_a+cname.npy", "o365_clip_a+cnamefix.npy", "oid_clip_a+cname.npy")
RESULTS = ROOT / "bench-results"
FEWSHOT = DATA / "coop-fewshot"
#: the CoOp sets with text-like prototypes; UNION names the seven as one 1,033-class problem
COOP_SETS = ("caltech101", "fgvc", "oxford_flowers", "oxford_pets", "ucf101", "stanford_cars", "sun397")
UNION = "all7"


# ----------------------------------------------------------------------------- CoOp data and per-image scores

def unit(x, dtype=np.float64):
    x = np.asarray(x, dtype=dtype)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def class_means(X, y, C):
    """Unit class means (float32): the stand-in prototypes of sets without text embeddings."""
    return unit(np.stack([X[y == c].mean(axis=0) for c in range(C)]), np.float32)


def load_coop(name):
    """(X, y, P): a CoOp set's unit validation features, labels and unit text-like prototypes
    (``FEWSHOT/<name>/textlike_prototypes.npy``: class means of the train rows mapped into CLIP's text region; they
    contain no validation image). ``UNION``: the seven sets as one problem (labels offset set by set)."""
    parts = COOP_SETS if name == UNION else (name,)
    protos = [np.load(FEWSHOT / n / "textlike_prototypes.npy") for n in parts]
    offsets = np.cumsum([0] + [p.shape[0] for p in protos])
    X = unit(np.concatenate([np.load(FEWSHOT / n / "val_features.npy") for n in parts]))
    y = np.concatenate([np.load(FEWSHOT / n / "val_labels.npy").astype(np.int64) + o for n, o in zip(parts, offsets)])
    return X, y, unit(np.concatenate(protos))


def load_dataset(name):
    """(X, y, P, C, zero-shot classifier): :func:`load_coop` and svgen's default zero-shot fit on the prototypes."""
    from svgen import SVGClassifier

    X, y, P = load_coop(name)
    return X, y, P, P.shape[0], SVGClassifier().fit(P.astype(np.float32))


def sample(y, k, seed):
    """(shots, queries): k shots of every class (seeded; none for k = 0), the rest queries."""
    if k == 0:
        return np.zeros(0, dtype=np.int64), np.arange(len(y))
    rng = np.random.default_rng(seed)
    s = np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), k, replace=False) for c in np.unique(y)]))
    return s, np.setdiff1d(np.arange(len(y)), s)


def image_nll(p, y):
    """Per-image −log p(true class), floored at 10⁻³⁰⁰."""
    return -np.log(np.maximum(np.asarray(p, dtype=np.float64)[np.arange(len(y)), y], 1e-300))


def per_image(p, y):
    """Per-image top-1 and top-5 correctness (0/1 floats) and NLL of probabilities ``p``."""
    order = np.argsort(-p, axis=1)[:, :5]
    return {"top1": (order[:, 0] == y).astype(float), "top5": np.any(order == y[:, None], axis=1).astype(float),
            "nll": image_nll(p, y)}


# ----------------------------------------------------------------------------- the paired bootstrap

def bootstrap(diffs, reps: int = 2000, seed: int = 0) -> dict:
    """The paired bootstrap of a per-image difference between two methods on the same images: ``{"diff", "ci95"}``,
    the mean and its 95% percentile interval. ``diffs`` is one array (images resampled), or a list of arrays, one
    per data set (the mean over the data sets; images resampled within each)."""
    diffs = [np.asarray(diffs, dtype=np.float64)] if np.ndim(diffs[0]) == 0 else [np.asarray(d, np.float64) for d in diffs]
    rng = np.random.default_rng(seed)
    boot = np.zeros(reps)
    for d in diffs:
        boot += d[rng.integers(0, len(d), size=(reps, len(d)))].mean(axis=1)
    boot /= len(diffs)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"diff": float(np.mean([d.mean() for d in diffs])), "ci95": [float(lo), float(hi)]}


def fmt_ci(r: dict, digits: int = 2) -> str:
    """``+1.23 [+0.45, +2.01]`` from :func:`bootstrap`'s result (or ``svgen.evaluation.metrics.paired_bootstrap``'s)."""
    lo, hi = r["ci95"] if "ci95" in r else (r["low"], r["high"])
    return f"{r['diff']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


# ----------------------------------------------------------------------------- the CoOp benchmarks' command line

def coop_parser(doc: str, shots, out: str, extra_datasets=(), datasets=COOP_SETS,
                seeds: int = 3) -> argparse.ArgumentParser:
    """The options every CoOp benchmark shares (``extra_datasets`` are accepted by ``--datasets`` but not run by
    default)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(datasets), choices=(*datasets, *extra_datasets))
    ap.add_argument("--shots", nargs="+", type=int, default=list(shots))
    ap.add_argument("--seeds", type=int, default=seeds)
    ap.add_argument("--out", default=out, help="result name under bench-results/")
    ap.add_argument("--render", metavar="RESULT.json", help="print the markdown tables of a saved result and stop")
    return ap


def render_or_missing(args, markdown_fn, name: str):
    """``--render``: print a saved result's tables (exit 0); no CoOp data: say so (exit 2); else None (run)."""
    if args.render:
        print(markdown_fn(json.loads(Path(args.render).read_text())), end="")
        return 0
    if not FEWSHOT.is_dir():
        print(f"{name}: {FEWSHOT} is absent; nothing to measure", file=sys.stderr)
        return 2
    return None


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


def clock(fn):
    """(result, {"wall_s", "cpu_s", "load_before", "load_after"}) of one call of ``fn()``."""
    load = os.getloadavg()[0]
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, {"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c,
                 "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def run_command(argv, env=None) -> float:
    """Run a command as users type it (a subprocess); its wall seconds. Exits with its stderr's tail on failure."""
    t0 = time.perf_counter()
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(map(str, argv))}\n{r.stderr[-2000:]}")
    return wall


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


def md_table(header, rows) -> list:
    """Markdown table lines: ``header`` (column titles; a title ending in ``:`` is right-aligned, the colon dropped)
    and ``rows`` (lists of cells, already formatted)."""
    titles = [h[:-1] if h.endswith(":") else h for h in header]
    lines = ["| " + " | ".join(titles) + " |", "|" + "|".join("---:" if h.endswith(":") else "---" for h in header) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def write_atomic(path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def replace_between(path, begin: str, end: str, body: str) -> bool:
    """Replace the text between the markers ``begin`` and ``end`` of a doc (kept) with ``body``; False (the file
    unchanged) where a marker is missing."""
    text = Path(path).read_text(encoding="utf-8")
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    write_atomic(path, f"{head}{begin}\n{body}{end}{rest.split(end, 1)[1]}")
    return True


def save_result(name: str, result: dict) -> Path:
    """``bench-results/NAME.json``; returns its path."""
    return write_atomic(RESULTS / f"{name}.json", json.dumps(result, indent=2, default=float) + "\n")

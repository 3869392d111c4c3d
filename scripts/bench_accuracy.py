#!/usr/bin/env python
"""Accuracy ablations on real CLIP ViT-B/32 embeddings (LVIS, 1,203 classes), text-only fits.

Every fit sees text embeddings only. The image-side features of the even-indexed LVIS classes
(the dev half, 602 exemplar means) score the heads, over all 1,203 classes as candidates.
Rows: the cosine baseline, the default fit's kernel-vote and linear heads, and one row per
ablation; each is the mean ± std over seeds of top-1 / top-5, with the fit's wall time.

    python scripts/bench_accuracy.py                 # writes docs/accuracy.md and bench-results/accuracy.json
    python scripts/bench_accuracy.py --quick         # one seed, fewer steps, fewer rows (a smoke run)
    python scripts/bench_accuracy.py --json          # also print one JSON object

Defaults were chosen on this dev half only; the odd-indexed classes stay an independent test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "clip-vit-b32"


def load_data():
    if not DATA.is_dir():
        sys.exit(f"bench_accuracy: {DATA} is absent; this benchmark needs the shared CLIP embeddings")
    a = np.load(DATA / "lvis_v1_clip_a+cname.npy").astype(np.float32)
    g = np.load(DATA / "lvis_gpt3_text-davinci-002_features_author.npy").astype(np.float32)
    x = np.load(DATA / "lvis_dev_image_features.npy").astype(np.float32)
    y = np.load(DATA / "lvis_dev_labels.npy").astype(np.int64)
    names = [line.strip() for line in (DATA / "lvis_classes.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"CxD": a, "T=2": np.stack([a, g], axis=1)}, x, y, names


def topk_acc(scores: torch.Tensor, y: np.ndarray):
    top = scores.topk(5, dim=1).indices.numpy()
    return 100 * float((top[:, 0] == y).mean()), 100 * float((top == y[:, None]).any(axis=1).mean())


T2_ROWS = {"default", "no training (steps=0)", "no text metric (plain cosine geometry)", "K=2"}


def ablations(quick: bool, input_name: str = "CxD"):
    """(row name, SVGClassifier keyword overrides, heads to report); the T=2 input gets a subset."""
    rows = [
        ("default", {}, ("kernel", "linear")),
        ("no training (steps=0)", {"steps": 0}, ("kernel", "linear")),
        ("alignment only", {"margin_weight": 0.0, "grounding_weight": 0.0}, ("kernel", "linear")),
        ("hinge only", {"alignment_weight": 0.0, "grounding_weight": 0.0}, ("kernel", "linear")),
        ("linear head trained by the margin term (head_lr=1e-3)", {"head_lr": 1e-3}, ("linear",)),
        ("no grounding", {"grounding_weight": 0.0}, ("kernel", "linear")),
        ("no text metric (plain cosine geometry)", {"metric": "none"}, ("kernel", "linear")),
        ("K=1", {"n_support": 1}, ("kernel", "linear")),
        ("K=2", {"n_support": 2}, ("kernel", "linear")),
        ("K=8", {"n_support": 8}, ("kernel", "linear")),
        ("σ fixed (median heuristic)", {"learn_sigma": False}, ("kernel",)),
        ("λ by leave-one-out", {"ridge": "loo"}, ("kernel",)),
        ("λ by GCV", {"ridge": "gcv"}, ("kernel",)),
        ("λ fixed 1e-3", {"ridge": 1e-3}, ("kernel",)),
    ]
    if input_name != "CxD":
        rows = [r for r in rows if r[0] in T2_ROWS]
    if quick:
        keep = {"default", "no training (steps=0)", "no text metric (plain cosine geometry)"}
        rows = [r for r in rows if r[0] in keep]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the library default)")
    ap.add_argument("--inputs", default="CxD,T=2", help="comma list of CxD and T=2")
    ap.add_argument("--quick", action="store_true", help="1 seed, 30 steps, 3 rows")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", default=str(ROOT / "docs" / "accuracy.md"))
    ap.add_argument("--render", metavar="RESULTS.json", help="only rewrite --out from a saved results file")
    args = ap.parse_args(argv)
    if args.render:
        _write_atomic(Path(args.out), render_markdown(json.loads(Path(args.render).read_text())))
        return 0
    if args.quick:
        args.seeds, args.steps = 1, args.steps or 30

    from svgen import SVGClassifier
    from svgen.heads import cosine_logits

    inputs, x, y, names = load_data()
    xt = torch.from_numpy(x)
    results = {"config": {"seeds": args.seeds, "steps": args.steps, "quick": args.quick,
                          "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"},
               "inputs": {}}
    for name in args.inputs.split(","):
        emb = inputs[name]
        mean_proto = _mean_proto(emb)
        c1, c5 = topk_acc(cosine_logits(xt, mean_proto), y)
        table = [{"row": "cosine (CLIP zero-shot)", "head": "cosine", "top1": [c1], "top5": [c5], "fit_s": [0.0]}]
        print(f"\n[{name}] cosine: {c1:.2f} / {c5:.2f}", flush=True)
        for row, overrides, heads in ablations(args.quick, name):
            per_head = {h: {"top1": [], "top5": []} for h in heads}
            times = []
            for seed in range(args.seeds):
                kw = dict(overrides, seed=seed)
                if args.steps is not None and "steps" not in overrides:
                    kw["steps"] = args.steps
                t0 = time.perf_counter()
                clf = SVGClassifier(**kw).fit(emb, classes=names)
                times.append(time.perf_counter() - t0)
                for h in heads:
                    a1, a5 = topk_acc(clf.decision_function(xt, h), y)
                    per_head[h]["top1"].append(a1)
                    per_head[h]["top5"].append(a5)
            for h in heads:
                entry = {"row": row, "head": h, **per_head[h], "fit_s": times}
                table.append(entry)
                print(f"[{name}] {row:<40} {h:<7} {_fmt(entry['top1'])} / {_fmt(entry['top5'])}  "
                      f"fit {np.mean(times):.1f}s", flush=True)
        results["inputs"][name] = table
    out = Path(args.out)
    if not args.quick:
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(out, render_markdown(results))
    res_dir = ROOT / "bench-results"
    res_dir.mkdir(exist_ok=True)
    _write_atomic(res_dir / ("accuracy-quick.json" if args.quick else "accuracy.json"), json.dumps(results, indent=1))
    if args.json:
        print(json.dumps(results))
    return 0


def _mean_proto(emb: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(emb).float()
    if t.dim() == 2:
        t = t[:, None]
    return torch.nn.functional.normalize(t, dim=-1).mean(dim=1)


def _fmt(vals) -> str:
    return f"{np.mean(vals):.2f} ± {np.std(vals):.2f}" if len(vals) > 1 else f"{vals[0]:.2f}"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


CHOICES = """
## How the defaults were chosen (dev half only)

Inputs: `CxD` is the "a {class}" text embedding per class (C×D); `T=2` stacks it with the GPT-3
description embedding of the class as two templates (C×2×D; its cosine row uses their normalised
mean). Everything was chosen on this dev half; the odd-indexed classes remain an independent test
that this project has not looked at.

* **Text metric, κ = 1.5.** The gain over cosine comes from the geometry, not from a
  hyperparameter of the solve: the neighbour-difference covariance (each class minus its nearest
  other class), shrunk to condition number κ. The "no text metric" rows show the method without
  it. κ = 1.5 was picked on this half (κ from 1.3 to 1.75 gave similar results; κ = 2 lost 1–4
  points for the LDA head); k = 1 nearest neighbour likewise.
* **Linear head = closed-form LDA under that metric** (`head_lr = 0`). Training the head with the
  margin term on text-only support vectors loses accuracy (its row below).
* **λ = auto (Parzen regime, M·λ = 100·λ_max(K_SS)).** Leave-one-out and GCV over the support
  vectors are exact closed forms, but they pick small λ: the solve then decorrelates classes along
  text-to-text similarities, which do not carry across CLIP's image–text modality gap (their rows).
* **100 training steps, trust region ρ = 0.25, K = 4.** Text-only training refines the
  alignment and the conditioning of K_SS, and costs the kernel vote well under a point against no
  training; more steps drift further from the text embeddings (300 steps: 65.78 top-1 for seed 0).
  K = 4 is the design default; K makes little difference on this data (its rows).
* **σ** starts at the median heuristic and is learned; in the Parzen regime it only weighs a
  class's K support vectors against each other.

**What the table says about training.** Text-only training of the generator does not improve
image accuracy: on `CxD` it costs the kernel vote 0.7 points against no training (66.06 vs
66.78), and on `T=2` it costs 2.7 points (71.71 vs 74.42), taking the default kernel vote *below*
the cosine baseline there. The default keeps 100 steps because the generator trained by
alignment and margin is the method this toolkit implements and the `CxD` target is met with it;
`--steps 0` (the closed-form geometry alone) is the better choice on this data, and making the
training objective transfer across the modality gap is the open problem.
"""


def render_markdown(results) -> str:
    cfg = results["config"]
    lines = ["# Accuracy on real CLIP ViT-B/32 embeddings (LVIS, dev half)", "",
             "Written by `python scripts/bench_accuracy.py` — do not edit by hand.", "",
             f"Text-only fits; 602 dev image features (even-indexed LVIS classes) scored over all 1,203 classes. "
             f"Mean ± std over {cfg['seeds']} seeds; steps: {cfg['steps'] or 'library default'}; {cfg['machine']}.", ""]
    lines += CHOICES.strip().splitlines() + [""]
    for name, table in results["inputs"].items():
        lines += [f"## Input {name}", "", "| row | head | top-1 | top-5 | fit time (s) |", "|---|---|---|---|---|"]
        for e in table:
            lines.append(f"| {e['row']} | {e['head']} | {_fmt(e['top1'])} | {_fmt(e['top5'])} | {np.mean(e['fit_s']):.1f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

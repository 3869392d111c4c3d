#!/usr/bin/env python
"""Zero-shot accuracy against the CLIP cosine baseline, with intervals and class folds.

Real CLIP ViT-B/32 embeddings of LVIS (1,203 classes). Every fit sees text embeddings only; the
602 image-side features of the even-indexed classes (the dev half) score the heads over all
1,203 classes as candidates. For every input and head the table gives the difference to the
cosine baseline on the same prototypes, top-1 and top-5, with a paired bootstrap 95% interval
(images resampled, 2,000 resamples) on the whole dev half and the difference on each of 4 class
folds (dev class index // 2 mod 4, about 150 images each).

Verdicts (per head, top-1 and top-5 together):

* **gain**    — top-1 interval above zero on the whole half, and no fold below −0.3 points;
* **no loss** — whole-half differences ≥ −0.3 and no fold below −0.3;
* **LOSS**    — anything else.

Inputs: ``CxD`` ("a {class}", one prompt per class), ``T=2`` (that prompt and the GPT-3
description embedding as two templates; cosine uses their normalised mean), ``GPT-3`` (the
description embedding alone as C×D: an average of several descriptions, standing in for
precomputed prompt-ensemble prototypes, the input that the single-prompt metric hurt).

    python -m benchmarks.bench_accuracy            # writes docs/accuracy.md and bench-results/accuracy.json
    python -m benchmarks.bench_accuracy --quick    # default rows only (a smoke run, writes no docs)
    python -m benchmarks.bench_accuracy --render bench-results/accuracy.json   # only rewrite the docs
    python -m benchmarks.bench_accuracy --subsets  # few classes: random 10- and 100-class subsets of the dev half

Everything here is dev data: the odd-indexed LVIS classes and other data sets are held out.
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

from benchmarks.bench_common import DATA, ROOT, fmt_ci as _ci, replace_between, save_result, write_atomic
N_FOLDS = 4
TOLERANCE = 0.3  # points: "no loss" allows this much below cosine (the bar)
RESAMPLES = 2000


def load_data():
    if not DATA.is_dir():
        sys.exit(f"bench_accuracy: {DATA} is absent; this benchmark needs the shared CLIP embeddings")
    a = np.load(DATA / "lvis_v1_clip_a+cname.npy").astype(np.float32)
    g = np.load(DATA / "lvis_gpt3_text-davinci-002_features_author.npy").astype(np.float32)
    x = np.load(DATA / "lvis_dev_image_features.npy").astype(np.float32)
    y = np.load(DATA / "lvis_dev_labels.npy").astype(np.int64)
    return {"CxD": a, "T=2": np.stack([a, g], axis=1), "GPT-3": g}, x, y


def class_folds(y: np.ndarray) -> np.ndarray:
    """Fold of each dev image: its class's position among the dev classes (index // 2), mod 4."""
    return (y // 2) % N_FOLDS


def correct(scores: torch.Tensor, y: np.ndarray):
    """(top-1 hit, top-5 hit) per image, as bool arrays."""
    top = scores.topk(5, dim=1).indices.numpy()
    return top[:, 0] == y, (top == y[:, None]).any(axis=1)


def compare(hit: np.ndarray, base: np.ndarray, folds: np.ndarray, seed: int = 0) -> dict:
    """Difference to cosine in points: whole half with its paired bootstrap interval, and per fold."""
    from svgen.evaluation.metrics import paired_bootstrap

    b = paired_bootstrap(hit, base, n_resamples=RESAMPLES, seed=seed)
    return {"acc": 100 * float(hit.mean()), "diff": 100 * b["diff"], "low": 100 * b["low"], "high": 100 * b["high"],
            "folds": [100 * float(hit[folds == f].mean() - base[folds == f].mean()) for f in range(N_FOLDS)]}


def verdict(top1: dict, top5: dict) -> str:
    worst = min([top1["diff"], top5["diff"]] + top1["folds"] + top5["folds"])
    if top1["low"] > 0 and min(top1["folds"] + top5["folds"]) >= -TOLERANCE and top5["diff"] >= -TOLERANCE:
        return "gain"
    return "no loss" if worst >= -TOLERANCE else "LOSS"


def rows(quick: bool):
    """(row name, SVGClassifier keyword overrides, heads)."""
    out = [("default", {}, ("kernel", "linear"))]
    if quick:
        return out
    return out + [
        ("trained generator (steps=100)", {"steps": 100}, ("kernel", "linear")),
        ("LDA linear head (the old default)", {"linear_head": "lda"}, ("linear",)),
        ("old default (steps=100, κ=1.5 for every input, LDA head)",
         {"steps": 100, "metric_condition": 1.5, "linear_head": "lda", "_fixed_kappa": True}, ("kernel", "linear")),
        ("κ=1.5", {"metric_condition": 1.5}, ("kernel", "linear")),
        ("κ=1.15", {"metric_condition": 1.15}, ("kernel", "linear")),
        ("no text metric (κ=1, cosine geometry)", {"metric": "none"}, ("kernel", "linear")),
        ("K=1", {"n_support": 1}, ("kernel",)),
    ]


def _fixed_kappa():
    """Context: the metric at the requested κ for every input (before the strength rule existed)."""
    import contextlib

    from svgen.zeroshot import training

    @contextlib.contextmanager
    def ctx():
        orig = training.metric_strength

        def full(kappa, n_templates, n_pairs, dim):
            d = orig(kappa, 1, dim, dim)
            return {**d, "templates_averaged": int(n_templates), "reason": "fixed κ (benchmark)"}

        training.metric_strength = full
        try:
            yield
        finally:
            training.metric_strength = orig
    return ctx()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", default="CxD,T=2,GPT-3", help="comma list of CxD, T=2, GPT-3")
    ap.add_argument("--seed", type=int, default=0, help="fit seed (the bootstrap uses seed 0)")
    ap.add_argument("--quick", action="store_true", help="default rows only; writes no docs")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", default=str(ROOT / "docs" / "accuracy.md"))
    ap.add_argument("--render", metavar="RESULTS.json", help="only rewrite --out from a saved results file")
    ap.add_argument("--subsets", action="store_true",
                    help="only the few-classes check: 20 random draws of 10 and 100 dev classes, each fit on its own "
                         "classes; mean and worst top-1 difference to cosine (writes bench-results/accuracy-subsets.json)")
    args = ap.parse_args(argv)
    if args.subsets:
        return run_subsets()
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        write_atomic(args.out, render_markdown(saved))
        update_readme(saved)
        return 0

    import contextlib

    from svgen import SVGClassifier
    from svgen.heads.scoring import cosine_logits

    inputs, x, y = load_data()
    xt = torch.from_numpy(x)
    folds = class_folds(y)
    results = {"config": {"seed": args.seed, "resamples": RESAMPLES, "folds": N_FOLDS, "tolerance": TOLERANCE,
                          "n_images": int(len(y)), "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"},
               "inputs": {}}
    for name in args.inputs.split(","):
        emb = inputs[name]
        base1, base5 = correct(cosine_logits(xt, _mean_proto(emb)), y)
        table = [{"row": "cosine (CLIP zero-shot)", "head": "cosine", "top1": 100 * float(base1.mean()),
                  "top5": 100 * float(base5.mean()), "fit_s": 0.0}]
        print(f"\n[{name}] cosine: {table[0]['top1']:.2f} / {table[0]['top5']:.2f}", flush=True)
        for row, overrides, heads in rows(args.quick):
            kw = dict(overrides, seed=args.seed)
            fixed = kw.pop("_fixed_kappa", False)
            t0 = time.perf_counter()
            with (_fixed_kappa() if fixed else contextlib.nullcontext()):
                clf = SVGClassifier(**kw).fit(emb)
            fit_s = time.perf_counter() - t0
            kappa = (clf.fit_metrics_.get("geometry") or {}).get("kappa", 1.0)
            for h in heads:
                h1, h5 = correct(clf.decision_function(xt, h), y)
                e = {"row": row, "head": h, "fit_s": fit_s, "kappa": kappa,
                     "top1": compare(h1, base1, folds), "top5": compare(h5, base5, folds)}
                e["verdict"] = verdict(e["top1"], e["top5"])
                table.append(e)
                print(f"[{name}] {row:<44} {h:<7} κ={kappa:.3f} top-1 {_diff(e['top1'])}  top-5 {_diff(e['top5'])}  "
                      f"{e['verdict']}  ({fit_s:.1f}s)", flush=True)
        results["inputs"][name] = table
    save_result("accuracy-quick" if args.quick else "accuracy", results)
    if not args.quick:
        write_atomic(args.out, render_markdown(results))
        update_readme(results)
    if args.json:
        print(json.dumps(results))
    return 0


def run_subsets(sizes=(10, 100), draws: int = 20, seed: int = 0) -> int:
    """Does the metric fade to cosine when there are few classes? Fit on random subsets of dev classes."""
    from svgen import SVGClassifier

    inputs, x, y = load_data()
    xt = torch.from_numpy(x)
    rng = np.random.default_rng(seed)
    out = []
    for C in sizes:
        for name in ("CxD", "T=2"):
            diffs = {"kernel": [], "linear": []}
            kappas = []
            for _ in range(draws):
                cls = np.sort(rng.choice(np.unique(y), C, replace=False))
                keep = np.isin(y, cls)
                yy = np.searchsorted(cls, y[keep])
                clf = SVGClassifier(seed=seed).fit(inputs[name][cls])
                kappas.append(clf.fit_metrics_["geometry"]["kappa"])
                cos = (np.asarray(clf.decision_function(xt[keep], "cosine")).argmax(1) == yy).mean()
                for h in diffs:
                    diffs[h].append(100 * float((np.asarray(clf.decision_function(xt[keep], h)).argmax(1) == yy).mean() - cos))
            row = {"classes": C, "input": name, "draws": draws, "kappa": float(np.mean(kappas)),
                   **{h: {"mean": float(np.mean(v)), "worst": float(np.min(v))} for h, v in diffs.items()}}
            out.append(row)
            print(f"C={C:4d} {name:4s} κ_eff={row['kappa']:.3f}  " + "  ".join(
                f"{h} {row[h]['mean']:+.2f} (worst {row[h]['worst']:+.2f})" for h in diffs), flush=True)
    save_result("accuracy-subsets", out)
    return 0


def _mean_proto(emb: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(emb).float()
    if t.dim() == 2:
        t = t[:, None]
    return torch.nn.functional.normalize(t, dim=-1).mean(dim=1)


def _diff(d: dict) -> str:
    folds = " ".join(f"{f:+.1f}" for f in d["folds"])
    return f"{_ci(d)} (folds {folds})"


CHOICES = """
## How the defaults were chosen (dev half only)

The question for a default is not "what is best on this half" but "what never loses": every
setting is judged by its **worst** difference to cosine over the three inputs, both heads, top-1
and top-5, the whole half and the four folds. One fold has about 150 images, so one image is
0.67 points: fold differences of ±0.7 are single images and say little on their own.

* **No generator training by default (`steps = 0`).** Text-only training of the generator
  (alignment + margin + grounding) costs image accuracy on every input (its row). The trained
  path stays one flag away (`svgen fit --steps 100`).
* **Linear head = whitened cosine**, `W_c = normalize(Σ⁻¹ p_c)`, no bias. The LDA head (the
  old default) adds the bias `−p_cᵀΣ⁻¹p_c`, which assumes images lie near their text prototype;
  across CLIP's modality gap they do not, and on the ensemble-like GPT-3 prototypes it loses.
* **Metric strength decided from the text alone**: κ = 1.3 for single-prompt prototypes,
  `κ_eff = 1 + (κ − 1)·r/T` for prototypes averaging T prompts (T = 2 here: 1.15; an
  80-prompt ensemble: 1.004, i.e. cosine) and for too few classes (`r = min(1, pairs/D)`).
  κ = 1.3 sits between 1.25 and 1.5 (single prompts gain more at 1.5; ensemble-like prototypes
  lose at 1.5, rows below). It is recorded in `svgen.json` and printed by `svgen diagnose`.
* **Anchors**: the K support vectors of a class start at its template-group means, pulled
  towards the prototype by the metric's trust r/T; the slots templates cannot fill are ± pairs
  along the confusion directions (projected onto the class's tangent plane, step θ/√T) around
  the prototype, so a class's anchors average to the prototype itself.
* **How the rule was arrived at (honestly).** κ = 1.3 and the whitened head came from a grid on
  this half (κ ∈ {1.1 … 2}, single prompts gaining most at 1.5, ensemble-like prototypes at
  1.1–1.25). The 1/T scaling of κ − 1 is the noise argument above; the θ/√T spread and the
  r/T pull of template anchors were added after the T=2 kernel vote showed a one-image top-5
  loss on one fold and a −0.35 mean loss on 100-class subsets, and both follow the same
  argument (less prompt noise, less correction). A check on class subsets
  (`python -m benchmarks.bench_accuracy --subsets`: 20 random draws of 10 and 100 dev classes,
  each fit on its own classes, top-1 Δ vs cosine, mean (worst draw)): at 10 classes (κ_eff ≈ 1.005)
  C×D kernel +0.00 (+0.00), linear +0.00 (+0.00); T=2 kernel −0.50 (−10.0: one image of ten in
  one draw; the Parzen solve's small decorrelation term still re-ranks near-ties), linear +0.00
  (+0.00); at 100 classes C×D +0.15 (+0.00) / +0.25 (+0.00), T=2 +0.05 (−1.00) / +0.05 (−1.00).
  With few classes the heads fall back to cosine, up to that residual.
* **Provenance of the rows below.** Regenerated in full on the final zero-shot code
  (`python -m benchmarks.bench_accuracy`, 2026-11-30): every accuracy equals the previous table's
  except one image in one non-default row (CxD κ=1.5 kernel, top-5 89.37 → 89.20), so the rows
  measured before the last zero-residual change were right. The fit times (s) were measured on the
  2-core machine shared with four other jobs (load average 8–20); compare them within a run only.
* **λ = auto (Parzen regime)** as before: leave-one-out and GCV over text support vectors pick
  small λ and lose (measured in the previous version of this table: 33.6 top-1 on `CxD`).

**Honest limits.** GPT-3 description prototypes given as C×D look like single prompts to the
rule (nothing in a C×D array says it is an average), so they get the full κ = 1.3; the margin
there is smaller than for single prompts. A user who knows their prototypes average many
prompts should pass the C×T×D array, or `--metric-strength 1`.
"""


def render_markdown(results) -> str:
    cfg = results["config"]
    lines = ["# Zero-shot accuracy on real CLIP ViT-B/32 embeddings (LVIS, dev half)", "",
             "Written by `python -m benchmarks.bench_accuracy` — do not edit by hand.", "",
             f"Text-only fits (seed {cfg['seed']}); {cfg['n_images']} dev image features (even-indexed LVIS classes) "
             f"scored over all 1,203 classes. Differences to the cosine baseline on the same prototypes, in points, "
             f"with paired bootstrap 95% intervals ({cfg['resamples']} resamples of the images) and the difference on "
             f"each of {cfg['folds']} class folds. Verdict: **gain** = top-1 interval above 0 and no fold below "
             f"−{cfg['tolerance']}; **no loss** = nothing below −{cfg['tolerance']}; else **LOSS**. {cfg['machine']}.",
             "", "**All numbers here are dev data.** The odd-indexed LVIS classes and other data sets are held out.", ""]
    lines += CHOICES.strip().splitlines() + [""]
    for name, table in results["inputs"].items():
        base = table[0]
        lines += [f"## Input {name}", "", f"Cosine baseline: top-1 {base['top1']:.2f}, top-5 {base['top5']:.2f}.", "",
                  "| row | head | κ | top-1 | Δ top-1 [95% CI] | folds Δ top-1 | top-5 | Δ top-5 [95% CI] | folds Δ top-5 | verdict | fit (s) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in table[1:]:
            t1, t5 = e["top1"], e["top5"]
            lines.append(f"| {e['row']} | {e['head']} | {e['kappa']:.3g} | {t1['acc']:.2f} | {_ci(t1)} | {_folds(t1)} | "
                         f"{t5['acc']:.2f} | {_ci(t5)} | {_folds(t5)} | {e['verdict']} | {e['fit_s']:.1f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


README = ROOT / "docs" / "usage.md"  # its Accuracy section holds the table between the markers
BEGIN, END = "<!-- bench_accuracy:begin -->", "<!-- bench_accuracy:end -->"
README_ROWS = ("default", "trained generator (steps=100)", "old default (steps=100, κ=1.5 for every input, LDA head)")


def render_readme(results) -> str:
    """The README's accuracy table: the default heads (and the trained / old defaults) per input."""
    lines = ["| input | head | row | top-1 | Δ top-1 vs cosine [95% CI] | folds | Δ top-5 [95% CI] | folds | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, table in results["inputs"].items():
        base = table[0]
        lines.append(f"| {name} | cosine | CLIP zero-shot | {base['top1']:.2f} | | | | | |")
        for e in table[1:]:
            if e["row"] in README_ROWS:
                row = "**default**" if e["row"] == "default" else e["row"]
                lines.append(f"| {name} | {e['head']} | {row} | {e['top1']['acc']:.2f} | {_ci(e['top1'])} | "
                             f"{_folds(e['top1'])} | {_ci(e['top5'])} | {_folds(e['top5'])} | {e['verdict']} |")
    return "\n".join(lines)


def update_readme(results, path: Path = README) -> None:
    """Replace the text between the README's bench_accuracy markers (left alone when they are absent)."""
    if path.is_file() and not replace_between(path, BEGIN, END, render_readme(results) + "\n"):
        print(f"bench_accuracy: no {BEGIN} … {END} markers in {path}; README not updated", file=sys.stderr)


def _folds(d):
    return " ".join(f"{f:+.1f}" for f in d["folds"])


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Transductive benchmark: unlabelled images as support vectors against the inductive heads.

Side by side, in one run, on the same pools:

* ``inductive_kernel`` / ``inductive_linear``  the svgen heads the pool is adapted from (zero-shot
                 fit; with shots, the few-shot adapt); ``inductive`` is the one the transduction takes
                 as its prior (kernel zero-shot, linear = LDA with shots)
* ``refine_kernel`` / ``refine_linear``  the simple baseline: one-step prototype refinement,
                 ``p'_c = p̂_c + Σ_i z_ic û_i / Σ_i z_ic`` with ``z`` that inductive head's
                 entropy-calibrated probabilities, then cosine to ``p'``
* ``svgen_labels``  ``clf.adapt(unlabelled=U)``: the transductive soft labels of the pool
* ``svgen_kernel`` / ``svgen_linear``  the adapted heads (what the artifact keeps) scored on the pool
* ``cosine``     plain CLIP (cosine to the prototypes)

Data:

* LVIS dev half (zero-shot): ``lvis_dev_image_features.npy`` is the pool (602 class-mean exemplar
  features; the labels only score); the prototypes are the real "a {class}" text embeddings, all
  1,203 classes are candidates.
* CoOp dev sets (``coop-fewshot/``): 1 and 4 shots per class from the ``train16`` rows; the
  validation images are the unlabelled pool and the queries; stand-in prototypes = class means of
  the shots (as in ``bench_fewshot.py``). With ``--zero-shot-path`` the shots only make the
  stand-in prototypes and are not given to ``adapt``: the zero-shot code path on per-image pools.
* ``--shots-from val``: the shots are k *single* validation images per class (one centre crop, as a
  user's photos; the ``train16`` rows are means of 10 augmented views), drawn per seed, and the other
  validation images are the pool and the queries (each image scored in the seeds where it is not a
  shot). This needs no ``train16`` rows, so it also runs DTD (``dtd``: validation features only),
  which no transduction default was ever chosen or looked at on — the closest to a held-out set here.

Nothing is chosen on the validation labels inside a run: they are only scored. ``--fold A|B``
uses one half of each validation set (a fixed random split) as the pool and the queries: the
defaults of the kernel re-solve were chosen on fold A (seed 0), fold B confirms them. Paired bootstrap 95% intervals
(images resampled within each dataset, seeds averaged per image) of transductive − inductive on the
mean over the datasets, and per dataset.

    python -m benchmarks.bench_transductive                  # ~10 min on 2 cores
    python -m benchmarks.bench_transductive --datasets oxford_pets --shots 1 --seeds 1   # quick look

Writes ``bench-results/bench_transductive.json``.
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np

from benchmarks.bench_common import DATA, machine, print_table, save_result
from benchmarks.bench_fewshot import (DATASETS, FEWSHOT, class_means, coop_parser, paired_bootstrap,
                           render_or_missing, sample_shots, unit)

SHOTS = (1, 4)
METHODS = ("cosine", "inductive", "inductive_kernel", "inductive_linear", "refine_kernel", "refine_linear",
           "svgen_labels", "svgen_kernel", "svgen_linear")
#: (method, its inductive reference) pairs with a paired bootstrap interval in the summary
PAIRS = (("svgen_labels", "inductive"), ("svgen_kernel", "inductive_kernel"), ("svgen_linear", "inductive_linear"),
         ("refine_kernel", "inductive_kernel"), ("refine_linear", "inductive_linear"))
FOLD_SEED = 12345


def fold_rows(n, fold):
    """Row indices of one half of a validation set (``all``: every row)."""
    if fold == "all":
        return np.arange(n)
    perm = np.random.default_rng(FOLD_SEED).permutation(n)
    half = perm[: n // 2] if fold == "A" else perm[n // 2:]
    return np.sort(half)


def refine(U, P, prior_logits):
    """One-step prototype refinement: soft pseudo-label means added to the prototypes, then cosine."""
    z = np.exp(prior_logits - prior_logits.max(1, keepdims=True))
    z /= z.sum(1, keepdims=True)
    means = (z.T @ U) / np.maximum(z.sum(0), 1e-12)[:, None]
    return U @ unit(unit(P) + means).T


def evaluate(clf, U, P, yv):
    """Correctness (0/1 per pool image) of every method, after the inductive ``clf`` is fitted."""
    import torch

    from svgen.heads.scoring import CLIP_LOGIT_SCALE
    from svgen.adapt.solvers import transduction as td

    head = clf.default_head_   # the transduction's prior: the inductive default head
    out = {"cosine": U @ unit(P).T}
    target = td.entropy(CLIP_LOGIT_SCALE * torch.as_tensor(out["cosine"]))
    for h in ("kernel", "linear"):
        out[f"inductive_{h}"] = np.asarray(clf.decision_function(U, h))
        t = td.match_entropy(torch.as_tensor(out[f"inductive_{h}"]), target)
        out[f"refine_{h}"] = refine(U, P, t * out[f"inductive_{h}"])
    out["inductive"] = out.get(f"inductive_{head}", np.asarray(clf.decision_function(U, head)))
    t0 = time.perf_counter()
    clf.adapt(unlabelled=U)
    wall = time.perf_counter() - t0
    out["svgen_labels"] = np.asarray(clf.transductive_labels_)
    out["svgen_kernel"] = np.asarray(clf.decision_function(U, "kernel"))
    out["svgen_linear"] = np.asarray(clf.decision_function(U, "linear"))
    info = {k: clf.transductive_.get(k) for k in ("prior_head", "prior_strength", "rounds", "round_agreement",
                                                  "changed_from_prior", "fallback", "prior_temperature")}
    kh = clf.transductive_.get("kernel_head") or {}
    info["kernel_head"] = {k: kh.get(k) for k in ("replaced", "factor", "reason")}
    info["adapt_s"] = wall
    return {m: (np.asarray(s).argmax(1) == yv).astype(float) for m, s in out.items()}, info


def query_folds(results, datasets, k):
    """Whole-pool runs scored on each fixed half of the queries (the halves of ``fold_rows``): the same
    adapted heads, the claim checked on two disjoint halves of the dev images. ``{A|B: {pair: interval,
    "per_dataset": {dataset: {pair: interval}}}}`` (the mean pairs; per dataset the kernel and linear heads)."""
    out = {}
    for half in ("A", "B"):
        per = {}
        for n in datasets:
            r = results[n][k]
            rows = fold_rows(len(r["correct"]["cosine"]), half)
            per[n] = {"correct": {m: v[rows] for m, v in r["correct"].items()}}
        out[half] = {_pair(a, b): paired_bootstrap(list(per.values()), a, b) for a, b in PAIRS[:3]}
        out[half]["per_dataset"] = {n: {_pair(a, b): paired_bootstrap([per[n]], a, b) for a, b in PAIRS[1:3]}
                                    for n in datasets}
    return out


def min_class_size(name) -> int:
    """The smallest validation class of a CoOp set (``--shots-from val`` needs k + 2)."""
    return int(np.bincount(np.load(FEWSHOT / name / "val_labels.npy").astype(np.int64)).min())


def run_coop(name, shots_list, seeds, log, zero_shot_path=False, fold="all", shots_from="train16"):
    from svgen import SVGClassifier

    d = FEWSHOT / name
    U, yv = unit(np.load(d / "val_features.npy")), np.load(d / "val_labels.npy").astype(np.int64)
    if shots_from == "val":
        Xtr, ytr = U, yv
    else:
        Xtr, ytr = unit(np.load(d / "train16_features.npy")), np.load(d / "train16_labels.npy").astype(np.int64)
        rows = fold_rows(len(yv), fold)
        U, yv = U[rows], yv[rows]
    C = int(ytr.max()) + 1
    out = {}
    for k in shots_list:
        total = {m: np.zeros(len(yv)) for m in METHODS}
        scored = np.zeros(len(yv))            # in how many seeds each image was a query (not a shot)
        infos = []
        for seed in seeds:
            idx = sample_shots(ytr, k, seed)
            X, y = Xtr[idx], ytr[idx]
            P = class_means(X, y, C)
            clf = SVGClassifier(seed=seed).fit(P)
            if not zero_shot_path:
                clf.adapt(X, y)
            q = np.ones(len(yv), dtype=bool)
            if shots_from == "val":
                q[idx] = False                 # the shots are neither pool nor queries
            c, info = evaluate(clf, U[q], P, yv[q])
            infos.append(info)
            scored += q
            for m in METHODS:
                total[m][q] += c[m]
        keep = scored > 0                      # an image that was a shot in every seed is never scored
        correct = {m: v[keep] / scored[keep] for m, v in total.items()}
        out[k] = {"acc": {m: float(100 * v.mean()) for m, v in correct.items()}, "correct": correct, "choices": infos}
        log(f"{name:>15} {k:>2} shots: " + "  ".join(f"{m} {a:.1f}" for m, a in out[k]["acc"].items())
            + "  | " + "; ".join(f"β {i['prior_strength']:.2f} rounds {i['rounds']} kernel "
                                 + ("× pool" if i["kernel_head"].get("factor") else "kept")
                                 if not i["fallback"] else "fallback" for i in infos)
            + f" adapt {infos[0]['adapt_s']:.1f}s")
    return out


def run_lvis(log):
    from svgen import SVGClassifier

    P = np.load(DATA / "lvis_v1_clip_a+cname.npy").astype(np.float32)
    U, yv = unit(np.load(DATA / "lvis_dev_image_features.npy")), np.load(DATA / "lvis_dev_labels.npy").astype(np.int64)
    clf = SVGClassifier(seed=0).fit(P)
    correct, info = evaluate(clf, U, P, yv)
    if info["fallback"]:
        # diagnostic, not a default: what the solve would have done without the fall-back
        from dataclasses import replace

        from svgen.adapt import config as adapt_config

        keep = adapt_config.DEFAULT
        adapt_config.DEFAULT = replace(keep, min_pool_per_class=0.0)
        try:
            clf.adapt(unlabelled=U)
        finally:
            adapt_config.DEFAULT = keep
        correct["forced_labels"] = (np.asarray(clf.transductive_labels_).argmax(1) == yv).astype(float)
        correct["forced_kernel"] = (np.asarray(clf.decision_function(U, "kernel")).argmax(1) == yv).astype(float)
        correct["forced_linear"] = (np.asarray(clf.decision_function(U, "linear")).argmax(1) == yv).astype(float)
        info["forced"] = {k: clf.transductive_.get(k) for k in ("prior_strength", "rounds", "tries")}
    acc = {m: float(100 * v.mean()) for m, v in correct.items()}
    log("     lvis (dev pool, zero-shot): " + "  ".join(f"{m} {a:.1f}" for m, a in acc.items())
        + f"  | fallback: {info['fallback']}")
    return {"acc": acc, "correct": correct, "choices": [info]}


def _ci(r):
    return f"{r['diff']:+.2f} [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]"


NAMES = {"cosine": "cosine (stand-in prototypes)", "inductive": "inductive (the prior head)",
         "inductive_kernel": "inductive kernel head", "inductive_linear": "inductive linear head",
         "refine_kernel": "one-step refinement of the kernel head", "refine_linear": "one-step refinement of the linear head",
         "svgen_labels": "svgen transductive (pool labels)", "svgen_kernel": "svgen transductive kernel head",
         "svgen_linear": "svgen transductive linear head"}


def _pair(a, b):
    return f"{a}_vs_{b}"


def markdown(result: dict) -> str:
    """The docs tables from a saved result."""
    out = []
    lv = result.get("lvis_dev")
    if lv:
        out += ["LVIS dev pool (zero-shot, 602 images, 1,203 candidate classes):", "",
                "| method | top-1 | − cosine [95% CI] |", "|---|---:|---|"]
        for m, a in lv["acc"].items():
            ci = _ci(lv["vs_cosine"][m]) if m in lv["vs_cosine"] else ""
            out.append(f"| {m} | {a:.2f} | {ci} |")
        out.append("")
    if "summary" not in result:
        return "\n".join(out) + "\n"
    shots, datasets = result["shots"], result["datasets"]
    summ = {int(k): v for k, v in result["summary"].items()}
    fold = result.get("fold", "all")
    where = "" if fold == "all" else f", fold {fold} (half of each validation set as pool and queries)"
    if result.get("shots_from") == "val":
        where += (", single-image shots from the validation set (the other validation images are the pool "
                  "and the queries)")
    out += [f"CoOp dev sets ({', '.join(datasets)}), mean over {len(datasets)} datasets, {len(result['seeds'])} seeds{where}"
            + (" (zero-shot path: shots not given to adapt)" if result.get("zero_shot_path") else "") + ":", "",
            "| method | " + " | ".join(f"{k} shot{'s' if k > 1 else ''}" for k in shots) + " |",
            "|---|" + "---:|" * len(shots)]
    for m in METHODS:
        out.append(f"| {NAMES[m]} | " + " | ".join(f"{summ[k]['mean_acc'][m]:.2f}" for k in shots) + " |")
    out += ["", "| shots | " + " | ".join(f"{a} − {b}" for a, b in PAIRS) + " |", "|---:|" + "---|" * len(PAIRS)]
    for k in shots:
        out.append(f"| {k} | " + " | ".join(_ci(summ[k][_pair(a, b)]) for a, b in PAIRS) + " |")
    out += ["", "| dataset | shots | inductive kernel | svgen kernel | kernel − inductive [95% CI] | inductive linear | "
                "svgen linear | linear − inductive [95% CI] | β per seed | kernel × pool likelihood |",
            "|---|---:|---:|---:|---|---:|---:|---|---|---|"]
    for n in datasets:
        for k in shots:
            r = result["per_dataset"][n][str(k)]
            a, pd = r["acc"], summ[k]["per_dataset"][n]
            betas = ", ".join("fall-back" if c["fallback"] else f"{c['prior_strength']:.2g}" for c in r["choices"])
            kept = ", ".join("–" if c["fallback"] else ("yes" if c["kernel_head"].get("factor") else "no")
                             for c in r["choices"])
            out.append(f"| {n} | {k} | {a['inductive_kernel']:.1f} | {a['svgen_kernel']:.1f} | "
                       f"{_ci(pd[_pair('svgen_kernel', 'inductive_kernel')])} | {a['inductive_linear']:.1f} | "
                       f"{a['svgen_linear']:.1f} | {_ci(pd[_pair('svgen_linear', 'inductive_linear')])} | {betas} | {kept} |")
    if all("query_folds" in summ[k] for k in shots):
        out += ["", "The same whole-pool runs scored on each fixed half of the queries (pool unchanged; the halves "
                    "of `--fold A|B`), transductive − inductive [95% CI], and each half's lowest dataset:", "",
                "| shots | query half | kernel | linear | pool labels | lowest dataset, kernel | lowest dataset, linear |",
                "|---:|---|---|---|---|---|---|"]
        for k in shots:
            for half, q in summ[k]["query_folds"].items():
                low = []
                for a, b in PAIRS[1:3]:
                    n = min(q["per_dataset"], key=lambda d: q["per_dataset"][d][_pair(a, b)]["diff"])
                    low.append(f"{n} {_ci(q['per_dataset'][n][_pair(a, b)])}")
                out.append(f"| {k} | {half} | {_ci(q[_pair('svgen_kernel', 'inductive_kernel')])} | "
                           f"{_ci(q[_pair('svgen_linear', 'inductive_linear')])} | "
                           f"{_ci(q[_pair('svgen_labels', 'inductive')])} | {low[0]} | {low[1]} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = coop_parser(__doc__, SHOTS, "bench_transductive", extra_datasets=("dtd",))
    ap.set_defaults(datasets=None)
    ap.add_argument("--no-lvis", action="store_true", help="skip the LVIS zero-shot pool")
    ap.add_argument("--only-lvis", action="store_true", help="only the LVIS zero-shot pool")
    ap.add_argument("--zero-shot-path", action="store_true",
                    help="CoOp: the shots only make the stand-in prototypes and are not given to adapt, so the "
                         "zero-shot path runs (kernel-vote prior, entropy calibration, diagonal Σ) on per-image pools")
    ap.add_argument("--fold", choices=("all", "A", "B"), default="all",
                    help="CoOp: the whole validation set (default) or one half of it as pool and queries "
                         "(A: where the kernel re-solve's defaults were chosen; B: the confirming half)")
    ap.add_argument("--shots-from", choices=("train16", "val"), default="train16",
                    help="CoOp: the shots are train16 rows (means of 10 augmented views; default) or single "
                         "validation images, the other validation images then being the pool and the queries "
                         "(adds dtd to the default data sets)")
    args = ap.parse_args(argv)
    code = render_or_missing(args, markdown, "bench_transductive")
    if code is not None:
        return code
    if args.datasets is None:
        args.datasets = list(DATASETS) + (["dtd"] if args.shots_from == "val" else [])
    if args.shots_from == "val":
        if args.fold != "all":
            ap.error("--shots-from val uses the whole validation set (--fold must be all)")
        small = {n: m for n in args.datasets if (m := min_class_size(n)) < max(args.shots) + 2}
        if small:
            ap.error(f"--shots-from val with {max(args.shots)} shots leaves fewer than 2 queries in a class of "
                     + ", ".join(f"{n} (smallest class {m})" for n, m in small.items()))
    elif "dtd" in args.datasets:
        ap.error("dtd has no train16 rows; run it with --shots-from val")
    logging.basicConfig(level=logging.WARNING)
    log = lambda s: print(s, flush=True)  # noqa: E731
    seeds = list(range(args.seeds))
    result = {"datasets": args.datasets, "shots": args.shots, "seeds": seeds, "zero_shot_path": args.zero_shot_path,
              "fold": args.fold, "shots_from": args.shots_from,
              "prototypes": "CoOp: stand-in (class means of the shots); LVIS: 'a {class}' text embeddings",
              "machine": machine()}
    if not args.no_lvis:
        lv = run_lvis(log)
        lv["vs_cosine"] = {m: paired_bootstrap([lv], m, "cosine") for m in lv["correct"] if m != "cosine"}
        lv.pop("correct")
        result["lvis_dev"] = lv
    if args.only_lvis:
        print(f"\nwrote {save_result(args.out, result)}")
        return 0
    results = {n: run_coop(n, args.shots, seeds, log, args.zero_shot_path, args.fold, args.shots_from)
               for n in args.datasets}
    rows, summary = [], {}
    for k in args.shots:
        per = [results[n][k] for n in args.datasets]
        mean = {m: float(np.mean([r["acc"][m] for r in per])) for m in METHODS}
        summary[k] = {"mean_acc": mean, **{_pair(a, b): paired_bootstrap(per, a, b) for a, b in PAIRS},
                      "per_dataset": {n: {_pair(a, b): paired_bootstrap([results[n][k]], a, b) for a, b in PAIRS}
                                      for n in args.datasets}}
        if args.fold == "all":
            summary[k]["query_folds"] = query_folds(results, args.datasets, k)
        rows.append({"shots": k, **mean, **{f"{a}−{b}": _ci(summary[k][_pair(a, b)]) for a, b in PAIRS[:3]}})
    print()
    print_table(rows, ["shots", *METHODS, *(f"{a}−{b}" for a, b in PAIRS[:3])],
                title=f"CoOp dev: mean top-1 over {len(args.datasets)} datasets (val pool = queries), {len(seeds)} seeds")
    print()
    print_table([{"dataset": n, "shots": k, **results[n][k]["acc"],
                  "kernel−inductive": _ci(summary[k]["per_dataset"][n][_pair("svgen_kernel", "inductive_kernel")]),
                  "linear−inductive": _ci(summary[k]["per_dataset"][n][_pair("svgen_linear", "inductive_linear")])}
                 for n in args.datasets for k in args.shots],
                ["dataset", "shots", *METHODS, "kernel−inductive", "linear−inductive"], title="per dataset")
    for n in results:
        for k in results[n]:
            results[n][k].pop("correct")
    result.update({"summary": summary, "per_dataset": results})
    path = save_result(args.out, result)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

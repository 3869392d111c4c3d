#!/usr/bin/env python
"""Transductive benchmark: unlabelled images as support vectors against the inductive heads.

Side by side, in one run, on the same pools:

* ``inductive``  the svgen heads the pool is adapted from (zero-shot fit; with shots, the few-shot
                 adapt), the head the transduction uses as its prior (kernel zero-shot; the
                 LOO-better head few-shot), and the other head too
* ``refine``     the simple baseline: one-step prototype refinement, ``p'_c = p̂_c + Σ_i z_ic û_i / Σ_i z_ic``
                 with ``z`` the inductive prior's calibrated probabilities, then cosine to ``p'``
* ``svgen_labels``  ``clf.adapt(unlabelled=U)``: the transductive soft labels of the pool
* ``svgen_linear``  the adapted linear head (the transductive posterior) scored on the pool
* ``cosine``     plain CLIP (cosine to the prototypes)

Data:

* LVIS dev half (zero-shot): ``lvis_dev_image_features.npy`` is the pool (602 class-mean exemplar
  features; the labels only score); the prototypes are the real "a {class}" text embeddings, all
  1,203 classes are candidates.
* CoOp dev sets (``coop-fewshot/``): 1 and 4 shots per class from the ``train16`` rows; the
  validation images are the unlabelled pool and the queries; stand-in prototypes = class means of
  the shots (as in ``bench_fewshot.py``). With ``--zero-shot-path`` the shots only make the
  stand-in prototypes and are not given to ``adapt``: the zero-shot code path on per-image pools.

Nothing is chosen on the validation labels: they are only scored. Paired bootstrap 95% intervals
(images resampled within each dataset, seeds averaged per image) of transductive − inductive on the
mean over the datasets, and per dataset.

    python scripts/bench_transductive.py                  # ~10 min on 2 cores
    python scripts/bench_transductive.py --datasets oxford_pets --shots 1 --seeds 1   # quick look

Writes ``bench-results/bench_transductive.json``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import DATA, machine, print_table, save_result  # noqa: E402
from bench_fewshot import DATASETS, FEWSHOT, class_means, paired_bootstrap, sample_shots, unit  # noqa: E402

SHOTS = (1, 4)
METHODS = ("cosine", "inductive", "inductive_other", "refine", "svgen_labels", "svgen_linear")


def refine(U, P, prior_logits):
    """One-step prototype refinement: soft pseudo-label means added to the prototypes, then cosine."""
    z = np.exp(prior_logits - prior_logits.max(1, keepdims=True))
    z /= z.sum(1, keepdims=True)
    means = (z.T @ U) / np.maximum(z.sum(0), 1e-12)[:, None]
    return U @ unit(unit(P) + means).T


def evaluate(clf, U, P, yv):
    """Correctness (0/1 per pool image) of every method, after the inductive ``clf`` is fitted."""
    import torch

    from svgen import transductive as td

    from svgen.classifier import prior_head_of

    head = prior_head_of(clf)
    other = "linear" if head == "kernel" else "kernel"
    out = {"cosine": U @ unit(P).T, "inductive": clf.decision_function(U, head).numpy(),
           "inductive_other": clf.decision_function(U, other).numpy()}
    target = td._entropy(td.CLIP_LOGIT_SCALE * torch.as_tensor(out["cosine"]))
    t = td.match_entropy(torch.as_tensor(out["inductive"]), target)
    out["refine"] = refine(U, P, t * out["inductive"])
    t0 = time.perf_counter()
    clf.adapt(unlabelled=U)
    wall = time.perf_counter() - t0
    out["svgen_labels"] = clf.transductive_labels_.numpy()
    out["svgen_linear"] = clf.decision_function(U, "linear").numpy()
    info = {k: clf.transductive_.get(k) for k in ("prior_head", "prior_strength", "rounds", "round_agreement",
                                                  "changed_from_prior", "fallback", "prior_temperature",
                                                  "held_out_check")}
    info["adapt_s"] = wall
    return {m: (np.asarray(s).argmax(1) == yv).astype(float) for m, s in out.items()}, info


def run_coop(name, shots_list, seeds, log, zero_shot_path=False):
    from svgen import SVGClassifier

    d = FEWSHOT / name
    Xtr, ytr = unit(np.load(d / "train16_features.npy")), np.load(d / "train16_labels.npy").astype(np.int64)
    U, yv = unit(np.load(d / "val_features.npy")), np.load(d / "val_labels.npy").astype(np.int64)
    C = int(ytr.max()) + 1
    out = {}
    for k in shots_list:
        correct = {m: np.zeros(len(yv)) for m in METHODS}
        infos = []
        for seed in seeds:
            idx = sample_shots(ytr, k, seed)
            X, y = Xtr[idx], ytr[idx]
            P = class_means(X, y, C)
            clf = SVGClassifier(seed=seed).fit(P)
            if not zero_shot_path:
                clf.adapt(X, y)
            c, info = evaluate(clf, U, P, yv)
            infos.append(info)
            for m in METHODS:
                correct[m] += c[m] / len(seeds)
        out[k] = {"acc": {m: float(100 * v.mean()) for m, v in correct.items()}, "correct": correct, "choices": infos}
        log(f"{name:>15} {k:>2} shots: " + "  ".join(f"{m} {a:.1f}" for m, a in out[k]["acc"].items())
            + "  | " + "; ".join(f"β {i['prior_strength']:.2f} rounds {i['rounds']}" if not i["fallback"]
                                 else "fallback" for i in infos) + f" adapt {infos[0]['adapt_s']:.1f}s")
    return out


def run_lvis(log):
    from svgen import SVGClassifier

    P = np.load(DATA / "lvis_v1_clip_a+cname.npy").astype(np.float32)
    U, yv = unit(np.load(DATA / "lvis_dev_image_features.npy")), np.load(DATA / "lvis_dev_labels.npy").astype(np.int64)
    clf = SVGClassifier(seed=0).fit(P)
    correct, info = evaluate(clf, U, P, yv)
    if info["fallback"]:
        # diagnostic, not a default: what the solve would have done without the fall-back
        from svgen import transductive as td

        keep, td.MIN_POOL_PER_CLASS = td.MIN_POOL_PER_CLASS, 0.0
        try:
            clf.adapt(unlabelled=U)
        finally:
            td.MIN_POOL_PER_CLASS = keep
        correct["forced_labels"] = (clf.transductive_labels_.numpy().argmax(1) == yv).astype(float)
        correct["forced_linear"] = (clf.decision_function(U, "linear").numpy().argmax(1) == yv).astype(float)
        info["forced"] = {k: clf.transductive_.get(k) for k in ("prior_strength", "rounds", "tries")}
    acc = {m: float(100 * v.mean()) for m, v in correct.items()}
    log("     lvis (dev pool, zero-shot): " + "  ".join(f"{m} {a:.1f}" for m, a in acc.items())
        + f"  | fallback: {info['fallback']}")
    return {"acc": acc, "correct": correct, "choices": [info]}


def _ci(r):
    return f"{r['diff']:+.2f} [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]"


NAMES = {"cosine": "cosine (stand-in prototypes)", "inductive": "inductive (the prior head)",
         "inductive_other": "inductive, other head", "refine": "one-step prototype refinement",
         "svgen_labels": "svgen transductive (pool labels)", "svgen_linear": "svgen transductive (linear head)"}


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
    shots, datasets = result["shots"], result["datasets"]
    summ = {int(k): v for k, v in result["summary"].items()}
    out += [f"CoOp dev sets, mean over {len(datasets)} datasets, {len(result['seeds'])} seeds"
            + (" (zero-shot path: shots not given to adapt)" if result.get("zero_shot_path") else "") + ":", "",
            "| method | " + " | ".join(f"{k} shot{'s' if k > 1 else ''}" for k in shots) + " |",
            "|---|" + "---:|" * len(shots)]
    for m in METHODS:
        out.append(f"| {NAMES[m]} | " + " | ".join(f"{summ[k]['mean_acc'][m]:.2f}" for k in shots) + " |")
    out += ["", "| shots | svgen labels − inductive | svgen linear − inductive | refine − inductive |",
            "|---:|---|---|---|"]
    for k in shots:
        out.append(f"| {k} | {_ci(summ[k]['svgen_labels_vs_inductive'])} | {_ci(summ[k]['svgen_linear_vs_inductive'])}"
                   f" | {_ci(summ[k]['refine_vs_inductive'])} |")
    out += ["", "| dataset | shots | inductive | refine | svgen labels | labels − inductive [95% CI] | β per seed |",
            "|---|---:|---:|---:|---:|---|---|"]
    for n in datasets:
        for k in shots:
            r = result["per_dataset"][n][str(k)]
            betas = ", ".join("fall-back" if c["fallback"] else f"{c['prior_strength']:.2g}" for c in r["choices"])
            out.append(f"| {n} | {k} | {r['acc']['inductive']:.1f} | {r['acc']['refine']:.1f} | "
                       f"{r['acc']['svgen_labels']:.1f} | {_ci(summ[k]['per_dataset_labels_vs_inductive'][n])} | {betas} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    ap.add_argument("--shots", nargs="+", type=int, default=list(SHOTS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-lvis", action="store_true", help="skip the LVIS zero-shot pool")
    ap.add_argument("--only-lvis", action="store_true", help="only the LVIS zero-shot pool")
    ap.add_argument("--zero-shot-path", action="store_true",
                    help="CoOp: the shots only make the stand-in prototypes and are not given to adapt, so the "
                         "zero-shot path runs (kernel-vote prior, entropy calibration, diagonal Σ) on per-image pools")
    ap.add_argument("--out", default="bench_transductive", help="result name under bench-results/")
    ap.add_argument("--render", metavar="RESULT.json", help="print the markdown tables of a saved result and stop")
    args = ap.parse_args(argv)
    if args.render:
        import json

        print(markdown(json.loads(Path(args.render).read_text())), end="")
        return 0
    if not FEWSHOT.is_dir():
        print(f"bench_transductive: {FEWSHOT} is absent; nothing to measure", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    log = lambda s: print(s, flush=True)  # noqa: E731
    seeds = list(range(args.seeds))
    result = {"datasets": args.datasets, "shots": args.shots, "seeds": seeds, "zero_shot_path": args.zero_shot_path,
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
    results = {n: run_coop(n, args.shots, seeds, log, args.zero_shot_path) for n in args.datasets}
    rows, summary = [], {}
    for k in args.shots:
        per = [results[n][k] for n in args.datasets]
        mean = {m: float(np.mean([r["acc"][m] for r in per])) for m in METHODS}
        summary[k] = {"mean_acc": mean,
                      **{f"{m}_vs_inductive": paired_bootstrap(per, m, "inductive")
                         for m in ("refine", "svgen_labels", "svgen_linear")},
                      "per_dataset_labels_vs_inductive": {n: paired_bootstrap([results[n][k]], "svgen_labels", "inductive")
                                                          for n in args.datasets}}
        rows.append({"shots": k, **mean, "labels−inductive [95% CI]": _ci(summary[k]["svgen_labels_vs_inductive"]),
                     "linear−inductive": _ci(summary[k]["svgen_linear_vs_inductive"]),
                     "refine−inductive": _ci(summary[k]["refine_vs_inductive"])})
    print()
    print_table(rows, ["shots", *METHODS, "labels−inductive [95% CI]", "linear−inductive", "refine−inductive"],
                title=f"CoOp dev: mean top-1 over {len(args.datasets)} datasets (val pool = queries), {len(seeds)} seeds")
    print()
    print_table([{"dataset": n, "shots": k, **results[n][k]["acc"],
                  "labels−inductive": _ci(summary[k]["per_dataset_labels_vs_inductive"][n])}
                 for n in args.datasets for k in args.shots], ["dataset", "shots", *METHODS, "labels−inductive"],
                title="per dataset")
    for n in results:
        for k in results[n]:
            results[n][k].pop("correct")
    result.update({"summary": summary, "per_dataset": results})
    path = save_result(args.out, result)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

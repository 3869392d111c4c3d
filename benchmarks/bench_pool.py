#!/usr/bin/env python
"""Unlabelled pools on text-like prototypes: does adapting to the pool ever make svgen worse?

Data: real CLIP ViT-B/32 validation features of the CoOp sets and their **text-like prototypes**
(``../shared/data/clip-vit-b32/coop-fewshot/*/textlike_prototypes.npy``, real text's geometry).
For each seed, k validation images per class are the labelled shots (k = 0: zero-shot), the other
validation images are the queries, and the pool is the queries themselves (``--pool all``, the
transductive setting: ``classify --transductive`` over a folder) or at most ``--per-class`` of
them per class (``--pool small``: ImageNet with a 5-per-class pool, the many-classes/few-images case).
Everything is scored on the pool images, which are the queries; labels are only scored.

* ``zero_shot``     cosine, ``softmax(100 · x̂ P̂ᵀ)``
* ``inductive``     the default head after ``fit(P)`` (and ``.adapt(X, y)`` with shots): what ``classify`` uses
* ``pool``          the default head after ``.adapt(unlabelled=pool)``: what the adapted artifact deploys
* ``pool_labels``   ``transductive_labels_``: the pool's probabilities (what ``classify --transductive`` prints)
* ``inductive_kernel`` / ``pool_kernel`` (and ``_linear``): each head named, before and after the pool

Paired bootstrap 95% intervals (images resampled within each dataset, seeds averaged per image) of
``pool − inductive`` and ``pool_labels − inductive`` for top-1, top-5 and NLL, per dataset and for the mean.

    python -m benchmarks.bench_pool                                  # every set, 0/1/4 shots, 2 seeds
    python -m benchmarks.bench_pool --datasets sun397 --shots 0 1 --pool small --seeds 1

Writes ``bench-results/bench_pool.json`` (``--out``) and prints the tables (``--render FILE`` reprints them).
"""

from __future__ import annotations

import collections
import copy
import json
import re
import sys
import time

import numpy as np

from benchmarks.bench_common import (COOP_SETS, bootstrap, coop_parser, fmt_ci, load_dataset, machine, per_image,
                                     render_or_missing, sample, save_result, softmax)

METHODS = ("zero_shot", "inductive", "pool", "pool_labels")
HEADS = ("kernel", "linear")   # each head as a user names it (``--head``), before and after the pool
PAIRS = (("pool", "inductive"), ("pool_labels", "inductive")) + tuple((f"pool_{h}", f"inductive_{h}") for h in HEADS)
METRICS = ("top1", "top5", "nll")


def small_pool(q, y, per_class, seed):
    """At most ``per_class`` of the queries ``q`` of each class (seeded)."""
    rng = np.random.default_rng(seed + 1000)
    keep = [rng.permutation(q[y[q] == c])[:per_class] for c in np.unique(y[q])]
    return np.sort(np.concatenate(keep))


def run_dataset(name, shots, seeds, pool_kind, per_class, log):
    X, y, P, C, base = load_dataset(name)
    out = {}
    for k in shots:
        if k and np.bincount(y, minlength=C).min() <= k:
            log(f"{name:>15} {k:>2} shots: skipped (a class has ≤ {k} validation images)")
            continue
        per = {m: {x: np.zeros(len(y)) for x in METRICS} for m in METHODS + tuple(n for pair in PAIRS[2:] for n in pair)}
        seen = np.zeros(len(y))
        info = []
        for seed in range(seeds):
            s, q = sample(y, k, seed)
            if pool_kind == "small":
                q = small_pool(q, y, per_class, seed)
            U = X[q].astype(np.float32)
            clf = copy.deepcopy(base)
            if k:
                clf.adapt(X[s].astype(np.float32), y[s])
            probs = {"zero_shot": softmax(100.0 * X[q] @ P.T),
                     "inductive": np.asarray(clf.predict_proba(U), dtype=np.float64),
                     **{f"inductive_{h}": np.asarray(clf.predict_proba(U, head=h), dtype=np.float64) for h in HEADS}}
            t0 = time.perf_counter()
            clf.adapt(unlabelled=U)
            wall = time.perf_counter() - t0
            probs["pool"] = np.asarray(clf.predict_proba(U), dtype=np.float64)
            probs["pool_labels"] = np.asarray(clf.transductive_labels_, dtype=np.float64)
            probs.update({f"pool_{h}": np.asarray(clf.predict_proba(U, head=h), dtype=np.float64) for h in HEADS})
            for m, p in probs.items():
                for x, v in per_image(p, y[q]).items():
                    per[m][x][q] += v
            seen[q] += 1
            td = clf.transductive_ or {}
            info.append({"seed": seed, "pool": len(q), "wall_s": wall, "fallback": td.get("fallback"),
                         "decision": td.get("decision"), "default_head": clf.default_head_})
        rows = seen > 0
        res = {m: {x: v[rows] / seen[rows] for x, v in d.items()} for m, d in per.items()}
        out[k] = {"per_image": res, "info": info}
        log(f"{name:>15} {k:>2} shots, pool {np.mean([i['pool'] for i in info]):.0f}: "
            + "  ".join(f"{m} {100 * res[m]['top1'].mean():.1f}/{100 * res[m]['top5'].mean():.1f}/"
                        f"{res[m]['nll'].mean():.3f}" for m in METHODS)
            + " | " + "; ".join(str(i["fallback"] or "adapted")[:60] for i in info))
    return out


def summarise(results, shots):
    summary = {}
    for k in shots:
        names = [n for n in results if k in results[n]]
        if not names:
            continue
        scale = {"top1": 100.0, "top5": 100.0, "nll": 1.0}
        s = {"datasets": names, "mean": {m: {x: float(np.mean([scale[x] * results[n][k]["per_image"][m][x].mean()
                                                               for n in names])) for x in METRICS} for m in METHODS}}
        for m, before in PAIRS:
            for x in METRICS:
                d = [scale[x] * (results[n][k]["per_image"][m][x] - results[n][k]["per_image"][before][x])
                     for n in names]
                s[f"{m}-{before} {x}"] = {"mean": bootstrap(d), "per_dataset": {n: bootstrap([v]) for n, v in zip(names, d)}}
        summary[k] = s
    return summary


REFUSALS = ((r"top-1 on held-out shots [\d.]+% is not above", "held-out top-1 not better"),
            (r"top-5 [\d.]+% is below", "held-out top-5 worse"), (r"NLL [\d.]+ is above", "held-out NLL worse"),
            (r"does not replicate", "the pool's structure does not replicate"),
            (r"did not settle", "the rounds did not settle"))


def decisions(infos: list) -> str:
    """The seeds' decisions in a few words: how many kept the pool, and why the others did not (each reason counted;
    the numbers behind them are in the JSON's ``info``)."""
    why = collections.Counter()
    for i in infos:
        if i.get("fallback"):
            found = [short for pattern, short in REFUSALS if re.search(pattern, i["fallback"])]
            why[" + ".join(found) or str(i["fallback"])[:60]] += 1
    kept = sum(1 for i in infos if not i.get("fallback"))
    return f"kept {kept} of {len(infos)}" + ("; refused: " + ", ".join(f"{r} ×{n}" for r, n in why.items()) if why else "")


def markdown(result: dict) -> str:
    out = [f"Pool: {result['pool']}" + (f" (at most {result['per_class']} per class)" if result["pool"] == "small" else "")
           + f"; {len(result['seeds'])} seeds; top-1 / top-5 / NLL on the pool images (the queries).", ""]
    out.append("| shots | datasets | " + " | ".join(METHODS) + " | pool − inductive top-1 | top-5 | NLL "
               "| pool_labels − inductive top-1 | top-5 | NLL |")
    out.append("|---:|---:|" + "---|" * (len(METHODS) + 6))
    for k, s in result["summary"].items():
        cells = [f"{s['mean'][m]['top1']:.1f} / {s['mean'][m]['top5']:.1f} / {s['mean'][m]['nll']:.3f}" for m in METHODS]
        diffs = [fmt_ci(s[f"{m}-inductive {x}"]["mean"], 3 if x == "nll" else 2)
                 for m in ("pool", "pool_labels") for x in METRICS]
        out.append(f"| {k} | {len(s['datasets'])} | " + " | ".join(cells + diffs) + " |")
    out += ["", "Per dataset, pool − inductive (top-1, top-5, NLL) and what the adaptation decided:", "",
            "| dataset | shots | top-1 | top-5 | NLL | the pool, over the seeds |", "|---|---:|---|---|---|---|"]
    for k, s in result["summary"].items():
        for n in s["datasets"]:
            cells = [fmt_ci(s[f"pool-inductive {x}"]["per_dataset"][n], 3 if x == "nll" else 2) for x in METRICS]
            out.append(f"| {n} | {k} | " + " | ".join(cells) + f" | {decisions(result['info'][n][str(k)])} |")
    if any(f"pool_{HEADS[0]}-inductive_{HEADS[0]} top1" in s for s in result["summary"].values()):
        out += ["", "Each head named (`predict_proba(head=…)`, `--head`), after − before the pool: the mean, and the lowest "
                "per-set cell (the highest for NLL):", "",
                "| shots | head | top-1 | lowest | top-5 | lowest | NLL | highest |", "|---:|---|---|---|---|---|---|---|"]
        for k, s in result["summary"].items():
            for h in HEADS:
                cells = []
                for x in METRICS:
                    r = s[f"pool_{h}-inductive_{h} {x}"]
                    pick = max if x == "nll" else min
                    n, worst = pick(r["per_dataset"].items(), key=lambda kv: kv[1]["diff"])
                    digits = 3 if x == "nll" else 2
                    cells += [fmt_ci(r["mean"], digits), f"{worst['diff']:+.{digits}f} ({n})"]
                out.append(f"| {k} | {h} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = coop_parser(__doc__, [0, 1, 4], "bench_pool", datasets=COOP_SETS, seeds=2)
    ap.add_argument("--pool", choices=("all", "small"), default="all")
    ap.add_argument("--per-class", type=int, default=5, help="--pool small: pool images per class")
    args = ap.parse_args(argv)
    done = render_or_missing(args, markdown, "bench_pool")
    if done is not None:
        return done
    log = lambda s: print(s, flush=True)  # noqa: E731
    results = {n: run_dataset(n, args.shots, args.seeds, args.pool, args.per_class, log) for n in args.datasets}
    result = {"datasets": args.datasets, "shots": args.shots, "seeds": list(range(args.seeds)), "pool": args.pool,
              "per_class": args.per_class, "machine": machine(), "summary": summarise(results, args.shots),
              "info": {n: {str(k): r[k]["info"] for k in r} for n, r in results.items()}}
    print("\n" + markdown(json.loads(json.dumps(result))), end="")
    print(f"\nwrote {save_result(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

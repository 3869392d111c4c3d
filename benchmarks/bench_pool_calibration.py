#!/usr/bin/env python
"""Calibration of a zero-shot pool's heads (docs/calibration.md, "A zero-shot pool"; issue 40, item 5).

Each CoOp set's text-like prototypes are fitted zero-shot (``SVGClassifier().fit(P)``) and adapted to the whole
validation set as an unlabelled pool (``.adapt(unlabelled=X)``, the pool check included); the labels only score.
For the default head, on the pool images:

* ``inductive``  the zero-shot default head (what ``classify`` gives without the pool);
* ``entropy``    the kept pool's head at the temperature giving it the inductive head's mean entropy on the pool
                 (the rule until issue 40);
* ``unguarded``  the kept pool's head at the cross-half agreement alone (``AdaptConfig(pool_trust=1.0)``: the rule
                 from issue 40 until issue 49, item 20);
* ``agreement``  the kept pool's head as ``adapt`` deploys it: mean top-1 probability on the pool = the check's
                 cross-half agreement (``transductive.check.agreement_pool``), no sharper than the NLL guard allows
                 (expected NLL under ``0.7·p_head + 0.3·p_cosine`` not above the cosine head's); no label used;
* ``cosine``     CLIP's own ``softmax(100·cos)``, the reference of the guard.

The pool rows are the same head at different temperatures: their top-1 is identical. A refused pool changes nothing.
``--copies K --noise S`` builds an adversarial pool instead of the validation set: K copies of every validation
image, each with Gaussian noise of norm about S added and re-normalised (near-duplicates on both sides of the check's
halves; seeded by ``--seed``).

    python -m benchmarks.bench_pool_calibration                 # the 7 sets (a few minutes on 2 cores)
    python -m benchmarks.bench_pool_calibration --datasets oxford_pets
    python -m benchmarks.bench_pool_calibration --copies 3 --noise 0.3 --seed 1 --out bench_pool_calibration_dup

Writes ``bench-results/bench_pool_calibration.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import torch

from benchmarks.bench_common import (COOP_SETS, bootstrap, fmt_ci, image_nll, load_dataset, machine, md_table,
                                     save_result)


def scores(p, y) -> dict:
    from svgen.heads.calibration import ece

    p = np.asarray(p, dtype=np.float64)
    return {"top1": float((p.argmax(1) == y).mean()), "nll": float(image_nll(p, y).mean()),
            "ece": float(ece(p, y)), "confidence": float(p.max(1).mean())}


def paired_nll(p, p_ref, y) -> dict:
    """Mean per-image NLL of ``p`` minus ``p_ref`` and its paired bootstrap 95% interval (images resampled)."""
    return bootstrap(image_nll(p, y) - image_nll(p_ref, y))


def noisy_copies(X, y, copies: int, noise: float, seed: int):
    """``copies`` re-normalised copies of every row of ``X`` with Gaussian noise of norm about ``noise`` added."""
    rng = np.random.default_rng(seed)
    Xs = np.concatenate([X + noise * rng.normal(size=X.shape) / np.sqrt(X.shape[1]) for _ in range(copies)])
    return (Xs / np.linalg.norm(Xs, axis=1, keepdims=True)).astype(np.float32), np.tile(y, copies)


def run_dataset(name: str, copies: int = 0, noise: float = 0.0, seed: int = 0) -> dict:
    from svgen import AdaptConfig
    from svgen.heads import calibration, predictor

    X, y, P, C, base = load_dataset(name)
    if copies:
        X, y = noisy_copies(X, y, copies, noise, seed)
    t0 = time.perf_counter()
    row = {"dataset": name, "classes": C, "pool": len(y), "inductive": scores(base.predict_proba(X), y),
           "cosine": scores(base.predict_proba(X, "cosine"), y)}
    clf = copy.deepcopy(base).adapt(unlabelled=X)
    rec = clf.transductive_
    row["wall_s"] = time.perf_counter() - t0
    if rec.get("fallback"):
        row["refused"] = rec["fallback"]
        return row
    U = torch.from_numpy(X.astype(np.float32))
    head = clf.default_head_
    z = torch.as_tensor(clf.logits(U, head)).double()
    rows = calibration.calibration_rows(len(U))
    target = calibration.entropy(predictor.logits(base.heads_, base.prototypes_, base.fit_config_.kernel, U[rows],
                                                  base.default_head_).double() / base.temperatures_[base.default_head_])
    row["entropy"] = scores(torch.softmax(calibration.match_entropy(z, target) * z, 1).numpy(), y)
    p_now, p_cos = clf.predict_proba(X), base.predict_proba(X, "cosine")
    row["agreement"] = scores(p_now, y)
    unguarded = copy.deepcopy(base)
    unguarded.adapt_config = AdaptConfig(pool_trust=1.0)
    p_before = unguarded.adapt(unlabelled=X).predict_proba(X)
    row["unguarded"] = scores(p_before, y)
    row["nll_now_minus_unguarded"] = paired_nll(p_now, p_before, y)
    row["nll_now_minus_cosine"] = paired_nll(p_now, p_cos, y)
    row["nll_unguarded_minus_cosine"] = paired_nll(p_before, p_cos, y)
    row["softened"] = {h: g["softened"] for h, g in rec["nll_guard"]["heads"].items()}
    row["agreement_pool"] = float(rec["check"]["agreement_pool"])
    row["head"] = head
    return row


def render(rows) -> str:
    def cell(r):
        return f"{100 * r['top1']:.1f} / {r['confidence']:.3f} / {r['ece']:.3f} / {r['nll']:.3f}"

    body = []
    for r in rows:
        cells = [r["dataset"], r["classes"], r["pool"], cell(r["cosine"]), cell(r["inductive"])]
        if "refused" in r:
            body.append(cells + ["refused", "refused", "refused", "–"])
        else:
            soft = " (softened)" if r["softened"].get("linear") else ""
            body.append(cells + [cell(r["entropy"]), cell(r["unguarded"]), cell(r["agreement"]) + soft,
                                 f"{r['agreement_pool']:.3f}"])
    lines = md_table(["data set", "classes:", "pool:", "cosine", "inductive", "pool, entropy T",
                      "pool, agreement T, unguarded", "pool, agreement T, guarded (now)", "agreement:"], body)
    lines += ["", "NLL differences on the pool images, paired bootstrap 95% intervals:", ""]
    lines += md_table(["data set", "guarded − unguarded", "guarded − cosine", "unguarded − cosine"],
                      [[r["dataset"], fmt_ci(r["nll_now_minus_unguarded"], 3), fmt_ci(r["nll_now_minus_cosine"], 3),
                        fmt_ci(r["nll_unguarded_minus_cosine"], 3)] for r in rows if "refused" not in r])
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(COOP_SETS), choices=COOP_SETS)
    ap.add_argument("--copies", type=int, default=0, help="an adversarial pool: this many noisy copies of each image")
    ap.add_argument("--noise", type=float, default=0.3, help="the copies' noise norm (about)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_pool_calibration")
    args = ap.parse_args(argv)
    rows = []
    for name in args.datasets:
        rows.append(run_dataset(name, args.copies, args.noise, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    print("top-1 % / mean top-1 probability / ECE / NLL, default head, on the pool images")
    print(render(rows))
    save_result(args.out, {"machine": machine(), "rows": rows, "copies": args.copies, "noise": args.noise,
                           "seed": args.seed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python
"""Calibration of a zero-shot pool's heads (docs/calibration.md, "A zero-shot pool"; issue 40, item 5).

Each CoOp set's text-like prototypes are fitted zero-shot (``SVGClassifier().fit(P)``) and adapted to the whole
validation set as an unlabelled pool (``.adapt(unlabelled=X)``, the pool check included); the labels only score.
For the default head, on the pool images:

* ``inductive``  the zero-shot default head (what ``classify`` gives without the pool);
* ``entropy``    the kept pool's head at the temperature giving it the inductive head's mean entropy on the pool
                 (the rule until issue 40);
* ``agreement``  the kept pool's head as ``adapt`` deploys it: mean top-1 probability on the pool = the check's
                 cross-half agreement (``transductive.check.agreement_pool``), no label used.

Both pool rows are the same head at two temperatures: their top-1 is identical. A refused pool changes nothing.

    python -m benchmarks.bench_pool_calibration                 # the 7 sets (a few minutes on 2 cores)
    python -m benchmarks.bench_pool_calibration --datasets oxford_pets

Writes ``bench-results/bench_pool_calibration.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import torch

from benchmarks.bench_adapt import DATASETS, load_dataset
from benchmarks.bench_common import machine, save_result


def scores(p, y) -> dict:
    from svgen.calibration.temperatures import ece

    p = np.asarray(p, dtype=np.float64)
    return {"top1": float((p.argmax(1) == y).mean()), "nll": float(-np.log(np.maximum(p[np.arange(len(y)), y],
                                                                                          1e-300)).mean()),
            "ece": float(ece(p, y)), "confidence": float(p.max(1).mean())}


def run_dataset(name: str) -> dict:
    from svgen.heads import predictor
    from svgen.transductive import solve as td

    X, y, P, C, base = load_dataset(name)
    t0 = time.perf_counter()
    row = {"dataset": name, "classes": C, "pool": len(y), "inductive": scores(base.predict_proba(X), y)}
    clf = copy.deepcopy(base).adapt(unlabelled=X)
    rec = clf.transductive_
    row["wall_s"] = time.perf_counter() - t0
    if rec.get("fallback"):
        row["refused"] = rec["fallback"]
        return row
    U = torch.from_numpy(X.astype(np.float32))
    head = clf.default_head_
    z = torch.as_tensor(clf.logits(U, head)).double()
    rows = td.calibration_rows(len(U))
    target = td._entropy(predictor.logits(base.heads_, base.prototypes_, base.fit_config_.kernel, U[rows],
                                          base.default_head_).double() / base.temperatures_[base.default_head_])
    row["entropy"] = scores(torch.softmax(td.match_entropy(z, target) * z, 1).numpy(), y)
    row["agreement"] = scores(clf.predict_proba(X), y)
    row["agreement_pool"] = float(rec["check"]["agreement_pool"])
    row["head"] = head
    return row


def render(rows) -> str:
    def cell(r):
        return f"{100 * r['top1']:.1f} / {r['confidence']:.3f} / {r['ece']:.3f} / {r['nll']:.3f}"

    lines = ["| data set | classes | pool | inductive | pool, entropy T (before) | pool, agreement T (now) | "
             "agreement |", "|---|---:|---:|---|---|---|---:|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['dataset']} | {r['classes']} | {r['pool']} | {cell(r['inductive'])} | refused | "
                         f"refused | – |")
        else:
            lines.append(f"| {r['dataset']} | {r['classes']} | {r['pool']} | {cell(r['inductive'])} | "
                         f"{cell(r['entropy'])} | {cell(r['agreement'])} | {r['agreement_pool']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    args = ap.parse_args(argv)
    rows = []
    for name in args.datasets:
        rows.append(run_dataset(name))
        print(json.dumps(rows[-1]), flush=True)
    print("top-1 % / mean top-1 probability / ECE / NLL, default head, on the pool images")
    print(render(rows))
    save_result("bench_pool_calibration", {"machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

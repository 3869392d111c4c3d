#!/usr/bin/env python
"""Benchmark b) random Fourier features: relative kernel error against m.

svgen's plain, orthogonal and orthogonal cos/sin-paired (the training default) features versus scikit-learn's ``RBFSampler`` (the stock
alternative) at equal m, on support-vector-like points with real CLIP text geometry, σ from the
median heuristic. Error is ``||ΦΦᵀ − K||_F / ||K||_F`` averaged over seeds; ``ratio`` is
svgen's error divided by RBFSampler's (≤ 1 is the target).

    .venv/bin/python -m benchmarks.bench_rff [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from benchmarks.bench_common import machine, make_prototypes, print_table, save_result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="fewer m values, points and seeds")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args(argv)
    from sklearn.kernel_approximation import RBFSampler

    from svgen.core.kernels import RandomFourierFeatures, kernel, median_heuristic

    n_points, seeds = (600, 2) if args.quick else (args.points, args.seeds)
    ms = (128, 512, 2048) if args.quick else (128, 256, 512, 1024, 2048, 4096)
    emb, source = make_prototypes(n_points // 4, seed=1)
    base = torch.from_numpy(emb)
    X = torch.nn.functional.normalize(  # K=4 perturbed copies of each prototype, like support vectors
        base[:, None, :] + 0.3 * torch.randn(base.shape[0], 4, base.shape[1], generator=torch.Generator().manual_seed(2))
        / base.shape[1] ** 0.5, dim=-1).reshape(-1, base.shape[1]).double()
    sigma = median_heuristic(X)
    K = kernel(X, X, sigma)
    knorm = float(K.norm())
    Xn = X.numpy()
    rows = []
    for m in ms:
        errs = {"plain": [], "orthogonal": [], "orth_paired": [], "sklearn": []}
        times = {k: 0.0 for k in errs}
        for s in range(seeds):
            for name, orth, paired in (("plain", False, False), ("orthogonal", True, False),
                                       ("orth_paired", True, True)):
                t0 = time.perf_counter()
                phi = RandomFourierFeatures(X.shape[1], m, orthogonal=orth, seed=s, paired=paired)(X, sigma)
                times[name] += time.perf_counter() - t0
                errs[name].append(float((phi @ phi.T - K).norm()) / knorm)
            t0 = time.perf_counter()
            phi = torch.from_numpy(RBFSampler(gamma=1.0 / (2 * sigma ** 2), n_components=m, random_state=s)
                                   .fit_transform(Xn))
            times["sklearn"] += time.perf_counter() - t0
            errs["sklearn"].append(float((phi @ phi.T - K).norm()) / knorm)
        e = {k: float(np.mean(v)) for k, v in errs.items()}
        rows.append({"m": m, "err_plain": e["plain"], "err_orthogonal": e["orthogonal"],
                     "err_orth_paired": e["orth_paired"], "err_rbfsampler": e["sklearn"],
                     "ratio_plain": e["plain"] / e["sklearn"], "ratio_orthogonal": e["orthogonal"] / e["sklearn"],
                     "ratio_orth_paired": e["orth_paired"] / e["sklearn"],
                     "ms_orth_paired": 1e3 * times["orth_paired"] / seeds, "ms_rbfsampler": 1e3 * times["sklearn"] / seeds})
    result = {"benchmark": "rff", "points": int(X.shape[0]), "dim": int(X.shape[1]), "sigma": sigma, "seeds": seeds,
              "data": source, "machine": machine(), "rows": rows,
              "target_met": all(r["ratio_orth_paired"] <= 1.0 for r in rows)}
    path = save_result("rff" + ("-quick" if args.quick else ""), result)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(rows, list(rows[0]), title=f"RFF relative kernel error, {X.shape[0]} points, D={X.shape[1]}, "
                                               f"σ={sigma:.3f}, mean of {seeds} seeds ({source})")
        print(f"target (orthogonal cos/sin features, svgen's training default, ≤ RBFSampler at every m): {'met' if result['target_met'] else 'NOT met'}; "
              f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Benchmark c) scoring throughput of the kernel-vote and linear heads, as a fraction of plain GEMM.

For N×D features and C classes with K support vectors each (M = C·K):

* ``gemm``  — the same matrix products without anything else: ``X Sᵀ`` (N×D·D×M) then, for dense
  vote weights, ``(·) A`` (N×M·M×C); this is the stock alternative and the 100% mark;
* ``kernel`` — :func:`svgen.heads.scoring.kernel_scores` (normalise, in-place RBF on blocks of S, vote);
* ``naive`` — the unblocked formula ``exp(-||x̂-s||²/2σ²) @ A`` with the full N×M kernel;
* ``linear`` — :func:`svgen.heads.scoring.linear_logits` against the GEMM ``X Wᵀ`` (N×D·D×C).

``frac`` = GEMM time / head time (throughput as a fraction of GEMM; target ≥ 0.5 for the kernel
head). Large C uses sparse vote weights (the large-C artifact layout), whose GEMM mark is ``X Sᵀ``.

    .venv/bin/python -m benchmarks.bench_scoring [--quick] [--json]
"""

from __future__ import annotations

import argparse
import warnings
import json
import sys

import torch
import torch.nn.functional as F

from benchmarks.bench_common import machine, make_prototypes, peak_rss_mb, print_table, save_result, timed

warnings.filterwarnings("ignore", message="Sparse")


def sparse_votes(P, K, neighbours=32, seed=0):
    """Vote weights with the layout of a large-C artifact: column c on c's nearest classes' rows."""
    from svgen.core.scale import class_neighbours

    C = P.shape[0]
    nb = class_neighbours(P, neighbours)
    rows = (nb[:, :, None] * K + torch.arange(K)).reshape(C, -1)
    cols = torch.arange(C)[:, None].expand_as(rows)
    vals = torch.rand(rows.numel(), generator=torch.Generator().manual_seed(seed))
    return torch.sparse_coo_tensor(torch.stack([rows.reshape(-1), cols.reshape(-1)]), vals, (C * K, C)).coalesce()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="smaller N and fewer repeats")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--n", type=int, default=2048, help="feature rows per call")
    args = ap.parse_args(argv)
    from svgen.heads.scoring import kernel_scores, linear_logits
    from svgen.core.kernels import kernel

    N, repeat = (512, 2) if args.quick else (args.n, 3)
    cases = [(1000, "dense"), (21843, "sparse")] if not args.quick else [(1000, "dense"), (5000, "sparse")]
    K, D, sigma = 4, 512, 0.8
    rows = []
    g = torch.Generator().manual_seed(0)
    for C, layout in cases:
        emb, source = make_prototypes(C)
        P = torch.from_numpy(emb)
        S = F.normalize(P[:, None, :] + 0.3 * torch.randn(C, K, D, generator=g) / D ** 0.5, dim=-1).reshape(-1, D)
        A = torch.rand(C * K, C, generator=g) if layout == "dense" else sparse_votes(P, K)
        W, b = torch.randn(C, D, generator=g), torch.randn(C, generator=g)
        X = torch.randn(N, D, generator=g)
        with torch.no_grad():
            kernel_scores(X[:64], S, sigma, A)  # warm up
            if layout == "dense":
                t_gemm, _ = timed(lambda: (X @ S.T) @ A, repeat=repeat)
            else:
                t_gemm, _ = timed(lambda: X @ S.T, repeat=repeat)
            t_kernel, _ = timed(kernel_scores, X, S, sigma, A, repeat=repeat)
            naive_bytes = 4 * N * C * K * 3
            t_naive = None
            if naive_bytes < (2 << 30):
                # the COO product takes minutes at C=21,843: once is enough to show the gap
                t_naive, _ = timed(lambda: kernel(X, S, sigma) @ A, repeat=repeat if layout == "dense" else 1)
            t_lgemm, _ = timed(lambda: X @ W.T, repeat=repeat)
            t_linear, _ = timed(linear_logits, X, W, b, repeat=repeat)
        rows.append({"C": C, "M": C * K, "N": N, "votes": layout,
                     "gemm_ms": 1e3 * t_gemm, "kernel_ms": 1e3 * t_kernel,
                     "kernel_frac": t_gemm / t_kernel,
                     "naive_ms": None if t_naive is None else 1e3 * t_naive,
                     "kernel_vs_naive": None if t_naive is None else t_naive / t_kernel,
                     "kernel_rows_per_s": N / t_kernel,
                     "lin_gemm_ms": 1e3 * t_lgemm, "linear_ms": 1e3 * t_linear, "linear_frac": t_lgemm / t_linear})
    result = {"benchmark": "scoring", "D": D, "K": K, "data": source, "machine": machine(), "rows": rows,
              "peak_rss_mb": peak_rss_mb(), "target_met": all(r["kernel_frac"] >= 0.5 for r in rows)}
    path = save_result("scoring" + ("-quick" if args.quick else ""), result)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(rows, list(rows[0]), title=f"Scoring throughput, D={D}, K={K}, best of {repeat} "
                                               "(frac = GEMM time / head time)")
        print(f"target (kernel head ≥ 50% of GEMM): {'met' if result['target_met'] else 'NOT met'}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Benchmark a) fitting: wall time and peak RSS for C classes (K=4, D=512).

Two measurements per C, each in a fresh process so peak RSS is its own:

1. **fit** — the real command, ``/usr/bin/time -v svgen fit --prototypes P.npy --classes C.txt``
   with default settings (class mini-batches, automatic exact/blocked/rff path and vote solver);
   wall time and "Maximum resident set size" come from ``/usr/bin/time``.
2. **step** — one optimisation step over a *full* batch of all C classes along each alignment
   path: ``naive`` (the full (C·K)² kernel, the stock implementation), ``blocked`` and ``rff``,
   plus ``minibatch`` (the default class batch). ``naive_fit_est`` extrapolates the naive fit:
   steps × naive step + dense Cholesky solve + ``eigvalsh`` condition number, each measured.
   Paths that would exceed memory (naive) or take minutes per step (blocked) are skipped and say so.

Inputs are written to /tmp/svgen-bench (never into the repository); results to bench-results/.

    .venv/bin/python -m benchmarks.bench_fit [--quick] [--json] [--classes 100,1000,21843] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench_common import ROOT, machine, peak_rss_mb, print_table, save_result, write_inputs

TMP = Path("/tmp/svgen-bench")
SVGEN = ROOT / ".venv" / "bin" / "svgen"


def time_v(cmd):
    """Run ``/usr/bin/time -v cmd``; (wall s, peak RSS MB, stdout, rc)."""
    proc = subprocess.run(["/usr/bin/time", "-v", *map(str, cmd)], capture_output=True, text=True)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
    secs = None
    if wall:
        h, m, s = wall.groups()
        secs = int(h or 0) * 3600 + int(m) * 60 + float(s)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-2000:])
    return secs, (int(rss.group(1)) / 1024 if rss else None), proc.stdout, proc.returncode


TRAINED_STEPS = 100  # what the scale targets were measured with; svgen fit's default (0) only skips work


def run_fit(C, steps):
    npy, txt, source = write_inputs(C, TMP)
    out = TMP / f"out-{C}.svgen"
    cmd = [SVGEN, "fit", "--prototypes", npy, "--classes", txt, "--out", out, "--force"]
    if steps is not None:
        cmd += ["--steps", steps]
    wall, rss, _, rc = time_v(cmd)
    row = {"C": C, "M": 4 * C, "fit_s": wall, "fit_rss_mb": rss, "rc": rc, "data": source,
           "command": "/usr/bin/time -v " + " ".join(map(str, cmd))}
    if rc == 0:
        meta = json.loads((out / "svgen.json").read_text())
        m = meta["metrics"]
        row.update({"alignment_path": m["scale"]["alignment_path"], "vote_solver": m["scale"]["vote_solver"],
                    "train+solve_s": m["wall_time_s"], "alignment_end": m["alignment_end"],
                    "condition_number_method": m.get("condition_number_method"),
                    "vote_residual": (m.get("vote_weights") or {}).get("relative_residual"),
                    "artifact_mb": sum(f.stat().st_size for f in out.iterdir()) / 2**20})
    return row


def worker(C, path, n_steps, extra):
    """Time ``n_steps`` optimisation steps over a full batch of all C classes along ``path``."""
    import torch

    from benchmarks.bench_common import make_prototypes
    from svgen.core import scale
    from svgen.config import FitConfig
    from svgen.core.generator import SupportVectorGenerator, template_anchors
    from svgen.core.kernels import kernel, median_heuristic
    from svgen.encoders.prototypes import prototypes_from_embeddings
    from svgen.zeroshot.training import TrainState, _batch_loss, generate_all

    emb, _ = make_prototypes(C)
    E, P = prototypes_from_embeddings(torch.from_numpy(emb))
    K = 4
    minibatch = path == "minibatch"
    cfg = FitConfig(batch_classes=FitConfig().batch_classes if minibatch else C,
                    solver="auto" if minibatch else ("exact" if path == "naive" else path), metric="none")
    anchors = template_anchors(E, K)
    gen = SupportVectorGenerator(P.shape[1], K)
    S0 = generate_all(gen, P, anchors)
    sigma0 = median_heuristic(S0)
    state = TrainState(generator=gen, log_sigma=torch.tensor(math.log(sigma0), requires_grad=True),
                       weight=(10 * P).requires_grad_(True), bias=torch.zeros(C, requires_grad=True))
    params = list(gen.parameters()) + [state.weight, state.bias, state.log_sigma]
    opt = torch.optim.Adam(params, lr=1e-3)
    y_cache = torch.arange(min(C, cfg.batch_classes)).repeat_interleave(K)
    from svgen.zeroshot.training import ClassBatchSampler

    sampler = ClassBatchSampler(P, cfg.batch_classes, cfg.neighbours, 0)
    times = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        loss, _ = _batch_loss(cfg, state, P, anchors, E, sampler(), y_cache)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    out = {"step_s": min(times), "plan": scale.plan_fit(cfg, C, P.shape[1]).alignment_path}
    if path == "naive" and extra:
        S = generate_all(gen, P, anchors).reshape(-1, P.shape[1]).double()
        t0 = time.perf_counter()
        K_ss = kernel(S, S, sigma0)
        L = torch.linalg.cholesky(K_ss + 10.0 * S.shape[0] * torch.eye(S.shape[0], dtype=torch.float64))
        torch.cholesky_solve(torch.eye(S.shape[0], C, dtype=torch.float64), L)
        out["solve_s"] = time.perf_counter() - t0
        del L
        t0 = time.perf_counter()
        torch.linalg.eigvalsh(K_ss)
        out["eig_s"] = time.perf_counter() - t0
    out["rss_mb"] = peak_rss_mb()
    return out


def run_step(C, path, n_steps, extra=False):
    M = 4 * C
    if path == "naive":
        import psutil

        need = 24 * M * M + (16 * M * M if extra else 0)
        if need > 0.5 * psutil.virtual_memory().available:
            return {"skipped": f"needs ≈{need / 2**30:.0f} GiB for the (C·K)² kernel graph"}
    if path == "blocked" and M > 20000:
        return {"skipped": f"(C·K)²·D = {M * M * 512:.1e} flops per step (minutes on 2 cores)"}
    if path == "rff" and M > 20000:
        return {"skipped": f"full-batch Φ is {M}×2048 and (C·K)·m² = {M * 2048 ** 2:.1e} flops per step; "
                           "class mini-batches are the answer at this size"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_fit", "--worker", f"{C},{path},{n_steps},{int(extra)}"],
                          capture_output=True, text=True, cwd=str(ROOT))
    if proc.returncode != 0:
        return {"skipped": f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="C ∈ {100, 1000}, 30 fit steps, 2 timed steps per path")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--classes", default=None, help="comma-separated class counts (default 100,1000,21843)")
    ap.add_argument("--steps", type=int, default=TRAINED_STEPS,
                    help=f"fit steps (default {TRAINED_STEPS}: the trained path, the costly one; svgen's own "
                         "default is no training, --steps 0)")
    ap.add_argument("--step-repeats", type=int, default=3, help="timed steps per path (best is reported)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        C, path, n, extra = args.worker.split(",")
        print(json.dumps(worker(int(C), path, int(n), extra == "1")))
        return 0
    classes = [int(c) for c in args.classes.split(",")] if args.classes else ([100, 1000] if args.quick else [100, 1000, 21843])
    steps = 30 if args.quick and args.steps == TRAINED_STEPS else args.steps
    n_steps = 2 if args.quick else args.step_repeats
    default_steps = steps
    fits, step_rows = [], []
    for C in classes:
        fits.append(run_fit(C, steps))
        row = {"C": C, "M": 4 * C}
        for path in ("naive", "blocked", "rff", "minibatch"):
            r = run_step(C, path, n_steps, extra=(path == "naive"))
            if "skipped" in r:
                row[f"{path}_step_s"], row[f"{path}_note"] = None, r["skipped"]
            else:
                row[f"{path}_step_s"], row[f"{path}_rss_mb"] = r["step_s"], r["rss_mb"]
                if path == "naive":
                    row["naive_fit_est_s"] = default_steps * r["step_s"] + r["solve_s"] + r["eig_s"]
        for path in ("blocked", "rff", "minibatch"):
            if row.get("naive_step_s") and row.get(f"{path}_step_s"):
                row[f"{path}_speedup"] = row["naive_step_s"] / row[f"{path}_step_s"]
        fit = fits[-1]
        if row.get("naive_fit_est_s") and fit.get("fit_s"):
            fit["naive_fit_est_s"] = row["naive_fit_est_s"]
            fit["speedup_vs_naive"] = row["naive_fit_est_s"] / fit["fit_s"]
        step_rows.append(row)
    result = {"benchmark": "fit", "steps": default_steps, "K": 4, "D": 512, "machine": machine(),
              "fits": fits, "steps_full_batch": step_rows}
    path = save_result("fit-" + "-".join(map(str, classes)) + ("-quick" if args.quick else ""), result)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(fits, ["C", "M", "alignment_path", "vote_solver", "fit_s", "fit_rss_mb", "train+solve_s",
                           "naive_fit_est_s", "speedup_vs_naive", "vote_residual", "artifact_mb"],
                    title=f"svgen fit (K=4, D=512, {default_steps} steps), /usr/bin/time -v; data: {fits[0]['data']}")
        print()
        cols = ["C", "M", "naive_step_s", "naive_rss_mb", "blocked_step_s", "blocked_rss_mb", "blocked_speedup",
                "rff_step_s", "rff_rss_mb", "rff_speedup", "minibatch_step_s", "minibatch_rss_mb", "minibatch_speedup"]
        print_table(step_rows, cols, title="one step over a full batch of all C classes (best of "
                                           f"{n_steps}); speedup = naive / path")
        for r in step_rows:
            for p in ("naive", "blocked", "rff"):
                if r.get(f"{p}_note"):
                    print(f"  C={r['C']}: {p} skipped: {r[f'{p}_note']}")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

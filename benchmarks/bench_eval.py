#!/usr/bin/env python
"""Benchmark: `svgen eval` against `svgen classify` with each head, same artifact and rows, one run.

``eval`` scores every head of an artifact on the same rows; the stock way to get the same numbers is one
``classify --head H`` per head. The target (issue 49, item 16): eval's wall time at most 1.2× the sum of the heads'
classify wall times. Also timed, in this process on the same loaded artifact: eval's scoring loop
(:func:`svgen.evaluation.metrics.evaluate_heads`) against the loop it replaced, which evaluated each head twice per
block (``decision_function`` for the ranking, then ``logits`` for the probabilities).

Inputs (built in a temporary folder, never in the repository): an LVIS artifact (1,203 classes, fit from the real CLIP
text prototypes in ../shared/data, default settings) and ``--rows`` (50,000) feature rows, the real LVIS dev features
tiled with noise, with their labels. Each command runs as users type it (a subprocess, wall clock from exec to exit);
rounds alternate the commands, and each figure is the best of ``--rounds``.

    .venv/bin/python -m benchmarks.bench_eval [--rows 50000] [--rounds 2] [--quick]

Results: ``bench-results/bench_eval.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_common import DATA, machine, print_table, run_command as sh, save_result

SVGEN = [sys.executable, "-m", "svgen.cli", "-q"]
TARGET = 1.2


def setup(tmp: Path, n_rows: int) -> dict:
    if not (DATA / "lvis_dev_image_features.npy").is_file():
        raise SystemExit(f"needs the LVIS CLIP embeddings in {DATA}")
    art = tmp / "lvis.svgen"
    sh(SVGEN + ["fit", "--prototypes", DATA / "lvis_v1_clip_a+cname.npy", "--classes", DATA / "lvis_classes.txt",
                "--out", art])
    x0 = np.load(DATA / "lvis_dev_image_features.npy").astype(np.float32)
    y0 = np.load(DATA / "lvis_dev_labels.npy")
    rng = np.random.default_rng(0)
    idx = np.arange(n_rows) % x0.shape[0]
    scale = np.linalg.norm(x0, axis=1).mean() * 0.05 / np.sqrt(x0.shape[1])
    x = x0[idx] + scale * rng.standard_normal((n_rows, x0.shape[1])).astype(np.float32)
    np.save(tmp / "x.npy", x.astype(np.float32))
    np.save(tmp / "y.npy", y0[idx])
    return {"art": art, "x": tmp / "x.npy", "y": tmp / "y.npy"}


def scoring_loops(inputs: dict, block_rows: int = 4096) -> dict:
    """In-process seconds of eval's loop, and of the loop that scored every head twice per block (the same metrics)."""
    from svgen import SVGClassifier
    from svgen.evaluation.metrics import HEAD_ORDER, HeadTally, evaluate_heads
    from svgen.heads import predictor

    clf = SVGClassifier.load(inputs["art"])
    x, y = np.load(inputs["x"], mmap_mode="r"), np.load(inputs["y"])

    def twice():
        import torch

        heads = [h for h in HEAD_ORDER if h in clf.head_names_]
        tallies = {h: HeadTally(len(clf.classes_)) for h in heads}
        for s in range(0, y.size, block_rows):
            xb, yb = torch.from_numpy(np.array(x[s:s + block_rows], dtype=np.float32)), y[s:s + block_rows]
            for h in heads:
                tallies[h].add_ranking(clf.decision_function(xb, head=h), yb)
                tallies[h].add_probabilities(clf.logits(xb, head=h), predictor.temperature(clf.heads_, h), yb)
        return {h: t.result() for h, t in tallies.items()}

    from svgen.engine.predictions import score

    per_head = {}
    for h in clf.head_names_:   # classify's scoring of each head alone (no start-up, no output)
        t0 = time.perf_counter()
        for s in range(0, y.size, block_rows):
            score(clf, np.array(x[s:s + block_rows], dtype=np.float32), h, False)
        per_head[h] = time.perf_counter() - t0
    t0 = time.perf_counter()
    once = evaluate_heads(clf, x, y)
    t_once = time.perf_counter() - t0
    t0 = time.perf_counter()
    old = twice()
    t_twice = time.perf_counter() - t0
    same = all(abs(once[h]["acc1"] - old[h]["acc1"]) < 1e-12 for h in old)
    return {"once_s": t_once, "twice_s": t_twice, "acc1_equal": same, "classify_scoring_s": per_head,
            "classify_scoring_sum_s": sum(per_head.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="5,000 rows, one round")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 5_000, 1
    with tempfile.TemporaryDirectory(prefix="svgen-bench-eval-") as tmp:
        tmp = Path(tmp)
        inputs = setup(tmp, args.rows)
        from svgen import SVGClassifier

        heads = list(SVGClassifier.load(inputs["art"]).head_names_)
        walls = {name: [] for name in ["eval", *heads]}
        for r in range(args.rounds):
            walls["eval"].append(sh(SVGEN + ["eval", inputs["art"], "--features", inputs["x"], "--labels", inputs["y"],
                                             "--json", "--out", tmp / f"eval{r}.json"]))
            for h in heads:
                walls[h].append(sh(SVGEN + ["classify", inputs["art"], "--features", inputs["x"], "--head", h,
                                            "--out", tmp / f"{h}{r}.csv"]))
        loops = scoring_loops(inputs)
    best = {k: min(v) for k, v in walls.items()}
    classify_sum = sum(best[h] for h in heads)
    rows = [{"command": "eval (every head)", "wall_s": best["eval"], "ratio": best["eval"] / classify_sum}]
    rows += [{"command": f"classify --head {h}", "wall_s": best[h], "ratio": None} for h in heads]
    rows.append({"command": "sum of the classify runs", "wall_s": classify_sum, "ratio": 1.0})
    print_table(rows, ["command", "wall_s", "ratio"],
                title=f"{args.rows} rows, 1,203 classes, best of {args.rounds} (ratio: eval / sum of classify)")
    print(f"in-process, no start-up or output: eval's loop {loops['once_s']:.2f}s = "
          f"{loops['once_s'] / loops['classify_scoring_sum_s']:.2f}× the heads' classify scoring "
          f"({loops['classify_scoring_sum_s']:.2f}s: "
          + ", ".join(f"{h} {t:.2f}s" for h, t in loops["classify_scoring_s"].items())
          + f"); the old loop, each head scored twice per block: {loops['twice_s']:.2f}s "
          f"({loops['twice_s'] / loops['once_s']:.2f}× eval's; acc1 equal: {loops['acc1_equal']})")
    ratio = best["eval"] / classify_sum
    print(f"target eval ≤ {TARGET}× the sum: {'met' if ratio <= TARGET else 'MISSED'} ({ratio:.2f}×)")
    path = save_result("bench_eval", {"rows": args.rows, "classes": 1203, "rounds": args.rounds, "walls_s": walls,
                                      "best_s": best, "classify_sum_s": classify_sum, "ratio": ratio,
                                      "target": TARGET, "met": ratio <= TARGET, "scoring_loops": loops,
                                      "machine": machine()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python
"""The default LVIS fit against the import floor, side by side in one run (issue 23, item 10).

Two commands, each in a fresh process, alternated ``--repeats`` times so load spikes hit both:

* ``floor``  ``python -c 'import torch, open_clip'``: what any open_clip tool pays before it does anything;
* ``fit``    ``svgen fit --prototypes lvis_v1_clip_a+cname.npy --classes lvis_classes.txt --out …`` with
  default settings (1,203 classes, real CLIP ViT-B/32 text embeddings from ../shared/data).

Reported: wall seconds (min and median over the repeats), the fit's own ``wall_time_s`` (the whole
``SVGClassifier.fit``), and the ratio fit / floor of the medians — the comparable number, since the
machine may be shared (the 1-minute load average before and after is recorded). Target: ≤ 1.5.

    python -m benchmarks.bench_fit_floor              # 3 repeats
    python -m benchmarks.bench_fit_floor --repeats 5

Writes ``bench-results/bench_fit_floor.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_common import DATA, machine, print_table, save_result

TARGET = 1.5


def run(cmd, env) -> tuple:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return wall, proc.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    protos, classes = DATA / "lvis_v1_clip_a+cname.npy", DATA / "lvis_classes.txt"
    if not protos.is_file():
        raise SystemExit(f"{protos} is absent: this benchmark needs ../shared/data")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    py = sys.executable
    svgen = str(Path(py).parent / "svgen")
    tmp = Path(tempfile.mkdtemp(prefix="svgen-floor-"))
    floor, fit, inner, loads = [], [], [], []
    try:
        for i in range(args.repeats):
            loads.append(os.getloadavg()[0])
            floor.append(run([py, "-c", "import torch, open_clip"], env)[0])
            out = tmp / f"lvis-{i}.svgen"
            wall, stdout = run([svgen, "-q", "fit", "--prototypes", protos, "--classes", classes, "--out", out], env)
            fit.append(wall)
            inner.append(json.loads(stdout)["wall_time_s"])
            shutil.rmtree(out)
        loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = statistics.median(fit) / statistics.median(floor)
    rows = [
        {"command": "python -c 'import torch, open_clip'", "min_s": min(floor), "median_s": statistics.median(floor)},
        {"command": "svgen fit (LVIS, defaults)", "min_s": min(fit), "median_s": statistics.median(fit),
         "fit_wall_time_s": statistics.median(inner)},
    ]
    print_table(rows, ["command", "min_s", "median_s", "fit_wall_time_s"],
                title=f"LVIS default fit vs the import floor ({args.repeats} repeats, alternated)")
    print(f"ratio fit / floor (medians): {ratio:.2f} (target ≤ {TARGET}); load average {min(loads):.1f}–{max(loads):.1f}")
    save_result("bench_fit_floor", {"rows": rows, "ratio_median": ratio, "ratio_min": min(fit) / min(floor),
                                    "target": TARGET, "meets_target": ratio <= TARGET, "repeats": args.repeats,
                                    "floor_s": floor, "fit_s": fit, "fit_wall_time_s": inner,
                                    "load_average_1min": loads, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

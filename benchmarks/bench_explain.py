#!/usr/bin/env python
"""Benchmark: ``svgen explain`` against ``svgen classify`` on the same rows (issue 48: at most 2×).

The artifact is the zero-shot LVIS fit (``--prototypes lvis_v1_clip_a+cname.npy``, 1,203 classes, K = 4) and the rows
the 602 LVIS dev features tiled to 1,000 (``--rows``). Both commands run in this process on the same features file,
artifact loading included: ``classify -k 3 --format jsonl`` (the stock path) and ``explain --json`` (top 3 classes,
5 support vectors for and against each), and ``explain``'s default table. ``ratio`` = explain time / classify time
(best of ``--repeat``, the three commands interleaved so that a change of load on shared cores hits them alike), in
wall and in CPU seconds (``cpu_ratio``: what other jobs on the cores disturb least), for the default (kernel) head
and for the linear and cosine heads. Memory: the peak RSS of a fresh process explaining two
batches of rows and four times as many (the same peak: one batch at a time).

    .venv/bin/python -m benchmarks.bench_explain [--artifact A.svgen] [--rows 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_common import DATA, machine, print_table, save_result


def fit_lvis(folder: Path) -> Path:
    from svgen.cli import main

    art = folder / "lvis.svgen"
    code = main(["-q", "fit", "--prototypes", str(DATA / "lvis_v1_clip_a+cname.npy"), "--classes",
                 str(DATA / "lvis_classes.txt"), "--out", str(art)])
    if code:
        raise SystemExit(f"fit failed ({code})")
    return art


def run_cli(*argv) -> None:
    from svgen.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["-q", *map(str, argv)])
    if code:
        raise SystemExit(f"svgen {argv[0]} failed ({code})")


PEAK = """
import sys, numpy as np, torch
from svgen import SVGClassifier


class Rows:   # rows read from the file as the explainer asks for them: the input is never held whole (and not
    def __init__(self, path):   # memory-mapped, whose pages would count in the process's peak)
        self.f = open(path, "rb")
        header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        shape, _, self.dtype = header[np.lib.format.read_magic(self.f)](self.f)
        self.shape, self.start = shape, self.f.tell()

    def __getitem__(self, part):
        lo, hi, _ = part.indices(self.shape[0])
        self.f.seek(self.start + lo * self.shape[1] * self.dtype.itemsize)
        x = np.fromfile(self.f, self.dtype, (hi - lo) * self.shape[1]).reshape(-1, self.shape[1])
        return torch.from_numpy(x.astype(np.float32))


clf = SVGClassifier.load(sys.argv[1])
n = 0
for row in clf.explainer().explain(Rows(sys.argv[2]), 3, 5):
    n += 1
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec, so it would report this benchmark's own peak
print(n, next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) / 1024.0)
"""


def peak_rss(art: Path, feats: Path) -> float:
    out = subprocess.run([sys.executable, "-c", PEAK, str(art), str(feats)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--artifact", help="an LVIS artifact (default: fit one from the shared data)")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    dev = DATA / "lvis_dev_image_features.npy"
    if not dev.is_file():
        raise SystemExit(f"{dev} is absent")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        art = Path(args.artifact) if args.artifact else fit_lvis(tmp)
        X = np.load(dev).astype(np.float32)
        tiled = np.concatenate([X] * (args.rows // len(X) + 1))[:args.rows]
        feats = tmp / "rows.npy"
        np.save(feats, tiled)
        rows = []
        for head in ("kernel", "linear", "cosine"):
            runs = {"classify": ("classify", art, "--features", feats, "--head", head, "-k", "3", "--format", "jsonl"),
                    "--json": ("explain", art, "--features", feats, "--head", head, "--json"),
                    "table": ("explain", art, "--features", feats, "--head", head)}
            wall, cpu = {k: float("inf") for k in runs}, {k: float("inf") for k in runs}
            for _ in range(args.repeat):   # interleaved, so that a change of load on shared cores hits all three
                for k, argv in runs.items():
                    w0, c0 = time.perf_counter(), time.process_time()
                    run_cli(*argv)
                    wall[k] = min(wall[k], time.perf_counter() - w0)
                    cpu[k] = min(cpu[k], time.process_time() - c0)
            for output in ("--json", "table"):   # what a script reads, and the default table a person reads
                rows.append({"head": head, "output": output, "rows": args.rows, "classify_s": wall["classify"],
                             "explain_s": wall[output], "ratio": wall[output] / wall["classify"],
                             "classify_cpu_s": cpu["classify"], "explain_cpu_s": cpu[output],
                             "cpu_ratio": cpu[output] / cpu["classify"]})
        from svgen.evaluation.explain import BATCH

        small, big = tmp / "small.npy", tmp / "big.npy"   # two full batches, and four times as many rows
        np.save(small, np.resize(X, (2 * BATCH, X.shape[1])))
        np.save(big, np.resize(X, (8 * BATCH, X.shape[1])))
        memory = {"rows": 2 * BATCH, "peak_rss_mb": peak_rss(art, small),
                  "rows_x4": 8 * BATCH, "peak_rss_mb_x4": peak_rss(art, big)}
    print_table(rows, ["head", "output", "rows", "classify_s", "explain_s", "ratio", "classify_cpu_s", "explain_cpu_s",
                       "cpu_ratio"],
                title=f"svgen explain vs classify, LVIS (1,203 classes), {args.rows} rows")
    print(f"peak RSS explaining {memory['rows']} rows: {memory['peak_rss_mb']:.0f} MB; "
          f"{memory['rows_x4']} rows: {memory['peak_rss_mb_x4']:.0f} MB")
    result = {"rows": rows, "memory": memory, "machine": machine(),
              "artifact": str(args.artifact or "zero-shot LVIS fit, defaults")}
    path = save_result("explain", result)
    print(f"wrote {path}")
    print(json.dumps({f'{r["head"]} {r["output"]}': [round(r["ratio"], 3), round(r["cpu_ratio"], 3)] for r in rows}))


if __name__ == "__main__":
    main()

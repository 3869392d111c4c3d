#!/usr/bin/env python
"""Benchmark: `svgen classify` in one process against `svgen classify --engine ray`, same inputs, one run.

Inputs (built in a temporary folder, never in the repository):

* an LVIS artifact (1,203 classes, fit from the real CLIP text prototypes in ../shared/data);
* **images**: the 100 real JPEGs of ``images-30class`` copied to ``--images`` files (300 by
  default), embedded by a random-weight ViT-B-32 (built from open_clip's config, seed 0, saved as a
  safetensors checkpoint and named with ``--model ViT-B-32 --checkpoint``): real decoding and
  preprocessing, the real encoder's compute;
* **features**: ``--rows`` (200,000) embedding rows, the real LVIS dev features tiled with noise,
  as one ``.npy`` shard.

Each configuration is run as the command users type (a subprocess, wall clock from exec to exit):
single-process writes CSV to a file, Ray writes Parquet parts. **Start-up** is the wall time of
the same command on one input; **steady** throughput is what a collection of millions sees: for Ray,
the rows of all parts but the first over the time between the first and the last part's rename;
for the single process (one file at the end), (N − 1) / (wall − start-up). Ray runs a local instance bounded to ``--cpus`` logical CPUs and a
512 MB object store. The per-actor throughput (one actor, one CPU) gives a paper estimate for
10 million images on N nodes.

    .venv/bin/python -m benchmarks.bench_classify [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.bench_common import machine, print_table, run_command as sh, save_result

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
SVGEN = [sys.executable, "-m", "svgen.cli"]
TEN_MILLION = 10_000_000


def setup(tmp: Path, n_images: int, n_rows: int) -> dict:
    import open_clip
    import torch
    from safetensors.torch import save_file

    clip = DATA / "clip-vit-b32"
    jpegs = sorted((DATA / "images-30class").glob("*.jpg"))
    if not jpegs or not (clip / "lvis_dev_image_features.npy").is_file():
        raise SystemExit("needs ../shared/data (images-30class and clip-vit-b32)")
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32")
    ckpt = tmp / "vit-b-32-random.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    del model
    art = tmp / "lvis.svgen"
    sh(SVGEN + ["-q", "fit", "--prototypes", clip / "lvis_v1_clip_a+cname.npy", "--classes", clip / "lvis_classes.txt",
                "-K", "2", "--steps", "2", "--ridge", "10", "--out", art])
    images = tmp / "images"
    images.mkdir()
    for i in range(n_images):
        src = jpegs[i % len(jpegs)]
        shutil.copy(src, images / f"{i:06d}-{src.name}")
    one_image = tmp / "one-image"
    one_image.mkdir()
    shutil.copy(jpegs[0], one_image / jpegs[0].name)
    rng = np.random.default_rng(0)
    base = np.load(clip / "lvis_dev_image_features.npy").astype(np.float32)
    feats = base[np.arange(n_rows) % len(base)]
    feats += 0.05 * np.linalg.norm(base, axis=1).mean() * rng.standard_normal(feats.shape).astype(np.float32) / 22.6
    np.save(tmp / "feats.npy", feats)
    np.save(tmp / "one-row.npy", feats[:1])
    del feats
    enc = ["--model", "ViT-B-32", "--checkpoint", ckpt]
    return {"art": art, "images": images, "one_image": one_image, "feats": tmp / "feats.npy",
            "one_row": tmp / "one-row.npy", "enc": enc}


def part_rate(out: Path):
    """Steady throughput of a Ray run from its output alone: the rows of every part but the first
    to finish, over the time from the first part's rename to the last's (start-up excluded)."""
    import pyarrow.parquet as pq

    parts = sorted(out.glob("part-*.parquet"), key=lambda p: p.stat().st_mtime_ns)
    if len(parts) < 3:
        return None
    rows = sum(pq.read_metadata(p).num_rows for p in parts[1:])
    return rows / ((parts[-1].stat().st_mtime_ns - parts[0].stat().st_mtime_ns) / 1e9)


def measure(name, argv_for, n, tmp, extra_label="") -> dict:
    """Start-up (the same command on one input) and full-run wall times; ``argv_for(kind, out)``.

    Steady throughput: for Ray, from the part files' rename times (:func:`part_rate`); for the
    single process, which writes one file at the end, (N − 1) / (wall − start-up).
    """
    start = sh(argv_for("one", tmp / f"{name}-one"))
    wall = sh(argv_for("all", tmp / f"{name}-all"))
    steady = part_rate(tmp / f"{name}-all") if "ray" in name else None
    how = "part files" if steady else "wall - start-up"
    steady = steady or (n - 1) / max(wall - start, 1e-9)
    return {"config": name, "n": n, "startup_s": round(start, 2), "wall_s": round(wall, 2),
            "throughput_per_s": round(n / wall, 1), "steady_per_s": round(steady, 1), "steady_from": how,
            "note": extra_label}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 images and 20,000 rows")
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of the local Ray instance (default: 2)")
    args = ap.parse_args()
    if args.quick:
        args.images, args.rows = 100, 20_000
    os.environ["HF_HUB_OFFLINE"] = "1"
    tmp = Path(tempfile.mkdtemp(prefix="svgen-bench-classify-"))
    try:
        inp = setup(tmp, args.images, args.rows)
        art, enc = inp["art"], inp["enc"]
        ray_common = ["--engine", "ray", "--cpus", args.cpus, "--object-store-mb", 512]

        def images_single(kind, out):
            src = inp["images"] if kind == "all" else inp["one_image"]
            return SVGEN + ["-q", "classify", art, src, *enc, "--out", f"{out}.csv"]   # one CSV file

        def images_ray(actors, actor_cpus, cpus=None):
            def argv(kind, out):
                src = inp["images"] if kind == "all" else inp["one_image"]
                common = list(ray_common)
                if cpus:
                    common[common.index("--cpus") + 1] = cpus
                return SVGEN + ["-q", "classify", art, src, *enc, *common, "--actors", actors,
                                "--actor-cpus", actor_cpus, "--block-size", 25, "--out", out]
            return argv

        def feats_single(kind, out):
            return SVGEN + ["-q", "classify", art, "--features", inp["feats"] if kind == "all" else inp["one_row"],
                            "--out", f"{out}.csv"]

        def feats_ray(actors):
            def argv(kind, out):
                return SVGEN + ["-q", "classify", art, "--features",
                                inp["feats"] if kind == "all" else inp["one_row"], *ray_common,
                                "--actors", actors, "--block-size", max(1000, n_rows // 10), "--out", out]
            return argv

        n_img, n_rows = args.images, args.rows
        rows = [
            measure("images single-process", images_single, n_img, tmp, "torch threads: all cores"),
            measure("images ray 1 actor x1 CPU", images_ray(1, 1), n_img, tmp,
                    "1 torch thread + decoding tasks on the other CPU"),
            measure("images ray 1 actor x2 CPU", images_ray(1, 2, cpus=args.cpus + 1), n_img, tmp,
                    f"2 torch threads; Ray told {args.cpus + 1} logical CPUs so one decoding task runs beside"),
            measure("features single-process", feats_single, n_rows, tmp, ""),
            measure("features ray 2 actors", feats_ray(2), n_rows, tmp, "1 CPU each"),
        ]
        for r in rows:
            r["kind"] = r["config"].split()[0]
        base = {r["kind"]: r for r in rows if "single" in r["config"]}
        for r in rows:
            b = base[r["kind"]]
            r["ratio_total"] = round(b["wall_s"] / r["wall_s"], 2)
            r["ratio_steady"] = round(r["steady_per_s"] / b["steady_per_s"], 2)
        print_table(rows, ["config", "n", "startup_s", "wall_s", "throughput_per_s", "steady_per_s", "ratio_total",
                           "ratio_steady"], title="svgen classify: single process vs --engine ray")
        # the paper estimate: per-actor steady throughput (1 actor, 1 CPU, decoding beside it)
        per_actor = next(r for r in rows if r["config"] == "images ray 1 actor x1 CPU")["steady_per_s"]
        ray_start = max(r["startup_s"] for r in rows if "ray" in r["config"])
        estimate = []
        for nodes in (1, 10, 100):
            for cores in (16, 64):
                actors = cores // 2  # each actor with one CPU and one CPU of decoding beside it, as measured
                rate = nodes * actors * per_actor
                estimate.append({"nodes": nodes, "cores_per_node": cores, "actors": nodes * actors,
                                 "images_per_s": round(rate), "hours": round((TEN_MILLION / rate + ray_start) / 3600, 2)})
        print_table(estimate, ["nodes", "cores_per_node", "actors", "images_per_s", "hours"],
                    title=f"\npaper estimate, 10M images (ViT-B-32 on CPU, {per_actor:.1f} images/s per actor, "
                          "linear scaling, no I/O limit)")
        result = {"machine": machine(), "images": n_img, "rows": n_rows, "ray_cpus": args.cpus,
                  "runs": rows, "per_actor_images_per_s": per_actor, "estimate_10M": estimate,
                  "command": "benchmarks/bench_classify.py" + (" --quick" if args.quick else "")}
        import ray

        result["ray"] = ray.__version__
        print(f"\nwrote {save_result('bench_classify' + ('_quick' if args.quick else ''), result)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

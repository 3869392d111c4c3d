#!/usr/bin/env python
"""Images per second: ``svgen classify`` against a plain open_clip loop, on the same files, in one run (issue 39).

The files are ``--n`` JPEGs of 500×375 made from the shared photographs (random crops, flips and brightness, in
a temporary folder), so it runs anywhere. The model is the tests' tiny random-weight model unless ``--model``
and ``--checkpoint`` name one (a random-weight ViT-B-32 does for speed: ``--random-vit``). Measured, interleaved
over ``--rounds`` rounds (the best of each is reported; on shared cores the ratios within a round are what
counts):

* ``svgen classify`` in-process (``svgen.cli.main``: artifact and encoder loading included) and as a whole process
  (Python start and imports included);
* the plain open_clip loop — ``create_model_and_transforms``, a ``DataLoader`` (PIL decode + the model's
  preprocess), ``encode_image`` (under ``torch.autocast`` on CUDA) — once with svgen's loader settings and once
  tuned (batch 256, a worker per core, ``pin_memory`` on CUDA);
* decoding and preprocessing alone (the CPU-side limit), with the tuned workers; tensor (``torchvision``) decoding
  alone, on CUDA (nvjpeg) where present, else on the CPU;
* with CUDA: ``svgen classify --decode gpu``; mixed precision against fp32 on the shared photos (cosine, top-1);
* text: ``svgen``'s prototypes against ``open_clip.build_zero_shot_classifier`` (autocast on CUDA) on
  ``--text-classes`` ImageNet classes × the ``openai`` templates, with the prototypes' agreement.

Writes ``bench-results/images-<device>-<model>.json`` and prints a markdown table; ``--write-docs`` puts it into
``docs/performance.md`` (between this device kind's markers, so a GPU run and a CPU run keep their own tables).

    python -m benchmarks.bench_images                                # CPU, tiny model
    python -m benchmarks.bench_images --random-vit --n 200           # CPU, ViT-B-32 with random weights
    python -m benchmarks.bench_images --device cuda --n 12000 --model ViT-B-32 --checkpoint FILE --quick-gelu \\
        --text-classes 1000 --write-docs                             # the GPU run (benchmarks/gpu_images.sh)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bench_common import ROOT, machine as common_machine, replace_between, save_result
PHOTOS = ROOT.parent / "shared" / "data" / "images-30class"
DOC = ROOT / "docs" / "performance.md"


# ----------------------------------------------------------------------------- inputs

def _make_jpeg(job):
    """One jittered 500×375 JPEG (crop, flip, brightness) of a shared photo; noise when there is none."""
    from PIL import Image, ImageEnhance, ImageOps

    i, source, out, size = job
    rng = random.Random(i)
    if source:
        im = Image.open(source).convert("RGB")
        w, h = im.size
        s = rng.uniform(0.7, 1.0)
        x, y = rng.uniform(0, w * (1 - s)), rng.uniform(0, h * (1 - s))
        im = im.crop((int(x), int(y), int(x + w * s), int(y + h * s))).resize(size, Image.BICUBIC)
        im = ImageOps.mirror(im) if rng.random() < 0.5 else im
        im = ImageEnhance.Brightness(im).enhance(rng.uniform(0.8, 1.2))
    else:
        im = Image.effect_noise(size, 64).convert("RGB")
    im.save(out, quality=90)


def make_jpegs(folder: Path, n: int, size=(500, 375)):
    """``n`` JPEGs of ``size`` made from the shared photos (in parallel, one process per core)."""
    import multiprocessing

    folder.mkdir(parents=True, exist_ok=True)
    sources = sorted(str(p) for p in PHOTOS.glob("*.jpg")) if PHOTOS.is_dir() else []
    jobs = [(i, sources[i % len(sources)] if sources else None, str(folder / f"{i:06d}.jpg"), size) for i in range(n)]
    with multiprocessing.get_context("spawn").Pool(min(16, os.cpu_count() or 1)) as pool:
        pool.map(_make_jpeg, jobs, chunksize=64)
    return sorted(str(p) for p in folder.glob("*.jpg")), ("shared photos, jittered" if sources else "noise")


def encoder_args(args):
    return ["--model", args.model, "--checkpoint", args.checkpoint] + (["--quick-gelu"] if args.quick_gelu else [])


def fit_artifact(args, work: Path) -> Path:
    from svgen.cli import main

    classes = sorted({ln.split(",", 1)[1] for ln in (PHOTOS / "labels.csv").read_text().splitlines() if ln.strip()}) \
        if (PHOTOS / "labels.csv").is_file() else [f"class {i}" for i in range(30)]
    (work / "classes.txt").write_text("\n".join(classes) + "\n")
    art = work / "bench.svgen"
    with contextlib.redirect_stdout(io.StringIO()):   # fit's JSON summary
        assert main(["-q", "fit", "--classes", str(work / "classes.txt"), *encoder_args(args), "--device", args.device,
                     "--steps", "5", "--out", str(art), "--force"]) == 0
    return art


# ----------------------------------------------------------------------------- the measurements

class _Files(torch.utils.data.Dataset):
    def __init__(self, paths, preprocess):
        self.paths, self.preprocess = paths, preprocess

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            return self.preprocess(im.convert("RGB"))


def oc_name(args) -> str:
    """The name open_clip knows the architecture by (a config file is registered under its stem)."""
    import open_clip

    if args.model.endswith(".json"):
        open_clip.add_model_config(args.model)
        return Path(args.model).stem
    return args.model


def open_clip_model(args, device):
    import open_clip

    act = {"force_quick_gelu": True} if args.quick_gelu else {}
    model, _, preprocess = open_clip.create_model_and_transforms(oc_name(args), pretrained=args.checkpoint,
                                                                 device=device, **act)
    return model.eval(), preprocess


def open_clip_loop(args, paths, device, batch_size, workers, encode=True):
    """The plain loop a user writes; returns the number of images (embeddings are computed and dropped)."""
    model, preprocess = open_clip_model(args, device)
    loader = torch.utils.data.DataLoader(_Files(paths, preprocess), batch_size=batch_size, num_workers=workers,
                                         pin_memory=device.type == "cuda", prefetch_factor=4 if workers else None)
    n = 0
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    with torch.inference_mode(), amp:
        out = []
        for x in loader:
            if encode:
                out.append(model.encode_image(x.to(device, non_blocking=True)).float())
            n += x.shape[0]
        if out:
            torch.cat(out).cpu()
    return n


def tensor_decode_only(paths, preprocess, device, batch_size=256):
    from svgen.encoders.tensor_decode import JpegBytes, TensorPreprocess, collate_bytes, decode_batches

    spec = TensorPreprocess.from_preprocess(preprocess)
    loader = torch.utils.data.DataLoader(JpegBytes(paths, preprocess), batch_size=batch_size, collate_fn=collate_bytes,
                                         num_workers=min(4, os.cpu_count() or 1))
    n = 0
    for idx, images, _ in decode_batches(loader, paths, preprocess, spec, device):
        n += len(idx)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n


def classify_in_process(args, art, folder, out, extra=()):
    from svgen.cli import main
    from svgen.encoders.identity import _sha256_of

    _sha256_of.cache_clear()   # as a fresh command would: the checkpoint is hashed again

    assert main(["-q", "classify", str(art), str(folder), *encoder_args(args), "--device", args.device,
                 "--out", str(out), "--force", *extra]) == 0


def classify_process(args, art, folder, out):
    code = "import sys; from svgen.cli import main; sys.exit(main(sys.argv[1:]))"
    subprocess.run([sys.executable, "-c", code, "-q", "classify", str(art), str(folder), *encoder_args(args),
                    "--device", args.device, "--out", str(out), "--force"], check=True, env=dict(os.environ))


def agreement(args, device):
    """Mixed precision against fp32 on the shared photos: min cosine, top-1 agreement over their 30 classes."""
    import torch.nn.functional as F

    from svgen.encoders.clip import ClipEncoder

    if not (PHOTOS / "labels.csv").is_file():
        return None
    rows = [ln.split(",", 1) for ln in (PHOTOS / "labels.csv").read_text().splitlines() if ln.strip()]
    paths, classes = [str(PHOTOS / f) for f, _ in rows], sorted({c for _, c in rows})
    enc = ClipEncoder(args.model, checkpoint=args.checkpoint, device=str(device), quick_gelu=args.quick_gelu or None)
    out = {}
    for precision in ("fp32", "auto" if device.type == "cuda" else "bf16"):
        enc.precision = precision
        x, _, _ = enc.encode_images(paths, num_workers=0)
        t = enc.encode_text([f"a photo of a {c}" for c in classes])
        out[precision] = (x, F.normalize(x, dim=-1) @ F.normalize(t, dim=-1).T)
    (a, sa), (b, sb) = out.values()
    return {"precision": enc.precision_name, "min_cosine": float(F.cosine_similarity(a, b).min()),
            "top1_agreement": float((sa.argmax(-1) == sb.argmax(-1)).float().mean())}


def text_side(args, device):
    """svgen's prototypes vs ``open_clip.build_zero_shot_classifier`` (autocast on CUDA): seconds and agreement."""
    import open_clip
    import torch.nn.functional as F

    from svgen.encoders.clip import ClipEncoder
    from svgen.encoders.prompts import load_templates, read_classes
    from svgen.encoders.prototypes import build_prototypes

    classes = read_classes(ROOT / "prompts" / "classes" / "imagenet1k.txt")[:args.text_classes]
    templates = load_templates("openai")
    enc = ClipEncoder(args.model, checkpoint=args.checkpoint, device=str(device), quick_gelu=args.quick_gelu or None)
    tokenizer = open_clip.get_tokenizer(oc_name(args))
    assert enc.tokenizer is not None   # both tokenizers built before the clock starts
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    t_svgen = t_open_clip = float("inf")
    for _ in range(max(1, min(args.rounds, 2))):   # interleaved, best of each
        t0 = time.perf_counter()
        ours = build_prototypes(enc, classes, templates, use_cache=False).mean
        t_svgen = min(t_svgen, time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.inference_mode(), amp:
            theirs = open_clip.build_zero_shot_classifier(enc.model, tokenizer, classes, templates,
                                                          num_classes_per_batch=10, device=device, use_tqdm=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t_open_clip = min(t_open_clip, time.perf_counter() - t0)
    cos = F.cosine_similarity(ours.float(), theirs.float().T.cpu())
    return {"prompts": len(classes) * len(templates), "svgen_s": t_svgen, "open_clip_s": t_open_clip,
            "speedup": t_open_clip / t_svgen, "min_prototype_cosine": float(cos.min()),
            "svgen_precision": enc.precision_name, "open_clip_precision": "bf16" if device.type == "cuda" else "fp32"}


# ----------------------------------------------------------------------------- the run

def table_rows(times: dict, n: int) -> list:
    """Per step: images/s of its best round, and its speed over the loop with svgen's settings in each round
    (the load changes between rounds, so a round's own ratio is the fairer comparison) and their median."""
    import statistics

    same = next(k for k in times if k.startswith("open_clip loop, svgen"))
    rows = []
    for what, seconds in times.items():
        ratios = [t_same / t for t, t_same in zip(seconds, times[same])]
        rows.append({"what": what, "images_per_s": n / min(seconds), "seconds": seconds,
                     "round_ratios_vs_same_settings": ratios,
                     "median_ratio_vs_same_settings": statistics.median(ratios)})
    return rows


def machine(device) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from svgen.encoders.runtime import usable_cores

    return {**common_machine(), "cpu": cpu, "cores": usable_cores(),
            "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None}


def run(args) -> dict:
    from svgen.encoders.clip import resolve_device

    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:   # the files and checkpoint go with it
        return _run(args, device, Path(tmp))


def _run(args, device, work: Path) -> dict:
    from svgen.encoders.runtime import plan_loader, usable_cores

    if args.random_vit or not args.checkpoint:
        args.checkpoint, args.model = make_model(args, work)
    folder = work / "jpegs"
    paths, source = make_jpegs(folder, args.n)
    art = fit_artifact(args, work)
    plan = plan_loader(len(paths), device)
    tuned = dict(batch_size=args.tuned_batch, workers=args.tuned_workers or usable_cores())
    _, preprocess = open_clip_model(args, torch.device("cpu"))
    steps = {
        "svgen classify, in-process": lambda: classify_in_process(args, art, folder, work / "p.csv"),
        "svgen classify, whole process": lambda: classify_process(args, art, folder, work / "p.csv"),
        f"open_clip loop, svgen's settings (batch {plan.batch_size}, {plan.workers} workers)":
            lambda: open_clip_loop(args, paths, device, plan.batch_size, plan.workers),
        f"open_clip loop, tuned (batch {tuned['batch_size']}, {tuned['workers']} workers)":
            lambda: open_clip_loop(args, paths, device, tuned["batch_size"], tuned["workers"]),
        f"decode + preprocess only, PIL ({tuned['workers']} workers)":
            lambda: open_clip_loop(args, paths, torch.device("cpu"), tuned["batch_size"], tuned["workers"], encode=False),
        f"decode + preprocess only, tensors on {device.type}": lambda: tensor_decode_only(paths, preprocess, device),
    }
    if device.type == "cuda":
        steps["svgen classify --decode gpu, in-process"] = lambda: classify_in_process(
            args, art, folder, work / "p.csv", extra=("--decode", "gpu"))
    warm = work / "warm"   # one untimed pass of each side on 8 files: first-use costs (the page cache, lazy
    warm.mkdir()           # imports, kernel selection) fall on neither side's first timed step
    for p in paths[:8]:
        shutil.copy(p, warm)
    classify_in_process(args, art, warm, work / "w.csv")
    open_clip_loop(args, paths[:8], device, 8, 0)
    if args.steps:   # a focused comparison: only the steps whose names start with one of these
        keep = [w.strip() for w in args.steps.split(",")]
        steps = {k: v for k, v in steps.items() if any(k.startswith(w) for w in keep)}
    times = {k: [] for k in steps}
    for r in range(args.rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))   # interleaved, alternating order
        for name in order:
            t0 = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t0)
            print(f"round {r + 1}: {name}: {len(paths) / times[name][-1]:.1f} images/s", file=sys.stderr)
    rows = table_rows(times, len(paths))
    return {"machine": machine(device), "device": str(device), "model": args.model_label, "n": len(paths),
            "files": f"{len(paths)} JPEGs 500×375 ({source})", "rounds": args.rounds, "rows": rows,
            "svgen_plan": {"batch_size": plan.batch_size, "workers": plan.workers, "pin_memory": plan.pin_memory},
            "agreement": agreement(args, device), "text": text_side(args, device) if args.text_classes else None}


def make_model(args, work: Path):
    """The tests' tiny model, or with ``--random-vit`` a ViT-B-32 with random weights, saved as a checkpoint."""
    from safetensors.torch import save_file

    if args.random_vit:
        import open_clip

        torch.manual_seed(0)
        model = open_clip.create_model("ViT-B-32")
        path = work / "vit-b-32-random.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        args.model_label = "ViT-B-32 (random weights)"
        return str(path), "ViT-B-32"
    import runpy

    paths = runpy.run_path(str(ROOT / "tests" / "conftest.py"))["build_tiny_model"](work / "tiny")
    args.model_label = "tiny (tests' random-weight model, 32 px)"
    return paths["safetensors"], paths["config"]


def markdown(result: dict) -> str:
    m = result["machine"]
    rows = result["rows"]
    tuned = next(r for r in rows if r["what"].startswith("open_clip loop, tuned"))
    same = next(r for r in rows if r["what"].startswith("open_clip loop, svgen"))
    lines = [f"{result['files']}; model {result['model']}; device {result['device']}; "
             f"{m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}"
             + (f", GPU {m['gpu']}" if m["gpu"] else "") + f"; load average {m['load_average_1m']} at the start; "
             f"best of {result['rounds']} interleaved rounds.", "",
             "| what | images/s | × tuned loop | × loop with svgen's settings | the same, median of the rounds' ratios |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        median = r.get("median_ratio_vs_same_settings")
        lines.append(f"| {r['what']} | {r['images_per_s']:,.1f} | {r['images_per_s'] / tuned['images_per_s']:.2f} | "
                     f"{r['images_per_s'] / same['images_per_s']:.2f} | "
                     + (f"{median:.2f} |" if median is not None else "– |"))
    a = result.get("agreement")
    if a:
        lines += ["", f"Mixed precision ({a['precision']}) against fp32 on the 100 shared photos: min cosine "
                      f"{a['min_cosine']:.5f}, top-1 agreement {100 * a['top1_agreement']:.1f} % (30 classes)."]
    t = result.get("text")
    if t:
        lines += ["", f"Text: {t['prompts']:,} prompts; svgen {t['svgen_s']:.2f} s ({t['svgen_precision']}), "
                      f"open_clip `build_zero_shot_classifier` {t['open_clip_s']:.2f} s ({t['open_clip_precision']}): "
                      f"{t['speedup']:.2f}×; prototypes agree to cosine ≥ {t['min_prototype_cosine']:.5f}."]
    return "\n".join(lines) + "\n"


def write_docs(text: str, kind: str) -> None:
    start, end = f"<!-- bench_images:{kind}:start -->", f"<!-- bench_images:{kind}:end -->"
    if not replace_between(DOC, start, end, text):
        raise SystemExit(f"{DOC} has no {start} … {end} markers")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=600, help="JPEGs to make and classify (default: %(default)s)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default=None, help="open_clip architecture (with --checkpoint)")
    ap.add_argument("--checkpoint", default=None, help="weights file; default: the tiny random-weight model")
    ap.add_argument("--quick-gelu", action="store_true", help="QuickGELU (OpenAI weights)")
    ap.add_argument("--random-vit", action="store_true", help="ViT-B-32 with random weights (nothing downloaded)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tuned-batch", type=int, default=256)
    ap.add_argument("--tuned-workers", type=int, default=None, help="default: one per usable core")
    ap.add_argument("--text-classes", type=int, default=20, help="ImageNet classes × 80 templates; 0: no text")
    ap.add_argument("--steps", default=None, help="comma-separated prefixes of the steps to run (default: all); "
                                                   "must include \"open_clip loop, svgen's\" and \"open_clip loop, tuned\"")
    ap.add_argument("--write-docs", action="store_true", help="put the table into docs/performance.md")
    args = ap.parse_args(argv)
    args.model_label = args.model
    logging.basicConfig(level=logging.ERROR)
    if bool(args.model) != bool(args.checkpoint) and not args.random_vit:
        ap.error("--model and --checkpoint go together")
    result = run(args)
    text = markdown(result)
    print(text)
    name = f"images-{result['device'].split(':')[0]}-{'vit' if 'ViT' in result['model'] else 'tiny'}"
    save_result(name, result)
    if args.write_docs:
        write_docs(text, f"{result['device'].split(':')[0]}-{'vit' if 'ViT' in result['model'] else 'tiny'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

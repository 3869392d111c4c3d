#!/usr/bin/env python
"""CPU time of ``svgen fit --classes LIST`` with its default prompt ensemble, cold and from the prompt cache,
against open_clip's own zero-shot classifier build on the same prompts, in the same run.

The encoder is ViT-B-32 built from open_clip's config with random weights (``open_clip.create_model('ViT-B-32',
pretrained=None)``: the compute equals the real model's), saved as a safetensors checkpoint and passed with
``--checkpoint``. Per class list (``cifar10``: CLIP_benchmark's 18 CIFAR templates, 180 prompts; ``imagenet1k``:
OpenAI's 80 templates, 80,000 prompts), each a fresh process on ``--device cpu``:

* ``svgen fit, cold``      ``python -m svgen fit --classes LIST --model ViT-B-32 --checkpoint CKPT`` with an empty
  ``SVGEN_CACHE_DIR``: interpreter start, imports, model load, every prompt encoded, the kernel fit, the write;
* ``svgen fit, cached``    the same command again: every prompt comes from the prompt cache and no model is loaded;
* ``svgen fit --templates single, cold``  the one-prompt default before issue 49 (item 19), for the cost of the change;
* ``python -c 'import torch, open_clip'``  the bare imports in a fresh process, the floor under any fit;
* ``open_clip classifier``  the stock alternative: ``open_clip.build_zero_shot_classifier(model, tokenizer, classes,
  templates)`` (what open_clip's own ImageNet zero-shot evaluation runs), model creation and checkpoint load
  included, imports excluded. Its text tower runs the full 77-token context (a few prompts/s on 2 cores), so
  ``--stock-classes N`` runs it on the first N classes only and scales its encoding time to the whole list by the
  number of prompts; such a row says ``extrapolated``.

``--steps`` picks the rows (``cached`` without ``cold`` fills the prompt cache with random unit vectors under the
checkpoint's identity first, as a cold ImageNet fit takes about an hour on 2 shared cores; the start, the imports
and the cache read cost the same, but the kernel fit's own part, ``wall_time_s``, depends on the values, so that
row's fit time is not the one on the encoder's embeddings), ``--tag`` names a run so that runs of one list can go
side by side.

Times are wall-clock seconds; ratios are to the stock row of the same run (the machine is shared: the load average
is recorded before each step). The result is saved after every step (a long cold ImageNet fit leaves the steps
before it), to ``bench-results/bench_fit_prompts_LIST[TAG].json``; the svgen fits' stderr (``-v``, progress bars on) goes to
``bench-results/bench_fit_prompts_LIST[TAG].log``.

    python -m benchmarks.bench_fit_prompts --lists cifar10 --repeats 3
    python -m benchmarks.bench_fit_prompts --lists imagenet1k --steps cached single stock floor --stock-classes 2 --tag _other
    python -m benchmarks.bench_fit_prompts --lists imagenet1k --steps cold --tag _cold     # 51 min on 2 shared cores
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_common import RESULTS, ROOT, machine, print_table, save_result

STEPS = ("cold", "cached", "single", "stock", "floor")


def write_checkpoint(folder: Path, model_name: str) -> Path:
    """A random-weight ``model_name`` from open_clip's own config, saved as safetensors."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = open_clip.create_model(model_name, pretrained=None)
    path = folder / f"{model_name}-random.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def svgen_fit(classes: str, ckpt: Path, model_name: str, cache: Path, out: Path, log, extra=()) -> dict:
    """One ``svgen fit`` in a fresh process; its wall time, the artifact's record of what it encoded."""
    env = {**os.environ, "SVGEN_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "SVGEN_PROGRESS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "svgen", "fit", "--classes", classes, "--model", model_name, "--checkpoint",
           str(ckpt), "--device", "cpu", "--out", str(out), "--force", "-v", *extra]
    log.write(f"\n$ {' '.join(cmd[1:])}\n")
    log.flush()
    load = os.getloadavg()[0]
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"svgen fit failed ({done.returncode}); see {log.name}")
    meta = json.loads((out / "svgen.json").read_text())
    return {"wall_s": wall, "kernel_fit_s": json.loads(done.stdout)["wall_time_s"], "load_before": round(load, 2),
            "templates": len(meta["templates"]), "prompts": len(meta["classes"]) * len(meta["templates"]),
            "prompts_encoded": meta["metrics"]["runtime"]["prompts_encoded"],
            "peak_rss_mb_children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def import_floor() -> dict:
    """The bare imports in a fresh process: the floor under any fit (bench_fit_floor's)."""
    load = os.getloadavg()[0]
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, open_clip"], check=True)
    return {"wall_s": time.perf_counter() - t, "load_before": round(load, 2)}


def stock_classifier(classes, templates, ckpt: Path, model_name: str) -> dict:
    """open_clip's zero-shot classifier on ``classes`` × ``templates``: model load, then the build, timed apart."""
    import open_clip
    import torch
    from safetensors.torch import load_file

    load = os.getloadavg()[0]
    t = time.perf_counter()
    model = open_clip.create_model(model_name, pretrained=None)
    model.load_state_dict(load_file(str(ckpt)))
    model.eval()
    tokenizer = open_clip.get_tokenizer(model_name)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    with torch.inference_mode():
        weights = open_clip.build_zero_shot_classifier(model, tokenizer, classes, templates, device="cpu",
                                                       use_tqdm=False)
    t_build = time.perf_counter() - t
    assert tuple(weights.shape) == (model.text_projection.shape[1], len(classes))
    return {"load_s": t_load, "build_s": t_build, "load_before": round(load, 2),
            "classes": len(classes), "prompts": len(classes) * len(templates)}


def fill_cache(cache: Path, ckpt: Path, model_name: str, classes, templates, dim: int) -> None:
    """Every prompt of ``classes`` × ``templates`` in the prompt cache under the checkpoint's encoder identity, as a
    random unit vector: the cached fit without the hours of a cold ImageNet fit on 2 cores first."""
    import torch

    from svgen.encoders.identity import encoder_identity, identity_key
    from svgen.encoders.prompts import build_prompts
    from svgen.encoders.prototypes import PromptCache

    prompts = list(dict.fromkeys(p for row in build_prompts(classes, templates) for p in row))
    store = PromptCache(identity_key(encoder_identity(model_name, None, str(ckpt), None)), root=cache)
    emb = torch.nn.functional.normalize(torch.randn(len(prompts), dim, generator=torch.Generator().manual_seed(0)),
                                        dim=-1)
    store.add(prompts, emb)
    store.save()


def run_list(name: str, args, ckpt: Path, work: Path) -> dict:
    from svgen.encoders.prompts import default_templates, load_templates, read_classes

    classes = read_classes(name, duplicates="allow")
    template_set = default_templates(name)
    templates = load_templates(template_set)
    stock_n = min(args.stock_classes or len(classes), len(classes))
    result = {"class_list": name, "classes": len(classes), "default_templates": template_set,
              "templates": len(templates), "prompts": len(classes) * len(templates), "model": f"{args.model} "
              "(random weights from open_clip's config; the compute of the real model)", "device": "cpu",
              "stock_classes": stock_n, "steps": args.steps, "runs": {}, "machine": machine()}
    runs = result["runs"]

    def save():
        result["summary"] = summarise(result)
        save_result(f"bench_fit_prompts_{name}{args.tag}", result)

    with open(RESULTS / f"bench_fit_prompts_{name}{args.tag}.log", "w") as log:
        for r in range(args.repeats):
            tag = f"repeat {r + 1}/{args.repeats}, {name}"
            cache = Path(tempfile.mkdtemp(dir=work))
            if "cold" in args.steps:
                cold = svgen_fit(name, ckpt, args.model, cache, work / "a.svgen", log)
                assert cold["prompts_encoded"] == result["prompts"], cold  # an empty cache: every prompt encoded
                runs.setdefault("svgen fit, cold", []).append(cold)
                print(f"{tag}: cold {cold['wall_s']:.1f}s", flush=True)
                save()
            if "cached" in args.steps:
                if "cold" not in args.steps:
                    import open_clip

                    fill_cache(cache, ckpt, args.model, classes, templates,
                               open_clip.get_model_config(args.model)["embed_dim"])
                    result["cache"] = ("filled by the benchmark with random unit vectors for every prompt (no cold "
                                       "fit ran): the kernel fit ran on those values, not on the encoder's")
                warm = svgen_fit(name, ckpt, args.model, cache, work / "b.svgen", log)
                assert warm["prompts_encoded"] == 0, warm
                runs.setdefault("svgen fit, cached", []).append(warm)
                print(f"{tag}: cached {warm['wall_s']:.1f}s", flush=True)
                save()
            if "single" in args.steps:
                single = svgen_fit(name, ckpt, args.model, Path(tempfile.mkdtemp(dir=work)), work / "c.svgen", log,
                                   ("--templates", "single"))
                runs.setdefault("svgen fit --templates single, cold", []).append(single)
                print(f"{tag}: single template, cold {single['wall_s']:.1f}s", flush=True)
                save()
            if "floor" in args.steps:
                runs.setdefault("python -c 'import torch, open_clip'", []).append(import_floor())
                save()
            if "stock" in args.steps:
                stock = stock_classifier(classes[:stock_n], templates, ckpt, args.model)
                runs.setdefault("open_clip classifier", []).append(stock)
                print(f"{tag}: stock {stock['load_s'] + stock['build_s']:.1f}s on {stock['prompts']} prompts",
                      flush=True)
                save()
    return result


def summarise(result: dict) -> dict:
    """Median wall time per step; the stock row scaled to the whole list when it ran on fewer classes."""
    import statistics

    out = {}
    for step, runs in result["runs"].items():
        if step == "open_clip classifier":
            scale = result["prompts"] / runs[0]["prompts"]
            walls = [r["load_s"] + r["build_s"] * scale for r in runs]
            out[step] = {"wall_s": statistics.median(walls), "extrapolated": scale != 1, "templates": result["templates"],
                         "measured_prompts": runs[0]["prompts"],
                         "prompts_per_s": statistics.median(r["prompts"] / r["build_s"] for r in runs)}
        elif "kernel_fit_s" not in runs[0]:
            out[step] = {"wall_s": statistics.median(r["wall_s"] for r in runs)}
        else:
            out[step] = {"wall_s": statistics.median(r["wall_s"] for r in runs),
                         "kernel_fit_s": statistics.median(r["kernel_fit_s"] for r in runs),
                         "prompts_encoded": runs[0]["prompts_encoded"], "templates": runs[0]["templates"]}
    stock = out.get("open_clip classifier")
    if stock:
        for step in out:
            out[step]["x_stock"] = out[step]["wall_s"] / stock["wall_s"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lists", nargs="+", default=["cifar10"], help="built-in class lists (default: cifar10)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--stock-classes", type=int, default=None, metavar="N",
                    help="run open_clip's classifier on the first N classes and scale it (default: all)")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                    help="what to run, in this order per repeat (default: all); 'cached' without 'cold' fills the "
                         "prompt cache with random unit vectors first")
    ap.add_argument("--tag", default="", help="suffix of the result and log names (runs of one list side by side)")
    ap.add_argument("--model", default="ViT-B-32", help="open_clip architecture (random weights)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or (args.stock_classes is not None and args.stock_classes < 1):
        print("bench_fit_prompts: --repeats and --stock-classes must be at least 1", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(logging.ERROR)  # open_clip warns (on the root logger) about random weights
    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_fit_prompts-") as tmp:
        work = Path(tmp)
        ckpt = write_checkpoint(work, args.model)
        for name in args.lists:
            result = run_list(name, args, ckpt, work)
            rows = [{"step": step, "templates": s.get("templates"), "wall s": s["wall_s"],
                     "kernel fit s": s.get("kernel_fit_s"), "× open_clip": s.get("x_stock"),
                     "note": "extrapolated" if s.get("extrapolated") else ""}
                    for step, s in result["summary"].items()]
            print()
            print_table(rows, ["step", "templates", "wall s", "kernel fit s", "× open_clip", "note"],
                        title=f"{name}: {result['classes']} classes × {result['templates']} templates "
                              f"({result['default_templates']}) = {result['prompts']} prompts, {args.repeats} "
                              f"repeat(s), median; {result['machine']['cpus']} CPUs, load "
                              f"{result['machine']['load_average_1m']}")
            print(f"wrote {RESULTS / f'bench_fit_prompts_{name}{args.tag}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

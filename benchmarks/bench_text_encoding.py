#!/usr/bin/env python
"""Text-encoding speed: svgen's truncated ``encode_text`` vs stock open_clip, in the same run.

The ViT-B-32 architecture with random weights (speed does not depend on the values, so
nothing is downloaded). Prompts are ImageNet-1k class names × the 7 templates of open_clip's
``SIMPLE_IMAGENET_TEMPLATES``. By default an evenly spaced subset of the classes is used so
the stock side finishes in about a minute on a small CPU; ``--classes 1000`` runs them all.

Both sides tokenize, batch (``--batch-size``) and encode the same prompts in inference mode;
svgen sorts prompts by token length and cuts each batch after its longest prompt's end-of-text
token. Prints a table, or with ``--json`` one JSON object (``speedup``, ``max_cosine_deviation``,
timings and settings); writes that object to ``bench-results/text_encoding.json``.

    python -m benchmarks.bench_text_encoding                 # 20 classes × 7 templates
    python -m benchmarks.bench_text_encoding --classes 1000 --json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch
import torch.nn.functional as F

from benchmarks.bench_common import ROOT, machine, save_result, timed


def imagenet_classes():
    path = ROOT / "prompts" / "classes" / "imagenet1k.txt"
    if path.is_file():
        from svgen.encoders.prompts import read_classes

        return read_classes(path)
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    return list(IMAGENET_CLASSNAMES)


def seven_templates():
    from open_clip.zero_shot_metadata import SIMPLE_IMAGENET_TEMPLATES

    return [t("{}") for t in SIMPLE_IMAGENET_TEMPLATES]


def stock_encode(model, tokenizer, prompts, batch_size):
    out = []
    with torch.inference_mode():
        for s in range(0, len(prompts), batch_size):
            out.append(model.encode_text(tokenizer(prompts[s:s + batch_size])).float())
    return torch.cat(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", type=int, default=20, help="ImageNet classes to use, evenly spaced (max 1000)")
    ap.add_argument("--batch-size", type=int, default=256, help="prompts per forward pass (both sides)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--model", default="ViT-B-32", help="open_clip architecture (random weights)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)

    import logging

    import open_clip

    from svgen.encoders.clip import ClipEncoder

    logging.getLogger().setLevel(logging.ERROR)  # open_clip warns (on the root logger) about random weights
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    all_classes = imagenet_classes()
    n = max(1, min(args.classes, len(all_classes)))
    classes = [all_classes[round(i * len(all_classes) / n)] for i in range(n)]
    templates = seven_templates()
    prompts = [t.replace("{}", c) for c in classes for t in templates]

    model = open_clip.create_model(args.model)  # random weights: no download
    tokenizer = open_clip.get_tokenizer(args.model)
    enc = ClipEncoder.from_model(model, tokenizer, name=f"{args.model}-random", device="cpu")
    if not enc.truncate_text:
        print(f"{args.model}: truncation is not exact for this text tower; nothing to compare", file=sys.stderr)
        return 1

    tokens = tokenizer(prompts)
    eot = tokens.argmax(dim=-1) + 1  # tokens up to and including end-of-text
    ordered = eot.sort().values
    batch_lengths = [int(ordered[s:s + args.batch_size].max()) for s in range(0, len(prompts), args.batch_size)]

    warm = prompts[: min(8, len(prompts))]  # first-call overheads out of both timings
    enc.encode_text(warm, batch_size=args.batch_size)
    stock_encode(model, tokenizer, warm, args.batch_size)

    t_ours, ours = timed(enc.encode_text, prompts, batch_size=args.batch_size)
    t_stock, stock = timed(stock_encode, model, tokenizer, prompts, args.batch_size)
    cos = F.cosine_similarity(ours, stock, dim=-1)

    result = {
        "model": f"{args.model} (random weights)",
        "classes": n,
        "templates": len(templates),
        "prompts": len(prompts),
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "context_length": int(tokens.shape[1]),
        "mean_tokens_per_prompt": round(float(eot.float().mean()), 2),
        "mean_tokens_per_batch": round(sum(batch_lengths) / len(batch_lengths), 2),
        "stock_s": round(t_stock, 3),
        "svgen_s": round(t_ours, 3),
        "stock_prompts_per_s": round(len(prompts) / t_stock, 1),
        "svgen_prompts_per_s": round(len(prompts) / t_ours, 1),
        "speedup": round(t_stock / t_ours, 2),
        "max_cosine_deviation": float(1.0 - cos.min()),
        "max_abs_difference": float((ours - stock).abs().max()),
        "torch": torch.__version__,
        "open_clip": open_clip.__version__,
        "cpu": platform.processor() or platform.machine(),
        "machine": machine(),
    }
    path = save_result("text_encoding", result)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['model']}: {n} ImageNet classes × {len(templates)} templates = {len(prompts)} prompts, "
          f"batch {args.batch_size}, {result['threads']} threads")
    print(f"tokens per prompt: mean {result['mean_tokens_per_prompt']} of {result['context_length']}; "
          f"svgen batches run {result['mean_tokens_per_batch']} positions on average")
    print()
    print(f"{'encoder':<28}{'seconds':>10}{'prompts/s':>12}")
    print(f"{'open_clip encode_text':<28}{t_stock:>10.2f}{result['stock_prompts_per_s']:>12.1f}")
    print(f"{'svgen (truncated batches)':<28}{t_ours:>10.2f}{result['svgen_prompts_per_s']:>12.1f}")
    print()
    print(f"speedup {result['speedup']:.2f}×, max cosine deviation {result['max_cosine_deviation']:.2e}, "
          f"max |difference| {result['max_abs_difference']:.2e}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

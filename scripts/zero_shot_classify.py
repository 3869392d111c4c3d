#!/usr/bin/env python
"""Classify a folder of images with open_clip and an exported svgen head — without svgen.

The deployment story: ``svgen export`` writes a head file (``.safetensors``, ``.npz`` or
``.onnx``); this script needs only open_clip, torch, numpy, Pillow, safetensors (for
``.safetensors``) and onnxruntime (for ``.onnx``).

    python scripts/zero_shot_classify.py lvis-linear.safetensors photos/ --top-k 3
    python scripts/zero_shot_classify.py head.onnx photos/ --model ViT-B-32 --pretrained openai

Scores, given raw image embeddings ``x`` and ``x̂ = x / ||x||``:

* linear / cosine head file: ``logits = logit_scale * (x̂ @ weight + bias)`` (weight D×C);
* kernel head file: ``exp(-||x̂ - s||² / (2σ²)) @ vote_weights`` over the support vectors ``s``
  (``exp(-||x̂ - s|| / σ)`` for the Laplacian kernel; vote weights dense or COO);
* mixture head file (after labelled shots): the kernel and linear heads' tensors prefixed ``kernel.`` and ``linear.``
  and ``mixture_weight`` w; probabilities ``w·p_kernel + (1 − w)·p_linear`` (times ``exp(class_log_factor)`` and
  renormalised where the file has that vector: the classes without shots), scores ``log(max(probs, 1e-30))``;
* a kernel or mixture head adapted to an unlabelled pool (``pool_factor.*``; a mixture after shots, a kernel head
  after shots or after a zero-shot pool): its probabilities ``p0`` times
  the pool's class likelihood to a power, scores ``log(max(p0, 1e-30)) + pool_factor.power * (x̂ @
  pool_factor.weightᵀ + pool_factor.bias)``, probabilities their softmax (a linear head has it folded in its matrix);
* ONNX: ``session.run(["scores"], {"embeddings": x})``.

``--probs`` prints probabilities instead: ``softmax(logits / temperature)`` with the head file's
``temperature``; a kernel head's logits are as its ``kernel_logits`` says: ``log`` (also files
without the field), ``log(max(scores, 1e-30))``; ``score``, the scores themselves; or ``floored``,
``log(max(scores, kernel_floor·prior·max(scores)/max(prior), 1e-30))`` with ``prior`` the zero-shot probabilities
``softmax(prior_logit_scale·x̂·prior_prototypesᵀ)`` (maxima per row). ONNX: the ``probs`` output.

The model defaults to the one recorded in the head file (``--model``/``--pretrained``/
``--checkpoint`` as in open_clip; a model-config ``.json`` path registers a custom architecture).
A checkpoint whose sha256 differs from the recorded one, or a model of another embedding
dimension, is refused. Output: one CSV (or JSON Lines) row per image with the top-k labels and
scores, the same columns as ``svgen classify``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

KERNEL_LOGITS = ("log", "score", "floored")  # a kernel head's logits: log(max(scores, 1e-30)), the scores, or
# log(max(scores, kernel_floor * prior * max(scores) / max(prior), 1e-30)) with prior the zero-shot probabilities
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


class Failure(Exception):
    """A user-fixable problem: printed as one line, exit status 2."""


# ----------------------------------------------------------------------------- head files

def load_head(path: str) -> dict:
    """``{"head", "classes", "encoder", "score": fn(x_raw N×D) -> N×C}`` from an exported file."""
    p = Path(path)
    if not p.is_file():
        raise Failure(f"head file not found: {path}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".onnx":
            import onnxruntime as ort

            sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
            meta = dict(sess.get_modelmeta().custom_metadata_map)
            head = {"head": meta.get("head", "onnx"), "classes": json.loads(meta["classes"]),
                    "encoder": json.loads(meta.get("encoder") or "{}"), "dim": int(meta["dim"])}
            head["score"] = lambda x: sess.run(["scores"], {"embeddings": x.astype(np.float32)})[0]
            outputs = {o.name for o in sess.get_outputs()}
            if "probs" in outputs:  # heads exported before probabilities have scores only
                head["probs"] = lambda x: sess.run(["probs"], {"embeddings": x.astype(np.float32)})[0]
            return head
        if suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(p), framework="numpy") as f:
                meta = dict(f.metadata() or {})
                arrays = {k: f.get_tensor(k) for k in f.keys()}
            classes = json.loads(meta["classes"])
        elif suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            classes = [str(c) for c in arrays.pop("classes")]
            meta = {k: str(arrays.pop(k)) for k in list(arrays) if arrays[k].dtype.kind == "U"}
        else:
            raise Failure(f"{path}: expected a .safetensors, .npz or .onnx head file")
    except Failure:
        raise
    except Exception as e:  # any unreadable file (wrong bytes for its suffix, truncated, …): one line
        first = (str(e).splitlines() or [""])[0][:200]
        raise Failure(f"{path} is not a readable exported svgen head ({type(e).__name__}: {first})") from None
    if meta.get("format") != "svgen-head":
        raise Failure(f"{path} is not an exported svgen head (format {meta.get('format')!r})")
    head = {"head": meta["head"], "classes": classes, "encoder": json.loads(meta.get("encoder") or "{}")}
    if head["head"] == "mixture":   # w·p_kernel + (1 − w)·p_linear, each from its own head file's tensors
        if "mixture_weight" not in arrays:
            raise Failure(f"{path}: a mixture head file needs mixture_weight")
        w = float(arrays["mixture_weight"])
        parts = {h: head_functions({k[len(h) + 1:]: v for k, v in arrays.items() if k.startswith(h + ".")},
                                   meta, h, path) for h in ("kernel", "linear")}
        if any("probs" not in f for f in parts.values()):
            raise Failure(f"{path}: a mixture head file needs kernel.temperature and linear.temperature")

        factor = np.exp(arrays["class_log_factor"].astype(np.float64)) if "class_log_factor" in arrays else None

        def probs(x):
            p = (w * parts["kernel"]["probs"](x).astype(np.float64)
                 + (1.0 - w) * parts["linear"]["probs"](x).astype(np.float64))
            if factor is None:
                return p
            p = p * factor   # the classes without shots × e^δ (class_log_factor), renormalised
            return p / p.sum(axis=1, keepdims=True)

        head.update(dim=parts["kernel"]["dim"], probs=lambda x: probs(x).astype(np.float32),
                    score=lambda x: np.log(np.maximum(probs(x), 1e-30)).astype(np.float32))
        return with_pool_factor(head, arrays, path)
    head.update(head_functions(arrays, meta, head["head"], path))
    return with_pool_factor(head, arrays, path)


def with_pool_factor(head: dict, arrays: dict, path: str) -> dict:
    """A head adapted to an unlabelled pool: its probabilities p0 times the pool's class likelihood to a
    power, ``scores = log(max(p0, 1e-30)) + pool_factor.power * (x̂ @ pool_factor.weight.T + pool_factor.bias)``,
    ``probs = softmax(scores)``; ``head`` unchanged where the file has no ``pool_factor.power``."""
    if "pool_factor.power" not in arrays:
        return head
    if "probs" not in head or not {"pool_factor.weight", "pool_factor.bias"} <= set(arrays):
        raise Failure(f"{path}: a head with a pool factor needs its temperature, pool_factor.weight and pool_factor.bias")
    W, b = arrays["pool_factor.weight"].astype(np.float64), arrays["pool_factor.bias"].astype(np.float64)
    a, base = float(arrays["pool_factor.power"]), head["probs"]

    def logits(x):
        p0 = base(x).astype(np.float64)
        return np.log(np.maximum(p0, 1e-30)) + a * (normalize(x).astype(np.float64) @ W.T + b)

    return {**head, "score": lambda x: logits(x).astype(np.float32), "probs": lambda x: softmax(logits(x))}


def head_functions(arrays: dict, meta: dict, name: str, path: str) -> dict:
    """``{"dim", "score", "probs"?}`` of one head (``name``) from its tensors ``arrays`` and the file's ``meta``."""
    head = {}
    if "weight" in arrays:  # linear or cosine: an open_clip-style D×C classifier
        W, b = arrays["weight"].astype(np.float32), arrays["bias"].astype(np.float32)
        scale = float(arrays["logit_scale"])
        head["dim"] = W.shape[0]
        head["score"] = lambda x: scale * (normalize(x) @ W + b)
    else:  # kernel vote
        S = arrays["support_vectors"].astype(np.float32)
        if "vote_weights" in arrays:
            A = arrays["vote_weights"].astype(np.float32)
        else:  # sparse COO vote weights (large-C artifacts)
            rows, cols = arrays["vote_weights.indices"]
            vals = arrays["vote_weights.values"].astype(np.float32)
            M, C = (int(v) for v in arrays["vote_weights.shape"])
            A = None
        sigma, kind = float(arrays["bandwidth"]), meta.get("kernel", "rbf")
        head["dim"] = S.shape[1]

        def votes(x):
            d2 = np.maximum(2.0 - 2.0 * normalize(x) @ S.T, 0.0)
            k = np.exp(-d2 / np.float32(2.0 * sigma * sigma)) if kind == "rbf" else np.exp(-np.sqrt(d2 + 1e-12) / sigma)
            if A is not None:
                return k @ A
            out = np.zeros((k.shape[0], C), dtype=np.float32)
            for start in range(0, len(vals), 1 << 20):  # scores[:, col] += k[:, row] * value
                r, c, v = rows[start:start + (1 << 20)], cols[start:start + (1 << 20)], vals[start:start + (1 << 20)]
                np.add.at(out.T, c, (k[:, r] * v).T)
            return out

        def score(x):   # an artifact adapted to shots adds the zero-shot probabilities softmax(τ x̂ P̂ᵀ)
            if "prior_prototypes" not in arrays:
                return votes(x)
            P, tau = arrays["prior_prototypes"].astype(np.float32), float(arrays["prior_logit_scale"])
            return votes(x) + softmax((tau * normalize(x) @ P.T).astype(np.float64)).astype(np.float32)

        head["score"] = score
    logits_kind = meta.get("kernel_logits", "log") if name == "kernel" else "score"
    if logits_kind not in KERNEL_LOGITS:
        raise Failure(f"{path}: kernel_logits is {logits_kind!r}; this script knows {', '.join(KERNEL_LOGITS)}")
    if logits_kind == "floored" and not {"kernel_floor", "prior_prototypes", "prior_logit_scale"} <= set(arrays):
        raise Failure(f"{path}: kernel_logits is 'floored' but the file lacks kernel_floor or the prior term")
    if "temperature" in arrays:  # p = softmax(logits / T); a kernel head's logits: log scores, scores, floored logs
        T = float(arrays["temperature"])
        floor = 1e-30

        def to_logits(x, s):
            if logits_kind == "log":
                return np.log(np.maximum(s, floor))
            if logits_kind == "floored":   # log max(s, ε·p₀·max s / max p₀, 1e-30), p₀ the zero-shot prior term
                P, tau = arrays["prior_prototypes"].astype(np.float64), float(arrays["prior_logit_scale"])
                p0 = softmax(tau * normalize(x).astype(np.float64) @ P.T).astype(np.float64)
                f = float(arrays["kernel_floor"]) * p0 * (s.max(axis=1, keepdims=True) / p0.max(axis=1, keepdims=True))
                return np.log(np.maximum(np.maximum(s, f), floor))
            return s

        head["probs"] = lambda x: softmax(to_logits(x, head["score"](x).astype(np.float64)) / T)
    return head


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def normalize(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# ----------------------------------------------------------------------------- the model

def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_model(args, recorded: dict):
    import open_clip

    model = args.model or recorded.get("model")
    if not model:
        raise Failure("the head file does not record its encoder; name it with --model and --pretrained/--checkpoint")
    self_contained = model.startswith(("hf-hub:", "local-dir:"))  # config and weights come with the name
    moved = self_contained and model.startswith("local-dir:") and str(recorded.get("model")).startswith("local-dir:")
    if recorded.get("model") and Path(model).stem != recorded["model"] and model != recorded["model"] and not moved:
        raise Failure(f"--model {model} is not the model the head was fit with ({recorded['model']})")
    if args.checkpoint and not os.path.isfile(args.checkpoint):
        raise Failure(f"checkpoint file not found: {args.checkpoint}")
    if self_contained:
        if args.checkpoint or args.pretrained:
            raise Failure(f"{model} holds its own weights; drop --checkpoint/--pretrained")
        pretrained = None
    elif recorded.get("checkpoint_sha256"):
        if not args.checkpoint:
            raise Failure(f"the head was fit from checkpoint {recorded.get('checkpoint')!r}; pass --checkpoint FILE")
        if sha256(args.checkpoint) != recorded["checkpoint_sha256"]:
            raise Failure(f"checkpoint {args.checkpoint} is not the one the head was fit with ({recorded.get('checkpoint')})")
        pretrained = args.checkpoint
    elif args.checkpoint:
        if recorded.get("pretrained"):
            raise Failure(f"the head was fit from {recorded['model']} pretrained {recorded['pretrained']!r}, not a checkpoint")
        pretrained = args.checkpoint
    elif args.pretrained:
        if recorded.get("pretrained") and args.pretrained != recorded["pretrained"]:
            raise Failure(f"--pretrained {args.pretrained} is not the tag the head was fit with ({recorded['pretrained']})")
        pretrained = args.pretrained
    elif recorded.get("model"):
        pretrained = recorded.get("pretrained")
    else:  # the head does not know its encoder: open_clip's usual default for built-in names
        pretrained = None if model.startswith(("hf-hub:", "local-dir:")) or model.endswith(".json") else "openai"
    if model.endswith(".json") and os.path.isfile(model):
        open_clip.add_model_config(model)
        model = Path(model).stem
    # The MLP activation the head's prompts were encoded with: recorded by svgen, else the tag's own
    # (open_clip 3.x would build GELU for OpenAI's QuickGELU weights); else open_clip's config default.
    quick_gelu = recorded.get("quick_gelu")
    if quick_gelu is None and pretrained and not os.path.isfile(pretrained):
        quick_gelu = open_clip.get_pretrained_cfg(model, pretrained).get("quick_gelu")
    act = {} if quick_gelu is None else {"quick_gelu": bool(quick_gelu), "force_quick_gelu": bool(quick_gelu)}
    try:
        m, _, preprocess = open_clip.create_model_and_transforms(model, pretrained=pretrained, device=args.device, **act)
    except (RuntimeError, OSError, ValueError) as e:
        raise Failure(f"cannot load {model} ({pretrained}): {(str(e).splitlines() or [''])[0][:200]}") from None
    if self_contained and recorded.get("checkpoint_sha256"):
        got = sha256(self_contained_weights(model))
        if got != recorded["checkpoint_sha256"]:
            raise Failure(f"the weights of {model} (sha256 {got[:12]}...) are not the ones the head was fit with "
                          f"({recorded['model']}, sha256 {recorded['checkpoint_sha256'][:12]}...)")
    return m.eval(), preprocess


def self_contained_weights(model: str) -> str:
    """The weights file open_clip loads for a ``local-dir:`` or ``hf-hub:`` name."""
    if model.startswith("local-dir:"):
        from open_clip.factory import _find_checkpoint_in_dir

        return _find_checkpoint_in_dir(Path(model[len("local-dir:"):]))
    from open_clip.pretrained import download_pretrained_from_hf

    return download_pretrained_from_hf(model[len("hf-hub:"):])


def find_images(inputs):
    out = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            out += sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.is_file():
            out.append(str(p))
        else:
            raise Failure(f"no such file or folder: {item}")
    return out


def encode(model, preprocess, paths, batch_size, device):
    """Raw image embeddings of the readable files; unreadable ones are reported on stderr."""
    import torch
    from PIL import Image

    feats, ok = [], []
    for start in range(0, len(paths), batch_size):
        batch, names = [], []
        for path in paths[start:start + batch_size]:
            try:
                with Image.open(path) as im:
                    im.load()
                    batch.append(preprocess(im.convert("RGB")))
                names.append(path)
            except (OSError, ValueError, SyntaxError) as e:
                print(f"zero_shot_classify: skipped {path}: {e}", file=sys.stderr)
        if batch:
            with torch.inference_mode():
                feats.append(model.encode_image(torch.stack(batch).to(device)).float().cpu().numpy())
            ok += names
    return (np.concatenate(feats) if feats else np.zeros((0, 0), np.float32)), ok


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: …)`` where there is one to show (not for None)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Classify images with open_clip and an exported svgen head "
                                             "(.safetensors, .npz or .onnx); prints the top-k per image.",
                                 formatter_class=_Defaults)
    ap.add_argument("head", metavar="HEAD_FILE", help="file written by 'svgen export'")
    ap.add_argument("inputs", nargs="+", metavar="IMAGE|DIR", help="images and/or folders (searched recursively)")
    ap.add_argument("--model", help="open_clip architecture, hf-hub:/local-dir: name, or a model-config .json "
                                    "(default: the one recorded in the head file)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--pretrained", metavar="TAG", help="pretrained tag (default: the recorded one)")
    src.add_argument("--checkpoint", metavar="FILE", help="local weights file")
    ap.add_argument("--probs", action="store_true",
                    help="print probabilities (softmax with the head's stored temperature) instead of scores")
    ap.add_argument("-k", "-K", "--top-k", type=int, default=5,
                    help="classes per row (more than the head has gives all of them)")
    ap.add_argument("--format", choices=("csv", "jsonl"), default="csv",
                    help="svgen classify's schema. csv: path,label_1,score_1,...,head (prob_N with --probs); "
                         "jsonl: one {path, labels, scores (or probs), head} object per line")
    ap.add_argument("--batch-size", type=int, default=32, help="images per encoder batch")
    ap.add_argument("--device", default="cpu", help="torch device for the image encoder")
    args = ap.parse_intermixed_args(argv)
    try:
        head = load_head(args.head)
        paths = find_images(args.inputs)
        if not paths:
            raise Failure(f"no image files found in {', '.join(args.inputs)}")
        model, preprocess = load_model(args, head["encoder"])
        x, ok = encode(model, preprocess, paths, args.batch_size, args.device)
        if not ok:
            raise Failure("none of the files could be read as an image")
        if x.shape[1] != head["dim"]:
            raise Failure(f"the model embeds to dimension {x.shape[1]} but the head expects {head['dim']}")
        if args.probs and "probs" not in head:
            raise Failure(f"{args.head} carries no temperature (exported by an older svgen); re-export it for --probs")
        scores = head["probs" if args.probs else "score"](x)
    except Failure as e:
        print(f"zero_shot_classify: error: {e}", file=sys.stderr)
        return 2
    try:
        write_rows(ok, scores, head["classes"], args, head.get("head", ""))
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (`| head`): not our error, and no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


def write_rows(ok, scores, classes, args, head: str = "") -> None:
    """One CSV row or JSON line per image, in ``svgen classify``'s schema: path, the top-k labels, their
    scores (``probs`` with --probs; float32 in full), the head. CSV keeps the csv module's default quoting
    and line ends, so a file name holding a newline or carriage return reads back as one row."""
    k = max(1, min(args.top_k, len(classes)))
    if args.top_k > len(classes):
        print(f"zero_shot_classify: --top-k {args.top_k} is more than the head's {len(classes)} classes; "
              f"showing all {len(classes)}", file=sys.stderr)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    what = "prob" if args.probs else "score"

    def text(v):  # the shortest decimal that reads back as the same float32 (float64 for probabilities)
        v = np.float64(v) if np.asarray(v).dtype == np.float64 else np.float32(v)
        return str(v) if np.isfinite(v) else None

    if args.format == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(["path"] + [f"{x}_{r}" for r in range(1, k + 1) for x in ("label", what)] + ["head"])
        for path, idx, row in zip(ok, order, scores):
            w.writerow([path] + [v for i in idx for v in (classes[i], text(row[i]) or "")] + [head])
    else:
        for path, idx, row in zip(ok, order, scores):
            vals = ", ".join(text(row[i]) or "null" for i in idx)  # strict JSON: a non-finite value is null
            print("{" + f'"path": {json.dumps(path, ensure_ascii=False)}, '
                  f'"labels": {json.dumps([classes[i] for i in idx], ensure_ascii=False)}, '
                  f'"{what}s": [{vals}], "head": {json.dumps(head)}' + "}")


if __name__ == "__main__":
    sys.exit(main())

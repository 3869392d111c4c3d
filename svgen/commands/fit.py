"""``svgen fit``: class names (or precomputed text embeddings) → an artifact directory."""

from __future__ import annotations

import logging
import os
import sys

from svgen.errors import SvgenError
from svgen.commands._common import (DEFAULT_MODEL, HelpFormatter, add_encoder_args, add_refused_flag,
                                   default_pretrained, json_text, load_array, load_encoder, note, text_prototypes)
from svgen.commands._pool import add_pool_args, encode_pool, pool_array, pool_check_summary, pool_note, pool_paths, wants_pool
from svgen.commands._shots import add_shot_args, encode_shots, shot_arrays, shot_images, wants_shots

log = logging.getLogger(__name__)


def add_parser(sub):
    from svgen.config import DEFAULT_RFF_DIM, LINEAR_HEADS, SOLVERS, VOTE_SOLVERS, FitConfig

    d = FitConfig()
    p = sub.add_parser(
        "fit",
        help="fit a kernel classifier from class names (no images needed)",
        description="Encode every (template, class) prompt with a frozen open_clip model, expand each class "
                    "into K unit-norm support vectors with the generator, and write an artifact directory. "
                    "With --prototypes the text embeddings come from a .npy file and no encoder is loaded. "
                    "stdout gets one JSON object of fit metrics (svgen fit … | jq .sigma); the 'wrote …' line "
                    "goes to stderr. With --shots or --shot-features labelled images join as support vectors "
                    "afterwards (as 'svgen adapt' does); with --unlabelled or --unlabelled-features the result is "
                    "then adapted transductively to those unlabelled images.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--classes", required=True, metavar="FILE|NAME",
                   help="class names, one per line (UTF-8; blank lines and # comments ignored), or a built-in "
                        "list: cifar10, cifar100, imagenet1k")
    p.add_argument("--prototypes", metavar="EMB.npy",
                   help="precomputed text embeddings, C×D or C×T×D, rows in the order of --classes")
    p.add_argument("--out", required=True, metavar="ARTIFACT_DIR", help="artifact directory to create")
    p.add_argument("--force", action="store_true", help="replace an existing artifact")
    p.add_argument("--strict", action="store_true",
                   help="refuse repeated class names and classes whose prototypes coincide (cos ≥ 0.9999); "
                        "by default they are fitted with one warning naming them (they tie; the ridge keeps "
                        "the solve well-posed), as open_clip classifies with such vocabularies")
    add_encoder_args(p)
    from svgen.encoders.prompts import builtin_template_sizes, default_templates_help

    p.add_argument("--templates", default=None, metavar="NAME|FILE",
                   help=f"prompt templates: a built-in set, with its number of templates: {builtin_template_sizes()} "
                        "(openai: OpenAI's 80 ImageNet templates, openai-simple: their 7-template subset, as "
                        "open_clip ships them; cifar: the CLIP paper's CIFAR templates, as CLIP_benchmark ships "
                        "them); or a file with one '{}' template per line. Default: the class list's own "
                        f"ensemble — {default_templates_help()}; the templates used are recorded in svgen.json")
    add_shot_args(p)
    add_pool_args(p)
    m = p.add_argument_group("method")
    m.add_argument("-K", "--n-support", type=int, default=d.n_support, help="support vectors per class")
    add_refused_flag(m, "-k", "is classify's --top-k; support vectors per class are -K/--n-support")
    m.add_argument("--steps", type=int, default=d.steps,
                   help="optimisation steps of the support vector generator; 0 keeps the closed-form text "
                        "geometry (text-only training cost image accuracy on LVIS, docs/accuracy.md); "
                        "e.g. 100 trains with alignment + margin + grounding")
    m.add_argument("--metric-strength", type=float, default=d.metric_condition, metavar="KAPPA",
                   help="condition number of the text metric before it is weakened for averaged prompts "
                        "and few classes (1 = the plain cosine geometry)")
    m.add_argument("--linear-head", choices=LINEAR_HEADS, default=d.linear_head,
                   help="closed-form linear head: whitened cosine (safe) or Fisher LDA under the text metric")
    m.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    m.add_argument("--kernel", choices=("rbf", "laplacian"), default=d.kernel, help="kernel on unit vectors")
    m.add_argument("--margin", choices=("hinge", "ce"), default=d.margin, help="margin loss of the linear head")
    m.add_argument("--margin-weight", type=float, default=d.margin_weight, help="weight of the margin term")
    m.add_argument("--grounding-weight", type=float, default=d.grounding_weight, help="weight of the grounding term")
    m.add_argument("--ridge", default=str(d.ridge),
                   help="vote-weight ridge λ in A = (K_SS + M·λ·I)⁻¹Y: a number; 'auto' (Parzen regime, "
                        "M·λ = 100·λ_max(K_SS)); or 'loo' / 'gcv' for closed-form selection over the support vectors")
    m.add_argument("--batch-classes", type=int, default=d.batch_classes, help="classes per optimisation step")
    m.add_argument("--rff-dim", type=int, default=None, metavar="M",
                   help="random Fourier features per alignment step when the rff path is used "
                        f"(default: {DEFAULT_RFF_DIM})")
    m.add_argument("--solver", choices=SOLVERS, default=d.solver,
                   help="alignment path per class batch: the full kernel, row blocks, or random Fourier features "
                        "(auto: from the batch size and available memory; recorded in svgen.json)")
    m.add_argument("--vote-solver", choices=VOTE_SOLVERS, default=d.vote_solver,
                   help="vote weights A: one dense Cholesky of the M×M system, or 'local' (sparse: each class's "
                        "column solved on its nearest classes' support vectors; for very many classes). auto: "
                        "dense while it fits in memory; recorded in svgen.json")
    m.add_argument("--vote-neighbours", type=int, default=d.vote_neighbours, metavar="N",
                   help="classes (itself included) whose support vectors carry each class's vote with "
                        "--vote-solver local")
    m.add_argument("--seed", type=int, default=d.seed, help="random seed (same seed, same tensors on CPU)")
    p.set_defaults(func=run)


def _ridge(value: str):
    from svgen.config import RIDGE_RULES

    if value in RIDGE_RULES:
        return value
    try:
        return float(value)
    except ValueError:
        raise SvgenError(f"--ridge must be a number or one of {', '.join(RIDGE_RULES)}; got {value!r}") from None


def run(args) -> int:
    from svgen import SVGClassifier
    from svgen.encoders.prompts import default_templates, load_templates, read_classes
    from svgen.safeio import check_dir_target

    classes = read_classes(args.classes, duplicates="error" if args.strict else "allow")
    out = check_dir_target(args.out, args.force)  # before any work: only an artifact or an empty folder is replaced
    clf = SVGClassifier(
        n_support=args.n_support, kernel=args.kernel, steps=args.steps, lr=args.lr, margin=args.margin,
        margin_weight=args.margin_weight, grounding_weight=args.grounding_weight, ridge=_ridge(args.ridge),
        batch_classes=args.batch_classes, rff_dim=args.rff_dim, solver=args.solver, vote_solver=args.vote_solver,
        vote_neighbours=args.vote_neighbours, seed=args.seed,
        metric_condition=args.metric_strength, linear_head=args.linear_head, progress=args.progress,
        strict=args.strict,
    )
    clf.check_params()  # settings checked before any expensive work
    shots = shot_folder = None
    if wants_shots(args):
        # read (and check) the labelled images before any expensive work
        shots = shot_arrays(args, classes, f"the classes file {args.classes}") if args.shot_features else None
        shot_folder = shot_images(args, classes) if args.shots else None
    pool = pool_folder = None
    if wants_pool(args):
        pool = pool_array(args) if args.unlabelled_features else None
        pool_folder = pool_paths(args) if args.unlabelled else None
    templates = None
    if args.prototypes:
        named = [opt for opt, value in (("--model", args.model), ("--pretrained", args.pretrained),
                                        ("--checkpoint", args.checkpoint),
                                        ("--quick-gelu/--no-quick-gelu", getattr(args, "quick_gelu", None)))
                 if value is not None and not (args.shots or args.unlabelled)]  # image folders: the encoder embeds them
        named += ["--templates"] if args.templates is not None else []
        if named:
            raise SvgenError(f"{' and '.join(named)} cannot be used with --prototypes: the embeddings are already "
                             "made and no encoder is loaded; drop {} (name the model when classifying images)"
                             .format("it" if len(named) == 1 else "them"))
    else:
        from svgen.encoders.hub import check_weights_reachable

        templates = load_templates(args.templates or default_templates(args.classes))
        check_weights_reachable(args.model or DEFAULT_MODEL, default_pretrained(args))  # fail fast, before torch loads

    import numpy as np

    from svgen.encoders.runtime import autocast_dtype, device_name, precision_label, resolve_device

    device = resolve_device(args.device)
    # Where the encoder ran: svgen.json → metrics.runtime, beside (never in) the encoder's identity.
    runtime = {"device": device_name(device), "requested": args.device,
               "precision": precision_label(autocast_dtype(device))}
    if args.prototypes:
        emb = load_array(args.prototypes, "prototypes")
        if emb.ndim not in (2, 3):
            raise SvgenError(f"prototypes file {args.prototypes} has shape {emb.shape}; expected C×D or C×T×D")
        if emb.shape[0] != len(classes):
            raise SvgenError(f"prototypes file {args.prototypes} has {emb.shape[0]} rows but {args.classes} "
                             f"lists {len(classes)} classes; they must match")
        encoder_id = {"source": "prototypes", "file": os.path.basename(args.prototypes)}
    else:
        protos, identity = text_prototypes(args, classes, templates)
        emb = protos.per_template
        encoder_id = {**identity, "embed_dim": int(emb.shape[-1])}
        runtime = {**runtime, "prompts_encoded": protos.encoded}
    if shot_folder is not None or pool_folder is not None:  # images to embed: the encoder is needed even
        from svgen.encoders.hub import check_weights_reachable               # when every prompt was cached

        check_weights_reachable(args.model or DEFAULT_MODEL, default_pretrained(args))
        encoder = load_encoder(args)
        if args.prototypes:
            encoder_id = {**encoder_id, "images": encoder.identity()}
        if shot_folder is not None:
            shots = encode_shots(args, encoder, shot_folder, "fit")
        if pool_folder is not None:
            pool = encode_pool(args, encoder, pool_folder, "fit")
    clf.fit(np.asarray(emb, dtype=np.float32), classes=classes, templates=templates, encoder=encoder_id, shots=shots,
            unlabelled=pool)
    if not args.prototypes or shot_folder is not None or pool_folder is not None:
        clf.fit_metrics_["runtime"] = runtime
    clf.save(out, force=args.force)
    m = clf.fit_metrics_
    if m.get("diverged_at_step") is not None:
        print(f"svgen fit: warning: training diverged at step {m['diverged_at_step']}; "
              "kept the last good state", file=sys.stderr)
    summary = {k: m[k] for k in ("alignment_start", "alignment_end", "hinge", "sigma", "ridge_lambda",
                                 "condition_number", "mean_cos_support_prototype", "wall_time_s") if k in m}
    if m.get("geometry"):
        summary["metric_kappa"] = m["geometry"].get("kappa")
    if clf.fewshot_:
        summary["fewshot"] = {**{k: clf.fewshot_[k] for k in ("shots", "classes_with_shots", "default_head")},
                              "kernel_adapted": clf.fewshot_["kernel"]["decision"]["adopted"],
                              "mixture_weight": (clf.fewshot_.get("head_choice") or {}).get("mixture_weight"),
                              **({"classes_without_shots_offset": clf.heads_.calibration.shotless_offset}
                                 if clf.heads_.calibration.shotless_offset is not None else {})}
    if clf.transductive_:
        summary["transductive"] = {**{k: clf.transductive_.get(k) for k in ("pool", "fallback", "prior_strength",
                                                                             "rounds")},
                                   "default_head": clf.default_head_, "check": pool_check_summary(clf.transductive_)}
    note(args, f"wrote {out}: {len(classes)} classes × K={clf.fit_config_.n_support}, D={clf.n_features_in_}")
    print(json_text(summary))
    if clf.transductive_:
        note(args, pool_note(clf))
    return 0

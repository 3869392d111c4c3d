"""``svgen classify --engine ray``: the options, their checks, and the run (see :mod:`svgen.engine.ray`)."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from svgen.errors import SvgenError
from svgen.commands._common import note

log = logging.getLogger(__name__)



def add_ray_args(p) -> None:
    g = p.add_argument_group(
        "large collections (--engine ray)",
        "Classify on Ray Data: decoding in Ray tasks, the artifact and encoder loaded once per actor, "
        "Parquet out. --out is a folder (named FOLDER or FOLDER.parquet) of part-NNNNN.parquet files, one "
        "per block of inputs, each "
        "written atomically: rerunning the same command skips the blocks already written, and "
        "unreadable images are listed in OUT/_failed/. Needs pip install 'svgen[ray]'.")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this process (default); ray: a local Ray instance, or the cluster at --address")
    g.add_argument("--address", metavar="auto|ray://HOST:PORT",
                   help="join a running Ray cluster ('auto': the one this machine belongs to) instead of "
                        "starting a local instance; the artifact, --checkpoint and inputs must be readable "
                        "at the same paths on every node")
    g.add_argument("--actors", type=int, default=1, metavar="N",
                   help="classifier actors, each holding the artifact and encoder (default: %(default)s)")
    g.add_argument("--actor-cpus", type=float, default=1, metavar="C",
                   help="CPUs reserved per actor; its torch uses as many threads (default: %(default)s)")
    g.add_argument("--gpus-per-actor", type=float, default=0, metavar="G",
                   help="GPUs reserved per actor (Ray's num_gpus; fractions share one): actors then run only on "
                        "nodes with GPUs, each seeing its own; leave --device auto so each actor uses the GPU "
                        "it was given (default: %(default)s)")
    g.add_argument("--block-size", type=int, default=None, metavar="N",
                   help="inputs per output part: the unit of work and of resumption "
                        "(default: 256 images, 65536 feature rows)")
    g.add_argument("--path-column", default="path", metavar="NAME",
                   help="column of image paths in .csv/.parquet sources (default: %(default)s)")
    g.add_argument("--features-column", metavar="NAME",
                   help="list column of embeddings in .parquet feature shards (default: the only list column)")
    g.add_argument("--cpus", type=int, default=None, metavar="N",
                   help="local instance only: CPUs Ray may use (default: all)")
    g.add_argument("--object-store-mb", type=int, default=None, metavar="MB",
                   help="local instance only: Ray object store size (default: Ray's own, about 30%% of RAM)")


_RAY_ONLY = {"address": None, "actors": 1, "actor_cpus": 1, "gpus_per_actor": 0, "block_size": None, "path_column": "path",
             "features_column": None, "cpus": None, "object_store_mb": None}


def check_local(args) -> None:
    """Refuse --engine ray's own options without it (they would be silently ignored)."""
    given = [k for k, default in _RAY_ONLY.items() if getattr(args, k, default) != default]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise SvgenError(f"{flags} only apply with --engine ray")


def _check(args) -> None:
    if args.transductive:
        raise SvgenError("--transductive adapts to all inputs at once; it does not run with --engine ray")
    if args.format:
        raise SvgenError("--engine ray writes Parquet; drop --format")
    if not args.out:
        raise SvgenError("--engine ray needs --out FOLDER (it writes Parquet parts there)")
    from svgen.io.output import check_ray_folder

    check_ray_folder(args.out)
    if args.features and args.inputs:
        raise SvgenError("give images/folders or --features, not both")
    if not args.features and not args.inputs:
        raise SvgenError("nothing to classify: give image folders, files, globs, lists, tables or .tar shards, "
                         "or --features SHARDS")
    for flag in ("actors", "cpus"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise SvgenError(f"--{flag} must be at least 1, got {v}")
    if args.actor_cpus <= 0:
        raise SvgenError(f"--actor-cpus must be positive, got {args.actor_cpus:g}")
    if args.gpus_per_actor < 0:
        raise SvgenError(f"--gpus-per-actor must be 0 or more, got {args.gpus_per_actor:g}")
    if getattr(args, "decode", "cpu") != "cpu":
        raise SvgenError("--decode gpu runs in one process; with --engine ray images are decoded in Ray tasks "
                         "(drop --decode)")
    from svgen.commands._images import check_loader_args

    check_loader_args(args)
    from svgen.engine.ray import check_address

    check_address(args.address)
    if args.address and (args.cpus or args.object_store_mb):
        raise SvgenError("--cpus and --object-store-mb size a local Ray instance; drop them with --address")


def run_ray(args) -> int:
    from svgen import SVGClassifier
    from svgen.engine import ray as ray_engine
    from svgen.engine.blocks import plan_blocks, plan_digest

    _check(args)
    ray_engine.require_ray()  # before any work: one line saying what to install
    clf = SVGClassifier.load(args.artifact)
    args.head = args.head or clf.default_head_   # what the fit decided
    features = bool(args.features)
    block_size = args.block_size if args.block_size is not None else (65536 if features else 256)
    blocks = plan_blocks(args.features if features else args.inputs, block_size, features=features,
                         path_column=args.path_column, features_column=args.features_column,
                         dim=clf.n_features_in_)
    n_inputs = sum(b.size for b in blocks)
    preprocess = factory = None
    if not features:
        from svgen.encoders.resolve import EncoderRequest, encoder_for_artifact

        # Checked (and its preprocessing taken) here, so a wrong encoder is one line before Ray starts.
        request = EncoderRequest.from_options(args)
        preprocess = encoder_for_artifact(request, clf).preprocess
        factory = functools.partial(encoder_for_artifact, request)
    job = {"artifact": str(Path(args.artifact).resolve()), "head": args.head, "probs": bool(args.probs),
           "top_k": args.top_k, "block_size": block_size, "blocks": len(blocks), "inputs": n_inputs,
           "plan_sha256": plan_digest(blocks), "kind": "features" if features else "images"}
    ray_engine.check_output(args.out, job, force=args.force)  # before Ray starts; nothing is written yet
    if args.top_k > len(clf.class_names_):
        note(args, f"svgen classify: --top-k {args.top_k} is more than the artifact's {len(clf.class_names_)} classes; "
                   f"showing all {len(clf.class_names_)}")
    done = ray_engine.finished_blocks(args.out, job) if not args.force else set()
    if done:
        note(args, f"svgen classify: {len(done)} of {len(blocks)} block(s) already in {args.out}; classifying the rest")
    if len(done) < len(blocks):
        store = args.object_store_mb * 1024 * 1024 if args.object_store_mb else None
        started = ray_engine.connect(args.address, num_cpus=args.cpus, object_store_memory=store)
        try:
            done = ray_engine.prepare_output(args.out, job, force=args.force)
            ray_engine.run_blocks(blocks, args.out, args.artifact, args.head, args.probs, args.top_k,
                                  preprocess=preprocess, encoder_factory=factory, actors=args.actors,
                                  actor_cpus=args.actor_cpus, gpus_per_actor=args.gpus_per_actor,
                                  batch_size=args.batch_size, done=done,
                                  progress=args.progress, restart_actors=bool(args.address))
        finally:
            if started:
                import ray

                ray.shutdown()
    rows, failed, parts = ray_engine.count_rows(args.out)
    if rows + failed != n_inputs or parts != len(blocks):  # pragma: no cover - a bug, never a user error
        raise SvgenError(f"{args.out} holds {rows} prediction(s) + {failed} failure(s) in {parts} part(s) for "
                         f"{n_inputs} input(s) in {len(blocks)} block(s); rerun to finish it")
    if failed:
        note(args, f"svgen classify: {failed} of {n_inputs} input(s) could not be read; "
                   f"see {os.path.join(args.out, ray_engine.FAILED_DIR)}")
    note(args, f"wrote {args.out}: {rows} row(s) in {parts} part(s), {args.head} head "
               f"{'probabilities' if args.probs else 'scores'}, top {min(args.top_k, len(clf.class_names_))}, Parquet")
    return 0

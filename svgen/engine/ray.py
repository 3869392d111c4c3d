"""``svgen classify --engine ray``: blocks of a large collection classified on Ray Data.

The plan (:func:`svgen.engine.blocks.plan_blocks`) is a list of blocks; those whose part file is not yet
in the output folder become a Ray Dataset of one row per block, then

1. ``map`` — Ray **tasks** decode the block's images with the encoder's own preprocessing
   (:func:`svgen.engine.predictions.decode_block`; feature blocks skip this stage);
2. ``map_batches`` — an **actor pool** (``actors`` actors, each loading the artifact and the
   encoder once) embeds the images, or reads the feature rows, and scores them with
   :func:`svgen.engine.predictions.score`, the function single-process ``svgen classify`` uses; it returns
   the block's predictions and failures as Parquet bytes;
3. the driver writes each block as ``OUT/part-NNNNN.parquet`` through a temporary file and an
   atomic rename, after its failures (``OUT/_failed/part-NNNNN.parquet``).

So the output folder only ever holds complete blocks: a rerun of the same job skips them and
finishes the rest, and Ctrl-C loses at most the blocks in flight. ``OUT/_svgen_job.json``
records what the job is (artifact, head, top-k, the plan's digest); a rerun with different
settings is refused rather than mixed in. Readers that skip ``_``-prefixed paths (pyarrow,
pandas, Ray, Spark) see only the predictions when reading ``OUT``; the failures are read from
``OUT/_failed``. Rows of the output plus failures equal the number of inputs.

Without ``address`` a local Ray instance is started (and stopped at the end); with one, the
driver joins that cluster. Every node must then see the artifact, the checkpoint and the inputs
at the same paths (a shared file system), and have svgen installed. The output is written
by the driver alone.
"""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from svgen.engine.blocks import Block, read_features
from svgen.engine.predictions import (decode_block, failure_table, feature_keys, prediction_table, score, table_bytes,
                                      usable_rows)
from svgen.errors import SvgenError, setting_error
from svgen.safeio import atomic_file

log = logging.getLogger(__name__)

JOB_FILE = "_svgen_job.json"
FAILED_DIR = "_failed"
INSTALL_HINT = "--engine ray needs Ray: pip install 'svgen[ray]' (or pip install 'ray[data]')"


def require_ray():
    """Import ray (with Ray Data), or one line saying what to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise SvgenError(INSTALL_HINT) from None
    return ray


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


# ----------------------------------------------------------------------------- the output folder

def check_output(out, job: dict, force: bool = False) -> None:
    """Raise :class:`SvgenError` (writing nothing) unless ``out`` is new, or an earlier run of this
    ``job`` (then it is continued), or one that ``force`` may start over."""
    out = Path(out)
    if force and out.is_symlink():   # force starts over in a folder of svgen's own, never through a link
        raise SvgenError(f"out {out} is a symbolic link; force=True starts over only in a real folder",
                         cli=f"--out {out} is a symbolic link; --force starts over only in a real folder")
    if out.exists() and not out.is_dir():
        raise SvgenError(f"out {out} is a file; the Ray engine writes a folder of Parquet parts there",
                         cli=f"--out {out} is a file; --engine ray writes a folder of Parquet parts there")
    if not out.resolve().parent.is_dir():
        raise SvgenError(f"cannot write {out}: folder {out.resolve().parent} does not exist")
    job_file = out / JOB_FILE
    if out.is_dir() and any(out.iterdir()):
        if not job_file.is_file():
            raise setting_error("out", "--out", f"{out} is a folder that holds other files, not an earlier svgen classify run")
        if not force:
            try:
                before = json.loads(job_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise SvgenError(f"cannot read {job_file}: {e}") from None
            changed = [k for k in sorted(set(job) | set(before)) if job.get(k) != before.get(k)]
            if changed:
                why = f"{out} holds a different job (it differs in {', '.join(changed)})"
                raise SvgenError(f"{why}; use another out, or force=True to start over",
                                 cli=f"{why}; use another --out, or --force to start over")


def prepare_output(out, job: dict, force: bool = False) -> set:
    """Create or reopen the output folder (see :func:`check_output`); the block indices already written.

    ``force`` removes an earlier run's files (and only those) and starts over.
    """
    check_output(out, job, force)
    out = Path(out)
    job_file = out / JOB_FILE
    if force and job_file.is_file():
        for p in out.glob("part-*.parquet"):
            p.unlink()
        shutil.rmtree(out / FAILED_DIR, ignore_errors=True)
        job_file.unlink()
    _clean_temporaries(out)
    (out / FAILED_DIR).mkdir(parents=True, exist_ok=True)
    if not job_file.is_file():
        _write_atomic(job_file, json.dumps(job, indent=1, sort_keys=True).encode())
    return finished_blocks(out, job)


def finished_blocks(out, job: dict) -> set:
    """Indices of the blocks whose part file is in ``out`` (an atomic rename put each there whole)."""
    done = set()
    for p in Path(out).glob("part-*.parquet"):
        try:
            done.add(int(p.stem.split("-")[1]))
        except (IndexError, ValueError):
            pass
    return {i for i in done if i < job["blocks"]}


def _clean_temporaries(out: Path) -> None:
    """Remove what an interrupted write left (``.tmp-`` files are never a complete block)."""
    for folder in (out, out / FAILED_DIR):
        if folder.is_dir():
            for p in folder.glob(".*.tmp-*"):
                p.unlink(missing_ok=True)


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a temporary sibling (``.NAME.tmp-*``, what :func:`_clean_temporaries`
    removes) and a rename; an earlier file of the same block is replaced."""
    atomic_file(path, lambda tmp: tmp.write_bytes(data), force=True)


def write_block(out, index: int, part: bytes, failed: Optional[bytes]) -> None:
    """The block's failures (if any), then its predictions: a part file exists only once both are whole."""
    out = Path(out)
    if failed is not None:
        _write_atomic(out / FAILED_DIR / part_name(index), failed)
    _write_atomic(out / part_name(index), part)


def count_rows(out) -> tuple:
    """(prediction rows, failure rows, part files) in an output folder, from the Parquet footers alone."""
    import pyarrow.parquet as pq

    out = Path(out)
    parts = sorted(out.glob("part-*.parquet"))
    rows = sum(pq.read_metadata(p).num_rows for p in parts)
    failed = sum(pq.read_metadata(p).num_rows for p in (out / FAILED_DIR).glob("part-*.parquet"))
    return rows, failed, len(parts)


# ----------------------------------------------------------------------------- Ray stages

def decode_memory(preprocess, block_size: int) -> int:
    """Bytes a decoding task reserves: the block's preprocessed images plus 1 MB per image for decoding."""
    from PIL import Image

    one = preprocess(Image.new("RGB", (64, 64))).numel() * 4
    return int(block_size * (one + (1 << 20)))

def _decode_row(row: dict, preprocess) -> dict:
    """Ray task: the block's images, decoded and preprocessed (float32 bytes), and its failures."""
    block = Block.from_json(row["block"])
    images, ok, failed = decode_block(block, preprocess)
    arr = images.numpy() if images is not None else np.zeros((0,), dtype=np.float32)
    return {"block": row["block"], "images": arr.tobytes(), "shape": json.dumps(list(arr.shape)),
            "ok": json.dumps(ok), "failed": json.dumps(failed)}


class BlockClassifier:
    """One block in, its predictions out. The artifact and (on the first image block) the encoder are
    loaded once per instance: a Ray actor, or the caller's process.

    ``encoder_factory(clf)`` returns the :class:`~svgen.encoders.clip.ClipEncoder` the artifact needs;
    ``threads`` sets torch's intra-op threads (a Ray actor gets one by default).
    """

    def __init__(self, artifact: str, head: str, probs: bool, top_k: int, batch_size: Optional[int] = None,
                 encoder_factory: Optional[Callable] = None, threads: Optional[int] = None):
        import torch

        from svgen import SVGClassifier

        if threads:
            torch.set_num_threads(int(threads))
        self.clf = SVGClassifier.load(artifact)
        self.head, self.probs, self.top_k, self.batch_size = head, probs, top_k, batch_size
        self.encoder_factory, self.encoder = encoder_factory, None

    def _encoder(self):
        if self.encoder is None:
            self.encoder = self.encoder_factory(self.clf)
        return self.encoder

    def embed(self, images):
        """Raw embeddings of preprocessed images, ``batch_size`` at a time (default: the encoder's device's)."""
        import torch

        from svgen.encoders.runtime import image_batch_size

        encoder = self._encoder()
        size = self.batch_size or image_batch_size(encoder.device)
        return torch.cat([encoder.encode_batch(images[s:s + size]) for s in range(0, images.shape[0], size)])

    def classify(self, block: Block, decoded: Optional[dict] = None) -> dict:
        """``{"block", "part", "failed"}``: Parquet bytes of the block's predictions and failures
        (``failed`` is ``b""`` when there are none). ``decoded`` is :func:`_decode_row`'s output for
        an image block (decoded here when absent)."""
        import torch

        failed = []
        if block.kind == "features":
            s = block.spec
            x = torch.from_numpy(read_features(s["file"], s["start"], s["stop"], s["column"]))  # writable: no warning
            x, keys, failed = usable_rows(x, feature_keys(block), s["file"])  # a NaN row is a failure, not a crash
        else:
            if decoded is None:
                images, ok, failed = decode_block(block, self._encoder().preprocess)
            else:
                shape = json.loads(decoded["shape"])
                ok, failed = json.loads(decoded["ok"]), [tuple(f) for f in json.loads(decoded["failed"])]
                images = torch.from_numpy(np.frombuffer(decoded["images"], dtype=np.float32).copy().reshape(shape)) \
                    if ok else None
            x = self.embed(images) if ok else torch.zeros(0, self.clf.n_features_in_)
            keys = {"path": list(ok)}
        # images are scored where they were encoded
        device = None if block.kind == "features" else getattr(self._encoder(), "device", None)
        part = prediction_table(keys, score(self.clf, x, self.head, self.probs, device=device), self.clf.class_names_,
                                self.top_k, self.head, self.probs)
        return {"block": block.index, "part": table_bytes(part),
                "failed": table_bytes(failure_table(block.index, failed)) if failed else b""}

    def __call__(self, batch: dict) -> dict:
        """Ray Data ``map_batches`` entry: a batch of blocks (numpy format) in, one row per block out."""
        rows = []
        for i, spec in enumerate(batch["block"]):
            decoded = {k: batch[k][i] for k in ("images", "shape", "ok", "failed")} if "images" in batch else None
            rows.append(self.classify(Block.from_json(str(spec)), decoded))
        return {"block": np.array([r["block"] for r in rows], dtype=np.int64),
                "part": np.array([r["part"] for r in rows], dtype=object),
                "failed": np.array([r["failed"] for r in rows], dtype=object)}


# ----------------------------------------------------------------------------- the driver

def check_address(address: Optional[str]) -> None:
    if address and address != "auto" and not address.startswith("ray://"):
        raise setting_error("address", "--address", f"takes 'auto' or ray://HOST:PORT, got {address!r}")


def connect(address: Optional[str] = None, num_cpus: Optional[int] = None,
            object_store_memory: Optional[int] = None) -> bool:
    """Join ``address`` or start a local Ray; True when this call started it (the caller shuts it down).

    An instance already running in this process (``ray.init`` by the caller) is used as it is.
    """
    check_address(address)
    ray = require_ray()
    if ray.is_initialized():
        return False
    # Ray's own start-up chatter (token auth, deprecations) stays off the terminal unless -v.
    quiet = logging.getLogger("svgen").getEffectiveLevel() > logging.INFO
    kwargs = dict(logging_level=logging.ERROR if quiet else logging.WARNING, log_to_driver=not quiet)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # ConnectionError, a gRPC error, a timeout: one line either way
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise SvgenError(f"cannot join the Ray cluster at {address}: {first}") from None
    else:
        ray.init(num_cpus=num_cpus, object_store_memory=object_store_memory, include_dashboard=False, **kwargs)
    return True


def run_blocks(blocks: Sequence[Block], out, artifact: str, head: str, probs: bool, top_k: int, *,
               preprocess=None, encoder_factory: Optional[Callable] = None, actors: int = 1, actor_cpus: float = 1,
               gpus_per_actor: float = 0, batch_size: Optional[int] = None, done: Optional[set] = None, progress: bool = False,
               restart_actors: bool = True) -> int:
    """Classify the blocks not in ``done`` on the connected Ray instance, writing each as it finishes.

    Returns the number of blocks written now. ``preprocess`` (the encoder's image transform) and
    ``encoder_factory`` are needed for image blocks; ``gpus_per_actor``: each actor's GPUs (Ray's ``num_gpus``);
    ``restart_actors``: see :func:`build_dataset`.
    An actor that dies for good (killed, out of memory) ends the run with one line; the blocks
    written so far stay, and a rerun finishes the rest.
    """
    ray = require_ray()
    from ray.data import DataContext

    todo = [b for b in blocks if b.index not in (done or set())]
    if not todo:
        return 0
    images = todo[0].kind != "features"
    cpus = ray.cluster_resources().get("CPU", 0)
    need = actors * actor_cpus + (1 if images else 0)
    if cpus < need:
        why = (f"{actors} actor(s) of {actor_cpus:g} CPU(s)" + (" plus one decoding task" if images else "")
               + f" need {need:g} CPUs but the Ray cluster has {cpus:g}")
        raise SvgenError(f"{why}; use fewer actors", cli=f"{why}; use fewer --actors")
    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus_per_actor and gpus < actors * gpus_per_actor:
        why = f"{actors} actor(s) of {gpus_per_actor:g} GPU(s) need {actors * gpus_per_actor:g} GPUs but the Ray cluster has {gpus:g}"
        raise SvgenError(f"{why}; use fewer actors or gpus_per_actor",
                         cli=f"{why}; use fewer --actors or a smaller --gpus-per-actor")
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    if logging.getLogger("svgen").getEffectiveLevel() > logging.INFO:
        # Without -v, Ray Data's own logs stay off the terminal, its errors too: an error that ends the
        # run reaches svgen as the exception (a dead actor is one line, below), with no traceback first.
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)

    ds = build_dataset(todo, artifact, head, probs, top_k, preprocess=preprocess, encoder_factory=encoder_factory,
                       actors=actors, actor_cpus=actor_cpus, gpus_per_actor=gpus_per_actor, batch_size=batch_size,
                       restart_actors=restart_actors)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(blocks), initial=len(blocks) - len(todo), desc="blocks", unit="block")
    written = 0
    try:
        for row in ds.iter_rows():
            write_block(out, int(row["block"]), bytes(row["part"]), bytes(row["failed"]) or None)
            written += 1
            if bar is not None:
                bar.update(1)
    except ray.exceptions.RayActorError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise SvgenError(f"a classifier actor died ({type(e).__name__}: {first}); the {len(done or ()) + written} "
                         f"block(s) written are kept: rerun the same command to finish the rest") from None
    except ray.exceptions.RayTaskError as e:  # a block's own error, raised in a task or actor: its first line
        said = _block_error(e)
        raise SvgenError(f"a block failed ({said}); the {len(done or ()) + written} block(s) written are kept") \
            from None
    finally:
        if bar is not None:
            bar.close()
    return written


def _block_error(e: BaseException) -> str:
    """One line for a block's error raised in a Ray task or actor: svgen's own message, found in the remote
    traceback Ray carries back as text (Ray Data's ``UserCodeException`` drops the cause itself), else that
    traceback's last line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    ours = [line.split(": ", 1)[1] for line in lines if line.startswith("svgen.errors.SvgenError: ")]
    return (ours[-1] if ours else (lines[-1] if lines else type(e).__name__))[:300]


def build_dataset(todo: Sequence[Block], artifact, head: str, probs: bool, top_k: int, *, preprocess=None,
                  encoder_factory=None, actors: int = 1, actor_cpus: float = 1, gpus_per_actor: float = 0,
                  batch_size: Optional[int] = None, restart_actors: bool = True):
    """The Ray Dataset of one row per block: decoding tasks (image blocks), then the actor pool.

    ``restart_actors=False`` turns off Ray Data's default for the actor pool: restart a dead actor
    and retry its block, without limit. With restarts on, Ray core logs an error line to the
    driver's terminal for every actor (``core_worker.cc``: "has constructor arguments in the object
    store and max_restarts > 0"), because Ray Data hands each actor its function and context as
    object-store references (ray-project/ray#53727, #57733). No ``ray.init`` option drops that line
    alone: ``RAY_BACKEND_LOG_LEVEL=fatal`` drops every C++ error of every Ray process, from their log
    files too, and prints a line of its own. `svgen classify` therefore turns restarts off on a local
    instance, where svgen's own recovery covers a dead actor (one error line; the blocks written stay
    and a rerun finishes the rest), and keeps them with ``--address``, where they outlive a lost node.
    """
    ray = require_ray()
    images = todo[0].kind != "features"
    ds = ray.data.from_items([{"block": b.to_json()} for b in todo], override_num_blocks=len(todo))
    if images:
        # Decoding runs in tasks, not in the actors: the tasks' memory reservation (which the actors
        # do not have) also keeps Ray Data from fusing the two stages into the actor pool.
        ds = ds.map(_decode_row, fn_kwargs={"preprocess": preprocess}, num_cpus=1,
                    memory=decode_memory(preprocess, max(b.size for b in todo)))
    remote_args = {} if restart_actors else _no_restarts(ray)
    with warnings.catch_warnings():
        # Ray 2.60 announces the removal of map_batches' Ray remote arguments (max_restarts has no
        # named parameter yet); the warning is about this one call, not the user's code.
        warnings.filterwarnings("ignore", message=r"`ray_remote_args` is deprecated")
        ds = ds.map_batches(BlockClassifier, batch_size=1, batch_format="numpy", num_cpus=actor_cpus,
                            **({"num_gpus": gpus_per_actor} if gpus_per_actor else {}),
                            compute=ray.data.ActorPoolStrategy(size=actors),
                            fn_constructor_kwargs=dict(artifact=str(artifact), head=head, probs=probs, top_k=top_k,
                                                       batch_size=batch_size, encoder_factory=encoder_factory,
                                                       threads=max(1, int(actor_cpus))),
                            **remote_args)
    return ds


def _no_restarts(ray) -> dict:
    """``map_batches`` arguments that turn actor restarts off, where this Ray still takes them (a Ray
    without ``**ray_remote_args`` gets none: its own default, and possibly the log line)."""
    params = inspect.signature(ray.data.Dataset.map_batches).parameters.values()
    return {"max_restarts": 0} if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params) else {}

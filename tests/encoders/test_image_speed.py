"""The fast image path (issue 39): device choice, loader plan, mixed precision, JPEG draft decoding, tensor
(``--decode gpu``) decoding, text deduplication, and what ``svgen.json`` records. Every check runs on the CPU;
the CUDA versions of the agreement checks skip without a GPU. Nothing here times anything.

Tolerances, measured on the 100 shared photographs (``docs/performance.md`` states them):

* mixed precision vs fp32: cosine ≥ 0.999 per image; the same top-1 class wherever the fp32 top-1 leads by
  ≥ 2e-3 (see :func:`_agreement` for why not "on ≥ 99.5 % of images" with random weights);
* draft decoding of large JPEGs (2000×1500 made from the photos) vs a full decode: preprocessed pixels differ by
  at most :data:`DRAFT_MAX` and on average :data:`DRAFT_MEAN` (units of 1/255), embeddings cosine ≥ 0.999;
* tensor decoding (torchvision's libjpeg here, nvjpeg on CUDA) vs PIL: at most :data:`TENSOR_MAX`, on average
  :data:`TENSOR_MEAN` (1/255), embeddings cosine ≥ 0.999.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from svgen.encoders import runtime
from svgen.encoders.clip import ClipEncoder, resolve_device
from svgen.encoders.images import load_image, resize_target
from svgen.encoders.tensor_decode import JpegBytes, TensorPreprocess, jpeg_components
from svgen.errors import SvgenError

COSINE = 0.999
MARGIN = 2e-3                        # cosine lead of the fp32 top-1 over the runner-up (see _agreement)
DRAFT_MAX, DRAFT_MEAN = 24, 1.0      # 1/255 units; measured: ≤ 8 and 0.41 (ViT-B-32's 224), see docs/performance.md
TENSOR_MAX, TENSOR_MEAN = 4, 0.5     # 1/255 units; measured: ≤ 3 and 0.15


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"], device="cpu")


@pytest.fixture(scope="module")
def photos(shared_data):
    folder = shared_data / "images-30class"
    if not (folder / "labels.csv").is_file():
        pytest.skip("images-30class is absent")
    rows = [ln.split(",") for ln in (folder / "labels.csv").read_text().splitlines() if ln.strip()]
    return [str(folder / f) for f, _ in rows], [c for _, c in rows]


def _pixels(a, b, preprocess):
    """|a − b| of two preprocessed images in 1/255 units (the normalisation undone)."""
    std = torch.tensor(TensorPreprocess.from_preprocess(preprocess).std).view(3, 1, 1)
    return ((a - b) * std * 255).abs()


def _scores(encoder, feats, classes):
    text = F.normalize(encoder.encode_text([f"a photo of a {c}" for c in sorted(set(classes))]), dim=-1)
    return F.normalize(feats, dim=-1) @ text.T


# ----------------------------------------------------------------------------- the device

def test_auto_picks_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_every_device_option_defaults_to_auto():
    from svgen.cli import build_parser

    parser = build_parser()
    for argv in (["classify", "A", "x.jpg"], ["eval", "A", "--data", "d"], ["fit", "--classes", "c", "--out", "o"],
                 ["add-classes", "A", "--classes", "c"]):
        args = parser.parse_args(argv)
        assert args.device == "auto", argv


def test_the_device_is_logged_and_recorded_beside_the_identity(cli, tiny_model, tmp_path, caplog):
    (tmp_path / "c.txt").write_text("cat\ndog\nbird\n")
    enc = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
    with caplog.at_level("INFO", logger="svgen"):   # -v: the CLI lets svgen's INFO lines through
        code, _, err = cli("-v", "fit", "--classes", tmp_path / "c.txt", *enc, "--steps", 2, "--out", tmp_path / "a")
    assert code == 0, err
    assert any("encoder device: cpu (--device auto), fp32" in r.getMessage() for r in caplog.records)
    meta = json.loads((tmp_path / "a" / "svgen.json").read_text())
    assert meta["metrics"]["runtime"] == {"device": "cpu", "requested": "auto", "precision": "fp32",
                                         "prompts_encoded": 3 * 7}  # 3 classes × openai-simple, the default
    assert "device" not in meta["encoder"] and "runtime" not in meta["encoder"]


# ----------------------------------------------------------------------------- the loader plan

def test_loader_plan_follows_the_machine_and_keeps_what_is_given(monkeypatch):
    monkeypatch.setattr(runtime, "usable_cores", lambda: 16)
    monkeypatch.setattr(runtime, "available_memory", lambda: 64 << 30)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(runtime, "image_batch_size", lambda d: runtime.IMAGE_BATCH.get(d.type, 32))
    assert runtime.plan_loader(10, cpu) == runtime.LoaderPlan(32, 0, False, None)   # a couple of batches
    assert runtime.plan_loader(1000, cpu) == runtime.LoaderPlan(32, 16, False, runtime.PREFETCH)
    monkeypatch.setattr(runtime, "usable_cores", lambda: 64)
    assert runtime.plan_loader(1000, cpu).workers == runtime.MAX_WORKERS
    monkeypatch.setattr(runtime, "usable_cores", lambda: 16)
    assert runtime.plan_loader(10_000, cuda) == runtime.LoaderPlan(256, 15, True, runtime.PREFETCH)
    assert runtime.plan_loader(10_000, cuda, batch_size=64, workers=3) == runtime.LoaderPlan(64, 3, True,
                                                                                             runtime.PREFETCH)
    assert runtime.plan_loader(10_000, cuda, workers=0).prefetch is None
    monkeypatch.setattr(runtime, "available_memory", lambda: 1 << 30)  # 1 GB: the batches in flight fit a quarter
    plan = runtime.plan_loader(10_000, cuda)
    assert plan.workers * runtime.PREFETCH * plan.batch_size * 3 * 224 * 224 * 4 <= (1 << 30) // 4 or plan.workers == 1


def test_precision_names():
    cpu = torch.device("cpu")
    assert runtime.autocast_dtype(cpu) is None and runtime.autocast_dtype(cpu, "bf16") == torch.bfloat16
    assert runtime.precision_label(runtime.autocast_dtype(cpu, "fp16")) == "fp16"
    with pytest.raises(SvgenError, match="precision must be one of"):
        runtime.autocast_dtype(cpu, "int8")


# ----------------------------------------------------------------------------- mixed precision

def _agreement(encoder, photos, precision):
    """Image and text towers both in mixed precision against fp32.

    Per image, cosine ≥ 0.999. The top-1 criterion (same class on ≥ 99.5 % of images) assumes a real model's
    margins; on the random-weight test model the 30 classes' scores nearly tie (median top-1 margin 0.0076 in
    cosine; bf16 moves a score by up to 0.0034), and 3 of the 100 photos flip, at margins of 5e-4 to 9e-4. What
    is tested here: every image whose fp32 top-1 leads by ≥ :data:`MARGIN` keeps it, and ≥ 95 % keep it overall.
    ``benchmarks/bench_images.py`` measures the 99.5 % criterion with real weights (``--checkpoint``).
    """
    paths, classes = photos
    reference, ok, _ = encoder.encode_images(paths, num_workers=0)
    ref = _scores(encoder, reference, classes)
    before = encoder.precision
    encoder.precision = precision
    try:
        mixed, ok_mixed, _ = encoder.encode_images(paths, num_workers=0)
        got = _scores(encoder, mixed, classes)
    finally:
        encoder.precision = before
    assert ok_mixed == ok and len(ok) == len(paths) and mixed.dtype == torch.float32
    cos = F.cosine_similarity(reference, mixed)
    assert cos.min() >= COSINE, cos.min()
    top2 = ref.topk(2).values
    agree = ref.argmax(-1) == got.argmax(-1)
    assert agree[top2[:, 0] - top2[:, 1] >= MARGIN].all()
    assert agree.float().mean() >= 0.95


def test_bf16_autocast_matches_fp32_on_the_cpu(tiny, photos):
    _agreement(tiny, photos, "bf16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_precision_matches_fp32_on_cuda(tiny_model, photos):
    encoder = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"], device="cuda")
    encoder.precision = "fp32"
    _agreement(encoder, photos, "auto")


# ----------------------------------------------------------------------------- draft decoding

@pytest.fixture(scope="module")
def large_jpegs(photos, tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("large")
    out = []
    for i, p in enumerate(photos[0][:12]):
        f = root / f"{i:02d}.jpg"
        Image.open(p).convert("RGB").resize((2000, 1500), Image.BICUBIC).save(f, quality=90)
        out.append(str(f))
    return out


def test_draft_decoding_of_large_jpegs_stays_within_tolerance(tiny, large_jpegs):
    import open_clip

    _, _, vit_preprocess = open_clip.create_model_and_transforms("ViT-B-32")
    for preprocess in (tiny.preprocess, vit_preprocess):   # 32 and 224 pixels
        diffs = []
        for f in large_jpegs:
            full, _ = load_image(f, preprocess, draft=False)
            draft, _ = load_image(f, preprocess)
            diffs.append(_pixels(full, draft, preprocess))
        d = torch.stack(diffs)
        assert 0 < d.max() <= DRAFT_MAX and d.mean() <= DRAFT_MEAN, (d.max(), d.mean())   # > 0: draft did act
    full = torch.stack([load_image(f, tiny.preprocess, draft=False)[0] for f in large_jpegs])
    draft = torch.stack([load_image(f, tiny.preprocess)[0] for f in large_jpegs])
    assert F.cosine_similarity(tiny.encode_batch(full), tiny.encode_batch(draft)).min() >= COSINE


def test_draft_leaves_small_jpegs_alone(tiny, photos):
    import open_clip

    _, _, vit_preprocess = open_clip.create_model_and_transforms("ViT-B-32")
    assert resize_target(vit_preprocess) == 224 and resize_target(tiny.preprocess) == 32
    assert resize_target(lambda im: im) is None
    f = photos[0][0]  # 224×224: under twice the target (and the 224 floor, for the 32-pixel model), decoded in full
    for preprocess in (vit_preprocess, tiny.preprocess):
        assert torch.equal(load_image(f, preprocess)[0], load_image(f, preprocess, draft=False)[0])


# ----------------------------------------------------------------------------- tensor decoding (--decode gpu)

@pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")
def test_tensor_decoding_matches_pil(tiny, photos, tmp_path):
    import open_clip
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    _, _, vit_preprocess = open_clip.create_model_and_transforms("ViT-B-32")
    spec = TensorPreprocess.from_preprocess(vit_preprocess)
    assert spec.resize == 224 and spec.crop == (224, 224) and spec.interpolation == "bicubic"
    diffs = []
    for i, p in enumerate(photos[0][:20]):
        f = tmp_path / f"{i}.jpg"
        Image.open(p).convert("RGB").resize((500, 375), Image.BICUBIC).save(f, quality=90)
        pil, _ = load_image(str(f), vit_preprocess)
        tensor = spec([decode_jpeg(read_file(str(f)), mode=ImageReadMode.RGB)])[0]
        diffs.append(_pixels(pil, tensor, vit_preprocess))
    d = torch.stack(diffs)
    assert d.max() <= TENSOR_MAX and d.mean() <= TENSOR_MEAN, (d.max(), d.mean())
    pil, ok, _ = tiny.encode_images(photos[0], num_workers=0)
    tensor, ok_tensor, _ = tiny.encode_images(photos[0], num_workers=0, decode="tensor")
    assert ok_tensor == ok
    assert F.cosine_similarity(pil, tensor).min() >= COSINE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvjpeg_decoding_matches_pil_on_cuda(tiny_model, photos, tmp_path):
    """``--decode gpu`` proper: nvjpeg's pixels against PIL's (the figure docs/performance.md states comes from
    here and from the benchmark), and the embeddings."""
    import open_clip
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    _, _, vit_preprocess = open_clip.create_model_and_transforms("ViT-B-32")
    spec = TensorPreprocess.from_preprocess(vit_preprocess)
    diffs = []
    for i, p in enumerate(photos[0][:20]):
        f = tmp_path / f"{i}.jpg"
        Image.open(p).convert("RGB").resize((500, 375), Image.BICUBIC).save(f, quality=90)
        pil, _ = load_image(str(f), vit_preprocess)
        gpu = spec([decode_jpeg(read_file(str(f)), mode=ImageReadMode.RGB, device="cuda")])[0].cpu()
        diffs.append(_pixels(pil, gpu, vit_preprocess))
    d = torch.stack(diffs)
    assert d.max() <= 2 * TENSOR_MAX and d.mean() <= TENSOR_MEAN, (float(d.max()), float(d.mean()))
    encoder = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"], device="cuda")
    pil, ok, _ = encoder.encode_images(photos[0], num_workers=0)
    gpu, ok_gpu, _ = encoder.encode_images(photos[0], num_workers=0, decode="gpu")
    assert ok_gpu == ok and F.cosine_similarity(pil, gpu).min() >= COSINE


def test_tensor_decoding_falls_back_to_pil_file_by_file(tiny, photos, tmp_path):
    from PIL import Image

    src = photos[0][0]
    Image.open(src).convert("RGB").save(tmp_path / "a.png")
    Image.open(src).convert("CMYK").save(tmp_path / "b.jpg")
    (tmp_path / "c.jpg").write_bytes(open(src, "rb").read()[:300])   # truncated JPEG
    (tmp_path / "d.jpg").write_text("not an image")
    files = [src, str(tmp_path / "a.png"), str(tmp_path / "b.jpg"), str(tmp_path / "c.jpg"),
             str(tmp_path / "d.jpg"), photos[0][1]]
    assert jpeg_components(open(src, "rb").read()) == 3 and jpeg_components(open(files[2], "rb").read()) == 4
    assert [item[1] is not None for item in (JpegBytes(files, tiny.preprocess)[i] for i in range(6))] == \
        [True, False, False, True, False, True]    # bytes for the decoder; PIL in the worker for the rest
    pil, ok, failed = tiny.encode_images(files, batch_size=4, num_workers=0)
    tensor, ok_t, failed_t = tiny.encode_images(files, batch_size=4, num_workers=0, decode="tensor")
    assert ok_t == ok and [p for p, _ in failed_t] == [p for p, _ in failed]
    assert str(tmp_path / "d.jpg") in [p for p, _ in failed]
    assert F.cosine_similarity(pil, tensor).min() >= COSINE


def test_decode_gpu_without_cuda_is_one_line(cli, tiny, tiny_model, photos, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SvgenError, match="needs the encoder on a CUDA device"):
        tiny.encode_images(photos[0][:2], decode="gpu")
    (tmp_path / "c.txt").write_text("cat\ndog\n")
    enc = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
    assert cli("fit", "--classes", tmp_path / "c.txt", *enc, "--steps", 2, "--out", tmp_path / "a")[0] == 0
    code, out, err = cli("classify", tmp_path / "a", photos[0][0], *enc, "--decode", "gpu", "--out", tmp_path / "p.csv")
    assert code == 2 and out == "" and not (tmp_path / "p.csv").exists()
    assert err.strip() == "svgen classify: error: --decode gpu needs a CUDA device; the encoder is on cpu " \
                          "(use --decode cpu)"
    with pytest.raises(SystemExit) as e:   # a usage error: argparse's line, then where to read the help
        cli("classify", tmp_path / "a", photos[0][0], *enc, "--workers", -1)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines()[0] == "svgen classify: error: argument --workers: must be 0 or more, got -1"


# ----------------------------------------------------------------------------- chunks and text

def test_chunks_from_one_loader_equal_one_pass(tiny, photos):
    whole, ok, _ = tiny.encode_images(photos[0], batch_size=16, num_workers=2)
    chunks = list(tiny.iter_images(photos[0], batch_size=16, num_workers=2, chunk=40))
    assert [len(c[1]) for c in chunks] == [48, 48, 4]   # whole batches until a chunk has 40
    assert sum((c[1] for c in chunks), []) == ok
    torch.testing.assert_close(torch.cat([c[0] for c in chunks]), whole)


def test_identical_prompts_are_encoded_once(tiny, monkeypatch):
    seen = []
    tokenizer = tiny.tokenizer
    monkeypatch.setattr(tiny, "tokenizer", lambda texts: seen.append(list(texts)) or tokenizer(texts))
    prompts = ["a cat", "a dog", "a cat", "a bird", "a dog"]
    out = tiny.encode_text(prompts, batch_size=2)
    assert seen == [["a cat", "a dog", "a bird"]]
    monkeypatch.setattr(tiny, "tokenizer", tokenizer)
    one = tiny.encode_text(["a cat", "a dog", "a bird"], batch_size=2)
    torch.testing.assert_close(out, one[[0, 1, 0, 2, 1]])
    torch.testing.assert_close(tiny.encode_text(prompts, batch_size=256), out)


def test_each_prompt_is_tokenised_once_and_as_open_clip_does(tiny, monkeypatch):
    """``too_long`` and ``encode_text`` share the BPE ids (ftfy's cleaning is most of a prompt's tokenisation),
    and the tokens are exactly open_clip's, a prompt over the context length included."""
    from svgen.encoders.prototypes import build_prototypes

    prompts = ["a photo of a cat", "a dog", "word " * 100, "a dog", "ünïcödé café"]
    assert torch.equal(tiny.tokenize(prompts), tiny.tokenizer(prompts))
    assert tiny.too_long(prompts) == ["word " * 100]
    calls = []
    encode = type(tiny.tokenizer).encode
    monkeypatch.setattr(type(tiny.tokenizer), "encode", lambda self, text: calls.append(text) or encode(self, text))
    build_prototypes(tiny, ["cat", "dog", "bird"], ["a photo of a {}.", "a {}."], use_cache=False)
    assert sorted(calls) == sorted(t.format(c) for c in ("cat", "dog", "bird") for t in ("a photo of a {}.", "a {}."))
    assert "_ids_memo" not in tiny.__dict__   # dropped once encoded


def test_images_alone_never_build_the_tokenizer(tiny_model, photos):
    """Building open_clip's BPE tokenizer costs half a second that ``classify`` does not need."""
    enc = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"], device="cpu")
    assert enc.embed_dim == tiny_model["dim"]
    feats, ok, _ = enc.encode_images(photos[0][:3], num_workers=0)
    assert len(ok) == 3 and enc.__dict__["_tokenizer"] is None
    assert enc.encode_text(["a cat"]).shape == (1, tiny_model["dim"]) and enc.__dict__["_tokenizer"] is not None


def test_a_checkpoints_sha256_is_remembered_on_disk_until_the_file_changes(tmp_path, monkeypatch):
    """Large weights are hashed once across commands (the in-process memo is cleared here as a new process has
    none); any change to the file (its size, times or inode) hashes it again."""
    import hashlib
    import os

    from svgen.encoders import identity

    monkeypatch.setattr(identity, "DISK_MEMO_BYTES", 0)
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"weights" * 1000)
    truth = hashlib.sha256(f.read_bytes()).hexdigest()
    identity._sha256_of.cache_clear()
    assert identity.file_sha256(f) == truth
    memos = list((tmp_path / "svgen-cache" / "sha256").iterdir())
    assert len(memos) == 1 and memos[0].read_text().strip() == truth
    memos[0].write_text("0" * 64)   # what a later command reads instead of hashing
    identity._sha256_of.cache_clear()
    assert identity.file_sha256(f) == "0" * 64
    st = f.stat()
    f.write_bytes(b"other weights" * 1000)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))   # same mtime: the change time still differs
    identity._sha256_of.cache_clear()
    assert identity.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()

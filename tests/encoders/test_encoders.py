"""ClipEncoder through the real open_clip loading paths, with a random-weight tiny model.

Truncated text encoding must equal stock ``encode_text`` (cosine ≥ 0.99999); models where
truncation is not exact must fall back to stock; images that cannot be read are skipped and
reported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from svgen.encoders.clip import ClipEncoder, _truncation_exact, encode_text_truncated

from svgen.encoders.images import find_images
from svgen.errors import SvgenError

# A real, downloadable tag; the tests that name it never reach the network (refused before any load: "not both").
REAL_TAG = "openai"

# One word up to well past the 77-token context: every batch mixes very different lengths.
PROMPTS = [
    "a",
    "a photo of a cat.",
    "a blurry photo of the small red tabby cat sitting on a windowsill.",
    "dog",
    "a photo of a " + "very " * 30 + "large dog.",
    "a photo of a " + "really " * 90 + "long name.",  # truncated by the tokenizer
    "an origami crane.",
    "a bad photo of a hammerhead shark, a type of fish.",
    "猫の写真",
    "x y z",
]


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"])


def _stock(enc: ClipEncoder, prompts) -> torch.Tensor:
    with torch.inference_mode():
        return enc.model.encode_text(enc.tokenizer(list(prompts))).float()


def _min_cos(a, b) -> float:
    return float(F.cosine_similarity(a, b, dim=-1).min())


# ----------------------------------------------------------------------------- loading paths

def test_checkpoint_safetensors(encoder, tiny_model):
    assert encoder.truncate_text
    assert encoder.model_name == "svgen-tiny"
    assert encoder.context_length == 77 and encoder.embed_dim == tiny_model["dim"]
    assert not any(p.requires_grad for p in encoder.model.parameters()) and not encoder.model.training
    ident = encoder.identity()
    assert ident["checkpoint"] == "tiny.safetensors" and len(ident["checkpoint_sha256"]) == 64


@pytest.mark.parametrize("source", ["pt", "local_dir"])
def test_every_path_loads_the_same_weights(encoder, tiny_model, source):
    if source == "pt":
        other = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["pt"])
    else:
        other = ClipEncoder(tiny_model["local_dir"])
        assert other.checkpoint_sha256 is not None  # the cache key follows the weights file
    assert other.truncate_text
    a, b = encoder.encode_text(PROMPTS), other.encode_text(PROMPTS)
    assert _min_cos(a, b) >= 0.99999


def test_pt_checkpoint_is_read_with_weights_only(tiny_model, monkeypatch):
    seen = []
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    ClipEncoder(tiny_model["config"], checkpoint=tiny_model["pt"])
    assert seen and all(w is True for w in seen)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickled_objects_in_a_pt_file_are_refused(tiny_model, tmp_path, capsys):
    from safetensors.torch import load_file

    state = load_file(tiny_model["safetensors"])
    state["extra"] = _Payload()
    torch.save(state, tmp_path / "evil.pt")
    with pytest.raises(SvgenError, match="weights_only=True") as e:
        ClipEncoder(tiny_model["config"], checkpoint=str(tmp_path / "evil.pt"))
    assert "\n" not in str(e.value) and "must never run" not in capsys.readouterr().out


@pytest.mark.parametrize("content", [b"not a checkpoint", b"\x00" * 64])
def test_damaged_checkpoints_are_one_line_errors(tiny_model, tmp_path, content):
    for name in ("bad.safetensors", "bad.pt"):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(SvgenError, match="cannot load") as e:
            ClipEncoder(tiny_model["config"], checkpoint=str(tmp_path / name))
        assert "\n" not in str(e.value)


def test_checkpoint_for_another_architecture(tiny_model, tmp_path):
    cfg = json.loads(Path(tiny_model["config"]).read_text())
    cfg["embed_dim"] = 16
    other = tmp_path / "svgen-tiny-narrow.json"
    other.write_text(json.dumps(cfg))
    with pytest.raises(SvgenError, match="does not match architecture"):
        ClipEncoder(str(other), checkpoint=tiny_model["safetensors"])


def test_bad_names_and_options(tiny_model, tmp_path):
    with pytest.raises(SvgenError, match="unknown open_clip model"):
        ClipEncoder("ViT-Nope-99", checkpoint=tiny_model["safetensors"])
    with pytest.raises(SvgenError, match="checkpoint file not found"):
        ClipEncoder(tiny_model["config"], checkpoint=str(tmp_path / "missing.safetensors"))
    with pytest.raises(SvgenError, match="not both"):
        ClipEncoder("ViT-B-32", pretrained=REAL_TAG, checkpoint=tiny_model["safetensors"])
    with pytest.raises(SvgenError, match="unknown pretrained tag 'nope'.*openai"):
        ClipEncoder("ViT-B-32", pretrained="nope")
    with pytest.raises(SvgenError, match="open_clip_config.json"):
        ClipEncoder(f"local-dir:{tmp_path}")
    if not torch.cuda.is_available():
        with pytest.raises(SvgenError, match="device='cpu'") as e:
            ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"], device="cuda")
        assert e.value.cli_message.endswith("use --device cpu")


def test_local_dir_without_weights_is_an_error(tiny_model, tmp_path):
    src = Path(tiny_model["local_dir"][len("local-dir:"):])
    shutil.copy(src / "open_clip_config.json", tmp_path / "open_clip_config.json")
    with pytest.raises(SvgenError, match="holds no weights"):  # open_clip alone would go on with random weights
        ClipEncoder(f"local-dir:{tmp_path}")


# ----------------------------------------------------------------------------- text encoding

@pytest.mark.parametrize("batch_size", [1, 3, 256])
def test_truncated_equals_stock(encoder, batch_size):
    stock = _stock(encoder, PROMPTS)
    ours = encoder.encode_text(PROMPTS, batch_size=batch_size)
    assert ours.shape == stock.shape and ours.dtype == torch.float32
    assert _min_cos(ours, stock) >= 0.99999  # also checks the output order is the input order
    assert torch.allclose(ours, stock, atol=1e-4, rtol=1e-4)


def test_truncation_really_truncates(encoder, monkeypatch):
    lengths = []
    real = encoder.model.transformer.forward

    def spy(x, *args, **kwargs):
        lengths.append(x.shape[1])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(encoder.model.transformer, "forward", spy)
    encoder.encode_text(["a", "dog", "a photo of a cat."], batch_size=2)
    assert max(lengths) < 10  # stock encode_text would run all 77 positions


def test_truncated_function_on_a_padded_batch(encoder):
    tokens = encoder.tokenizer(PROMPTS)
    with torch.inference_mode():
        assert _min_cos(encode_text_truncated(encoder.model, tokens), encoder.model.encode_text(tokens)) >= 0.99999


def test_empty_prompt_list(encoder):
    assert encoder.encode_text([]).numel() == 0


def test_too_long_names_the_prompts(encoder):
    assert encoder.too_long(PROMPTS) == [PROMPTS[5]]


def _variant(tmp_path, tiny_model, name, **text_cfg):
    cfg = json.loads(Path(tiny_model["config"]).read_text())
    cfg["text_cfg"].update(text_cfg)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return ClipEncoder(str(path), checkpoint=tiny_model["safetensors"])


@pytest.mark.parametrize("name, text_cfg", [
    ("svgen-tiny-lastpool", {"pool_type": "last"}),
    ("svgen-tiny-nomask", {"no_causal_mask": True}),
])
def test_fallback_to_stock_when_truncation_is_not_exact(tmp_path, tiny_model, name, text_cfg):
    enc = _variant(tmp_path, tiny_model, name, **text_cfg)
    assert not _truncation_exact(enc.model) and not enc.truncate_text
    stock = _stock(enc, PROMPTS)
    assert _min_cos(enc.encode_text(PROMPTS, batch_size=4), stock) >= 0.99999
    # ...and truncating anyway would have been wrong for this model: the guard matters.
    with torch.inference_mode():
        tokens = enc.tokenizer(["a", "dog"])
        if enc.model.attn_mask is not None:
            assert _min_cos(encode_text_truncated(enc.model, tokens), enc.model.encode_text(tokens)) < 0.999


def test_non_causal_mask_patched_in_is_detected(encoder):
    model = encoder.model
    saved = model.attn_mask
    try:
        model.attn_mask = torch.zeros_like(saved)  # a bidirectional mask: later tokens would matter
        assert not _truncation_exact(model)
        model.attn_mask = saved.clone()
        model.attn_mask[0, 1] = 0.0  # one hole is enough to break exactness
        assert not _truncation_exact(model)
    finally:
        model.attn_mask = saved
    assert _truncation_exact(model)


def test_eos_pooling_also_truncates_exactly(tmp_path, tiny_model):
    enc = _variant(tmp_path, tiny_model, "svgen-tiny-eos", pool_type="eos")
    assert enc.truncate_text
    assert _min_cos(enc.encode_text(PROMPTS, batch_size=4), _stock(enc, PROMPTS)) >= 0.99999


# ----------------------------------------------------------------------------- images

def _real_images(shared_data, n):
    folder = shared_data / "images-30class"
    files = sorted(folder.glob("*.jpg"))[:n]
    if not files:
        pytest.skip("no JPEGs in ../shared/data/images-30class")
    return files


def test_images_bad_files_are_reported_and_skipped(encoder, shared_data, tmp_path, tiny_model):
    real = _real_images(shared_data, 6)
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    for f in real[:4]:
        shutil.copy(f, folder / f.name)
    shutil.copy(real[4], folder / "sub" / real[4].name)
    (folder / "corrupt.jpg").write_bytes(real[5].read_bytes()[:400])  # a JPEG cut off after its header
    (folder / "notes.jpg").write_text("this is not an image\n")  # image suffix, text inside
    (folder / "readme.txt").write_text("ignored inside folders\n")

    paths = find_images([str(folder)])
    assert len(paths) == 7 and not any(p.endswith(".txt") for p in paths)
    feats, ok, failed = encoder.encode_images(paths, batch_size=3, num_workers=0)
    assert feats.shape == (5, tiny_model["dim"]) and torch.isfinite(feats).all()
    assert sorted(Path(p).name for p in ok) == sorted(f.name for f in real[:5])
    reasons = {Path(p).name: why for p, why in failed}
    assert set(reasons) == {"corrupt.jpg", "notes.jpg"}
    assert reasons["notes.jpg"] == "not an image" and reasons["corrupt.jpg"]


def test_images_with_dataloader_workers_match(encoder, shared_data, tmp_path):
    real = [str(p) for p in _real_images(shared_data, 8)]
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    paths = real[:4] + [str(bad)] + real[4:]
    serial, ok0, failed0 = encoder.encode_images(paths, batch_size=4, num_workers=0)
    parallel, ok2, failed2 = encoder.encode_images(paths, batch_size=4, num_workers=2)
    assert ok0 == ok2 == real and [p for p, _ in failed0] == [p for p, _ in failed2] == [str(bad)]
    assert torch.allclose(serial, parallel, atol=1e-5)


def test_images_equal_stock_preprocess_and_encode(encoder, shared_data):
    from PIL import Image

    path = _real_images(shared_data, 1)[0]
    feats, _, _ = encoder.encode_images([str(path)], num_workers=0)
    with torch.inference_mode(), Image.open(path) as im:
        stock = encoder.model.encode_image(encoder.preprocess(im.convert("RGB"))[None]).float()
    assert _min_cos(feats, stock) >= 0.99999


def test_all_bad_images(encoder, tmp_path):
    (tmp_path / "a.png").write_bytes(b"nope")
    feats, ok, failed = encoder.encode_images([str(tmp_path / "a.png")], num_workers=0)
    assert feats.shape[0] == 0 and ok == [] and len(failed) == 1


def test_find_images_errors_and_explicit_files(tmp_path):
    f = tmp_path / "photo.dat"
    f.write_bytes(b"x")
    assert find_images([str(f)]) == [str(f)]  # named explicitly: kept, checked when read
    with pytest.raises(SvgenError, match="no such file"):
        find_images([str(tmp_path / "missing")])


def test_from_model_wraps_a_built_model(encoder):
    wrapped = ClipEncoder.from_model(encoder.model, encoder.tokenizer, encoder.preprocess, name="mine")
    assert wrapped.truncate_text and wrapped.identity()["model"] == "mine"
    assert _min_cos(wrapped.encode_text(PROMPTS), _stock(encoder, PROMPTS)) >= 0.99999

"""``svgen check-encoder`` and :func:`svgen.encoders.check.check_encoder`: verdicts on deliberately wrong encoders.

With plain random weights GELU and QuickGELU give nearly the same embeddings (cosine ≈ 0.99996),
so no check could tell them apart. The model here is the tiny architecture with random weights
whose MLPs work where the two activations differ most: every ``c_fc`` bias is −2.5 (the
pre-activations sit in the negative tail, where QuickGELU decays like e^{-1.7|x|} and GELU like
e^{-x²/2}) and ``c_proj`` is scaled ×30 so the MLP branch dominates the residual stream. Its
reference embeddings are computed independently of svgen: stock ``encode_text`` on the tokens and
``encode_image`` on the image through ``open_clip.image_transform`` with the right settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from svgen.encoders.check import THRESHOLD, Reference, check_encoder, reference_applies, shipped_reference
from svgen.encoders.clip import ClipEncoder
from svgen.errors import SvgenError

from conftest import TINY_CFG

TEXTS = ["a diagram", "a dog", "a cat"]
RIGHT_PRE = {"image_size": TINY_CFG["vision_cfg"]["image_size"], "mean": [0.48145466, 0.4578275, 0.40821073],
             "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic", "resize_mode": "shortest"}


def _sensitive_state(seed):
    import open_clip

    torch.manual_seed(seed)
    state = open_clip.create_model("svgen-tiny").state_dict()
    return {k: (torch.full_like(v, -2.5) if k.endswith("c_fc.bias") else 30 * v if k.endswith("c_proj.weight") else v)
            .contiguous() for k, v in state.items()}


@pytest.fixture(scope="module")
def sensitive(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("sensitive")
    paths = {}
    for seed in (1, 2):
        paths[seed] = str(root / f"sensitive-{seed}.safetensors")
        save_file(_sensitive_state(seed), paths[seed])
    return {"config": tiny_model["config"], "right": paths[1], "other_weights": paths[2]}


def _reference(config, checkpoint, quick_gelu) -> Reference:
    """Stock open_clip outputs with the right settings — no svgen code involved."""
    import open_clip
    from PIL import Image

    from svgen.encoders.check import REFERENCE_DIR

    open_clip.add_model_config(config)
    model = open_clip.create_model(Path(config).stem, pretrained=checkpoint, force_quick_gelu=quick_gelu).eval()
    image = str(REFERENCE_DIR / "CLIP.png")
    pre = dict(RIGHT_PRE)
    transform = open_clip.image_transform(pre.pop("image_size"), is_train=False, **pre)
    with torch.no_grad(), Image.open(image) as im:
        text = model.encode_text(open_clip.get_tokenizer(Path(config).stem)(TEXTS))
        img = model.encode_image(transform(im.convert("RGB"))[None])
    return Reference("tiny test model", TEXTS, image, torch.cat([text, img]).numpy(), RIGHT_PRE, "computed in the test")


@pytest.fixture(scope="module")
def ref_quick(sensitive):
    return _reference(sensitive["config"], sensitive["right"], quick_gelu=True)


def _encoder(sensitive, quick_gelu, weights="right"):
    return ClipEncoder(sensitive["config"], checkpoint=sensitive[weights], quick_gelu=quick_gelu)


def _squash(enc):
    import open_clip

    pre = dict(RIGHT_PRE, resize_mode="squash")
    enc.preprocess = open_clip.image_transform(pre.pop("image_size"), is_train=False, **pre)
    return enc


def test_right_settings_pass(sensitive, ref_quick):
    result = check_encoder(_encoder(sensitive, True), ref_quick)
    assert result.passed and len(result.cosines) == 4 and min(result.cosines) >= 0.99999
    assert result.labels == ['text "a diagram"', 'text "a dog"', 'text "a cat"', "image CLIP.png"]
    assert "reproduces" in result.verdict and result.tried == {}


def test_gelu_for_quickgelu_weights_fails_as_a_mix_up(sensitive, ref_quick):
    result = check_encoder(_encoder(sensitive, False), ref_quick)
    assert not result.passed and max(result.cosines) < THRESHOLD  # texts and image: both towers are affected
    assert result.verdict.startswith("GELU/QuickGELU mix-up") and "pass --quick-gelu" in result.verdict
    assert result.tried["with QuickGELU"] >= 0.99999


def test_quickgelu_for_gelu_weights_fails_as_a_mix_up(sensitive):
    ref = _reference(sensitive["config"], sensitive["right"], quick_gelu=False)
    result = check_encoder(_encoder(sensitive, True), ref)
    assert not result.passed and "pass --no-quick-gelu" in result.verdict
    assert check_encoder(_encoder(sensitive, False), ref).passed


def test_wrong_preprocessing_fails_as_preprocessing(sensitive, ref_quick):
    enc = _squash(_encoder(sensitive, True))
    result = check_encoder(enc, ref_quick)
    assert not result.passed
    assert min(result.cosines[:3]) >= 0.99999 and result.cosines[3] < THRESHOLD  # only the image is off
    assert result.verdict.startswith("wrong image preprocessing") and "shortest resize to 32 bicubic" in result.verdict
    assert enc.preprocess.transforms[0].size == (32, 32)  # the encoder's own preprocessing is left as it was


def test_both_mistakes_at_once(sensitive, ref_quick):
    result = check_encoder(_squash(_encoder(sensitive, False)), ref_quick)
    assert not result.passed and result.verdict.startswith("GELU/QuickGELU mix-up and wrong image preprocessing")


def test_wrong_weights(sensitive, ref_quick):
    result = check_encoder(_encoder(sensitive, True, "other_weights"), ref_quick)
    assert not result.passed and result.verdict.startswith("wrong weights")
    assert max(result.tried.values()) < THRESHOLD
    assert f"the best variant's minimum cosine is {max(result.tried.values()):.4f}" in result.verdict  # not "best"


def test_check_restores_the_encoder(sensitive, ref_quick):
    enc = _encoder(sensitive, False)
    before = enc.encode_text(TEXTS)
    check_encoder(enc, ref_quick)  # swaps activations and preprocessing while diagnosing
    assert enc.quick_gelu is False and torch.equal(enc.encode_text(TEXTS), before)


def test_other_dimension_is_an_error(sensitive):
    with pytest.raises(SvgenError, match="dimension 32 .* has 512"):
        check_encoder(_encoder(sensitive, True), shipped_reference())


# ----------------------------------------------------------------------------- the shipped reference

def test_shipped_reference_is_openai_clip(shared_data):
    ref = shipped_reference()
    assert ref.embeddings.shape == (4, 512) and ref.texts == TEXTS and Path(ref.image).is_file()
    e = ref.embeddings / np.linalg.norm(ref.embeddings, axis=1, keepdims=True)
    logits = 100 * e[3] @ e[:3].T
    np.testing.assert_allclose(logits, [25.55, 20.09, 19.75], atol=0.01)  # "a diagram" with p = 0.993, as CLIP's README
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert abs(probs[0] - 0.9927) < 5e-4
    data = shared_data / "clip-vit-b32"
    if not (data / "numpyclip_text_features_diagram_dog_cat.npy").is_file():
        pytest.skip("NumPyCLIP reference files are absent from ../shared/data")
    np.testing.assert_array_equal(ref.embeddings[:3], np.load(data / "numpyclip_text_features_diagram_dog_cat.npy"))
    np.testing.assert_array_equal(ref.embeddings[3:], np.load(data / "numpyclip_image_features_CLIP_png.npy"))
    assert Path(ref.image).read_bytes() == (data / "CLIP.png").read_bytes()
    licence = (Path(ref.image).parent / "LICENSE.NumPyCLIP").read_text()
    assert "MIT License" in licence and "Permission is hereby granted" in licence


def test_which_models_the_reference_applies_to(tiny_model, tmp_path):
    assert reference_applies("ViT-B-32", "openai") == (True, "")
    assert reference_applies("ViT-B-32-quickgelu", "openai") == (True, "")
    assert reference_applies("ViT-B-32", None) == (True, "")  # a checkpoint for ViT-B-32
    assert reference_applies("ViT-B-32", "laion2b_s34b_b79k")[0] is False  # other weights
    assert reference_applies("ViT-L-14", "openai")[0] is False  # another architecture
    assert reference_applies("svgen-tiny", None)[0] is False
    import open_clip

    folder = tmp_path / "b32"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": {
        **open_clip.get_model_config("ViT-B-32"), "quick_gelu": True}}))
    assert reference_applies(f"local-dir:{folder}", None) == (True, "")


# ----------------------------------------------------------------------------- the command

@pytest.fixture
def tiny_reference(monkeypatch, ref_quick):
    import svgen.encoders.check as check

    monkeypatch.setattr(check, "shipped_reference", lambda: ref_quick)
    monkeypatch.setattr(check, "reference_applies", lambda model, pretrained: (True, ""))


def test_cli_pass_and_fail(cli, sensitive, tiny_reference):
    args = ["check-encoder", "--model", sensitive["config"], "--checkpoint", sensitive["right"]]
    code, out, err = cli(*args, "--quick-gelu")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("encoder: svgen-tiny") and "QuickGELU (requested)" in lines[0]
    assert sum(line.strip().startswith("cosine") for line in lines) == 4
    assert lines[-1].startswith("PASS: every cosine ≥ 0.999")
    code, out, err = cli(*args, "--no-quick-gelu")
    assert code == 1 and err == ""
    assert out.count("FAIL ") == 4 and out.splitlines()[-1].startswith("FAIL: GELU/QuickGELU mix-up")
    assert "pass --quick-gelu" in out.splitlines()[-1]


def test_cli_without_a_reference_says_so(cli, tiny_model):
    code, out, err = cli("check-encoder", "--pretrained", "laion2b_s34b_b79k")  # refused before any loading
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no reference embeddings ship for ViT-B-32 pretrained 'laion2b_s34b_b79k'" in err
    code, out, err = cli("check-encoder", "--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"])
    assert code == 2 and "not the ViT-B-32 architecture" in err

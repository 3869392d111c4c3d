"""Prototypes end to end from a local checkpoint, and the prompt-embedding disk cache."""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.nn.functional as F

from svgen.encoders.clip import ClipEncoder
from svgen.encoders.prototypes import PromptCache, build_prototypes, cache_dir, prototypes_from_embeddings

CLASSES = ["cat", "dog", "golden retriever", "hammerhead shark"]
TEMPLATES = ["a photo of a {}.", "a blurry photo of the {}.", "art of a {}."]


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"])


@pytest.fixture
def counted(encoder, monkeypatch):
    """The module's encoder, recording every prompt that reaches ``encode_text``."""
    calls = []
    real = encoder.encode_text

    def spy(prompts, *args, **kwargs):
        calls.append(list(prompts))
        return real(prompts, *args, **kwargs)

    monkeypatch.setattr(encoder, "encode_text", spy)
    return encoder, calls


def test_prototypes_from_a_local_checkpoint(encoder, tiny_model):
    protos = build_prototypes(encoder, CLASSES, TEMPLATES)
    C, T, D = len(CLASSES), len(TEMPLATES), tiny_model["dim"]
    assert protos.per_template.shape == (C, T, D) and protos.mean.shape == (C, D)
    assert protos.classes == CLASSES and protos.templates == TEMPLATES and protos.encoded == C * T
    assert torch.allclose(protos.per_template.norm(dim=-1), torch.ones(C, T), atol=1e-5)
    assert torch.allclose(protos.mean.norm(dim=-1), torch.ones(C), atol=1e-5)
    assert torch.allclose(protos.mean, F.normalize(protos.per_template.mean(1), dim=-1), atol=1e-6)
    # CLIP's zero-shot recipe with stock open_clip, row by row: E[c, t] = normalize(encode_text(prompt))
    with torch.inference_mode():
        prompts = [t.replace("{}", c) for c in CLASSES for t in TEMPLATES]
        stock = F.normalize(encoder.model.encode_text(encoder.tokenizer(prompts)).float(), dim=-1)
    cos = (protos.per_template.reshape(C * T, D) * stock).sum(-1)
    assert float(cos.min()) >= 0.99999


def test_prototypes_from_local_dir_equal_checkpoint(encoder, tiny_model):
    other = ClipEncoder(tiny_model["local_dir"])
    a = build_prototypes(encoder, CLASSES, TEMPLATES, use_cache=False)
    b = build_prototypes(other, CLASSES, TEMPLATES, use_cache=False)
    assert float((a.mean * b.mean).sum(-1).min()) >= 0.99999


def test_same_classes_again_encode_nothing(counted):
    encoder, calls = counted
    first = build_prototypes(encoder, CLASSES, TEMPLATES)
    assert first.encoded == 12 and sum(map(len, calls)) == 12
    files = list(cache_dir().glob("text-*.safetensors"))
    assert len(files) == 1 and str(cache_dir()).startswith(os.environ["SVGEN_CACHE_DIR"])

    calls.clear()
    again = build_prototypes(encoder, CLASSES, TEMPLATES)  # a fresh PromptCache read from disk
    assert again.encoded == 0 and calls == []
    assert torch.equal(again.per_template, first.per_template)


def test_adding_one_class_encodes_only_its_prompts(counted):
    encoder, calls = counted
    first = build_prototypes(encoder, CLASSES, TEMPLATES)
    calls.clear()
    more = build_prototypes(encoder, CLASSES + ["zebra"], TEMPLATES)
    assert more.encoded == 3
    assert sorted(p for batch in calls for p in batch) == sorted(t.replace("{}", "zebra") for t in TEMPLATES)
    assert torch.allclose(more.per_template[:4], first.per_template, atol=1e-6)

    calls.clear()  # a new template for the old classes: only those prompts
    build_prototypes(encoder, CLASSES[:2], TEMPLATES + ["a toy {}."])
    assert sorted(p for batch in calls for p in batch) == ["a toy cat.", "a toy dog."]

    calls.clear()  # reordered, subset: all cached
    reordered = build_prototypes(encoder, ["dog", "cat"], TEMPLATES[::-1])
    assert calls == [] and torch.equal(reordered.per_template[0, 0], first.per_template[1, 2])


def test_cache_is_per_encoder_identity(encoder, tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(tiny_model["safetensors"])
    state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(tmp_path / "perturbed.safetensors"))
    other = ClipEncoder(tiny_model["config"], checkpoint=str(tmp_path / "perturbed.safetensors"))
    assert other.identity_key() != encoder.identity_key()

    a = build_prototypes(encoder, CLASSES, TEMPLATES)
    b = build_prototypes(other, CLASSES, TEMPLATES)
    assert b.encoded == 12  # nothing borrowed from the other model's cache
    assert len(list(cache_dir().glob("text-*.safetensors"))) == 2
    assert not torch.allclose(a.per_template, b.per_template)


def test_same_weights_under_another_file_name_share_the_cache(encoder, tiny_model, tmp_path):
    import shutil

    copy = tmp_path / "renamed.safetensors"
    shutil.copy(tiny_model["safetensors"], copy)
    build_prototypes(encoder, CLASSES, TEMPLATES)
    renamed = ClipEncoder(tiny_model["config"], checkpoint=str(copy))
    assert build_prototypes(renamed, CLASSES, TEMPLATES).encoded == 0


def test_no_cache_writes_nothing(encoder):
    build_prototypes(encoder, CLASSES, TEMPLATES, use_cache=False)
    assert not cache_dir().exists() or not list(cache_dir().iterdir())


def test_corrupt_cache_is_rebuilt(encoder, caplog):
    build_prototypes(encoder, CLASSES, TEMPLATES)
    (path,) = cache_dir().glob("text-*.safetensors")
    path.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="svgen"):
        protos = build_prototypes(encoder, CLASSES, TEMPLATES)
    assert protos.encoded == 12 and "ignoring unreadable prompt cache" in caplog.text
    assert PromptCache(encoder.identity_key()).missing([t.replace("{}", "cat") for t in TEMPLATES]) == []


def test_too_long_prompts_warn_and_are_named(encoder, caplog):
    long_name = "extremely " * 80 + "long class"
    with caplog.at_level(logging.WARNING, logger="svgen"):
        build_prototypes(encoder, ["cat", long_name], ["a photo of a {}."], use_cache=False)
    assert "longer than the 77-token context" in caplog.text and "extremely extremely" in caplog.text
    assert "a photo of a cat." not in caplog.text


def test_prototypes_from_embeddings_shapes():
    emb = torch.randn(5, 8)
    per_template, mean = prototypes_from_embeddings(emb)
    assert per_template.shape == (5, 1, 8) and torch.allclose(mean, F.normalize(emb, dim=-1))
    per_template, mean = prototypes_from_embeddings(torch.randn(5, 3, 8) * 7)
    assert torch.allclose(per_template.norm(dim=-1), torch.ones(5, 3), atol=1e-5)
    assert torch.allclose(mean.norm(dim=-1), torch.ones(5), atol=1e-5)


# ----------------------------------------------------------------------------- through the CLI

@pytest.mark.parametrize("source", ["checkpoint", "local_dir"])
def test_cli_fit_from_local_weights_then_from_cache(cli, tiny_model, classes_file, tmp_path, monkeypatch, source):
    import json

    encoded = []
    real = ClipEncoder.encode_text

    def spy(self, prompts, *args, **kwargs):
        encoded.extend(prompts)
        return real(self, prompts, *args, **kwargs)

    monkeypatch.setattr(ClipEncoder, "encode_text", spy)
    weights = (["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]] if source == "checkpoint"
               else ["--model", tiny_model["local_dir"]])
    classes = classes_file(["cat", "dog", "bird"])
    common = ["fit", "--classes", classes, *weights, "--templates", "compact", "-K", "2", "--steps", "2",
              "--ridge", "0.01"]
    code, out, err = cli(*common, "--out", tmp_path / "a")
    assert code == 0, err
    meta = json.loads((tmp_path / "a" / "svgen.json").read_text())
    assert len(meta["encoder"]["checkpoint_sha256"]) == 64 and meta["encoder"]["embed_dim"] == tiny_model["dim"]
    from svgen.encoders.prompts import load_templates

    assert len(encoded) == 3 * len(load_templates("compact"))

    encoded.clear()
    code, _, err = cli(*common, "--out", tmp_path / "b")
    assert code == 0, err
    assert encoded == []  # every prompt came from the cache

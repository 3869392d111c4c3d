"""``svgen fit`` without ``--templates`` (issue 49, item 19): a built-in class list gets its own published prompt
ensemble (open_clip's 80 OpenAI templates for imagenet1k, CLIP_benchmark's CIFAR templates for the CIFARs), any other
list OpenAI's 7-template subset; the templates used are recorded in svgen.json and the rule is shown in ``--help``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from svgen.encoders.prompts import builtin_class_lists, builtin_templates, load_templates

ROOT = Path(__file__).resolve().parents[2]

# CLIP_benchmark, clip_benchmark/datasets/en_zeroshot_classification_templates.json: "cifar10" (and "cifar100", the
# same 18), "{c}" written as svgen's "{}". Typed here from that file, not read from svgen's copy.
CLIP_BENCHMARK_CIFAR = [
    "a photo of a {}.", "a blurry photo of a {}.", "a black and white photo of a {}.", "a low contrast photo of a {}.",
    "a high contrast photo of a {}.", "a bad photo of a {}.", "a good photo of a {}.", "a photo of a small {}.",
    "a photo of a big {}.", "a photo of the {}.", "a blurry photo of the {}.", "a black and white photo of the {}.",
    "a low contrast photo of the {}.", "a high contrast photo of the {}.", "a bad photo of the {}.",
    "a good photo of the {}.", "a photo of the small {}.", "a photo of the big {}.",
]


def _open_clip(name):
    from open_clip import zero_shot_metadata

    return [t("{}") for t in getattr(zero_shot_metadata, name)]


def _fit(cli, tiny_model, classes, out, *extra):
    code, _, err = cli("fit", "--classes", classes, "--model", tiny_model["config"], "--checkpoint",
                       tiny_model["safetensors"], *extra, "--out", out)
    assert code == 0, err
    return json.loads((Path(out) / "svgen.json").read_text())


def test_the_cifar_set_is_clip_benchmarks():
    assert load_templates("cifar") == CLIP_BENCHMARK_CIFAR


def test_every_builtin_class_list_names_a_builtin_ensemble():
    from svgen.encoders.prompts import CLASS_LIST_TEMPLATES, DEFAULT_TEMPLATES

    assert sorted(CLASS_LIST_TEMPLATES) == builtin_class_lists()  # a new list must choose its ensemble
    assert set(CLASS_LIST_TEMPLATES.values()) | {DEFAULT_TEMPLATES} <= set(builtin_templates())


@pytest.mark.parametrize("classes, expected", [
    ("cifar10", CLIP_BENCHMARK_CIFAR),
    ("imagenet1k", "OPENAI_IMAGENET_TEMPLATES"),
    ("own", "SIMPLE_IMAGENET_TEMPLATES"),
])
def test_fit_defaults_to_the_class_lists_own_ensemble_and_records_it(tmp_path, cli, tiny_model, classes_file,
                                                                      classes, expected):
    expected = _open_clip(expected) if isinstance(expected, str) else expected
    if classes == "own":
        classes = classes_file(["cat", "dog", "bird"])
    meta = _fit(cli, tiny_model, classes, tmp_path / "a.svgen")
    assert meta["templates"] == expected
    n_classes = len(meta["classes"])
    assert meta["metrics"]["runtime"]["prompts_encoded"] == n_classes * len(expected)


def test_a_file_named_like_a_builtin_list_is_a_users_list(tmp_path, cli, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("cifar10").write_text("cat\ndog\n", encoding="utf-8")  # read as the file, as read_class_names does
    meta = _fit(cli, tiny_model, "cifar10", tmp_path / "a.svgen")
    assert meta["classes"] == ["cat", "dog"] and meta["templates"] == _open_clip("SIMPLE_IMAGENET_TEMPLATES")


def test_named_templates_win_and_a_refit_reads_the_prompt_cache(tmp_path, cli, tiny_model):
    assert _fit(cli, tiny_model, "cifar10", tmp_path / "one.svgen", "--templates", "single")["templates"] == \
        ["a photo of a {}."]
    first = _fit(cli, tiny_model, "cifar10", tmp_path / "a.svgen")
    again = _fit(cli, tiny_model, "cifar10", tmp_path / "b.svgen")
    assert first["templates"] == again["templates"] == CLIP_BENCHMARK_CIFAR
    # the ensemble's prompt "a photo of a {}." was cached by the single-template fit
    assert first["metrics"]["runtime"]["prompts_encoded"] == 10 * 17
    assert again["metrics"]["runtime"]["prompts_encoded"] == 0


def test_help_and_docs_state_the_default(capsys):
    from svgen.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for rule in ("openai (80) for imagenet1k", "cifar (18) for cifar10 and cifar100",
                 "openai-simple (7) for your own list"):
        assert rule in text, rule
    for doc in ("README.md", "docs/usage.md"):
        words = " ".join((ROOT / doc).read_text(encoding="utf-8").split())
        assert "Without `--templates`" in words and "`openai-simple`" in words and "`cifar`" in words, doc

"""Class lists and templates: the shipped files, and one clear error for every bad input."""

from __future__ import annotations

import pytest

from svgen.errors import SvgenError
from svgen.encoders.prompts import (
    build_prompts,
    builtin_class_lists,
    builtin_templates,
    load_templates,
    read_classes,
    validate_classes,
)
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- shipped files

@pytest.mark.parametrize("name, count, first, last", [
    ("cifar10", 10, "airplane", "truck"),
    ("cifar100", 100, "apple", "worm"),
    ("imagenet1k", 1000, "tench", "toilet paper"),
])
def test_shipped_class_lists(name, count, first, last):
    classes = read_classes(ROOT / "prompts" / "classes" / f"{name}.txt")  # validates: no duplicates
    assert len(classes) == count
    assert (classes[0], classes[-1]) == (first, last)
    assert name in builtin_class_lists()


def test_cifar100_is_in_label_order():
    classes = read_classes(ROOT / "prompts" / "classes" / "cifar100.txt")
    assert classes == sorted(classes)  # CIFAR-100 fine labels are numbered alphabetically
    assert "aquarium fish" in classes and not any("_" in c for c in classes)


def test_imagenet_matches_open_clip_up_to_the_two_disambiguated_names():
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    ours = read_classes(ROOT / "prompts" / "classes" / "imagenet1k.txt")
    differ = [i for i, (a, b) in enumerate(zip(ours, IMAGENET_CLASSNAMES)) if a != b]
    assert differ == [744, 836]


def test_builtin_templates():
    assert builtin_templates() == ["cifar", "compact", "ensemble", "openai", "openai-simple", "single"]
    assert load_templates("single") == ["a photo of a {}."]
    compact, ensemble = load_templates("compact"), load_templates("ensemble")
    assert 4 <= len(compact) < len(ensemble)
    assert all(t.count("{}") == 1 for t in compact + ensemble)


def test_templates_from_a_file(tmp_path):
    f = tmp_path / "mine.txt"
    f.write_text("# my set\n\nart of the {}.\na {} in the wild.\n", encoding="utf-8")
    assert load_templates(str(f)) == ["art of the {}.", "a {} in the wild."]


def test_build_prompts_grid():
    assert build_prompts(["cat", "dog"], ["a {}.", "the {}!"]) == [["a cat.", "the cat!"], ["a dog.", "the dog!"]]


# ----------------------------------------------------------------------------- class-file format

def test_blank_lines_comments_and_bom_are_ignored(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes("\ufeff# header\n\n  cat  \n# comment\ndog\n\n".encode("utf-8"))
    assert read_classes(f) == ["cat", "dog"]


def test_non_ascii_names_are_fine(classes_file):
    assert read_classes(classes_file(["café", "naïve bayes", "猫"])) == ["café", "naïve bayes", "猫"]


# ----------------------------------------------------------------------------- bad inputs

def _one_line(message: str) -> str:
    assert "\n" not in message
    return message


@pytest.mark.parametrize("content, expected", [
    (b"", "empty"),
    (b"\n\n   \n", "empty"),
    (b"# only a comment\n", "empty"),
    (b"cat\n", "at least 2"),
])
def test_too_few_classes(tmp_path, content, expected):
    f = tmp_path / "c.txt"
    f.write_bytes(content)
    with pytest.raises(SvgenError, match=expected) as e:
        read_classes(f)
    _one_line(str(e.value))


def test_duplicates_are_listed(classes_file):
    with pytest.raises(SvgenError) as e:
        read_classes(classes_file(["cat", "dog", "cat", "bird", "dog", "fish"]))
    msg = _one_line(str(e.value))
    assert "2 duplicate" in msg and "'cat'" in msg and "'dog'" in msg and "'bird'" not in msg


def test_duplicates_after_stripping(classes_file):
    with pytest.raises(SvgenError, match="'cat'"):
        read_classes(classes_file(["cat", "  cat ", "dog"]))


def test_invalid_utf8_names_the_line(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes(b"cat\ndog\n# fine\ncaf\xe9\nbird\n")  # latin-1 'é' on line 4
    with pytest.raises(SvgenError, match=r"not valid UTF-8 at line 4") as e:
        read_classes(f)
    _one_line(str(e.value))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(SvgenError, match="not found"):
        read_classes(tmp_path / "nope.txt")
    with pytest.raises(SvgenError, match="directory"):
        read_classes(tmp_path)


def test_validate_classes_from_python():
    assert validate_classes(["a", "b"]) == ["a", "b"]
    with pytest.raises(SvgenError, match="empty class name"):
        validate_classes(["a", " ", "b"])
    with pytest.raises(SvgenError, match="empty"):
        validate_classes([])


@pytest.mark.parametrize("content, expected", [
    ("", "empty"),
    ("a photo of a cat.\n", r"exactly one '\{\}'"),
    ("a {} and a {}.\n", r"exactly one '\{\}'"),
    ("a {}.\na {}.\n", "more than once"),
])
def test_bad_template_files(tmp_path, content, expected):
    f = tmp_path / "t.txt"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(SvgenError, match=expected) as e:
        load_templates(str(f))
    _one_line(str(e.value))


def test_unknown_template_name_lists_the_builtins():
    with pytest.raises(SvgenError, match="compact, ensemble, openai, openai-simple, single"):
        load_templates("no-such-set")


# ----------------------------------------------------------------------------- through the CLI

@pytest.mark.parametrize("content, expected", [
    (b"", "empty"),
    (b"cat\n", "at least 2"),
    (b"cat\ndog\ncat\n", "'cat'"),
    (b"cat\n\xff\xfe\n", "line 2"),
])
def test_cli_rejects_bad_class_files_in_one_line(cli, tmp_path, content, expected):
    f = tmp_path / "c.txt"
    f.write_bytes(content)
    # --strict: repeated names are refused before anything loads (by default they fit, with a warning)
    code, out, err = cli("fit", "--classes", f, "--strict", "--out", tmp_path / "art")
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in err
    assert not (tmp_path / "art").exists()


def test_cli_rejects_bad_templates(cli, tmp_path, classes_file):
    code, _, err = cli("fit", "--classes", classes_file(["cat", "dog"]), "--templates", "nope",
                       "--out", tmp_path / "art")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "unknown templates" in err

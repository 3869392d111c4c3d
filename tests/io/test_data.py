"""svgen.io.data: labels.csv and ImageFolder layouts matched to an artifact's class names."""

import pytest

from svgen.io.data import labelled_images
from svgen.errors import SvgenError

CLASSES = ["brown bear", "dog", "kitten"]


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_labels_csv_with_and_without_header(tmp_path):
    for name in ("a.jpg", "b.jpg", "sub/c.png"):
        touch(tmp_path / name)
    (tmp_path / "labels.csv").write_text("a.jpg,dog\nb.jpg,brown_bear\n\nsub/c.png, kitten\n")
    d = labelled_images(tmp_path, CLASSES)
    assert d.layout == "labels.csv"
    assert [p.split("/")[-1] for p in d.paths] == ["a.jpg", "b.jpg", "c.png"] and d.labels == [1, 0, 2]
    (tmp_path / "labels.csv").write_text("file,class\na.jpg,dog\n")
    assert labelled_images(tmp_path, CLASSES).labels == [1]


@pytest.mark.parametrize("text, msg", [
    ("a.jpg,dog,extra\n", "line 1: expected 'file,class'"),
    ("a.jpg\n", "expected 'file,class'"),
    ("missing.jpg,dog\n", "line 1 names 'missing.jpg', which is not a file"),
    ("a.jpg,zebra\na.jpg,okapi\n", "2 class(es) the artifact does not have: 'zebra', 'okapi'"),
    ("# only a comment\n", "lists no images"),
])
def test_bad_labels_csv(tmp_path, text, msg):
    touch(tmp_path / "a.jpg")
    (tmp_path / "labels.csv").write_text(text)
    with pytest.raises(SvgenError) as e:
        labelled_images(tmp_path, CLASSES)
    assert msg in str(e.value)


def test_image_folder(tmp_path):
    touch(tmp_path / "dog" / "1.jpg")
    touch(tmp_path / "dog" / "deeper" / "2.JPG")
    touch(tmp_path / "dog" / "readme.txt")
    touch(tmp_path / "brown_bear" / "3.png")
    d = labelled_images(tmp_path, CLASSES)
    assert d.layout == "imagefolder"
    assert sorted(zip([p.split("/")[-1] for p in d.paths], d.labels)) == [("1.jpg", 1), ("2.JPG", 1), ("3.png", 0)]


def test_image_folder_errors(tmp_path):
    with pytest.raises(SvgenError, match="is empty"):
        labelled_images(tmp_path, CLASSES)
    touch(tmp_path / "loose.jpg")
    with pytest.raises(SvgenError, match="no class sub-folders"):
        labelled_images(tmp_path, CLASSES)
    (tmp_path / "dog").mkdir()
    with pytest.raises(SvgenError, match="no images found"):
        labelled_images(tmp_path, CLASSES)
    touch(tmp_path / "zebra" / "z.jpg")
    with pytest.raises(SvgenError, match="'zebra'"):
        labelled_images(tmp_path, CLASSES)
    with pytest.raises(SvgenError, match="no such folder"):
        labelled_images(tmp_path / "nope", CLASSES)
    with pytest.raises(SvgenError, match="must be a folder"):
        labelled_images(tmp_path / "loose.jpg", CLASSES)

"""Class lists and prompt templates.

``classes.txt`` holds one class name per line (UTF-8); blank lines and lines starting with
``#`` are ignored. A template file holds one template per line, each containing ``{}`` where
the class name goes. Built-in templates live in ``prompts/templates/NAME.txt`` and are
selected by ``NAME`` (``single``, ``compact``, ``ensemble``, OpenAI's ImageNet sets as open_clip
ships them in ``open_clip/zero_shot_metadata.py``: ``openai``, the 80 ``OPENAI_IMAGENET_TEMPLATES``, and
``openai-simple``, the 7 ``SIMPLE_IMAGENET_TEMPLATES``, and ``cifar``, the CLIP paper's 18 CIFAR templates as
CLIP_benchmark ships them); built-in class lists likewise (``prompts/classes/NAME.txt``: ``cifar10``,
``cifar100``, ``imagenet1k``).

Without ``--templates`` a fit uses :func:`default_templates`: a built-in class list's own published
ensemble, the 7 ``openai-simple`` templates for any other list.
"""

from __future__ import annotations

import logging
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import List, Sequence

from svgen.errors import SvgenError

log = logging.getLogger(__name__)

# The templates a text fit uses unless told otherwise (the one place this rule lives): a built-in class list gets
# the ensemble its published zero-shot numbers use (open_clip's ImageNet classifier, CLIP_benchmark's CIFARs), and
# any other list OpenAI's 7-template subset of their ImageNet set (general framings, tied to no data set).
CLASS_LIST_TEMPLATES = {"cifar10": "cifar", "cifar100": "cifar", "imagenet1k": "openai"}
DEFAULT_TEMPLATES = "openai-simple"


def _read_lines(path, what: str) -> List[str]:
    """Read a UTF-8 text file into stripped, non-blank, non-comment lines."""
    from svgen.safeio import MAX_TEXT_BYTES, read_regular

    path = Path(path)
    if path.is_dir():
        raise SvgenError(f"{what} file is a directory, expected a text file: {path}")
    raw = read_regular(path, MAX_TEXT_BYTES, what=f"{what} file")  # a FIFO or /dev/zero: one line, no hang
    lines = []
    for number, line in enumerate(raw.splitlines(), start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise SvgenError(f"{what} file {path} is not valid UTF-8 at line {number}") from None
        text = text.strip().lstrip("\ufeff").strip()
        if text and not text.startswith("#"):
            lines.append(text)
    return lines


def validate_classes(classes: Sequence[str], source: str = "class list", duplicates: str = "error") -> List[str]:
    """Check a list of class names: at least two, no empty names; repeated names are refused
    (``duplicates="error"``) or let through (``"allow"``: the caller decides, as
    :meth:`svgen.SVGClassifier.fit` does — published vocabularies such as OpenAI's ImageNet list
    repeat a few names)."""
    classes = [str(c).strip() for c in classes]
    if any(not c for c in classes):
        raise SvgenError(f"{source} contains an empty class name")
    if len(classes) == 0:
        raise SvgenError(f"{source} is empty: expected one class name per line")
    if len(classes) < 2:
        raise SvgenError(f"{source} has only {len(classes)} class ({classes[0]!r}): a classifier needs at least 2")
    dupes = duplicate_names(classes)
    if dupes and duplicates == "error":
        shown = ", ".join(repr(d) for d in dupes[:10]) + (" ..." if len(dupes) > 10 else "")
        raise SvgenError(f"{source} has {len(dupes)} duplicate class name(s): {shown}")
    return classes


def read_class_names(name_or_path) -> List[str]:
    """The lines of a class file, or of a built-in list by name (``cifar10``, ``cifar100``, ``imagenet1k``).

    A file that exists wins over a built-in name; anything else is one line naming both options.
    """
    name_or_path = str(name_or_path)
    if Path(name_or_path).exists():
        return _read_lines(name_or_path, "classes")
    builtin = _builtin_dir("classes") / f"{name_or_path}.txt"
    if builtin.is_file():
        return _read_lines(builtin, "classes")
    raise SvgenError(f"classes file not found: {name_or_path} (built-in class lists: "
                     f"{', '.join(builtin_class_lists())})")


def validate_new_classes(new: Sequence[str], existing: Sequence[str], source: str = "new class list") -> List[str]:
    """Check class names to add to ``existing`` ones: none empty, none repeated among themselves, none
    already there. Names ``existing`` itself repeats (a fitted vocabulary may) are left alone."""
    new = [str(c).strip() for c in new]
    if not new:
        raise SvgenError(f"{source} is empty: expected one class name per line")
    if any(not c for c in new):
        raise SvgenError(f"{source} contains an empty class name")
    dupes = duplicate_names(new)
    if dupes:
        shown = ", ".join(repr(d) for d in dupes[:10]) + (" ..." if len(dupes) > 10 else "")
        raise SvgenError(f"{source} has {len(dupes)} duplicate class name(s): {shown}")
    clash = [c for c in new if c in set(existing)]
    if clash:
        raise SvgenError(f"class(es) already in the artifact: {', '.join(map(repr, clash[:10]))}"
                         + (" …" if len(clash) > 10 else ""))
    return new


def duplicate_names(classes: Sequence[str]) -> List[str]:
    """The names that occur more than once in ``classes``, in order of first appearance."""
    return [name for name, n in Counter(classes).items() if n > 1]


def read_classes(path, duplicates: str = "error") -> List[str]:
    """Read and validate a class file or built-in list (see module docstring for the format)."""
    return validate_classes(read_class_names(path), source=f"classes file {path}", duplicates=duplicates)


def _builtin_dir(kind: str):
    return resources.files("svgen._prompts") / kind


def builtin_templates() -> List[str]:
    """Names of the template sets shipped with svgen."""
    return sorted(p.name[:-4] for p in _builtin_dir("templates").iterdir() if p.name.endswith(".txt"))


def builtin_template_sizes() -> str:
    """``'compact (8), ensemble (43), …'``: every built-in template set with its number of templates."""
    return ", ".join(f"{name} ({len(load_templates(name))})" for name in builtin_templates())


def builtin_class_lists() -> List[str]:
    """Names of the class lists shipped with svgen (``prompts/classes/NAME.txt``)."""
    return sorted(p.name[:-4] for p in _builtin_dir("classes").iterdir() if p.name.endswith(".txt"))


def default_templates(classes) -> str:
    """The built-in template set a fit of ``classes`` (a ``--classes`` value: a file or a built-in list's name)
    uses when no templates are named: the list's own ensemble (:data:`CLASS_LIST_TEMPLATES`) for a built-in
    list, else :data:`DEFAULT_TEMPLATES`. A file that exists is a user's list even when named like a built-in
    one, as :func:`read_class_names` reads it."""
    name = str(classes)
    if name in CLASS_LIST_TEMPLATES and not Path(name).exists():
        return CLASS_LIST_TEMPLATES[name]
    return DEFAULT_TEMPLATES


def default_templates_help() -> str:
    """``'openai (80) for imagenet1k, … ; openai-simple (7) for your own list'``: the rule, for ``--help``."""
    by_set = {}
    for lst, name in CLASS_LIST_TEMPLATES.items():
        by_set.setdefault(name, []).append(lst)
    size = {name: len(load_templates(name)) for name in [*by_set, DEFAULT_TEMPLATES]}
    return (", ".join(f"{name} ({size[name]}) for {' and '.join(lists)}" for name, lists in by_set.items())
            + f", {DEFAULT_TEMPLATES} ({size[DEFAULT_TEMPLATES]}) for your own list")


def load_templates(name_or_path: str) -> List[str]:
    """Templates from a built-in set name or a file path; each must contain exactly one ``{}``."""
    name_or_path = str(name_or_path)
    builtin = _builtin_dir("templates") / f"{name_or_path}.txt"
    if builtin.is_file():
        lines = _read_lines(builtin, "templates")
        source = f"built-in template set {name_or_path!r}"
    elif Path(name_or_path).is_file():
        lines = _read_lines(name_or_path, "templates")
        source = f"templates file {name_or_path}"
    else:
        raise SvgenError(
            f"unknown templates {name_or_path!r}: not a file, and not one of the built-in sets "
            f"({', '.join(builtin_templates())})"
        )
    if not lines:
        raise SvgenError(f"{source} is empty: expected one template per line containing '{{}}'")
    bad = [t for t in lines if t.count("{}") != 1]
    if bad:
        raise SvgenError(f"{source}: each template needs exactly one '{{}}' for the class name; got {bad[0]!r}")
    if len(set(lines)) != len(lines):
        raise SvgenError(f"{source} lists the same template more than once")
    return lines


def build_prompts(classes: Sequence[str], templates: Sequence[str]) -> List[List[str]]:
    """The C×T grid of prompts: ``prompts[c][t] = templates[t].format(classes[c])``."""
    return [[t.replace("{}", c) for t in templates] for c in classes]

"""The package layout holds (issue 25): no import cycles, modules and classes of readable size, the library never
reaching into the command line, and one definition of the helpers that were once written several times."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SVGEN = Path(__file__).resolve().parent.parent / "svgen"
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 300


def modules() -> dict:
    """{dotted name: path} of every module in the package."""
    out = {}
    for p in SVGEN.rglob("*.py"):
        parts = list(p.relative_to(SVGEN.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> dict:
    """{module: set of svgen modules it imports}, function-level imports included (a cycle through one is still a
    cycle: it only fails later, at the call)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                edges.update(subs if len(subs) == len(node.names) else [base, *subs])
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
        graph[name] = {e for e in edges if e in mods and e != name}
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_library_never_imports_the_command_line():
    graph = import_graph()
    library = {m for m in graph if not (m.startswith("svgen.commands") or m in ("svgen.cli", "svgen.__main__"))}
    offenders = {m: sorted(e for e in graph[m] if e.startswith("svgen.commands") or e == "svgen.cli") for m in library}
    assert {m: e for m, e in offenders.items() if e} == {}


# The layers, bottom-up (docs/architecture.md): each package or top-level module of svgen and the ones directly below
# it that it may import (and, through them, everything below those). The package root (``svgen/__init__.py``: the
# finder of moved modules, the lazy ``SVGClassifier``) stands outside the layers.
LAYERS = {
    "errors": [],
    "config": ["errors"],
    "filekind": [],                              # what kind of file a path is, from stat alone (nothing opened)
    "reading": ["errors", "filekind"],           # bounded reads of the files svgen is given
    "safeio": ["reading", "filekind"],           # atomic writes, what force may replace, for every layer that writes
    "locks": ["safeio"],                         # one writer at a time of an artifact (load to replace)
    "npy": ["errors"],                           # every .npy read: header checked first, native byte order
    "steps": ["errors"],                         # a log line with its duration for each long step (svgen -v)
    "adapt.config": ["config"],                  # AdaptConfig: the settings of every adaptive choice
    "adapt.solvers": ["core"],                   # closed forms of the heads' fits and held-out scores, no decisions
    "core": ["config", "steps"],                       # the kernel machine's math: kernels, generator, ridge solves, roots
    "state": ["core"],                           # the fitted state as plain objects
    "records": ["state"],                        # svgen.json's adaptation records, rendered from typed decisions
    "heads": ["adapt.config", "state"],          # scores and probabilities of the heads, text temperatures
    "encoders": ["core", "safeio"],              # data in: images and text to embeddings
    "validation": ["encoders", "npy"],           # user arrays and class names, checked at the boundary
    "zeroshot": ["heads", "validation"],         # the stages
    "adapt": ["zeroshot", "adapt.solvers", "records"],      # shots, pools, temperatures: the evidence and the choices
    "io": ["adapt", "encoders", "locks"],   # the files: the codec knows every stage's state
    "engine": ["heads", "encoders", "npy"],            # results out, in blocks
    "evaluation": ["adapt", "validation"],
    "estimator": ["evaluation"],
    "fitted": ["estimator"],
    "classifier": ["io", "fitted"],
    "commands": ["classifier", "engine"],
    "cli": ["commands"],
    "__main__": ["cli"],                         # python -m svgen
}


def layer(module: str) -> str:
    """The entry of :data:`LAYERS` a module belongs to (``svgen.io.codec`` → ``io``); ``svgen`` for the root."""
    parts = module.split(".")
    if parts[1:3] in (["adapt", "config"], ["adapt", "solvers"]):   # sub-layers: the settings, below the heads that
        return ".".join(parts[1:3])                                 # read them; the solvers, on the core alone
    return parts[1] if len(parts) > 1 else module


def below(name: str) -> set:
    """Every layer ``name`` may import: those :data:`LAYERS` lists for it, and theirs, down to ``errors``."""
    out, todo = set(), list(LAYERS[name])
    while todo:
        lower = todo.pop()
        if lower not in out:
            out.add(lower)
            todo.extend(LAYERS[lower])
    return out


def test_the_layers_form_a_dag_and_name_every_package():
    assert all(name not in below(name) for name in LAYERS)
    assert {layer(m) for m in modules()} - {"svgen"} == set(LAYERS)


def test_no_import_points_up_the_layers():
    """A module imports its own layer and the layers below it (:data:`LAYERS`), never one above or beside it."""
    upward = sorted(f"{m} -> {e}" for m, edges in import_graph().items() if layer(m) != "svgen"
                    for e in edges if e != "svgen" and layer(e) != layer(m) and layer(e) not in below(layer(m)))
    assert upward == []


def test_the_layers_check_finds_an_upward_import():
    assert "core" in below("heads") and "heads" not in below("core")
    assert "io" not in below("encoders") and "adapt" not in below("heads")


def test_no_private_name_is_imported_from_another_module():
    """A ``_name`` is its module's own: another module that needs it gets a public name (or the helper moves)."""
    found = []
    for path in SVGEN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("svgen") or (
                    isinstance(node, ast.ImportFrom) and node.level):
                found += [f"{path.relative_to(SVGEN)}: {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


@pytest.mark.parametrize("path", sorted(SVGEN.rglob("*.py")), ids=lambda p: str(p.relative_to(SVGEN.parent)))
def test_modules_and_classes_are_of_readable_size(path):
    lines = path.read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.name}: {lines} lines"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_CLASS_LINES, f"{path.name}: class {node.name} has {size} lines"


@pytest.mark.parametrize("pattern, home", [
    (r"^CLIP_LOGIT_SCALE\s*=|^COSINE_LOGIT_SCALE\s*=|LOGIT_SCALE\s*=\s*100", "heads/scoring.py"),
    (r"^def (follow_umask|atomic_file|atomic_dir|atomic_text)\b", "safeio.py"),
    (r"^def bisect\b", "core/roots.py"),
])
def test_each_shared_helper_is_defined_once(pattern, home):
    where = [str(p.relative_to(SVGEN)) for p in SVGEN.rglob("*.py")
             if any(re.search(pattern, line) for line in p.read_text().splitlines())]
    assert where == [home], where


def test_no_hand_written_renames_outside_safeio():
    """Files reach disk through svgen.safeio (atomic, never losing what exists), not os.replace/os.rename."""
    where = [str(p.relative_to(SVGEN)) for p in SVGEN.rglob("*.py")
             if re.search(r"\bos\.(replace|rename)\(", p.read_text()) and p.name != "safeio.py"]
    assert where == []


def test_the_adaptation_lives_in_one_package():
    """Issue 47: the shots, pools, temperatures and choices are all in ``svgen.adapt``; the old packages are gone (no
    import hook keeps their names alive) and the packages that took a module's name still answer its attributes."""
    import importlib

    for old in ("svgen.fewshot", "svgen.transductive", "svgen.calibration", "svgen.selection", "svgen.heads.heldout"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    from svgen.encoders import ClipEncoder
    from svgen.encoders.clip import ClipEncoder as there

    assert ClipEncoder is there
    with pytest.raises(AttributeError):
        importlib.import_module("svgen.heads").no_such_name


def test_library_errors_name_python_settings_and_the_cli_prints_its_flags(cli, tmp_path):
    """A setting out of range reads as the parameter to a Python caller and as the flag on the command line."""
    import numpy as np

    from svgen import SVGClassifier
    from svgen.errors import SvgenError

    with pytest.raises(SvgenError) as e:
        SVGClassifier(seed=-1).fit(np.eye(3, 8, dtype=np.float32))
    assert str(e.value).startswith("seed must be in 0..") and e.value.cli_message.startswith("--seed must be in 0..")
    np.save(tmp_path / "p.npy", np.eye(3, 8, dtype=np.float32))
    (tmp_path / "c.txt").write_text("a\nb\nc\n")
    code, out, err = cli("fit", "--prototypes", tmp_path / "p.npy", "--classes", tmp_path / "c.txt", "--seed", "-1",
                         "--out", tmp_path / "x.svgen")
    assert code == 2 and err.strip().endswith(e.value.cli_message) and "error: --seed must be in 0.." in err


def test_library_errors_name_flags_only_in_their_cli_wording():
    """Outside ``commands/`` and ``cli.py`` an error's message speaks Python (``seed``, ``force=True``); a command-line
    flag (``--seed``) may appear only in the ``cli=`` wording the CLI prints."""
    offenders = []
    for path in SVGEN.rglob("*.py"):
        if "commands" in path.parts or path.name == "cli.py":
            continue
        src = path.read_text()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in ("SvgenError", "EncoderUnavailableError", "setting_error") and node.args:
                first = ast.get_source_segment(src, node.args[0]) or ""
                if re.search(r"--[a-z]", first) and not any(k.arg == "cli" for k in node.keywords):
                    offenders.append(f"{path.relative_to(SVGEN)}:{node.lineno}")
    assert offenders == []


def test_every_package_is_installed():
    """pyproject.toml lists its packages by hand: a new one left out would be missing from a non-editable install."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+

    listed = set(tomllib.loads((SVGEN.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    present = {".".join(p.parent.relative_to(SVGEN.parent).parts) for p in SVGEN.rglob("__init__.py")}
    assert present - listed == set()

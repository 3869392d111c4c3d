"""Regression tests for issue 49, items 1 to 4 and the ``save()`` part of 14: things that are not svgen's.

``--force`` replaced a device node, a FIFO or a symbolic link (``/dev/stdout``) with a regular file; two concurrent
``add-classes`` both said ``wrote`` and one update was lost; ``svgen.json`` and ``weights.safetensors`` inside an
artifact were followed when they were links; ``eval --out r.png --plot r.png`` wrote the PNG, then failed; and
``SVGClassifier.save()`` wrote into another artifact's folder.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from svgen import SVGClassifier
from svgen.errors import SvgenError

from conftest import ROOT, file_tree as tree, one_line, small_input_fixtures

C, D = 5, 16
NAMES = [f"class {i}" for i in range(C)]

files, work = small_input_fixtures(NAMES, D, "i49")   # the inputs, and a private copy the test runs in

EVAL = ("eval", "a.svgen", "--features", "F.npy", "--labels", "y.npy")


# ----------------------------------------------------------------------------- 1. --force replaces only svgen's files

def _make(kind: str, path: Path) -> None:
    """Something at ``path`` that is not a regular file svgen could have written."""
    if kind == "link to a file":
        (path.parent / "victim.txt").write_text("the user's own\n")
        os.symlink("victim.txt", path)
    elif kind == "link to /dev/null":   # as /dev/stdout is a link: the link is what --force replaced
        os.symlink(os.devnull, path)
    elif kind == "dangling link":
        os.symlink("nowhere.txt", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()


def _kind(path: Path) -> tuple:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), (os.readlink(path) if stat.S_ISLNK(st.st_mode) else None)


WRITERS = {
    "eval --out": (*EVAL, "--out", "T"),
    "eval --plot": (*EVAL, "--plot", "T"),
    "classify --out": ("classify", "a.svgen", "--features", "F.npy", "--out", "T"),
    "export --out": ("export", "a.svgen", "--format", "npz", "--out", "T"),
    "diagnose --plot": ("diagnose", "a.svgen", "--plot", "T"),
}
KINDS = ("link to a file", "link to /dev/null", "dangling link", "fifo", "socket")


@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_force_replaces_no_link_device_fifo_or_socket(cli, work, writer, kind, force):
    """`eval … --out /dev/stdout --force` replaced the link with a file (nothing reached stdout); a FIFO, a socket or
    any link was replaced the same way. Only a regular file is replaced: anything else is one line, left as it
    was, and nothing else is written."""
    suffix = ".png" if "plot" in writer else ".npz" if "export" in writer else ".csv"
    target = work / f"target{suffix}"
    _make(kind, target)
    before, what = tree(work), _kind(target)
    argv = [a if a != "T" else target.name for a in WRITERS[writer]] + (["--force"] if force else [])
    code, out, err = cli(*argv)
    line = one_line(code, err)
    assert ("symbolic link" in line if "link" in kind else "not a regular file" in line), line
    assert "--force replaces only a regular file" in line, line
    assert out == "" and _kind(target) == what and tree(work) == before


def test_force_still_replaces_a_regular_file(cli, work):
    (work / "e.txt").write_text("old\n")
    code, out, err = cli(*EVAL, "--out", "e.txt", "--force")
    assert code == 0, err
    assert "acc1" in (work / "e.txt").read_text()


def test_the_library_refuses_to_replace_a_link_with_force(work):
    from svgen.safeio import atomic_text

    os.symlink(os.devnull, work / "out.txt")
    with pytest.raises(SvgenError, match="symbolic link; force=True replaces only a regular file"):
        atomic_text(work / "out.txt", "x\n", force=True)
    assert os.readlink(work / "out.txt") == os.devnull


def test_ray_force_does_not_start_over_through_a_link(work):
    from svgen.engine.ray import check_output

    (work / "real").mkdir()
    os.symlink("real", work / "link")
    with pytest.raises(SvgenError, match="symbolic link"):
        check_output(work / "link", {"blocks": 1}, force=True)


def test_out_dash_is_stdout_for_eval_and_classify(cli, work):
    """`--out -` says "stdout" (instead of --out /dev/stdout, which is a link): the table or rows are printed, and
    no file named '-' appears."""
    code, table, err = cli(*EVAL)
    assert code == 0, err
    code, out, err = cli(*EVAL, "--out", "-")
    assert code == 0 and out == table and "acc1" in out, err
    code, rows, _ = cli("classify", "a.svgen", "--features", "F.npy")
    code, out, err = cli("classify", "a.svgen", "--features", "F.npy", "--out", "-", "--format", "jsonl")
    assert code == 0 and len(out.splitlines()) == 12 and out.startswith("{"), err
    assert cli("classify", "a.svgen", "--features", "F.npy", "--out", "-")[1] == rows
    assert not (work / "-").exists()


@pytest.mark.parametrize("argv", [
    ("export", "a.svgen", "--out", "-"),
    ("fit", "--prototypes", "P.npy", "--classes", "classes.txt", "--out", "-"),
    ("eval", "a.svgen", "--features", "F.npy", "--labels", "y.npy", "--plot", "-"),
], ids=["export", "fit", "eval --plot"])
def test_out_dash_elsewhere_is_one_line_not_a_file_named_dash(cli, work, argv):
    line = one_line(*cli(*argv)[::2])
    assert "- (stdout) is not available" in line
    assert not (work / "-").exists()


def test_help_says_out_dash_is_stdout():
    from svgen.cli import build_parser

    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "eval" in a.choices)
    for command in ("eval", "classify"):
        assert "'-' is stdout" in " ".join(sub.choices[command].format_help().split())


# ----------------------------------------------------------------------------- 2. no update is lost

WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from svgen import SVGClassifier
    from svgen.cli import main

    folder, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    original = SVGClassifier.add_classes

    def slow(self, *a, **k):   # the window between the load and the save, widened: both runs are inside it at once
        time.sleep(1.5)
        return original(self, *a, **k)

    SVGClassifier.add_classes = slow
    (folder / f"ready-{me}").touch()
    while not (folder / f"ready-{other}").exists():   # start together
        time.sleep(0.01)
    sys.exit(main(["-q", "add-classes", str(folder / "a.svgen"), "--classes", str(folder / f"{me}.txt"),
                   "--prototypes", str(folder / f"{me}.npy")]))
""")


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1"}


def test_two_concurrent_add_classes_lose_no_update(work):
    """Two `add-classes` on one artifact at once both said `wrote a: 5 → 7 classes` and the result had 7 classes:
    the first run's 2 were gone. Two real processes, both inside the load-to-save window at once: the second waits
    for the first's lock, then adds to what the first wrote, so all 9 classes are there and no lock file is left."""
    rng = np.random.default_rng(49)
    for me in ("p", "q"):
        (work / f"{me}.txt").write_text(f"{me} one\n{me} two\n")
        np.save(work / f"{me}.npy", rng.normal(size=(2, 3, D)).astype(np.float32))
    (work / "worker.py").write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(work / "worker.py"), str(work), me, other], env=_env(),
                              stderr=subprocess.PIPE, text=True)
             for me, other in (("p", "q"), ("q", "p"))]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    classes = list(SVGClassifier.load(work / "a.svgen").classes_)
    assert sorted(classes) == sorted(NAMES + ["p one", "p two", "q one", "q two"]), classes
    assert classes[:C] == NAMES
    assert not [n for n in os.listdir(work) if n.startswith(".a.svgen")]


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from svgen.locks import artifact_lock

    folder = Path(sys.argv[1])
    with artifact_lock(folder / "a.svgen"):
        (folder / "held").touch()
        time.sleep(1.0)
        (folder / "released").touch()   # the last thing done under the lock
""")


def test_fit_force_onto_an_artifact_waits_for_its_writer(cli, work):
    """`fit --force` onto an artifact another process is updating replaces it only once that writer is done (it
    would otherwise replace the artifact under the writer, whose save would then undo the fit)."""
    (work / "holder.py").write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, str(work / "holder.py"), str(work)], env=_env(),
                              stderr=subprocess.PIPE, text=True)
    try:
        while not (work / "held").exists():
            assert holder.poll() is None, holder.stderr.read()
        code, out, err = cli("fit", "--prototypes", "P.npy", "--classes", "classes.txt", "-K", "3", "--steps", "3",
                             "--out", "a.svgen", "--force")
        assert code == 0, err
        assert (work / "released").exists()   # the fit's save came after the holder let go
    finally:
        holder.wait(timeout=120)
    assert holder.returncode == 0
    assert SVGClassifier.load(work / "a.svgen").n_support == 3
    assert not (work / ".a.svgen.lock").exists()


def test_a_lock_file_left_by_a_killed_writer_breaks_nothing(cli, work):
    """A writer killed with -9 leaves its lock file (its flock goes with it): the next writer takes it, and
    removes it."""
    (work / ".a.svgen.lock").write_text("")
    code, out, err = cli("add-classes", "a.svgen", "--classes", "new.txt", "--prototypes", "P2.npy")
    assert code == 0, err
    assert len(SVGClassifier.load(work / "a.svgen").classes_) == C + 2
    assert not (work / ".a.svgen.lock").exists()


def test_without_fcntl_a_second_writer_is_refused_in_one_line(cli, work, monkeypatch):
    """Where fcntl is missing, the lock is a file created exclusively with its writer's process id: while that
    process runs a second writer is one line and changes nothing; once it has ended its file is taken over."""
    import svgen.locks as locks

    monkeypatch.setattr(locks, "fcntl", None)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (work / ".a.svgen.lock").write_text(f"{writer.pid}\n")
        before = tree(work)
        line = one_line(*cli("add-classes", "a.svgen", "--classes", "new.txt", "--prototypes", "P2.npy")[::2])
        assert "being written by another svgen process" in line and str(writer.pid) in line
        assert tree(work) == before
    finally:
        writer.kill()
        writer.wait()
    from svgen import safeio

    held, write = [], safeio.atomic_dir

    def checked(*a, **k):   # the write itself (its tidying up of leftovers first) leaves this run's lock alone
        out = write(*a, **k)
        held.append((work / ".a.svgen.lock").read_text())
        return out

    monkeypatch.setattr(safeio, "atomic_dir", checked)
    code, out, err = cli("add-classes", "a.svgen", "--classes", "new.txt", "--prototypes", "P2.npy")
    assert code == 0, err
    assert held == [f"{os.getpid()}\n"]
    assert len(SVGClassifier.load(work / "a.svgen").classes_) == C + 2
    assert not (work / ".a.svgen.lock").exists()


def test_the_lock_is_taken_again_by_its_own_thread(work):
    """add-classes holds the lock from its load and its save takes it again: no wait on itself."""
    from svgen.locks import artifact_lock

    clf = SVGClassifier.load(work / "a.svgen")
    with artifact_lock(work / "a.svgen") as lock:
        assert lock.exists()
        clf.save(work / "a.svgen", force=True)
        assert lock.exists()
    assert not lock.exists()


# ----------------------------------------------------------------------------- 3. no link inside an artifact

@pytest.mark.parametrize("member", ["svgen.json", "weights.safetensors"])
def test_a_link_inside_an_artifact_is_not_followed(cli, work, member):
    """`svgen.json` linked to any file, or `weights.safetensors` to another artifact's, was read through the link.
    Both are refused by the library and every command, in one line."""
    shutil.copytree(work / "a.svgen", work / "other.svgen")
    (work / "a.svgen" / member).unlink()
    os.symlink(work / "other.svgen" / member, work / "a.svgen" / member)
    with pytest.raises(SvgenError, match="symbolic link"):
        SVGClassifier.load(work / "a.svgen")
    for argv in (("classify", "a.svgen", "--features", "F.npy"), EVAL, ("diagnose", "a.svgen"),
                 ("export", "a.svgen", "--out", "h.npz"),
                 ("add-classes", "a.svgen", "--classes", "new.txt", "--prototypes", "P2.npy")):
        code, out, err = cli(*argv)
        assert "symbolic link" in one_line(code, err) and member in err, argv
    assert SVGClassifier.load(work / "other.svgen").classes_.tolist() == NAMES


# ----------------------------------------------------------------------------- 4. outputs that coincide

@pytest.mark.parametrize("out, plot", [
    ("r.png", "r.png"),
    ("r.png", "sub/../r.png"),
    ("link.png", "r.png"),
    ("hard.png", "r.png"),
    ("res", "res/r.png"),
], ids=["same name", "a detour", "a link", "a hard link", "one inside the other"])
def test_outputs_that_coincide_are_refused_before_anything_is_written(cli, work, out, plot):
    """`eval --out r.png --plot r.png` wrote the PNG, then failed on the table. Two outputs that are one file (by
    name, a detour, a link or a hard link) or where one would hold the other are one line, and nothing is written."""
    (work / "sub").mkdir()
    (work / "r.png").write_bytes(b"old")
    os.symlink("r.png", work / "link.png")
    os.link(work / "r.png", work / "hard.png")
    before = tree(work)
    line = one_line(*cli(*EVAL, "--out", out, "--plot", plot, "--force")[::2])
    assert "same file" in line or "holds" in line, line
    assert tree(work) == before


def test_the_confusions_heat_map_is_an_output_too(cli, work):
    """`eval --confusions --plot r.png` also writes r_confusions.png: an --out of that name coincides with it."""
    before = tree(work)
    line = one_line(*cli(*EVAL, "--confusions", "--plot", "r.png", "--out", "r_confusions.png")[::2])
    assert "--out r_confusions.png and --plot's heat map" in line and "same file" in line, line
    assert tree(work) == before


# ----------------------------------------------------------------------------- 14. save() into an artifact

def test_save_never_writes_inside_an_artifact(work):
    """`clf.save("a.svgen/b.svgen")` wrote a folder into artifact a.svgen. Like the CLI's --out (with or without
    --force), the library refuses it: force replaces a target, it never writes into an artifact."""
    clf = SVGClassifier.load(work / "a.svgen")
    before = tree(work)
    for force in (False, True):
        with pytest.raises(SvgenError, match="inside the svgen artifact"):
            clf.save(work / "a.svgen" / "b.svgen", force=force)
        with pytest.raises(SvgenError, match="inside the svgen artifact"):
            from svgen.safeio import atomic_text

            atomic_text(work / "a.svgen" / "notes.txt", "x", force=force)
    with pytest.raises(SvgenError, match="already exists; pass force=True"):
        clf.save(work / "a.svgen")
    assert tree(work) == before
    clf.save(work / "a.svgen", force=True)   # replacing the artifact itself is what force is for
    assert SVGClassifier.load(work / "a.svgen").classes_.tolist() == NAMES

#!/usr/bin/env python
"""Run the README's (and docs/usage.md's) console sessions and check (or rewrite) the outputs they show.

Every ```` ```console ```` block of README.md and then docs/usage.md is a list of ``$ command`` lines (a trailing ``\\``
continues one), each followed by the output it printed. This script runs them in order, in a
sandbox laid out like the README assumes, and compares what they print with what the README
shows:

* ``repo/`` (the working directory) beside ``shared/data`` (a link to the real ``../shared/data``),
  so ``../shared/data/...`` paths resolve; ``repo/scripts`` links to this repository's scripts;
* ``repo/tiny/``: the random-weight open_clip model the tests build (``svgen-tiny.json`` +
  ``tiny.safetensors``, from ``tests/conftest.py``), the same bytes on every run;
* ``repo/photos/``: a copy of ``images-30class`` plus a text file named ``notes.jpg``;
* ``$ cat FILE`` writes the block's shown content to FILE first (that is how ``use_head.py``
  gets there), then checks that ``cat`` prints it;
* ``HF_HUB_OFFLINE=1``, an empty Hugging Face cache and an empty svgen prompt cache.

Outputs are compared line by line, numbers to a relative 1e-3 (measured times, the ONNX
check's float-rounding difference and kernel condition numbers, which are at round-off level, are not
compared). Commands in ``SKIP`` need the real
ViT-B-32 weights or the reader's own photos; every entry must still be in the README.

    python scripts/readme_sessions.py            # check; exit 1 and a diff on any mismatch
    python scripts/readme_sessions.py --write    # regenerate the README's outputs from real runs
    python scripts/readme_sessions.py --json     # also print one JSON object of results
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SVGEN_SHARED_DATA", ROOT.parent / "shared" / "data"))

SKIP = {  # need the real ViT-B-32 weights (downloaded once on a connected machine) or the reader's files
    "svgen fit --classes cifar10 --out cifar10.svgen": "real ViT-B-32 weights",
    "svgen classify cifar10.svgen photos/ --top-k 3 --out preds.csv": "real weights; the reader's photos",
    "svgen eval cifar10.svgen --data imagefolder/": "real weights; the reader's labelled images",
    "svgen export cifar10.svgen --format onnx --head kernel --out head.onnx": "needs cifar10.svgen",
    "svgen diagnose cifar10.svgen": "needs cifar10.svgen",
    "svgen add-classes cifar10.svgen --classes more.txt": "real weights; the reader's class list",
    "svgen adapt cifar10.svgen --shots labelled/ --out cifar10-shots.svgen": "real weights; the reader's labelled images",
    "svgen classify cifar10.svgen photos/ --transductive": "needs cifar10.svgen (real weights)",
    "svgen adapt pets.svgen --shots pets-4shot/ --out pets-4.svgen": "the reader's artifact and labelled images",
    "svgen adapt pets.svgen --shot-features X.npy --shot-labels y.npy --out pets-4.svgen": "the reader's files",
    "svgen fit --classes pets.txt --shots pets-4shot/ --out pets-4.svgen": "real weights; the reader's files",
    "svgen adapt pets.svgen --shots pets-4shot/ --config strict.toml --out pets-4.svgen": "the reader's files",
    "svgen classify pets.svgen photos/ --transductive": "the reader's artifact (real weights)",
    "svgen adapt pets.svgen --unlabelled photos/ --out pets-pool.svgen": "the reader's artifact (real weights)",
    "svgen adapt pets.svgen --shots pets-4shot/ --unlabelled photos/ --out pets-4-pool.svgen": "the reader's files",
    "svgen fit --classes pets.txt --unlabelled photos/ --out pets-pool.svgen": "real weights; the reader's files",
}
#: Not compared: measured times, the ONNX check's float rounding, and the kernel matrix's condition number,
#: whose smallest eigenvalue (≈ 1e-7 of the largest for the tiny model) is at round-off level and differs
#: between processors' BLAS kernels (16951198.9 on one CI machine, 20589784.9 on another, same code).
NOT_COMPARED = [re.compile(r'("wall_time_s": )[-+0-9.e]+'), re.compile(r"(max \|difference\| )[-+0-9.e]+"),
                re.compile(r'("condition_number": )[-+0-9.e]+')]
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
RTOL = 1e-3


def sessions(text: str):
    """``[(command, [expected lines], (first, last) line span of the output)]`` of every console block."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            if not lines[i].startswith("$ "):
                raise ValueError(f"README line {i + 1}: console block output without a '$ ' command before it")
            cmd = lines[i][2:]
            while cmd.endswith("\\"):
                i += 1
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            start = i
            while i < len(lines) and lines[i].strip() != "```" and not lines[i].startswith("$ "):
                i += 1
            out.append((" ".join(cmd.split("  #")[0].split()), lines[start:i], (start, i)))
    return out


def sandbox(root: Path) -> Path:
    """The layout the README's sessions assume (see the module docstring); returns the working dir."""
    repo = root / "repo"
    (root / "shared").mkdir(parents=True)
    os.symlink(SHARED.resolve(), root / "shared" / "data")
    repo.mkdir()
    os.symlink(ROOT / "scripts", repo / "scripts")
    logging.getLogger().setLevel(logging.ERROR)  # open_clip says "initialized randomly": that is the point here
    tiny = runpy.run_path(str(ROOT / "tests" / "conftest.py"))["build_tiny_model"](repo / "tiny")
    assert Path(tiny["config"]).name == "svgen-tiny.json" and Path(tiny["safetensors"]).name == "tiny.safetensors"
    shutil.copytree(SHARED / "images-30class", repo / "photos")
    (repo / "photos" / "notes.jpg").write_text("not a photo, just notes\n")
    return repo


def run(cmd: str, cwd: Path, env: dict) -> str:
    """stdout and stderr together, as a terminal shows them."""
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=900)
    return proc.stdout.rstrip("\n")


def same(expected: str, got: str) -> bool:
    """Equal text and numbers within ``RTOL`` (``NOT_COMPARED`` values masked on both sides)."""
    for pattern in NOT_COMPARED:
        expected, got = pattern.sub(r"\1…", expected), pattern.sub(r"\1…", got)
    if NUMBER.split(expected) != NUMBER.split(got):
        return False
    a, b = NUMBER.findall(expected), NUMBER.findall(got)
    return len(a) == len(b) and all(abs(float(x) - float(y)) <= RTOL * max(abs(float(x)), abs(float(y)), 1e-300)
                                    for x, y in zip(a, b))


DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "usage.md")  # run in this order, in one sandbox


def check_readme(path=DOCUMENTS, write: bool = False, log=print) -> dict:
    """Run every session command of ``path`` (a file, or several run in order in one sandbox: the
    README, then docs/usage.md, whose sessions use what the README's made);
    ``{"ran", "skipped", "mismatches": [...]}``."""
    if not SHARED.is_dir():
        raise FileNotFoundError(f"{SHARED} is absent; the README's sessions read ../shared/data")
    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    texts = {p: p.read_text(encoding="utf-8") for p in paths}
    found = [(p, *s) for p in paths for s in sessions(texts[p])]
    missing = sorted(set(SKIP) - {cmd for _, cmd, _, _ in found})
    if missing:
        raise ValueError(f"SKIP lists commands the documents no longer have: {missing}")
    result = {"ran": 0, "skipped": 0, "mismatches": [], "seconds": {}}
    edits = {p: [] for p in paths}
    with tempfile.TemporaryDirectory(prefix="svgen-readme-") as tmp:
        cwd = sandbox(Path(tmp))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(Path(tmp) / "hf-home"),
               "SVGEN_CACHE_DIR": str(Path(tmp) / "svgen-cache"), "COLUMNS": "100",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("SVGEN_PROGRESS", None)
        for doc, cmd, expected, span in found:
            if cmd in SKIP:
                result["skipped"] += 1
                continue
            if cmd.startswith("cat ") and len(cmd.split()) == 2:
                (cwd / cmd.split()[1]).write_text("\n".join(expected) + "\n", encoding="utf-8")
            t0 = time.perf_counter()
            got = run(cmd, cwd, env)
            result["seconds"][cmd] = round(time.perf_counter() - t0, 1)
            result["ran"] += 1
            want = "\n".join(expected)
            ok = same(want, got)
            log(f"{'ok  ' if ok else 'DIFF'} {result['seconds'][cmd]:6.1f}s  $ {cmd[:110]}")
            if not ok:
                result["mismatches"].append({"command": cmd, "expected": want, "got": got, "file": doc.name})
                edits[doc].append((span, got.split("\n") if got else []))
    for doc, changes in edits.items():
        if write and changes:
            lines = texts[doc].split("\n")
            for (start, end), new in sorted(changes, reverse=True):
                lines[start:end] = new
            doc.write_text("\n".join(lines), encoding="utf-8")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run the README's console sessions; check or rewrite their outputs.")
    ap.add_argument("--readme", type=Path, nargs="+", default=list(DOCUMENTS),
                    help="markdown files, run in order in one sandbox (default: README.md docs/usage.md)")
    ap.add_argument("--write", action="store_true", help="replace outputs that differ with the real ones")
    ap.add_argument("--json", action="store_true", help="print one JSON object of results at the end")
    args = ap.parse_args(argv)
    try:
        result = check_readme(args.readme, write=args.write, log=lambda s: print(s, file=sys.stderr, flush=True))
    except (FileNotFoundError, ValueError) as e:
        print(f"readme_sessions: error: {e}", file=sys.stderr)
        return 2
    for m in result["mismatches"]:
        print(f"\n$ {m['command']}\n--- README\n{m['expected']}\n--- now\n{m['got']}", file=sys.stderr)
    print(f"readme_sessions: {result['ran']} command(s) run, {result['skipped']} skipped (SKIP), "
          f"{len(result['mismatches'])} differ" + (" (README rewritten)" if args.write and result["mismatches"] else ""),
          file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    return 1 if result["mismatches"] and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())

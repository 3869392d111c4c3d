"""Helpers shared by the sub-commands (argument groups, reading arrays, loading encoders, output).

Output convention: stdout carries only the command's result (a table, CSV/JSON Lines rows, one
JSON object), so it can be piped (``svgen fit … | jq .sigma``); human lines such as
``wrote X: …`` go to stderr through :func:`note`, which ``-q`` silences. JSON is strict
(:func:`json_text`): no ``NaN``/``Infinity``, non-finite numbers are ``null``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

import numpy as np

from svgen.errors import SvgenError

log = logging.getLogger(__name__)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show ``(default: …)`` only where there is a default worth reading (not for None or flags)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class ExamplesFormatter(argparse.HelpFormatter):
    """Wraps description and epilog paragraphs to the terminal like any help text, and keeps as written
    the paragraphs meant to be read line by line: ``examples:`` lists and indented formulas."""

    def _fill_text(self, text, width, indent):
        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if para.startswith("examples:"):
                out.append("\n".join(indent + line for line in lines))
                continue
            block, prose = [], []
            for line in lines + [None]:  # runs of prose are wrapped; an indented formula line stays as it is
                if line is not None and not line.startswith("    "):
                    prose.append(line)
                    continue
                if prose:
                    block.append(super()._fill_text(" ".join(prose), width, indent))
                    prose = []
                if line is not None:
                    block.append(indent + line)
            out.append("\n".join(block))
        return "\n\n".join(out)


def add_refused_flag(p: argparse.ArgumentParser, flag: str, why: str) -> None:
    """A hidden ``flag`` that stops with a usage error saying ``why``: ``-k`` is classify's top-k and ``-K`` fit's
    support vectors, so neither letter is quietly read as the other command's."""

    class Refused(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            parser.error(f"{flag} {why}")

    p.add_argument(flag, action=Refused, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


from svgen.encoders.resolve import DEFAULT_MODEL


def add_encoder_args(p: argparse.ArgumentParser, with_model_default: bool = True) -> None:
    """--model/--pretrained/--checkpoint/--device. ``--model`` stays None unless given (so a command
    can tell whether it was named); :func:`default_pretrained` and :func:`load_encoder` fill in
    ``DEFAULT_MODEL`` for commands ``with_model_default``."""
    g = p.add_argument_group("encoder (open_clip)")
    g.add_argument("--model", default=None,
                   help="open_clip architecture (ViT-B-32), 'hf-hub:ORG/REPO', 'local-dir:PATH', "
                        "or an open_clip model-config .json file (default: "
                        + (f"{DEFAULT_MODEL})" if with_model_default else "the one recorded in the artifact)"))
    src = g.add_mutually_exclusive_group()
    src.add_argument("--pretrained", metavar="TAG",
                     help="pretrained tag for a built-in architecture (default: "
                          + ("openai, downloaded once)" if with_model_default else "the artifact's)"))
    src.add_argument("--checkpoint", metavar="FILE",
                     help="local weights for --model: .safetensors, or a torch file (read with weights_only=True)")
    add_quick_gelu_arg(g)
    g.add_argument("--device", default="auto",
                   help="device of the open_clip encoder (text prompts, images): cpu, cuda, cuda:N, mps or auto "
                        "(CUDA if present, then MPS, else the CPU); the kernel fit itself runs on the CPU "
                        "(default: %(default)s)")


def add_quick_gelu_arg(g, artifact: bool = False) -> None:
    """``--quick-gelu/--no-quick-gelu``: the MLP activation, for weights whose source does not say it (``artifact``:
    a command that reloads an artifact's encoder, whose recorded activation is the default)."""
    what = "build the MLPs with QuickGELU (OpenAI CLIP, LAION-400M, MetaCLIP weights) or GELU. "
    if artifact:
        help_text = what + "Default: the artifact's recorded activation, else as for 'svgen fit' (docs/usage.md, " \
                           "\"GELU or QuickGELU\")"
    else:
        help_text = what + ("Default: a pretrained tag's own setting (a contradicting flag is refused); for "
                            "--checkpoint or a .json config the config's quick_gelu or a '-quickgelu' model name, else "
                            "GELU (with a warning where the architecture has a -quickgelu variant); hf-hub:/local-dir: "
                            "their open_clip_config.json")
    g.add_argument("--quick-gelu", action=argparse.BooleanOptionalAction, default=None, help=help_text)


def default_pretrained(args):
    """The pretrained tag implied by CLI options (``--model`` filled in with the default)."""
    from svgen.encoders.resolve import EncoderRequest

    args.model = args.model or DEFAULT_MODEL
    return EncoderRequest.from_options(args).pretrained_or_default


def load_encoder(args):
    """A ClipEncoder from the CLI's encoder options (:func:`svgen.encoders.resolve.load_encoder`)."""
    from svgen.encoders.resolve import EncoderRequest, load_encoder as load

    default_pretrained(args)
    return load(EncoderRequest.from_options(args))


def text_prototypes(args, classes, templates, expect: dict = None):
    """``(Prototypes, encoder identity)`` under the CLI's encoder options (:func:`svgen.encoders.resolve.text_prototypes`)."""
    from svgen.encoders.resolve import EncoderRequest, text_prototypes as prototypes

    default_pretrained(args)
    return prototypes(EncoderRequest.from_options(args), classes, templates, expect)


def note(args, text: str) -> None:
    """A line for the person at the terminal ('wrote X: …'): stderr, silenced by ``-q``."""
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


def _finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def json_text(obj, **kw) -> str:
    """Strict JSON (RFC 8259) of ``obj``: NaN and ±inf become ``null``, as in ``svgen.json``."""
    return json.dumps(_finite(obj), allow_nan=False, **kw)


def load_array(path, what: str, mmap: bool = False, strings: bool = False) -> np.ndarray:
    """``np.load`` without pickle (``mmap``: memory-mapped); a clear one-line error for every way it can fail.
    ``strings``: a unicode string array (class names) is accepted too."""
    from svgen.safeio import check_regular, os_error

    path = Path(path)
    check_regular(path, f"{what} file")  # missing, unreadable, a folder or a FIFO: one line each
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise os_error(e, f"cannot read {what} file {path}") from None
    if magic != b"\x93NUMPY" and not magic.startswith(b"PK"):
        raise SvgenError(f"{what} file {path} is not a .npy file (no NumPy header; a text or CSV file?); "
                         "save the array with numpy.save")
    if magic != b"\x93NUMPY":
        raise SvgenError(f"{what} file {path} is an .npz archive; expected a single .npy array")
    from svgen.npy import load_npy

    arr = load_npy(path, what, mmap=mmap, strings=strings)  # header checked before allocating; native byte order
    if strings and arr.dtype.kind == "U":
        return arr
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_) or np.iscomplexobj(arr):
        expected = "integer class indices or class names (a str array)" if strings else "real numbers"
        raise SvgenError(f"{what} file {path} holds {arr.dtype} data; expected {expected}")
    return arr


# ----------------------------------------------------------------------------- checks every command gets (cli.main)

HEAD_CHOICES = ("kernel", "linear", "cosine", "mixture")   # --head: svgen.heads.scoring.HEADS and the mixture
OUTPUT_OPTIONS = (("out", "--out"), ("plot", "--plot"))
STDOUT_COMMANDS = ("eval", "classify")   # --out - writes their table or rows to stdout
INPUT_OPTIONS = ("artifact", "inputs", "features", "data", "labels", "prototypes", "classes", "templates", "shots",
                 "shot_features", "shot_labels", "unlabelled", "unlabelled_features", "checkpoint")


def non_negative_int(text: str) -> int:
    """argparse ``type`` for a count that may be 0 (``--workers``): a negative or non-integer value is a usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def check_args(args) -> None:
    """What every sub-command's arguments must satisfy before any work (run once by :func:`svgen.cli.main`):
    ``--device`` names a device this machine has, ``--out -`` is stdout where a command can write there, and no
    output (``--out``, ``--plot``) destroys an input or another output."""
    check_device(args)
    take_stdout(args)
    check_outputs(args)


def check_device(args) -> None:
    """``--device`` of every command, by the one parser and check (:func:`svgen.encoders.runtime.resolve_device`):
    refused up front, also where no encoder ends up being loaded (``fit --prototypes``, ``eval --features``), so
    no command accepts a device another refuses. Joining a Ray cluster (``--address``), the device is the nodes'
    own: only its name is checked here."""
    device = getattr(args, "device", None)
    if device is not None:
        from svgen.encoders.runtime import parse_device, resolve_device

        (parse_device if getattr(args, "address", None) else resolve_device)(device)


def take_stdout(args) -> None:
    """``--out -``: stdout, for the commands whose --out is a table or rows (:data:`STDOUT_COMMANDS`; ``--out`` is
    then None, as when it is not given); elsewhere, and for ``--plot -``, one line instead of a file named ``-``."""
    for name, opt in OUTPUT_OPTIONS:
        if getattr(args, name, None) != "-":
            continue
        if name == "out" and getattr(args, "command", None) in STDOUT_COMMANDS:
            args.out = None
            continue
        where = "a PNG" if name == "plot" else f"'svgen {getattr(args, 'command', '')}'"
        raise SvgenError(f"{opt} - (stdout) is not available for {where}: name a file"
                         + (" (--out - is for eval and classify)" if name == "out" else ""))


def _input_paths(args):
    for name in INPUT_OPTIONS:
        value = getattr(args, name, None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, (str, os.PathLike)) and str(item) and os.path.lexists(item):
                yield Path(item).resolve()


def check_outputs(args) -> None:
    """Refuse an output that is one of the inputs, lies inside an artifact folder (an input's, or any folder
    holding ``svgen.json``), or holds an input: ``export A --out A/weights.safetensors --force`` used to overwrite
    the artifact's own weights; and two outputs (a command's ``derived_outputs(args)`` default adds those it names
    after another) that coincide (``eval --out r.png --plot r.png`` wrote the PNG,
    then the table over it) or where one holds the other. Paths are compared resolved (symbolic links, ``..``),
    before anything is written."""
    from svgen.safeio import check_outside_artifact

    outs = [(opt, getattr(args, name)) for name, opt in OUTPUT_OPTIONS if getattr(args, name, None)]
    outs += list(getattr(args, "derived_outputs", lambda a: ())(args))   # named after another (eval's heat map)
    if not outs:
        return
    inputs = list(_input_paths(args))
    for opt, out in outs:
        target = Path(out).resolve()
        for p in inputs:
            if target == p:
                raise SvgenError(f"{opt} {out} is also an input ({p}); writing it would destroy what is read: "
                                 "choose another name")
            if target in p.parents:
                raise SvgenError(f"{opt} {out} holds the input {p}; choose another name")
        check_outside_artifact(target, f"{opt} {out}")
    for i, (opt, out) in enumerate(outs):
        for other_opt, other in outs[i + 1:]:
            a, b = Path(out).resolve(), Path(other).resolve()
            if a == b or _same_file(a, b):
                raise SvgenError(f"{opt} {out} and {other_opt} {other} are the same file; give each its own name")
            if a in b.parents or b in a.parents:
                outer, inner = ((opt, out), (other_opt, other)) if a in b.parents else ((other_opt, other), (opt, out))
                raise SvgenError(f"{outer[0]} {outer[1]} holds {inner[0]} {inner[1]}; give each its own place")


def _same_file(a: Path, b: Path) -> bool:
    """Two existing names of one file (a hard link: resolving does not show it)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


ADAPT_CONFIG_HELP = ("the settings of every adaptive choice (svgen.AdaptConfig: its grids, sizes and the paired test's "
                     "level; the fields are listed in docs/adaptation.md) as one JSON or TOML (.toml) table of fields, "
                     "e.g. 'level = 2.0' and 'alphas = [0, 1, 4]'; fields it does not name keep their defaults, an "
                     "unknown field or a bad value is refused. svgen.json records the fields that differ from the "
                     "defaults (adapt_config), and adapt and add-classes adapt with them again")


def adapt_config_arg(args, flag: str):
    """The :class:`svgen.AdaptConfig` of ``--adapt-config``/``--config FILE`` (checked: one line naming a bad
    field), or None where it was not given."""
    path = getattr(args, flag.lstrip("-").replace("-", "_"))
    if path is None:
        return None
    from svgen.io.settings import read_adapt_config

    return read_adapt_config(path, flag)

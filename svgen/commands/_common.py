"""Helpers shared by the sub-commands (argument groups, reading arrays, loading encoders)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from ..errors import SvgenError

log = logging.getLogger(__name__)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show ``(default: …)`` only where there is a default worth reading (not for None or flags)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_encoder_args(p: argparse.ArgumentParser, with_model_default: bool = True) -> None:
    g = p.add_argument_group("encoder (open_clip)")
    g.add_argument("--model", default="ViT-B-32" if with_model_default else None,
                   help="open_clip architecture (ViT-B-32), 'hf-hub:ORG/REPO', 'local-dir:PATH', "
                        "or an open_clip model-config .json file (default: "
                        + ("%(default)s)" if with_model_default else "the one recorded in the artifact)"))
    src = g.add_mutually_exclusive_group()
    src.add_argument("--pretrained", metavar="TAG",
                     help="pretrained tag for a built-in architecture (default: openai, downloaded once)")
    src.add_argument("--checkpoint", metavar="FILE",
                     help="local weights for --model: .safetensors, or a torch file (read with weights_only=True)")
    add_quick_gelu_arg(g)
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: %(default)s)")


def add_quick_gelu_arg(g, default_help: str = "") -> None:
    """``--quick-gelu/--no-quick-gelu``: the MLP activation, for weights whose source does not say it."""
    g.add_argument("--quick-gelu", action=argparse.BooleanOptionalAction, default=None,
                   help="build the MLPs with QuickGELU (OpenAI CLIP, LAION-400M, MetaCLIP weights) or GELU. "
                        "Default" + default_help + ": a pretrained tag's own setting (a contradicting flag is "
                        "refused); for --checkpoint or a .json config the config's quick_gelu or a '-quickgelu' "
                        "model name, else GELU (with a warning where the architecture has a -quickgelu variant); "
                        "hf-hub:/local-dir: their open_clip_config.json")


def default_pretrained(args):
    """The pretrained tag implied by CLI options: a plain built-in architecture defaults to 'openai'."""
    if args.pretrained or getattr(args, "checkpoint", None):
        return args.pretrained
    if args.model.startswith(("hf-hub:", "local-dir:")) or args.model.endswith(".json"):
        return None
    return "openai"


def load_encoder(args):
    """A ClipEncoder from the CLI's encoder options."""
    from ..encoders import ClipEncoder

    return ClipEncoder(args.model, pretrained=default_pretrained(args), checkpoint=args.checkpoint, device=args.device,
                       quick_gelu=getattr(args, "quick_gelu", None))


def load_array(path, what: str) -> np.ndarray:
    """``np.load`` without pickle; a clear one-line error for every way it can fail."""
    path = Path(path)
    if not path.is_file():
        raise SvgenError(f"{what} file not found: {path}")
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise SvgenError(f"{what} file {path} is not a plain numeric .npy array ({str(e).splitlines()[0]})") from None
    except (OSError, EOFError) as e:
        raise SvgenError(f"{what} file {path} is not a readable .npy file ({e})") from None
    if isinstance(arr, np.lib.npyio.NpzFile):
        raise SvgenError(f"{what} file {path} is an .npz archive; expected a single .npy array")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise SvgenError(f"{what} file {path} holds {arr.dtype} data; expected numbers")
    return arr

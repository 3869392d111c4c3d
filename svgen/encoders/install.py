"""The installed PyTorch pair: torch and torchvision built for each other, or one line saying they are not.

Where the CPU wheel index the README names cannot be reached, pip may fall back to another torch or torchvision
wheel and leave a pair that fails the moment torchvision is imported (``operator torchvision::nms does not
exist``: torchvision's compiled operators were built for another torch). open_clip imports torchvision, so this
surfaces at the first encoder use, far from its cause. :func:`torch_pair_error` recognises that failure and turns it
into one :class:`SvgenError` line with the installed versions and the command that reinstalls the pair;
:func:`import_open_clip` is ``import open_clip`` with that check (``ClipEncoder``), and the CLI applies the same
check to any exception it did not expect (:func:`svgen.cli.main`).
"""

from __future__ import annotations

from importlib import metadata
from typing import Optional

from svgen.errors import SvgenError

# the README's CPU install, forced: a plain `pip install` would find both already installed and change nothing
REINSTALL = "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cpu"
SIGNS = ("torchvision::",                                # operator torchvision::nms does not exist
         "PyTorch and torchvision",                      # torchvision.extension: "… versions are incompatible"
         "partially initialized module 'torchvision'")   # a second import after the first one failed


def installed(package: str) -> str:
    """The installed version of ``package`` (``"not installed"`` where pip has no record of it)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def torch_pair_error(e: BaseException) -> Optional[SvgenError]:
    """One line for ``e`` if it is torchvision failing against the installed torch (see module docstring), else None."""
    text = str(e)
    if not isinstance(e, (RuntimeError, ImportError, AttributeError, OSError)) or not any(s in text for s in SIGNS):
        return None
    first = (text.strip().splitlines() or [""])[0][:160]
    line = (f"torch {installed('torch')} and torchvision {installed('torchvision')} do not match (importing "
            f"torchvision failed: {first}); reinstall them together: {REINSTALL} (the README's CPU install; for a "
            "GPU build leave out --index-url)")
    return SvgenError(line, cli=line)   # pip's flags, not svgen's: the same words for Python and the CLI


def import_open_clip():
    """``import open_clip`` (which imports torchvision), with a mismatched torch/torchvision pair as one line."""
    try:
        import open_clip
    except Exception as e:
        err = torch_pair_error(e)
        if err is None:
            raise
        raise err from None
    return open_clip

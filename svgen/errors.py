"""The one exception type users see.

The library raises :class:`SvgenError` (a ``ValueError``) for anything the user can fix: bad
input files, mismatched shapes, unreachable weights. Its message is a single line that says
what was expected and what arrived; the CLI prints it and exits non-zero.
"""


from typing import Optional


class SvgenError(ValueError):
    """A user-facing error whose message is one self-contained line.

    The message names what a Python caller passes (``seed``, ``force=True``); where the command line spells it
    differently (``--seed``, ``--force``), ``cli`` gives the line the CLI prints instead (:attr:`cli_message`).
    """

    def __init__(self, message: str = "", cli: Optional[str] = None):
        super().__init__(message)
        if cli is not None:
            self.cli_message = cli


def setting_error(param: str, flag: str, rest: str) -> SvgenError:
    """``"<param> <rest>"`` for Python callers, ``"<flag> <rest>"`` on the command line."""
    return SvgenError(f"{param} {rest}", cli=f"{flag} {rest}")


class EncoderUnavailableError(SvgenError):
    """Pretrained weights are neither local nor downloadable right now."""


class TargetExistsError(SvgenError):
    """The output exists (or appeared while it was being written) and ``force`` was not given.

    The library's message names ``force=True``; :attr:`cli_message` names ``--force``, for the CLI.
    """

    def __init__(self, path, appeared: bool = False):
        self.path = path
        why = (f"{path} appeared while it was being written (another process wrote it); nothing was replaced"
               if appeared else f"{path} already exists")
        super().__init__(f"{why}; pass force=True to replace it", cli=f"{why}; pass --force to replace it")

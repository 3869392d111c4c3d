"""The one exception type users see.

The library raises :class:`SvgenError` (a ``ValueError``) for anything the user can fix: bad
input files, mismatched shapes, unreachable weights. Its message is a single line that says
what was expected and what arrived; the CLI prints it and exits non-zero.
"""


class SvgenError(ValueError):
    """A user-facing error whose message is one self-contained line."""


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
        super().__init__(f"{why}; pass force=True to replace it")
        self.cli_message = f"{why}; pass --force to replace it"

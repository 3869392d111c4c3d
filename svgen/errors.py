"""The one exception type users see.

The library raises :class:`SvgenError` (a ``ValueError``) for anything the user can fix: bad
input files, mismatched shapes, unreachable weights. Its message is a single line that says
what was expected and what arrived; the CLI prints it and exits non-zero.
"""


class SvgenError(ValueError):
    """A user-facing error whose message is one self-contained line."""


class EncoderUnavailableError(SvgenError):
    """Pretrained weights are neither local nor downloadable right now."""

"""Log lines for the steps that take time: ``with timed(log, "vote weights") as info: …`` logs
``vote weights (dense Cholesky, λ=0.05) in 1.23s`` at INFO when the block ends (``svgen -v``), and the step's
start at DEBUG (``-vv``), and a progress bar where the caller asks for one (:func:`bar`). The library only logs;
the command line decides what reaches stderr."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator, List


@contextmanager
def timed(log: logging.Logger, what: str) -> Iterator[List[str]]:
    """Time the block; details appended to the yielded list are said in parentheses after ``what``."""
    log.debug("%s …", what)
    details: List[str] = []
    t0 = time.perf_counter()
    yield details
    said = f" ({', '.join(details)})" if details else ""
    log.info("%s%s in %.2fs", what, said, time.perf_counter() - t0)


class Clock:
    """Laps of a sequence of steps: ``clock.lap("kernel matrix")`` logs the time since the previous lap (or the
    clock's start), at INFO unless ``level`` says otherwise, as :func:`timed` does for one block."""

    def __init__(self, log: logging.Logger, level: int = logging.INFO):
        self.log, self.level, self.t = log, level, time.perf_counter()

    def lap(self, what: str, *args) -> None:
        now = time.perf_counter()
        self.log.log(self.level, what + " in %.2fs", *args, now - self.t)
        self.t = now


def bar(items, progress: bool, **kw):
    """``items`` under a tqdm progress bar when ``progress`` (``items`` None with ``total=``: a bar to ``update``
    by hand, or None without ``progress``)."""
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, **kw)

"""A pipeline step's output goes to its rule's `log:` file, including the traceback of a failure."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator


@contextlib.contextmanager
def log_to(path: str | os.PathLike) -> Iterator[None]:
    """Send stdout and stderr to `path`; on an exception write its traceback there too, then re-raise."""
    with open(path, "w", buffering=1) as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            yield
        except BaseException:
            traceback.print_exc(file=log)
            raise

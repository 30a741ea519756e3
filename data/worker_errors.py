"""A DataLoader whose workers' ConfigErrors reach the caller as the one line they were raised with.

A worker's exception comes back to the training process as a new one of the same type around the
worker's whole traceback (torch._utils.ExceptionWrapper.reraise): `ConfigError("Caught ConfigError
in DataLoader worker process 0.\\nOriginal Traceback ...\\nerrors.ConfigError: <the line>")`. The
original object stays in the worker; its message is the traceback's last entry.

The one line holds neither the loader nor its iterator in a reference cycle. A frame that holds an
exception it raised makes one (torch's reraise does), and what the cycle reaches (the iterator, and
through the traceback the caller's frames with the loader) lives on until a garbage collection,
which calls the iterator's __del__ after multiprocessing's finalizers closed the queues it tells
the workers to stop on: it then waits 5 s for each worker before killing it. Wherever the process
goes on (the next job of an in-process sweep, a notebook, a test), they are let go at once instead.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from errors import ConfigError, raised_elsewhere


class OneLineErrorsLoader(DataLoader):
    def __iter__(self) -> Iterator[Any]:
        try:
            yield from super().__iter__()
        except ConfigError as e:
            one_line = raised_elsewhere(str(e))  # None: raised in this process, already the one line
            if one_line is None:
                raise
            traceback.clear_frames(e.__traceback__)  # torch's, reraise's among them
            try:
                raise one_line from None
            finally:
                del one_line  # this frame's own cycle

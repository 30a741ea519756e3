"""A DataLoader whose workers' ConfigErrors reach the caller as the one line they were raised with.

A worker's exception comes back to the training process as a new one of the same type around the
worker's whole traceback (torch._utils.ExceptionWrapper.reraise): `ConfigError("Caught ConfigError
in DataLoader worker process 0.\\nOriginal Traceback ...\\nerrors.ConfigError: <the line>")`. The
original object stays in the worker; its message is the traceback's last entry.
"""

from __future__ import annotations

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
            raise one_line from None

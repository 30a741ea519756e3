"""A DataLoader whose workers' ConfigErrors reach the caller as the one line they were raised with.

A worker's exception comes back to the training process as a new one of the same type around the
worker's whole traceback (torch._utils.ExceptionWrapper.reraise): `ConfigError("Caught ConfigError
in DataLoader worker process 0.\\nOriginal Traceback ...\\nerrors.ConfigError: <the line>")`. The
original object stays in the worker; its message is the traceback's last entry.
"""
from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader

from errors import ConfigError

_LAST_ENTRY = f"\n{ConfigError.__module__}.{ConfigError.__qualname__}: "


class OneLineErrorsLoader(DataLoader):
    def __iter__(self) -> Iterator[Any]:
        try:
            yield from super().__iter__()
        except ConfigError as e:
            _, from_worker, message = str(e).rpartition(_LAST_ENTRY)
            if not from_worker:  # raised in this process: already the one line
                raise
            raise ConfigError(message.rstrip("\n")) from None

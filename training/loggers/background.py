"""A backend's slow start (TensorBoard's imports, MLflow creating its store) on a thread of its own,
beside the first training steps, whose kernels release the GIL (see BENCHMARKS.md: Default job, time
to accuracy); the backend's first write waits for it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Background(Generic[T]):
    """`make()` on a daemon thread, started at once."""

    def __init__(self, make: Callable[[], T], name: str) -> None:
        self._make = make
        self._made: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        _running.add(self._thread)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._made = self._make()
        except BaseException as e:  # raised again by result(), in the thread that needs it
            self._error = e

    def result(self) -> T:
        """What `make()` returned, once it has; what it raised, raised here."""
        self._thread.join()
        _running.discard(self._thread)
        if self._error is not None:
            raise self._error
        return self._made


_running: set[threading.Thread] = set()


def _wait_for_threads() -> None:
    """Before this process forks (a DataLoader's workers): a thread still importing holds the import
    and dynamic-loader locks, and a child that needs one would wait forever for a thread it does not
    have (os.fork's documentation: forking a multi-threaded process)."""
    for thread in [t for t in _running if t is not threading.current_thread()]:
        thread.join()
        _running.discard(thread)


os.register_at_fork(before=_wait_for_threads)

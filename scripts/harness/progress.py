"""Progress bars for the benchmark's long phases (gevent: import it only from a program
that has monkey-patched).

A bar is drawn by its own greenlet, which polls a counter every ``INTERVAL`` s: the
load generator and the sink stay untouched (no callback in their hot paths), and a bar
costs the bench ~4 wake-ups a second whatever the task rate. Bars go to stderr only, so
the bench's one JSON line on stdout stays the only thing there; they are drawn only when
stderr is a terminal, or when asked for (``--progress``), and never with ``--quiet``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import gevent
from tqdm import tqdm

INTERVAL = 0.25  # s between redraws
tqdm.monitor_interval = 0  # no monitor thread: under monkey-patching it would be a greenlet


def enabled(quiet: bool, force: bool, stream: IO[Any] | None = None) -> bool:
    """Whether to draw: never when quiet, always when forced, else when stderr is a tty."""
    if quiet:
        return False
    if force:
        return True
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


def write(line: str) -> None:
    """A log line on stderr that does not break a bar being drawn."""
    tqdm.write(line, file=sys.stderr)


@contextmanager
def bar(on: bool, desc: str, total: int, count: Callable[[], int],
        unit: str = "task") -> Iterator[None]:
    """While the block runs, show ``count()`` out of ``total`` (nothing when ``on`` is
    false). The bar ends at the last value the counter had."""
    if not on:
        yield
        return
    progress = tqdm(total=total, initial=min(total, count()), desc=desc, unit=unit,
                    file=sys.stderr, dynamic_ncols=True, mininterval=INTERVAL, leave=True)

    def update() -> None:
        progress.n = min(total, count())
        progress.refresh()

    def poll() -> None:
        while True:
            gevent.sleep(INTERVAL)
            update()

    drawer = gevent.spawn(poll)
    try:
        yield
    finally:
        drawer.kill()
        update()
        progress.close()

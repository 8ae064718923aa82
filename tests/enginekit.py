"""What the in-process engine tests share: an Engine on an in-memory journal and a fake
clock the test moves (``clock["now"]``)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine, Hooks
from miyamoto.store.journal import Journal


@contextmanager
def memory_engine(now: float, hooks: Hooks | None = None, client: Any = None,
                  **flags: Any) -> Iterator[tuple[Engine, dict[str, float]]]:
    """An Engine at ``now`` on ``:memory:`` (``flags``: more config flags), and its clock."""
    cfg = config_mod.load(env={}, flags={"data_dir": ":memory:", **flags})
    journal = Journal(":memory:")
    journal.open()
    clock = {"now": now}
    try:
        yield Engine(cfg, journal, client=client, clock=lambda: clock["now"],
                     hooks=hooks or Hooks()), clock
    finally:
        journal.close()

"""miyamoto.wire.identity: the incarnation counter kept in the data dir."""

from __future__ import annotations

import os

import pytest

from miyamoto.wire.identity import BOOT_FILE, next_boot


@pytest.mark.timeout(10)
def test_the_boot_grows_at_every_start_even_when_the_clock_goes_back(tmp_path):
    d = str(tmp_path / "data")
    first = next_boot(d, clock=lambda: 1000.0)
    assert first == 1_000_000
    assert next_boot(d, clock=lambda: 1000.0) == first + 1
    assert next_boot(d, clock=lambda: 5.0) == first + 2  # the clock went back
    assert open(os.path.join(d, BOOT_FILE)).read() == f"{first + 2}\n"


@pytest.mark.timeout(10)
def test_a_wiped_or_garbled_counter_starts_from_the_clock(tmp_path):
    d = str(tmp_path)
    assert next_boot(d, clock=lambda: 2000.0) == 2_000_000  # no file yet
    with open(os.path.join(d, BOOT_FILE), "w") as f:
        f.write("garbage")
    assert next_boot(d, clock=lambda: 3000.0) == 3_000_000
    assert not [n for n in os.listdir(d) if ".tmp" in n]

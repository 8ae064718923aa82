"""miyamoto.wire.identity: the incarnation counter and the node's key, in the data dir."""

from __future__ import annotations

import json
import os

import pytest

from miyamoto.wire.identity import BOOT_FILE, KEY_FILE, MEMORY, next_boot, node_key
from miyamoto.wire.transport import keygen


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


@pytest.mark.timeout(10)
def test_the_node_key_is_made_once_kept_private_and_read_back(tmp_path):
    d = str(tmp_path / "data")
    keys = node_key(d)
    path = os.path.join(d, KEY_FILE)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert node_key(d) == keys  # a restart is the same member
    assert node_key(str(tmp_path / "other")) != keys


@pytest.mark.timeout(10)
def test_a_bad_key_file_is_named_and_never_replaced_nor_quoted(tmp_path):
    d = str(tmp_path)
    keys = node_key(d)
    path = os.path.join(d, KEY_FILE)
    other = keygen()
    with open(path, "w") as f:  # a pair that does not belong together
        json.dump({"public": other.public, "secret": keys.secret}, f)
    with pytest.raises(ValueError) as e:
        node_key(d)
    assert path in str(e.value) and keys.secret not in str(e.value)
    assert keys.secret in open(path).read()  # left as it was


@pytest.mark.timeout(10)
def test_no_data_dir_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert node_key(MEMORY) != node_key(MEMORY)
    assert next_boot(MEMORY, clock=lambda: 7.0) == 7000
    assert os.listdir(tmp_path) == []


def test_the_boot_counter_is_readable_by_all_the_key_by_its_owner_alone(tmp_path):
    next_boot(str(tmp_path), clock=lambda: 1000.0)
    assert (tmp_path / BOOT_FILE).stat().st_mode & 0o777 == 0o644
    node_key(str(tmp_path))
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600

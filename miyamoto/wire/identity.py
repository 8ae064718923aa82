"""A node's wire identity, kept in its data dir: its incarnation counter and its own key.

``node_key`` is the node's own CurveZMQ key pair (DESIGN §2, "Trust"): made at its
first start with a cluster key and kept in ``<data_dir>/node.key`` (mode 0600), so a
restarted node is the same member to its peers. That is the migration from one shared
pair: a node that has only the cluster pair makes its own at its next start, and the
cluster pair becomes the join secret. A node whose data dir is lost gets a new key and
is a new process to the cluster: the leader admits it once its old process is no
longer heard (``miyamoto.membership.machine``, ``live_namesake``).

``next_boot`` is the incarnation every frame carries (``miyamoto.wire.freshness``): it
must grow at every start, or a restarted node's new frames would look like replays of
its old ones. So it is kept on disk (``<data_dir>/boot``, written and fsynced before the
node sends anything) and is also at least the wall clock in milliseconds: a node whose
data dir was wiped still starts above what its peers remember of it, as long as its
clock did not go back by more than its downtime.

Files are replaced atomically (write a temporary file, fsync, rename, fsync the dir),
so a crash leaves the old value or the new one, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Callable

from miyamoto.wire.atomic import atomic_write
from miyamoto.wire.transport import CurveKeys, keygen

log = logging.getLogger(__name__)

MEMORY = ":memory:"  # no data dir: nothing kept
BOOT_FILE = "boot"
KEY_FILE = "node.key"


class BadKeyFile(ValueError):
    """The data dir's key file does not hold a key pair (a usage error: exit code 2)."""


def next_boot(data_dir: str, clock: Callable[[], float] = time.time) -> int:
    """This start's incarnation: above the last one kept in ``data_dir`` and at least
    the clock in ms; kept there before it is returned (``:memory:``: the clock's)."""
    if data_dir == MEMORY:
        return int(clock() * 1000)
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, BOOT_FILE)
    try:
        with open(path, "rb") as f:
            last = int(f.read(32).strip() or b"0")
    except FileNotFoundError:
        last = 0
    except ValueError:
        log.warning("%s is not a number: the incarnation starts from the clock", path)
        last = 0
    boot = max(last + 1, int(clock() * 1000))
    atomic_write(path, f"{boot}\n".encode(), mode=0o644)
    return boot


def node_key(data_dir: str) -> CurveKeys:
    """This node's own key pair: the one kept in ``data_dir``, or a new one kept there.
    A file that does not hold a valid pair is an error naming it (never replaced: it
    may be an operator's). With no data dir (``:memory:``), a pair for this process."""
    if data_dir == MEMORY:
        return keygen()
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, KEY_FILE)
    if not os.path.exists(path):
        keys = keygen()
        atomic_write(path, json.dumps({"public": keys.public, "secret": keys.secret}).encode(),
                     mode=0o600)
        log.info("made this node's own key pair in %s (public key %s)", path, keys.public)
        return keys
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read(4096))
        return CurveKeys(d["public"], d["secret"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadKeyFile(f"{path} does not hold this node's key pair ({type(e).__name__}); "
                         "move it away to make a new one") from None

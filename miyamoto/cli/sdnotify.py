"""systemd's readiness protocol, sd_notify(3), without libsystemd: one datagram of
``KEY=VALUE`` lines to the Unix socket that ``$NOTIFY_SOCKET`` names (``@`` leads an
abstract one). ``miyamoto serve`` says ``READY=1`` once its HTTP port listens and its
journal is open, and ``STOPPING=1`` when SIGTERM starts the drain, so a ``Type=notify``
unit (deploy/systemd/miyamoto.service) orders what needs the API after a node that
answers. READY does not wait for the cluster: a node with no peer reachable yet still
serves /healthz, and a start timeout would only restart it. Outside systemd nothing is
sent.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Mapping

log = logging.getLogger(__name__)

VARIABLE = "NOTIFY_SOCKET"


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` to systemd; False when no socket is named or it cannot be reached
    (logged: a unit that waits for READY would time out, so say why)."""
    path = (os.environ if env is None else env).get(VARIABLE, "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode("utf-8"))
    except OSError as e:
        log.warning("systemd notify: cannot send %s to %s: %s", state.split("\n")[0], path, e)
        return False
    return True

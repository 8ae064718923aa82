"""Plain (not ``zmq.green``) ZeroMQ sockets under gevent: the few calls the transport needs.

Why: the green wrappers cost ~10 % of a cluster node's CPU, in pyzmq's machinery
rather than ours: IntFlag arithmetic on every call, a ``getsockopt(EVENTS)`` per
frame, an AsyncResult and a Timeout per wait, a hub wakeup per message and an
io watcher per socket. Here a socket that only sends (a DEALER) needs nothing:
``send_frames`` never blocks. A socket that receives is drained with NOBLOCK
until ``zmq.Again`` and waited for with one reused ``Readable`` per socket.
"""

from __future__ import annotations

import gevent
import zmq
import zmq.backend

# The longest wait on a socket's zmq.FD before trying it anyway: libzmq can miss an
# edge of that edge-triggered FD, which would otherwise stall the socket for good.
FD_WAIT_TIMEOUT = 0.5
# Flags as plain ints: zmq's IntFlag arithmetic is slow on a per-frame path.
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE_NOBLOCK = int(zmq.SNDMORE) | NOBLOCK
# The backend's send, without the sugar layer's per-call Python (routing_id, group).
_raw_send = zmq.backend.Socket.send


def send_frames(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Queue one multipart message without blocking; raises zmq.Again at the HWM or
    when no peer is connected (with IMMEDIATE). A multipart message is atomic: the
    HWM is checked on its first frame only, so a later frame never raises Again."""
    for frame in frames[:-1]:
        _raw_send(sock, frame, SNDMORE_NOBLOCK)
    _raw_send(sock, frames[-1], NOBLOCK)


class Readable:
    """Waits until a plain zmq socket may have input.

    ``zmq.FD`` signals that the socket has commands to process, edge-triggered:
    the caller must receive with NOBLOCK until ``zmq.Again`` before waiting
    again, or an edge already consumed would leave queued messages unread. A
    wait also ends after `timeout` seconds (a missed edge), and the caller then
    simply tries the socket again. The watcher and the Timeout are made once and
    reused, so a wait allocates nothing but the hub's Waiter.
    """

    def __init__(self, sock: zmq.Socket, timeout: float | None = None) -> None:
        self._hub = gevent.get_hub()
        self._io = self._hub.loop.io(sock.getsockopt(zmq.FD), 1)
        self._seconds = FD_WAIT_TIMEOUT if timeout is None else timeout
        self._timeout = gevent.Timeout(self._seconds)

    def wait(self) -> None:
        """Return when the FD is readable or the timeout passed (never raises it)."""
        timeout = self._timeout
        timeout.start()
        try:
            self._hub.wait(self._io)
        except gevent.Timeout as e:
            if e is not timeout:
                raise
            # A gevent Timeout that has expired once expires at once when restarted
            # (gevent 26: a busy loop): an expired one is replaced, cancelled ones reused.
            timeout.close()
            self._timeout = gevent.Timeout(self._seconds)
        finally:
            timeout.cancel()

    def close(self) -> None:
        """Stop watching; call it when no greenlet waits (the socket may be closed already)."""
        self._timeout.close()
        self._io.close()

#!/usr/bin/env python3
"""Watch what Miyamoto delivers: the harness's counting sink in the foreground.

    python scripts/sink.py --port 9099

The sink itself (httptools on a gevent StreamServer, counts by X-Task-Id and by ``seq``) is
``harness.fastsink``, shared with scripts/bench.py.
"""

from __future__ import annotations

if __name__ == "__main__":  # the entry point patches once, before anything imports socket
    from gevent import monkey

    monkey.patch_all()

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.fastsink import Sink, SinkStats  # noqa: E402  (scripts/ is not a package)

__all__ = ["Sink", "SinkStats", "main"]


def main(argv: list[str] | None = None) -> int:
    """Serve a sink in the foreground and print a summary every few seconds (stderr)."""
    import gevent

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--port", type=int, default=9099, help="port on 127.0.0.1 (0 = any free)")
    parser.add_argument("--status", type=int, default=200, help="HTTP status to answer with")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between summaries")
    args = parser.parse_args(argv)
    sink = Sink(port=args.port, status=args.status).start()
    print(f"sink listening on {sink.url()}", file=sys.stderr)
    try:
        while True:
            gevent.sleep(args.every)
            s = sink.stats
            print(
                f"requests={s.requests} seqs={s.delivered} dup_seqs={len(s.duplicated_seqs())}"
                f" dup_ids={len(s.duplicated_ids())} foreign={s.foreign}",
                file=sys.stderr,
            )
    except KeyboardInterrupt:
        return 0
    finally:
        sink.stop()


if __name__ == "__main__":
    sys.exit(main())

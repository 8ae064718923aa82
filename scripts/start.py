#!/usr/bin/env python3
"""Start a node the way the original Miyamoto did, from environment variables.

    INTERFACE=127.0.0.1 LEADER=tcp://10.0.0.1:6000 REPLICAS=2 python scripts/start.py

INTERFACE  address to bind the HTTP API and the cluster port on (default 127.0.0.1)
HTTP_PORT  HTTP port (default 8088); CLUSTER_PORT cluster port (default 6000)
LEADER     cluster endpoint of any node to join (the original's leader; now any seed)
REPLICAS   copies of each task (replication)
NODE_ID    this node's id; DATA_DIR journal directory
Every other MIYAMOTO_* variable and any extra command-line flag is passed through. A node
with LEADER needs the cluster key pair (MIYAMOTO_CURVE_PUBLIC / MIYAMOTO_CURVE_SECRET, from
`miyamoto keygen`); an INTERFACE beyond loopback needs MIYAMOTO_API_TOKENS.
"""

from __future__ import annotations

import os
import sys


def argv_from_env(env: dict[str, str]) -> list[str]:
    interface = env.get("INTERFACE", "127.0.0.1")
    args = ["serve", "--http", f"{interface}:{env.get('HTTP_PORT', '8088')}",
            "--cluster", f"tcp://{interface}:{env.get('CLUSTER_PORT', '6000')}"]
    if env.get("LEADER"):
        leader = env["LEADER"]
        args += ["--seeds", leader if leader.startswith("tcp://") else f"tcp://{leader}"]
    if env.get("REPLICAS"):
        args += ["--replication", env["REPLICAS"]]
    if env.get("NODE_ID"):
        args += ["--node", env["NODE_ID"]]
    if env.get("DATA_DIR"):
        args += ["--data-dir", env["DATA_DIR"]]
    return args


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from miyamoto.cli.main import main

    raise SystemExit(main(argv_from_env(dict(os.environ)) + sys.argv[1:]))

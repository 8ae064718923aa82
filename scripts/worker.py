#!/usr/bin/env python3
"""An example worker: prints every task it receives and answers 200.

    python scripts/worker.py [--port 9099] [--fail-rate 0.0]

Then: curl -d "task.url=http://localhost:9099/worker&foo=bar" http://localhost:8088/queue
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9099)
    parser.add_argument("--fail-rate", type=float, default=0.0,
                        help="answer 500 to this fraction of requests, to watch retries")
    args = parser.parse_args()

    def app(environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        fail = random.random() < args.fail_rate
        print(json.dumps({"method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"],
                          "query": environ.get("QUERY_STRING", ""),
                          "content_type": environ.get("CONTENT_TYPE", ""),
                          "task_id": headers.get("X-Task-Id"),
                          "retry": headers.get("X-Task-Retry-Count"),
                          "body": body.decode("utf-8", "replace"),
                          "answer": 500 if fail else 200}), flush=True)
        start_response("500 Internal Server Error" if fail else "200 OK",
                       [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"no" if fail else b"ok"]

    class Quiet(WSGIRequestHandler):
        def log_message(self, *a):  # the JSON line above is the log
            pass

    print(f"worker listening on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    with make_server(args.host, args.port, app, handler_class=Quiet) as server:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

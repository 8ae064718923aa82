#!/usr/bin/env python3
"""A small mutation runner: plant one small change at a time in a core module, run the
tests that cover that module, and count the changes that no test notices (survivors).

    .venv/bin/python scripts/mutate.py                    # every module in MODULES
    .venv/bin/python scripts/mutate.py -m backoff -m ratelimit --budget 300
    .venv/bin/python scripts/mutate.py -m scheduler --list    # the mutants, nothing run
    .venv/bin/python scripts/mutate.py -p replicas -p wire --budget 1200  # whole packages
    .venv/bin/python scripts/mutate.py --all --budget 7200    # every package, budget split

With -p or --all the budget is split package by package (each gets an equal share of what
is left, so one that ends early hands its rest on) and, within a package, module by
module; each package's score is printed as it ends and a table of all at the end.
Modules with logic that no fast test covers are listed in UNCOVERED with the reason.

It never touches the working tree: the repository is copied to a temporary directory
(git's tracked files plus the working tree's changes, no .git, no .venv) and every
mutant is written there, so an interrupted run (Ctrl-C, a crash, a timeout) leaves
your files as they were. The copy's tests import the copy's package (PYTHONPATH and
cwd point there; the editable install's path entry comes after them).

Mutations (chosen from the AST, spliced into the source by position, so the rest of the
file stays byte for byte): comparison flips (< <= > >=, == !=, in / not in, is / is
not), + - * / swaps, augmented assignments, a dropped ``not`` or unary minus,
and <-> or, numeric constants +1, True <-> False, a negated if/while/ternary condition,
min <-> max, a dropped call statement, a dropped raise, ``return x`` -> ``return None``,
break <-> continue. Docstrings, annotations, decorators, f-strings and logging calls
are left alone.

Each run of the tests gets a timeout (a mutant that hangs counts as killed: the tests
did notice). By default the runs are forked from this process with pytest, gevent,
hypothesis and zmq already imported (~4x faster than a fresh interpreter); --no-fork
runs each in a new interpreter. The whole run is bounded by --budget seconds; a module
with more than --max-mutants candidates is sampled (with a fixed seed).

Mutants known to be equivalent (no behaviour can tell them apart) are listed in
EQUIVALENT with the reason, and left out of the score. Not part of .ci/run.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent

# module -> the test runs that cover it (fast, in-process tests: tests/unit and the pure
# simulators in tests/sim with a bounded selection of seeds; never tests/nodes, whose real
# processes are far too slow per mutant), each a list of pytest arguments, cheapest first
# (a mutant's later runs only happen when the earlier ones pass). A module, or a run whose
# test file, does not exist (yet) is skipped.
_SIMS = ([f"tests/unit/membership/test_membership.py::test_random_faults[{i}]" for i in range(60)]
         + [f"tests/unit/membership/test_membership.py::test_a_connected_majority_keeps_going[{i}]"
            for i in range(30)])
# the rule tests first (<1 s), the simulators' planted-bug checks last but one (~25 s)
_MEMBERSHIP = [["tests/unit/membership/test_membership.py", "-k",
                "not random_faults and not connected_majority and not survives and not catches"],
               _SIMS, ["tests/unit/membership/test_roster.py"],
               ["tests/unit/membership/test_membership.py", "-k", "catches"],
               # the attacks on the membership simulator: the planted-rule checks and the
               # absurd frame (<1 s), then one attack with faults (~4 s)
               ["tests/sim/test_membership_sim.py", "-k", "not attacker_moves"],
               ["tests/sim/test_membership_sim.py::test_an_attacker_moves_no_term_and_the_"
                "cluster_keeps_a_leader[forging-with-faults]"]]
# the composed cluster simulator: its fault-free run, replay and planted-bug checks (<1 s),
# then the first 50 seeded runs (~5 s)
_CLUSTER_SIM = [["tests/sim/test_cluster_sim.py", "-k", "not seeded_runs"],
                ["tests/sim/test_cluster_sim.py::test_seeded_runs_keep_the_rules[0]"]]
# the sibling protocol's rule tests (plus the short pause scenario and the planted-bug
# checks, ~3 s), then the first 100 of the 1,000 random simulator runs (~3 s)
_SIBLINGS = [["tests/unit/replicas/test_siblings.py"],
             ["tests/sim/test_siblings_random.py::test_random_runs_are_safe[0]"]]
# the same for replicas' own modules, the planted-bug checks last (~60 s of the ~80 s;
# a slip they alone would catch is rare, so they only run for a mutant the rest miss)
_REPLICAS = [["tests/unit/replicas/test_siblings.py", "-k", "not catches"],
             ["tests/unit/replicas/test_siblings_rejoin.py"], _SIBLINGS[1],
             ["tests/unit/replicas/test_siblings.py", "-k", "catches"]]
_DEFINITIONS = [["tests/unit/definitions/test_definitions.py"],
                ["tests/unit/definitions/test_sync.py"],
                ["tests/unit/definitions/test_schedules_pure.py"], ["tests/unit/definitions/test_schedules.py"]]
_JOURNAL = [["tests/unit/store/test_journal.py"], ["tests/unit/store/test_journal_failure.py"],
            ["tests/unit/engine/test_window.py"]]
_DELIVERY_UNITS = [["tests/unit/delivery/test_dispatch.py"],
                   ["tests/unit/delivery/test_fairness.py"],
                   ["tests/unit/delivery/test_breaker.py"], ["tests/unit/delivery/test_flow.py"]]
# the engine driven through its door on real journals (~4 s in one run)
_ENGINE_UNITS = [f"tests/unit/engine/test_engine_{n}.py"
                 for n in ("store", "replace", "remote", "leases", "expiry", "browse",
                           "oldest_due", "traces", "pull", "ordering")]
MODULES: dict[str, list[list[str]]] = {
    # wire/
    "miyamoto/wire/verbs.py": [["tests/unit/wire/test_verbs.py"],
                               ["tests/unit/wire/test_checks.py"],
                               ["tests/unit/wire/test_outbox.py"],
                               ["tests/unit/wire/test_transport.py"]],
    "miyamoto/wire/messages.py": [["tests/unit/wire/test_verbs.py"],
                                  ["tests/unit/definitions/test_definitions.py", "-k",
                                   "messages"], _MEMBERSHIP[0], *_SIBLINGS],
    "miyamoto/wire/checks.py": [["tests/unit/wire/test_checks.py"], _MEMBERSHIP[0],
                                ["tests/unit/replicas/test_siblings.py"]],
    "miyamoto/wire/transport.py": [["tests/unit/wire/test_transport.py"]],
    "miyamoto/wire/zmqio.py": [["tests/unit/wire/test_transport.py"]],
    "miyamoto/wire/freshness.py": [["tests/unit/wire/test_freshness.py"],
                                   ["tests/unit/wire/test_transport.py"]],
    "miyamoto/wire/identity.py": [["tests/unit/wire/test_identity.py"]],
    "miyamoto/wire/outbox.py": [["tests/unit/wire/test_outbox.py"], _CLUSTER_SIM[0]],
    "miyamoto/wire/atomic.py": [["tests/unit/wire/test_atomic.py"],
                                ["tests/unit/wire/test_identity.py"],
                                ["tests/unit/definitions/test_sync.py", "-k", "file"]],
    "miyamoto/wire/handshakes.py": [["tests/unit/wire/test_handshakes.py"],
                                    ["tests/unit/wire/test_transport.py", "-k", "curve"]],
    # tasks/
    "miyamoto/tasks/task.py": [["tests/unit/tasks/test_task.py"],
                               ["tests/unit/tasks/test_validate.py"],
                               ["tests/unit/store/test_journal.py"],
                               ["tests/unit/delivery/test_flow.py"],
                               ["tests/unit/delivery/test_priorities.py"]],
    "miyamoto/tasks/validate.py": [["tests/unit/tasks/test_validate.py"],
                                   ["tests/unit/tasks/test_dedupe.py"]],
    "miyamoto/tasks/checks.py": [["tests/unit/tasks/test_validate.py"]],
    "miyamoto/tasks/fields.py": [["tests/unit/tasks/test_fields.py"],
                                 ["tests/unit/tasks/test_task.py"],
                                 ["tests/unit/tasks/test_validate.py"],
                                 ["tests/unit/delivery/test_priorities.py"],
                                 ["tests/unit/delivery/test_flow.py"]],
    "miyamoto/tasks/dedupe.py": [["tests/unit/tasks/test_dedupe.py"]],
    "miyamoto/tasks/formdata.py": [["tests/unit/tasks/test_formdata.py"],
                                   ["tests/unit/tasks/test_validate.py"]],
    "miyamoto/tasks/options.py": [["tests/unit/tasks/test_options.py"],
                                  ["tests/unit/tasks/test_validate.py"],
                                  ["tests/unit/tasks/test_task.py"],
                                  ["tests/unit/delivery/test_retry.py"]],
    "miyamoto/tasks/labels.py": [["tests/unit/tasks/test_labels.py"],
                                 ["tests/unit/tasks/test_validate.py"]],
    "miyamoto/tasks/redact.py": [["tests/unit/tasks/test_redact.py"]],
    "miyamoto/tasks/repeat.py": [["tests/unit/tasks/test_repeat.py"],
                                 ["tests/unit/tasks/test_validate.py"]],
    # membership/
    # (each module's own unit tests first: tests/unit/membership/test_<module>.py)
    "miyamoto/membership/machine.py": [["tests/unit/membership/test_machine.py"], *_MEMBERSHIP],
    **{f"miyamoto/membership/{name}.py": [[f"tests/unit/membership/test_{name}.py"],
                                          *_MEMBERSHIP]
       for name in ("election", "liveness", "changes", "bootstrap", "roster")},
    # joinwatch: a pure decision the machine never calls (the cluster layer logs it)
    "miyamoto/membership/joinwatch.py": [["tests/unit/membership/test_joinwatch.py"]],
    "miyamoto/membership/messages.py": [
        ["tests/unit/membership/test_membership_messages.py"], *_MEMBERSHIP],
    # replicas/
    "miyamoto/replicas/placement.py": [["tests/unit/replicas/test_placement.py"]],
    "miyamoto/replicas/siblings.py": _REPLICAS,
    "miyamoto/replicas/restore.py": [["tests/unit/replicas/test_restore.py"], *_REPLICAS],
    "miyamoto/replicas/messages.py": [["tests/unit/replicas/test_replicas_messages.py"],
                                     *_REPLICAS],
    "miyamoto/replicas/events.py": _REPLICAS,
    "miyamoto/replicas/effects.py": [*_REPLICAS, *_CLUSTER_SIM],
    # definitions/
    "miyamoto/definitions/machine.py": _DEFINITIONS,
    "miyamoto/definitions/messages.py": [["tests/unit/definitions/test_messages.py"],
                                         *_DEFINITIONS],
    "miyamoto/definitions/sync.py": [["tests/unit/definitions/test_sync.py"],
                                     ["tests/unit/definitions/test_definitions.py"],
                                     ["tests/unit/http/test_api_inproc.py"], ["tests/unit/http/test_api.py"]],
    "miyamoto/definitions/schedules.py": [["tests/unit/definitions/test_schedules_pure.py"], ["tests/unit/definitions/test_schedules.py"]],
    "miyamoto/definitions/topics.py": [["tests/unit/definitions/test_topics.py"]],
    "miyamoto/definitions/queues.py": [["tests/unit/definitions/test_queue_definitions.py"],
                                       ["tests/unit/cluster/test_queuesettings.py"]],
    # store/
    "miyamoto/store/journal.py": [*_JOURNAL, ["tests/unit/store/test_file.py"]],
    "miyamoto/store/file.py": [["tests/unit/store/test_file.py"], *_JOURNAL],
    "miyamoto/store/rows.py": _JOURNAL,
    "miyamoto/store/datadir.py": [["tests/unit/store/test_datadir.py"], *_JOURNAL],
    "miyamoto/store/dbthread.py": [["tests/unit/store/test_dbthread.py"], *_JOURNAL],
    # engine/
    "miyamoto/engine/scheduler.py": [["tests/unit/engine/test_scheduler.py"]],
    "miyamoto/engine/browse.py": [["tests/unit/engine/test_browse.py"],
                                  ["tests/unit/cluster/test_queries.py"]],
    "miyamoto/engine/history.py": [["tests/unit/engine/test_history.py"],
                                   ["tests/unit/cluster/test_queries.py"]],
    "miyamoto/engine/window.py": [["tests/unit/engine/test_window.py"], _ENGINE_UNITS,
                                  *_CLUSTER_SIM],
    "miyamoto/engine/engine.py": [_ENGINE_UNITS, ["tests/unit/delivery/test_retry.py"],
                                  ["tests/unit/store/test_journal_failure.py"],
                                  ["tests/unit/engine/test_window.py"],
                                  ["tests/unit/cluster/test_queries.py"], *_CLUSTER_SIM],
    "miyamoto/engine/expiry.py": [["tests/unit/engine/test_engine_expiry.py"], _ENGINE_UNITS],
    "miyamoto/engine/pull.py": [["tests/unit/engine/test_pull.py"],
                                ["tests/unit/engine/test_engine_pull.py"],
                                ["tests/unit/cluster/test_queries_peer.py"], _ENGINE_UNITS],
    "miyamoto/engine/ordering.py": [["tests/unit/engine/test_ordering.py"],
                                    ["tests/unit/engine/test_engine_ordering.py"]],
    "miyamoto/engine/queues.py": [["tests/unit/engine/test_queues.py"],
                                  ["tests/unit/cluster/test_queuesettings.py"], _ENGINE_UNITS],
    # delivery/
    "miyamoto/delivery/dispatch.py": [["tests/unit/delivery/test_dispatch.py"],
                                      ["tests/unit/delivery/test_fairness.py"]],
    "miyamoto/delivery/fairness.py": [["tests/unit/delivery/test_fairness.py"],
                                      ["tests/unit/delivery/test_priorities.py"]],
    "miyamoto/delivery/breaker.py": [["tests/unit/delivery/test_breaker.py"]],
    "miyamoto/delivery/flow.py": [["tests/unit/delivery/test_flow.py"]],
    "miyamoto/delivery/backoff.py": [["tests/unit/delivery/test_backoff.py"],
                                     ["tests/unit/delivery/test_attempt.py", "-k", "retry_after"],
                                     ["tests/unit/config/test_settings.py", "-k", "backoff"]],
    "miyamoto/delivery/ratelimit.py": [["tests/unit/delivery/test_ratelimit.py"]],
    "miyamoto/delivery/attempt.py": [["tests/unit/delivery/test_attempt.py"]],
    # retry.py: test_retry.py has the decide() rules and the engine carrying them out;
    # backoff.retry_after's own tests are test_backoff.py's (backoff.py's entry)
    "miyamoto/delivery/retry.py": [["tests/unit/delivery/test_retry.py"]],
    "miyamoto/delivery/identity.py": [["tests/unit/delivery/test_delivery_identity.py"],
                                      ["tests/unit/delivery/test_attempt.py"]],
    "miyamoto/delivery/httpclient.py": [["tests/unit/delivery/test_httpclient.py"],
                                        ["tests/unit/delivery/test_targets.py"],
                                        ["tests/unit/delivery/test_egress.py"]],
    "miyamoto/delivery/targets.py": [["tests/unit/delivery/test_targets.py"],
                                     ["tests/unit/delivery/test_httpclient.py"]],
    "miyamoto/delivery/completion.py": [["tests/unit/delivery/test_completion.py"],
                                        ["tests/unit/engine/test_engine_leases.py"]],
    "miyamoto/delivery/egress.py": [["tests/unit/delivery/test_egress.py"]],
    # cluster/: each helper's own unit tests first; the I/O layer and the coordinator
    # run in the composed simulator
    "miyamoto/cluster/clocks.py": [["tests/unit/cluster/test_clocks.py"], *_CLUSTER_SIM],
    "miyamoto/cluster/clockmessages.py": [["tests/unit/cluster/test_clockmessages.py"],
                                          *_CLUSTER_SIM],
    "miyamoto/cluster/layer.py": [["tests/unit/cluster/test_layer_solo.py",
                                   "tests/unit/cluster/test_layer_roster.py",
                                   "tests/unit/cluster/test_layer_messages.py"], *_CLUSTER_SIM],
    "miyamoto/cluster/coordinator.py": [["tests/unit/cluster/test_coordinator.py",
                                         "tests/unit/cluster/test_coordinator_ordered.py"],
                                        *_CLUSTER_SIM],
    "miyamoto/cluster/requests.py": [["tests/unit/cluster/test_requests.py"], *_CLUSTER_SIM],
    "miyamoto/cluster/queries.py": [["tests/unit/cluster/test_queries.py",
                                     "tests/unit/cluster/test_bulk_total.py"],
                                    ["tests/unit/cluster/test_queries_peer.py",
                                     "tests/unit/cluster/test_queries_bulk.py"],
                                    ["tests/unit/http/test_dashboard.py"], *_CLUSTER_SIM],
    "miyamoto/cluster/queuesettings.py": [["tests/unit/cluster/test_queuesettings_pure.py",
                                           "tests/unit/cluster/test_queuesettings_edges.py"],
                                          ["tests/unit/cluster/test_queuesettings.py"]],
    "miyamoto/cluster/joinlog.py": [["tests/unit/cluster/test_joinlog.py"]],
    # http/
    "miyamoto/http/server.py": [["tests/unit/http/test_server.py"]],
    "miyamoto/http/head.py": [["tests/unit/http/test_head.py"], ["tests/unit/http/test_server.py"]],
    "miyamoto/http/connections.py": [["tests/unit/http/test_connections.py"],
                                     ["tests/unit/http/test_server.py"]],
    "miyamoto/http/api.py": [["tests/unit/http/test_api_inproc.py"], ["tests/unit/http/test_api.py"],
                             ["tests/unit/http/test_dashboard.py"],
                             ["tests/unit/http/test_qstash.py"]],
    "miyamoto/http/definitions.py": [["tests/unit/http/test_api_inproc.py"], ["tests/unit/http/test_api.py"]],
    "miyamoto/http/auth.py": [["tests/unit/http/test_auth.py"], ["tests/unit/http/test_api_inproc.py"], ["tests/unit/http/test_api.py"],
                              ["tests/unit/http/test_dashboard.py"]],
    "miyamoto/http/dashboard.py": [["tests/unit/http/test_dashboard.py"]],
    "miyamoto/http/mediatype.py": [["tests/unit/http/test_mediatype.py"]],
    "miyamoto/http/fdlimit.py": [["tests/unit/http/test_fdlimit.py"]],
    "miyamoto/http/openapi.py": [["tests/unit/http/test_openapi.py"]],
    "miyamoto/http/upstash.py": [["tests/unit/http/test_upstash.py"], ["tests/unit/http/test_qstash.py"]],
    "miyamoto/http/qstash.py": [["tests/unit/http/test_qstash.py"]],
    "miyamoto/http/cloudtasks.py": [["tests/unit/http/test_cloudtasks.py"]],
    "miyamoto/http/cloudtasksjson.py": [["tests/unit/http/test_cloudtasksjson.py"],
                                        ["tests/unit/http/test_cloudtasks.py"]],
    # config/
    "miyamoto/config/settings.py": [["tests/unit/config/test_settings.py"],
                                    ["tests/unit/cli/test_main.py"]],
    "miyamoto/config/values.py": [["tests/unit/config/test_values.py"],
                                  ["tests/unit/config/test_settings.py"],
                                  ["tests/unit/cli/test_main.py"]],
    "miyamoto/config/keys.py": [["tests/unit/config/test_keys.py"]],
    "miyamoto/config/tls.py": [["tests/unit/config/test_tls.py"]],
    # cli/: the commands run against a real node in this process (test_commands*.py);
    # processes (the supervisor of N node processes) is in UNCOVERED
    "miyamoto/cli/main.py": [["tests/unit/cli/test_main.py"]],
    "miyamoto/cli/times.py": [["tests/unit/cli/test_times.py"]],
    "miyamoto/cli/sdnotify.py": [["tests/unit/cli/test_sdnotify.py"]],
    "miyamoto/cli/tables.py": [["tests/unit/cli/test_tables.py"],
                               ["tests/unit/cli/test_commands_browse.py"]],
    "miyamoto/cli/bulk.py": [["tests/unit/cli/test_bulk.py"]],
    "miyamoto/cli/commands.py": [["tests/unit/cli/test_command_calls.py"],
                                 ["tests/unit/cli/test_bulk.py"],
                                 ["tests/unit/cli/test_commands.py"],
                                 ["tests/unit/cli/test_commands_browse.py"],
                                 ["tests/unit/cli/test_main.py"]],
    # top
    "miyamoto/sockets.py": [["tests/unit/test_sockets.py"], ["tests/unit/http/test_server.py"],
                            ["tests/unit/delivery/test_httpclient.py"]],
    "miyamoto/metrics.py": [["tests/unit/test_metrics.py"], ["tests/unit/delivery/test_retry.py"],
                            *_CLUSTER_SIM],
    "miyamoto/logs.py": [["tests/unit/test_logs.py"]],
    "miyamoto/client.py": [["tests/unit/test_client.py"]],
    "miyamoto/__init__.py": [["tests/unit/test_client.py"]],  # the lazy Client hook
    "miyamoto/errors.py": [["tests/unit/test_errors.py"]],
    "miyamoto/tracing.py": [["tests/unit/test_tracing.py"]],
}

# never mutated: files without logic (a one-line __init__.py, __main__.py, version.py)
TRIVIAL = {"__init__.py", "__main__.py", "version.py"}
# modules with logic that no fast test covers: the runner names them at every package run
_NODES = "only real-process tests cover it ({}): too slow per mutant"
UNCOVERED: dict[str, str] = {
    "miyamoto/node.py": "the composition root (it builds the parts and starts and stops "
                        "their services): a mutant shows only in a whole node, whose tests "
                        "(tests/nodes/, and the in-process ones that start a Node, seconds "
                        "each) are too slow per mutant; the parts it wires have their own",
    "miyamoto/delivery/types.py": "a dataclass and two exception classes, no logic to mutate",
    "miyamoto/cli/processes.py": _NODES.format("tests/nodes/test_processes.py"),
    "miyamoto/cli/usage.py": "one exception class, no logic to mutate",
    "miyamoto/cli/work.py": _NODES.format("tests/nodes/test_pull_node.py"),
    "miyamoto/http/pull.py": _NODES.format("tests/nodes/test_pull_node.py"),
}

# (module, the mutated line stripped, mutation) -> why no behaviour can tell them apart
_COMPACT = ("the compaction threshold is a memory/time trade-off: any threshold keeps "
            "every pop and next_time exact (test_scheduler_order_and_live_keys_survive_a_"
            "compaction); only how often the heap is rebuilt changes")
_STOP = ("Dispatcher.stop stops the pump twice over (the _stopping flag ends its loop "
         "and the greenlet is killed): either one alone stops it")
_YIELD = ("the pump's yield between two passes that set a long line aside (PARK_BATCH "
          "tasks each): only fairness to other greenlets; every task still starts")
_UNQUOTED = ("which decoded form values formdata keeps (a cache of at most ~0.5 MB): every "
             "answer is the same with or without it (test_agrees_with_parse_qsl asks each "
             "input twice), and test_the_field_cap_and_the_cache_bound holds the bound")
_BATCH_EDGE = ("a message exactly at the batch bound goes alone or closes the batch one "
               "message earlier: the peer unpacks the same messages in the same order")
_BATCH_SLACK = ("the batch bound is an estimate (16 bytes of framing counted per message, "
                "more than a short verb needs): a byte or a KiB more moves where a batch "
                "ends by at most one message; every frame stays far below MAX_FRAME and "
                "test_a_batch_frame_stays_within_one_mib holds")
_WRITER_ENDS = ("close sets _closed and wakes the writer, which then ends by itself after "
                "the group it is committing (the database thread runs that commit before "
                "the file's close: one FIFO queue); join's bound and the kill matter only for "
                "a writer stuck past 30 s")
_WATCHER = ("closing a watcher that is not started (an expired Timeout, or the Readable of a "
            "socket whose loop ended) only frees it: it can never fire again")
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("miyamoto/delivery/backoff.py", "if n <= q.max_doublings + 1:", "<= -> <"):
        "at n = max_doublings + 1 both branches give min_backoff * 2**max_doublings",
    ("miyamoto/delivery/backoff.py", "if n <= q.max_doublings + 1:", "1 -> 2"):
        "at n = max_doublings + 2 both branches give 2 * min_backoff * 2**max_doublings",
    ("miyamoto/delivery/ratelimit.py", "if now > self.stamp:", "> -> >="):
        "at now == stamp the refill adds (now - stamp) * rate = 0 tokens",
    ("miyamoto/delivery/ratelimit.py",
     "return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate", ">= -> >"):
        "at tokens == 1.0 the other branch gives (1.0 - 1.0) / rate = 0.0 too",
    ("miyamoto/engine/scheduler.py", "if head is None or when < head:", "< -> <="):
        "a key due at the same time as the head: an extra wake-up finds nothing new due",
    ("miyamoto/engine/scheduler.py", "if len(self._heap) > 2 * len(self._live) + 1024:",
     "negate the if"): _COMPACT,
    ("miyamoto/engine/scheduler.py", "if len(self._heap) > 2 * len(self._live) + 1024:",
     "> -> >="): _COMPACT,
    ("miyamoto/engine/scheduler.py", "if len(self._heap) > 2 * len(self._live) + 1024:",
     "> -> <"): _COMPACT + " (here: on every schedule below the threshold, so it is "
                           "never reached)",
    ("miyamoto/engine/scheduler.py", "if len(self._heap) > 2 * len(self._live) + 1024:",
     "+ -> -"): _COMPACT,
    ("miyamoto/engine/scheduler.py", "if len(self._heap) > 2 * len(self._live) + 1024:",
     "* -> /"): _COMPACT,
    ("miyamoto/engine/scheduler.py", "if len(self._heap) > 2 * len(self._live) + 1024:",
     "2 -> 3"): _COMPACT,
    ("miyamoto/engine/scheduler.py", "if len(self._heap) > 2 * len(self._live) + 1024:",
     "1024 -> 1025"): _COMPACT,
    ("miyamoto/engine/scheduler.py", "if nxt is not None and nxt <= self._clock():", "<= -> <"):
        "a key due exactly now: the wait(0) that follows returns at once and the loop "
        "pops it, as the sleep(0) branch would",
    ("miyamoto/engine/scheduler.py", "gevent.sleep(0)  # more are due: let others run, then carry on",
     "drop the call"):
        "only fairness to other greenlets between two batches of 1000 due keys; "
        "every key still fires, in order",
    ("miyamoto/delivery/dispatch.py", "self._stopping = True", "True -> False"): _STOP,
    ("miyamoto/delivery/dispatch.py", "if self._greenlet is not None:", "negate the if"): _STOP,
    ("miyamoto/delivery/dispatch.py", "if self._greenlet is not None:", "is not -> is"): _STOP,
    ("miyamoto/delivery/dispatch.py", "self._greenlet.kill()", "drop the call"): _STOP,
    ("miyamoto/delivery/dispatch.py", "self.group.kill(timeout=1)", "1 -> 2"):
        "how long kill() waits for killed greenlets to exit; they exit at once",
    ("miyamoto/delivery/dispatch.py", "gevent.sleep(0)", "drop the call"): _YIELD,
    ("miyamoto/delivery/fairness.py", "PARK_BATCH = 1000  # tasks one look may set aside before the "
     "pump yields to other greenlets", "1000 -> 1001"):
        "how many tasks one pass sets aside before the pump yields: the tests use PARK_BATCH "
        "itself; every task still starts, in the same order",
    ("miyamoto/replicas/placement.py",
     "return sorted(ring, key=lambda m: hashlib.sha1(key + m.encode()).digest(), reverse=True)",
     "True -> False"):
        "lowest instead of highest rendezvous scores: an equally valid placement with the "
        "same properties (stable, moves by one member); only a mixed-version cluster "
        "would notice",
    **{("miyamoto/replicas/placement.py",
        "order = [m for m in candidates if m > lost] + [m for m in candidates if m <= lost]",
        how): "the lost member holds a copy, so it is never among the candidates"
       for how in ("> -> >=", "<= -> <")},
    **{("miyamoto/tasks/task.py", "raise NotImplementedError  # replaced at import",
        "drop the raise"): "the body of Task.evolve and Task.encode is replaced at import "
                           "by _compile_copiers; this line never runs"},
    **{("miyamoto/tasks/formdata.py", line, how): _UNQUOTED for line, how in (
        ("_MAX_UNQUOTED, _MAX_UNQUOTED_LEN = 1024, 512  # ~0.5 MB at most; once full, no "
         "more are kept", "1024 -> 1025"),
        ("_MAX_UNQUOTED, _MAX_UNQUOTED_LEN = 1024, 512  # ~0.5 MB at most; once full, no "
         "more are kept", "512 -> 513"),
        ("if len(s) <= _MAX_UNQUOTED_LEN and len(_UNQUOTED) < _MAX_UNQUOTED:", "<= -> <"),
        ("if len(s) <= _MAX_UNQUOTED_LEN and len(_UNQUOTED) < _MAX_UNQUOTED:", "< -> >"))},
    ("miyamoto/store/journal.py", "BUSY_WINDOW = 0.002  # a group that follows the last one "
     "this closely means load", "0.002 -> 0.004"):
        "when a group lingers LINGER s for more records: how many share a commit, never "
        "whether one is committed (test_journal_group_commit bounds the commits)",
    ("miyamoto/store/journal.py", "last_done = 0.0", "0.0 -> 1.0"):
        "only whether the writer's first group lingers LINGER (0.5 ms) for more records",
    ("miyamoto/store/rows.py", "data = ujson.dumps(d, escape_forward_slashes=False)",
     "False -> True"):
        "'\\/' and '/' decode alike: only the stored bytes differ, no reader can tell",
    ("miyamoto/store/datadir.py", 'text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()',
     "32 -> 33"): "a pid and its newline are far shorter than 32 bytes",
    ("miyamoto/store/datadir.py", "os.ftruncate(fd, 0)", "0 -> 1"):
        "the pid written next (at least two bytes, from offset 0) covers the one byte kept",
    **{("miyamoto/store/datadir.py", "return False", "return None"):
       "intact() is only used as a condition: None and False are both false"},
    **{("miyamoto/store/dbthread.py", "self._async.close()", "drop the call"):
       "the watcher is unreferenced by then (it keeps no hub alive, test_only_a_call_"
       "outstanding_keeps_the_hub_alive) and the thread that sends to it has ended: an open "
       "one is a few bytes, never an event"},
    ("miyamoto/wire/outbox.py", "BUSY = 0.002  # a flush this soon after the last one means "
     "load ...", "0.002 -> 0.004"):
        "when a flush waits LINGER for more messages: how many share a frame, never whether "
        "or in what order one is sent (test_under_load_a_flush_waits_for_the_next_turns_messages)",
    ("miyamoto/wire/outbox.py", "LINGER = 0.001  # ... and waits this long (gevent's timers: "
     "about a millisecond at least)", "0.001 -> 0.002"):
        "how long a flush under load waits: latency and frame sizes only (the tests wait for "
        "the flush on a condition)",
    **{("miyamoto/wire/outbox.py", "self._timer.stop()", "drop the call"):
       "a timer left running flushes what is queued when it fires: sooner than LINGER, never "
       "later, in the same order; with nothing queued it sends nothing"},
    ("miyamoto/wire/transport.py", "if 0 < taken < YIELD_EVERY:", "< -> <="):
        "a full drain then yields by RX_LINGER's sleep instead of sleep(0): other greenlets "
        "still run between every YIELD_EVERY frames (test_a_burst_past_yield_every_...)",
    ("miyamoto/wire/outbox.py", "self._scheduled = True", "True -> False"):
        "a flush scheduled per put rather than per turn: the first one sends all that is "
        "queued, in the same batches, and the others find nothing",
    ("miyamoto/wire/outbox.py", "if len(data) > MAX_BATCH_BYTES:", "> -> >="): _BATCH_EDGE,
    ("miyamoto/wire/outbox.py",
     "if parts and (size + len(data) > MAX_BATCH_BYTES or len(parts) >= MAX_BATCH):",
     "> -> >="): _BATCH_EDGE,
    ("miyamoto/wire/outbox.py", "parts, fails, verbs, size = [], [], [], 0", "0 -> 1"):
        _BATCH_SLACK,
    ("miyamoto/wire/outbox.py", "MAX_BATCH_BYTES = 1024 * 1024  # a larger message (a big "
     "STORE) travels alone", "1024 -> 1025"): _BATCH_SLACK,
    ("miyamoto/definitions/machine.py", "if dterm > self.seen_term:", "> -> >="):
        "a new round's term comes from _next_term, one above every term promised, so it "
        "is always above seen_term",
    ("miyamoto/definitions/machine.py", "if not self.leading or not self.dterm:", "or -> and"):
        "dterm is non-zero exactly while this node leads (_view claims one on taking office "
        "and zeroes it on losing it): the two halves are always equal",
    ("miyamoto/definitions/machine.py", "return False", "return None"):
        "_covers is only used as a condition: None and False are both false",
    ("miyamoto/definitions/messages.py", 'kind = c.string(d, "kind", 16)', "16 -> 17"):
        "every kind is at most 8 characters: a longer one is refused by the KINDS check next",
    ("miyamoto/tasks/validate.py",
     "if isinstance(v, (int, float)) and (not isinstance(v, float) or math.isfinite(v)):",
     "drop not"):
        "build_task's _check_field_names has refused every non-finite number, in any field "
        "at any depth, before params are read: no float here is NaN or infinite",
    ("miyamoto/store/journal.py", "LINGER = 0.0005  # under load a group waits in steps this long ...",
     "0.0005 -> 0.001"):
        "how long a group under load waits for more records: how many share a commit, "
        "never whether one is committed",
    ("miyamoto/store/journal.py", "LAZY_COMMIT = 0.005", "0.005 -> 0.01"):
        "how long a write nobody waits for may wait for company: latency only "
        "(test_writes_nobody_waits_for_are_committed_soon_without_blocking sees each one "
        "committed, in one group, without blocking its caller)",
    ("miyamoto/store/journal.py", "WATCH_INTERVAL = 1.0  # how often the watcher checks the "
     "file and, while unhealthy, probes", "1.0 -> 2.0"):
        "how often the watcher looks: when a lost file is noticed if no commit noticed it "
        "first (a commit does, at once: test_a_deleted_file_makes_the_next_commit_fail_as_"
        "moved), never what it then does",
    ("miyamoto/store/journal.py", "RECENT_MAX = 2048  # committed records kept for reads of one "
     "task (None: deleted)", "2048 -> 2049"):
        "how many committed records reads find in memory rather than in the file: the "
        "answers are the same (test_journal_reads_past_the_recent_records_ask_the_file)",
    ("miyamoto/store/journal.py", "return False", "return None"):
        "_storable is only used as a condition: None and False are both false",
    **{("miyamoto/store/journal.py", "if self._writer is not None:", how): _WRITER_ENDS
       for how in ("negate the if", "is not -> is")},
    ("miyamoto/store/journal.py", "self._writer.join(timeout=30)", "30 -> 31"): _WRITER_ENDS,
    ("miyamoto/store/journal.py", "self._writer.kill()", "drop the call"): _WRITER_ENDS,
    ("miyamoto/store/journal.py", "self._lazy.close()", "drop the call"):
        "the lazy timer is stopped by close's last flush: an open stopped timer is a few "
        "bytes and never fires",
    ("miyamoto/store/file.py",
     "db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)",
     "False -> True"):
        "the connection is opened and used on the journal's one database thread only (or, "
        "in a simulation, on the only thread): SQLite's same-thread check never fires",
    ("miyamoto/store/file.py", "return tmp", "return None"):
        "copy_out's caller installs path + '.rebuild' by name and never reads the return",
    ("miyamoto/store/file.py", "self.since = 0.0", "0.0 -> 1.0"):
        "since is set when a problem starts and read only while there is one",
    ("miyamoto/wire/transport.py", "YIELD_EVERY = 64", "64 -> 65"):
        "how many messages one drain handles before it yields to the hub: fairness only "
        "(test_a_burst_past_yield_every_arrives_whole_in_order_and_yields)",
    ("miyamoto/wire/transport.py", r'sender = identity.split(b"\x00", 1)[0].decode("utf-8")',
     "1 -> 2"): "split's first part is the same however many splits follow it",
    **{("miyamoto/wire/transport.py", "self._zap.setsockopt(zmq.LINGER, 0)", how):
       "stop closes the ZAP socket with linger=0 and destroys the context with linger 0: "
       "the option set at bind never applies" for how in ("drop the call", "0 -> 1")},
    ("miyamoto/wire/transport.py",
     "self._ctx.destroy(linger=0)  # closes anything left, then terminates", "0 -> 1"):
        "every socket the context made (the DEALERs, the ROUTER, its monitor, the ZAP "
        "socket) is closed with linger 0 just before: destroy's linger applies to none",
    ("miyamoto/wire/transport.py", "router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)", "1 -> 2"):
        "a boolean option: libzmq reads any non-zero value as on",
    ("miyamoto/wire/zmqio.py", "timeout.close()", "drop the call"): _WATCHER,
    ("miyamoto/wire/zmqio.py", "self._timeout.close()", "drop the call"): _WATCHER,
    ("miyamoto/wire/zmqio.py", "self._io.close()", "drop the call"): _WATCHER,
    ("miyamoto/wire/outbox.py", "size = 0", "0 -> 1"): _BATCH_SLACK,
    ("miyamoto/wire/outbox.py", "size += len(data) + 16", "16 -> 17"): _BATCH_SLACK,
    ("miyamoto/tasks/checks.py", 'raise ValidationError(field, "must be an integer") from None',
     "drop the raise"):
        "the value stays a str and the next check raises the same field and message",
    ("miyamoto/tasks/validate.py", "return False", "return None"):
        "_is_text is only used as a condition: None and False are both false",
    **{("miyamoto/replicas/siblings.py", "self._prune_at = max(PRUNE_MIN, 2 * len(self.must_ask))", m):
       "when to prune the must-ask marks of ended copies again: memory, not behaviour (only"
       " a live copy fires, and a pruned mark is never read)"
       for m in ("max -> min", "* -> /", "2 -> 3")},
    ("miyamoto/replicas/siblings.py", "return self._decide(task_id, a, now)", "return None"):
        "unreachable in _ask_again: an ask's waiting set is never empty while it is in "
        "self.asking (every path that empties it decides at once) and is kept within the "
        "roster (set_members intersects it), so the &= before it leaves it non-empty",
    ("miyamoto/replicas/siblings.py", "if t.id in self.asking and t.replica < msg.replica:", "< -> <="):
        "two holders of a task never share a replica index (a restore puts the new member "
        "at the lost one's index; one not in our replica set is answered rehomed first)",
    ("miyamoto/replicas/restore.py", "and t.replicas[(t.replica + k) % n] != me), None)", "+ -> -"):
        "a task's replicas are distinct members and copy t.replica is this node's, so no "
        "other index holds me: the guard is true at (replica + k) and at (replica - k)",
}

# wire, tasks, store, config, cli, top and http (kept apart from the entries above)
_CHUNK_SLACK = ("the chunk's byte bound is an estimate in characters, half the node's "
                "1 MiB body limit: a KiB, a byte or an escaped character more moves where "
                "a chunk ends by a task; every task is sent once, in file order, with the "
                "same answers (test_chunks_keep_file_order_within_the_count_and_the_byte_"
                "bound holds the rule)")
_LEFT_ZERO = ("at left == 0 the next line (at most one byte read) can never be the blank line: "
        "431 one line later, the same status and words (only a client that sent exactly "
        "max_bytes and left gets a 431 it never reads instead of a quiet close)")
_FIRST_BOOT = ("with no counter kept, boot = max(last + 1, the clock in ms): the clock "
               "(~1.7e12 ms) is far above 1 or 2")
EQUIVALENT.update({
    ("miyamoto/wire/identity.py", 'last = int(f.read(32).strip() or b"0")', "32 -> 33"):
        "a counter in ms and its newline are 14 bytes, far shorter than 32",
    ("miyamoto/wire/identity.py", "last = 0", "0 -> 1"): _FIRST_BOOT,
    ("miyamoto/wire/freshness.py", "MAX_SENDERS = 4096", "4096 -> 4097"):
        "a memory bound on remembered senders (members x their connections, far fewer "
        "than 4096; the eviction rule is tested with max_senders=3)",
    ("miyamoto/http/server.py", "if len(_STATUS_LINES) < _MAX_STATUS_LINES:", "< -> <="):
        "a cache of rendered status lines: one more kept changes no byte of any answer",
    ("miyamoto/http/server.py",
     "self._sweeper = self.loop.timer(interval, interval, ref=False)", "False -> True"):
        "whether the sweeper alone keeps the hub alive: stop() stops and closes it, and "
        "a node's hub always has its other services while the server runs",
    **{("miyamoto/http/head.py", "if left < 0:", how): _LEFT_ZERO
       for how in ("0 -> 1", "< -> <=")},
    ("miyamoto/http/connections.py", "return False", "return None"):
        "idle() is only used as a condition (server.py: if not conns.idle(conn)): None "
        "and False are both false",
    **{("miyamoto/http/mediatype.py", "return False", "return None"):
       "_json_object is only used as a condition (looks_json): None and False are both false"},
    ("miyamoto/config/settings.py", 'values.setdefault("node", node)', "drop the call"):
        "the node that selects [node:NAME] comes from a flag or the environment, which "
        "override the INI's values: node is set to it either way",
    ("miyamoto/config/settings.py", "data = f.read(MAX_SECRET_FILE + 1)", "1 -> 2"):
        "reading one byte past the cap or two: a file over the cap is over it either way",
    ("miyamoto/http/cloudtasks.py",
     "data = ujson.dumps(body, ensure_ascii=False, escape_forward_slashes=False).encode()",
     "False -> True"):
        "'\\/' and '/' decode alike in JSON: only the answer's bytes differ, no client "
        "can tell",
    ("miyamoto/http/cloudtasksjson.py", 'HTTP_METHODS = {1: "POST", 2: "GET", 3: "HEAD", '
     '4: "PUT", 5: "DELETE", 6: "PATCH", 7: "OPTIONS"}', "3 -> 4"):
        "HEAD is no method a task may use: 3 is refused with or without its entry, and 4 "
        "stays PUT (the later key wins)",
    **{("miyamoto/cli/tables.py", 'return "-"', "return None"):
       "_last and _seconds give a table cell, and table() shows None as '-' (_cell)"},
    **{("miyamoto/cli/bulk.py", line, how): _CHUNK_SLACK for line, how in (
        ("MAX_CHUNK_BYTES = 512 * 1024", "512 -> 513"),
        ("MAX_CHUNK_BYTES = 512 * 1024", "1024 -> 1025"),
        ("n = len(json.dumps(line.task, ensure_ascii=False)) + 2", "False -> True"),
        ("chunk, used = [], 0", "0 -> 1"))},
    ("miyamoto/client.py", "return False", "return None"):
        "_never_sent is only read as ``not _never_sent(e)`` (the error's reached): None "
        "and False are both false",
    ("miyamoto/metrics.py", "late[q] = max(late.get(q, 0.0), seconds)", "0.0 -> 1.0"):
        "oldest_due's queues hold due scheduled copies, which live_depth counted from the "
        "same copies in the same pass of the collector (no yield between): their labels "
        "are in names, so late holds each and the default is never read",
    ("miyamoto/errors.py", "super().__init__(original_id)", "drop the call"):
        "Duplicate is caught by every API that raises it through (api, cloudtasks, "
        "qstash), which read .original_id, never str(e)",
    ("miyamoto/tracing.py", "return False", "return None"):
        "wanted() and start() are only used as conditions (node.py): None and False are "
        "both false",
    ("miyamoto/tracing.py", '"server.address": rest.split("/", 1)[0].rpartition("@")[2],',
     "1 -> 2"): "split's first part is the same however many splits follow it",
    ("miyamoto/http/server.py", 'rfile = sock.makefile("rb", -1)', "1 -> 2"):
        "any negative buffering is io's default buffer size: -1 and -2 read alike",
    ("miyamoto/wire/freshness.py", "if highest is None or boot > highest:", "> -> >="):
        "a boot equal to the highest is put again with the same value: the dict keeps its "
        "place and value (put_bounded only makes room for a new key)",
    ("miyamoto/wire/identity.py", "d = json.loads(f.read(4096))", "4096 -> 4097"):
        "a key file is about 100 bytes of JSON: 4096 or 4097 bytes read it whole",
    ("miyamoto/wire/atomic.py", "if mode != 0o600:  # mkstemp's", "384 -> 385"):
        "mkstemp makes the file 0o600: setting 0o600 again changes nothing",
    ("miyamoto/wire/atomic.py", "dfd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)",
     "| -> &"):
        "O_RDONLY is 0 either way; only O_CLOEXEC goes, and the directory's descriptor is "
        "closed before the function returns (no exec can come between)",
    ("miyamoto/wire/handshakes.py", "readable.close()", "drop the call"): _WATCHER,
    ("miyamoto/logs.py", 'seen["status"] = status.split(" ", 1)[0]', "1 -> 2"):
        "split's first part is the same however many splits follow it",
    ("miyamoto/cli/bulk.py", "bar.close()", "drop the call"):
        "the bar is tqdm's, which closes itself when it is collected: the last reference "
        "goes as run() returns, so the same last state and newline are written",
    ("miyamoto/http/cloudtasks.py", "raise", "drop the raise"):
        "unreachable in _put: the changes come from ctj.queue_settings, whose every key is "
        "a QUEUE_PATHS value, so any field parse_put names is in _BY_SETTING",
    ("miyamoto/cli/commands.py",
     'shown = data if getattr(args, "raw", False) else readable(data)', "False -> True"):
        "every client command's parser has --raw (the common parent), so the getattr "
        "default is never used",
    ("miyamoto/http/auth.py", "super().__init__(message)", "drop the call"):
        "Denied is caught where it is raised for (api.py, cloudtasks.py), which read its "
        ".status and .message, never str(e)",
})

# membership, config and cli (kept apart from the entries above)
_STALL_MARK = ("the mark is read only while stalled (fresh acks, an echoed seq), and "
               "every stall sets it first (Liveness.observe): its starting value is never read")
_NO_ACK = ("the default stands for no ack at all; a roster key (term, version) is never "
           "negative, so (-1, -1), (-2, -1) and (-1, -2) are all below every one")
EQUIVALENT.update({
    ("miyamoto/membership/changes.py", "if key > self.acked.get(voter, (-1, -1)):", "1 -> 2"):
        _NO_ACK,
    ("miyamoto/membership/changes.py",
     "if m.id == self._me or self.acked.get((m.id, inc), (-1, -1)) >= r.key)", "1 -> 2"):
        _NO_ACK,
    ("miyamoto/membership/changes.py",
     "return max(rest, key=lambda p: (self.acked.get((p[0].id, p[1]), (-1, -1)),",
     "1 -> 2"): _NO_ACK,
    ("miyamoto/membership/changes.py",
     "return max(rest, key=lambda p: (self.acked.get((p[0].id, p[1]), (-1, -1)),",
     "drop unary -"):
        "the successor's no-ack default as (1, -1) or (-1, 1): still below every ack a "
        "leader holds, as an ack carries the acker's roster key, at least (1, 1) (a first "
        "roster is version 1 of a term >= 1)",
    ("miyamoto/membership/changes.py", "return False", "return None"):
        "config_dead is only used as a condition (the machine's two ifs): None and False "
        "are both false",
    ("miyamoto/membership/roster.py", "compare=False)  # made from members: equal with them",
     "False -> True"):
        "a roster's id index is made from its members, so two rosters with equal members "
        "have equal indexes: comparing it too changes no equality",
    ("miyamoto/membership/liveness.py", "self._stall_round = 0", "0 -> 1"): _STALL_MARK,
    ("miyamoto/membership/liveness.py", "self._stall_seq = 0", "0 -> 1"): _STALL_MARK,
    ("miyamoto/membership/machine.py",
     "self._election.clear()  # (moot: a new round starts its own count)", "drop the call"):
        "a candidate back from a stall is a follower with no pre-vote (drop_pre follows): "
        "a follower counts no vote, and its next round starts its own count (start_pre, "
        "or start for a vote), so the votes left from before the stall are never read",
    ("miyamoto/membership/machine.py",
     "return []  # (never reached: _receive drops a message in our own name)", "return None"):
        "unreachable: _receive drops every message whose sender is this node's id before "
        "a handler runs, so a JOIN in our own name never gets here",
})

# membership, replicas and definitions (kept apart from the entries above)
EQUIVALENT.update({
    ("miyamoto/definitions/machine.py", "super().__init__(leader)", "drop the call"):
        "BaseException.__new__ already keeps the constructor's arguments as args: str() "
        "and args are the same without the call",
    ("miyamoto/definitions/machine.py",
     "wid, self._next_wid = self._next_wid, self._next_wid + 1", "1 -> 2"):
        "a write's id only names it to its acks and its Finished: ids two apart are as "
        "distinct as ids one apart",
    ("miyamoto/definitions/messages.py", 'op = c.string(d, "op", 16)', "16 -> 17"):
        "every op is at most 6 characters: a longer one is refused by the OPS check next",
    ("miyamoto/definitions/schedules.py", "PERIOD = 0.2        # seconds between the "
     "leader's looks at its schedules", "0.2 -> 0.4"):
        "how often the leader looks at its schedules: how late within a period a tick "
        "fires, never whether or how often (the loop's tests set PERIOD themselves)",
    ("miyamoto/definitions/schedules.py", 'return "is not a cron expression: "', "return None"):
        "unreachable with the croniter we pin: every expression it refuses (but for one "
        "matching no date) has a field it refuses alone (searched over combinations of "
        "fields each valid alone); the fallback words are for a croniter that differs",
    ("miyamoto/definitions/schedules.py",
     'return float(t) if t >= value.get("created", 0) else None', "0 -> 1"):
        "parse_schedule stores every schedule with created: the default is never read "
        "(and 0 and 1 differ only for a tick in 1970's first second)",
    **{("miyamoto/definitions/queues.py", '"paused": (bool, 0, 1),', how):
       "paused is a bool: _value returns before a bool's bounds are read"
       for how in ("0 -> 1", "1 -> 2")},
    ("miyamoto/replicas/effects.py", "abort: bool = False", "False -> True"):
        "the machine always names abort (siblings passes the CANCEL's own): the default "
        "is never taken inside the library",
    ("miyamoto/replicas/effects.py", "go: bool = False", "False -> True"):
        "Ready.go is read only for a Due or an Expiring, and the machine names go in both "
        "answers: the default is never read",
    ("miyamoto/cluster/coordinator.py",
     "ask, lease = self.members.fold(first) if first is not None else (0, 0.0)",
     "0.0 -> 1.0"):
        "a STORE's lease is read only with its folded ASK (layer._admit answers it only "
        "when ask is set): with ask 0 no one reads it",
    ("miyamoto/replicas/effects.py", "n: int = 0", "0 -> 1"):
        "Ready.n is read only for a Folded, whose answer always names n (_fold's round, 0 "
        "when it does not fold): the default is never read",
    ("miyamoto/replicas/messages.py",
     "return a.verdict in (ENDED, REHOMED) or (a.verdict == SAME and a.reruns > 0)",
     "and -> or"):
        "news_of_an_end only spares the layer a journal read: an answer it lets through "
        "as well (same of run 0, or another verdict with a run) reaches the machine with "
        "the ended copy, and _stale_end acts only on rehomed, ended with a later run and "
        "same with a later run, so it gives no effect",
    ("miyamoto/definitions/sync.py", "self._writes.pop(wid, None)", "drop the call"):
        "the write's Finished pops its waiter anyway, and the machine finishes every "
        "write by its deadline: a timed-out waiter stays a few seconds longer, unread",
})

LOG_NAMES = {"log", "logger", "logging", "_warn", "warnings"}


# engine, delivery and cluster (kept apart from the entries above)
_EXPIRY_COMPACT = ("the expiry heap's compaction threshold is a memory/time trade-off: "
                   "stale entries are skipped by next_at whenever it is rebuilt, so every "
                   "next_at and pop_due stays exact (test_engine_expiry.py)")
_CLASHES = ("JoinLog.clashes is read by nothing (no metric, no view, no log): only the "
            "log lines show a clash, and those are tested")
_URL_CACHE = ("which URLs the client keeps split (a cache of at most ~0.5 MB): a URL not "
              "kept is split again, to the same parts")
_ONE_PAST = ("only whether more than BULK_MAX rows came is read (``more``) and the first "
             "BULK_MAX are taken: one row past it or two says the same")
_FOUND = ("_at and the lines' entries hold the same (seq, id) pairs (note inserts both, "
          "remove drops both), so the copy's entry is always found at i < len(entries): "
          "the guard is never false")
EQUIVALENT.update({
    ("miyamoto/engine/window.py", "CACHE_MAX = 4096     # recently read copies outside the "
     "window", "4096 -> 4097"):
        "how many copies read from outside the window are kept in memory: a miss reads "
        "the same copy from the journal",
    ("miyamoto/engine/engine.py", "NAMES_MAX = 100_000  # name reservations remembered in "
     "memory; the journal has them all", "100000 -> 100001"):
        "how many name reservations memory keeps: name_holder asks the journal's index "
        "for one it forgot, and gets the same answer",
    ("miyamoto/engine/engine.py", '"response": t.last}, ensure_ascii=False)',
     "False -> True"):
        "a callback's JSON body with non-ASCII text as \\u escapes or as UTF-8: both "
        "decode to the same values, no receiver's JSON parser can tell",
    **{("miyamoto/engine/engine.py", "ended += 1", how):
       "purge reads ended only as zero or not (the page ended nothing: done), and a count "
       "of 2 a copy or of -1 is as non-zero; the count it returns is first's"
       for how in ("1 -> 2", "+= -> -=")},
    ("miyamoto/engine/expiry.py", "COMPACT_MIN = 1024  # entries before a rebuild is worth "
     "it", "1024 -> 1025"): _EXPIRY_COMPACT,
    ("miyamoto/engine/expiry.py",
     "if len(self._heap) > COMPACT_MIN and len(self._heap) > 2 * len(self._at):",
     "> -> >="): _EXPIRY_COMPACT,
    ("miyamoto/engine/expiry.py", "return False", "return None"):
        "Expiries.add's answer is only used as a condition (Engine._expires): None and "
        "False are both false",
    ("miyamoto/delivery/identity.py",
     'canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), '
     'sort_keys=True)', "True -> False"):
        "the members are listed in sorted order already (e, kty, n; crv, kty, x, y), so "
        "the dict is built sorted: RFC 7638's order either way (test_the_kid_is_the_"
        "rfc7638_thumbprint)",
    ("miyamoto/delivery/httpclient.py", "MAX_URLS, MAX_URL_KEPT = 1024, 512  # URLs kept "
     "split (a task's target repeats), <= 0.5 MB", "512 -> 513"): _URL_CACHE,
    ("miyamoto/delivery/httpclient.py", "MAX_URLS, MAX_URL_KEPT = 1024, 512  # URLs kept "
     "split (a task's target repeats), <= 0.5 MB", "1024 -> 1025"): _URL_CACHE,
    ("miyamoto/delivery/httpclient.py", "if len(self._urls) >= MAX_URLS:", ">= -> >"):
        _URL_CACHE,
    ("miyamoto/delivery/httpclient.py", "if reads > 1:", "> -> >="):
        "after a single read the socket's timeout was never changed: it is the origin's "
        "(connect set it), so setting it again changes nothing",
    ("miyamoto/delivery/httpclient.py", "if left <= 0:", "<= -> <"):
        "left is exactly 0.0 only when a clock reading lands on the deadline; a 0 s timer "
        "then throws the same socket.timeout on the loop's next turn (an answer landing "
        "within that very turn is a race of no width)",
    ("miyamoto/delivery/httpclient.py", "return False", "return None"):
        "_alive is only used as a condition (checkout): None and False are both false",
    ("miyamoto/delivery/targets.py", "if key != self._index[0]:", "0 -> 1"):
        "the endpoint index is then rebuilt at every check instead of when the endpoints "
        "change: the same index, the same answers (its literal cache is cleared with it)",
    ("miyamoto/delivery/egress.py",
     r'status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")', "1 -> 2"):
        "split's first part is the same however many splits follow it",
    ("miyamoto/cluster/queries.py", '"running": 2,', "2 -> 3"):
        "only the ranks' order is read (max and >): scheduled 1 < running 3 < ended 4 "
        "keeps it",
    ("miyamoto/cluster/queries.py", '_ORDER = {"deleted": 5, "succeeded": 4, "failed": 4, '
     '"cancelled": 4, "expired": 4,', "5 -> 6"):
        "only the ranks' order is read (max and >): deleted 6 stays above every other",
    ("miyamoto/cluster/queries.py", "copies = self.engine.journal.list(queue, "
     "State.FAILED.value, BULK_MAX + 1)", "1 -> 2"): _ONE_PAST,
    ("miyamoto/cluster/queries.py", 'copies = self.engine.journal.list(queue, f["state"], '
     "BULK_MAX + 1)", "1 -> 2"): _ONE_PAST,
    ("miyamoto/cluster/queries.py", "and (since is None or (t.finished or 0.0) >= since)",
     "0.0 -> 1.0"):
        "an ended copy always has its end time; and since is a unix time (far above 1), "
        "0 or absent: a copy without one falls on the same side of it at 0.0 or 1.0",
    ("miyamoto/cluster/queries.py", 'out = sorted(seen.values(), key=lambda s: s.get('
     '"next_attempt") or s.get("finished") or 0)', "0 -> 1"):
        "the list is of one state: scheduled copies all have next_attempt, ended ones all "
        "have finished, running ones neither (all keyed 0, or all 1: a stable sort keeps "
        "their order either way)",
    ("miyamoto/cluster/layer.py", "self.carry_out(rest)", "drop the call"):
        "a folded ASK is a fresh task's copy 0 asking with its STOREs (Coordinator.store "
        "folds only a new local copy 0 due at once), and the copy it asks about is the one "
        "just admitted from that STORE (a repeat is answered STORED before any fold): "
        "_on_ask's only answer is then the Send of its go/claimed/wait, folded; nothing is "
        "left in rest",
    ("miyamoto/engine/ordering.py", "high: int = 0  # the highest seq given or held",
     "0 -> 1"):
        "next_seq takes max(high + 1, the clock in microseconds): a line's first seq is the "
        "clock's (~1.7e15) whether a fresh line's high is 0 or 1; seqs are only compared "
        "with each other, so even a clock at 0 (1 or 2 first, counting up) orders alike",
    **{("miyamoto/engine/ordering.py", "if i < len(line.entries) and line.entries[i] == "
        "(seq, task_id):", how): _FOUND for how in ("< -> <=", "and -> or")},
    ("miyamoto/cluster/joinlog.py", "self.clashes = 0  # membership messages from another "
     "node with our id", "0 -> 1"): _CLASHES,
    ("miyamoto/cluster/joinlog.py", "self.clashes += 1", "+= -> -="): _CLASHES,
    ("miyamoto/cluster/joinlog.py", "self.clashes += 1", "1 -> 2"): _CLASHES,
})


# ---------------------------------------------------------------- mutants


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the repo
    start: tuple[int, int]  # (line, byte column) of the replaced span
    end: tuple[int, int]
    text: str  # what replaces the span
    what: str  # a short description
    line: str  # the original source line, stripped

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.line, self.what)

    def where(self) -> str:
        return f"{self.path}:{self.start[0]}"


_CMP_FLIPS: dict[type, list[type]] = {
    ast.Lt: [ast.LtE, ast.Gt], ast.LtE: [ast.Lt, ast.GtE], ast.Gt: [ast.GtE, ast.Lt],
    ast.GtE: [ast.Gt, ast.LtE], ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq],
    ast.In: [ast.NotIn], ast.NotIn: [ast.In], ast.Is: [ast.IsNot], ast.IsNot: [ast.Is],
}
_BIN_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
    ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr,
}
_SYM = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
        ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+",
        ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
        ast.Pow: "**", ast.BitOr: "|", ast.BitAnd: "&", ast.And: "and", ast.Or: "or"}


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node), mode="eval").body if isinstance(node, ast.expr) \
        else ast.parse(ast.unparse(node)).body[0]


def _is_log_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    while isinstance(f, ast.Attribute):
        if f.attr in LOG_NAMES:
            return True
        f = f.value
    return isinstance(f, ast.Name) and f.id in LOG_NAMES or \
        isinstance(f, ast.Name) and f.id == "print"


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or \
        isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))


class _Finder:
    """Walks a module and yields (node, replacement text, description)."""

    def __init__(self, source: bytes):
        self.source = source

    def find(self, tree: ast.Module) -> Iterator[tuple[ast.AST, str, str]]:
        yield from self._visit(tree)

    # nodes whose subtrees are never mutated
    def _skipped(self, node: ast.AST) -> bool:
        return isinstance(node, ast.JoinedStr) or _is_log_call(node) or \
            isinstance(node, ast.Expr) and (isinstance(node.value, ast.Constant)  # docstrings
                                            or _is_log_call(node.value))

    def _visit(self, node: ast.AST) -> Iterator[tuple[ast.AST, str, str]]:
        if self._skipped(node):
            return
        yield from self._here(node)
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "decorator_list", "type_comment"):
                continue
            if isinstance(node, ast.AnnAssign) and name == "target":
                continue
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, ast.AST):
                    yield from self._visit(child)

    def _here(self, node: ast.AST) -> Iterator[tuple[ast.AST, str, str]]:
        expr = lambda n: "(" + ast.unparse(n) + ")"  # noqa: E731
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                for new in _CMP_FLIPS.get(type(op), []):
                    m = _copy(node)
                    m.ops[i] = new()
                    yield node, expr(m), f"{_SYM[type(op)]} -> {_SYM[new]}"
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAPS \
                and not (_is_str(node.left) or _is_str(node.right)):
            new = _BIN_SWAPS[type(node.op)]
            m = _copy(node)
            m.op = new()
            yield node, expr(m), f"{_SYM[type(node.op)]} -> {_SYM[new]}"
        elif isinstance(node, ast.BoolOp):
            m = _copy(node)
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            m.op = new()
            yield node, expr(m), f"{_SYM[type(node.op)]} -> {_SYM[new]}"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            yield node, expr(node.operand), "drop " + ("not" if isinstance(node.op, ast.Not)
                                                       else "unary -")
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            v = node.value
            new = v + 1 if isinstance(v, int) else (1.0 if v == 0 else v * 2)
            yield node, repr(new), f"{v!r} -> {new!r}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, repr(not node.value), f"{node.value} -> {not node.value}"
        elif isinstance(node, ast.IfExp):
            m = _copy(node)
            m.test = ast.UnaryOp(ast.Not(), m.test)
            yield node, expr(m), "negate the condition"
        elif isinstance(node, (ast.If, ast.While)):
            t = node.test
            yield t, "not (" + ast.unparse(t) + ")", f"negate the {type(node).__name__.lower()}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("min", "max"):
            new = "max" if node.func.id == "min" else "min"
            yield node.func, new, f"{node.func.id} -> {new}"
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BIN_SWAPS:
            new = _BIN_SWAPS[type(node.op)]
            m = _copy(node)
            m.op = new()
            yield node, ast.unparse(m), f"{_SYM[type(node.op)]}= -> {_SYM[new]}="
        elif isinstance(node, ast.Expr) and isinstance(node.value, (ast.Call, ast.Await)):
            yield node, "pass", "drop the call"
        elif isinstance(node, ast.Raise):
            yield node, "pass", "drop the raise"
        elif isinstance(node, ast.Return) and node.value is not None and \
                not (isinstance(node.value, ast.Constant) and node.value.value is None):
            yield node, "return None", "return None"
        elif isinstance(node, ast.Break):
            yield node, "continue", "break -> continue"
        elif isinstance(node, ast.Continue):
            yield node, "break", "continue -> break"


def mutants_of(path: str, root: Path) -> list[Mutant]:
    source = (root / path).read_bytes()
    tree = ast.parse(source)
    lines = source.split(b"\n")
    out: list[Mutant] = []
    seen: set[tuple] = set()
    for node, text, what in _Finder(source).find(tree):
        start = (node.lineno, node.col_offset)
        end = (node.end_lineno, node.end_col_offset)
        k = (start, end, text)
        if k in seen:
            continue
        seen.add(k)
        line = lines[node.lineno - 1].decode("utf-8", "replace").strip()
        out.append(Mutant(path, start, end, text, what, line))
    return out


def apply(source: bytes, m: Mutant) -> bytes:
    lines = source.split(b"\n")
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln) + 1)
    a = offsets[m.start[0] - 1] + m.start[1]
    b = offsets[m.end[0] - 1] + m.end[1]
    new = source[:a] + m.text.encode() + source[b:]
    ast.parse(new)  # a mutant must still compile
    return new


# ---------------------------------------------------------------- the tree copy


def copy_tree(dest: Path) -> None:
    """Tracked files plus working-tree changes (untracked, not ignored, too)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], cwd=REPO, capture_output=True,
                               check=True).stdout.split(b"\0")
        files = [n.decode() for n in names if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: copy everything
        files = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
                 and not {".git", ".venv", "__pycache__"} & set(p.relative_to(REPO).parts)]
    for name in files:
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


# ---------------------------------------------------------------- running tests


class Runner:
    def __init__(self, root: Path, fork: bool):
        self.root = root
        self.fork = fork and hasattr(os, "fork")
        self.env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1",
                        PYTHONHASHSEED="0")
        self.env.pop("PYTEST_ADDOPTS", None)
        if self.fork:
            # what every test run imports, loaded once; never the package under test
            for mod in ("pytest", "gevent", "gevent.pool", "gevent.event", "hypothesis",
                        "zmq", "ujson", "requests", "sqlite3", "email.utils", "hmac",
                        "geventhttpclient"):
                try:
                    __import__(mod)
                except ImportError:
                    pass
            assert not any(k == "miyamoto" or k.startswith("miyamoto.") for k in sys.modules)
            # the test runs share compiled modules (a run took ~1.5 s longer compiling the
            # package afresh), kept inside the copy; the mutated module's is dropped before
            # each run (``forget``), so a mutant is never run from an older one's bytecode
            sys.dont_write_bytecode = False
            sys.pycache_prefix = str(root / ".mutate-pycache")

    def forget(self, module: str) -> None:
        """Drop the compiled copy of ``module`` (its source was just rewritten)."""
        if self.fork:
            try:
                os.remove(importlib.util.cache_from_source(str(self.root / module)))
            except FileNotFoundError:
                pass

    def run(self, args: list[str], timeout: float) -> tuple[str, float]:
        """'passed', 'failed' or 'timeout', and the seconds it took."""
        full = ["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                f"--timeout={max(5, int(timeout))}", *args]
        t0 = time.monotonic()
        if self.fork:
            result = self._run_forked(full, timeout)
        else:
            result = self._run_process(full, timeout)
        return result, time.monotonic() - t0

    def _run_process(self, args: list[str], timeout: float) -> str:
        try:
            p = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=self.root,
                               env=self.env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=timeout,
                               start_new_session=True)
        except subprocess.TimeoutExpired:
            return "timeout"
        return _state(p.returncode)

    def _run_forked(self, args: list[str], timeout: float) -> str:
        pid = os.fork()
        if pid == 0:  # the child: run the tests against the copy, then exit at once
            code = 3
            try:
                os.setsid()
                os.chdir(self.root)
                os.environ.clear()
                os.environ.update(self.env)
                sys.path.insert(0, str(self.root))
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                import pytest

                code = int(pytest.main(args))
            finally:
                os._exit(code)
        deadline = time.monotonic() + timeout
        try:
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return _state(os.waitstatus_to_exitcode(status))
                if time.monotonic() > deadline:
                    _kill(pid)
                    return "timeout"
                time.sleep(0.02)
        except BaseException:  # Ctrl-C or SIGTERM: take the test run down with us
            _kill(pid)
            raise


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _brief(args: list[str]) -> str:
    return " ".join(args) if len(args) <= 4 else f"{' '.join(args[:2])} (+{len(args) - 2} more)"


def _state(code: int) -> str:
    # pytest's exit codes: 0 all passed, 5 no test collected (a -k that selects none)
    return {0: "passed", 5: "empty"}.get(code, "failed")


def test_args(module: str, root: Path) -> list[list[str]]:
    """The module's test runs whose test files exist."""
    return [g for g in MODULES[module] if (root / g[0].split("::")[0]).exists()]


# ---------------------------------------------------------------- main


def package_of(module: str) -> str:
    """'miyamoto/replicas/siblings.py' -> 'replicas'; a top-level module -> 'top'."""
    parts = Path(module).parts
    return parts[1] if len(parts) > 2 else "top"


def packages() -> list[str]:
    """The packages with a module in MODULES, in MODULES order."""
    return list(dict.fromkeys(package_of(m) for m in MODULES))


def unlisted(root: Path) -> list[str]:
    """Modules under miyamoto/ in neither MODULES nor UNCOVERED (nor TRIVIAL)."""
    found = sorted(str(p.relative_to(root)) for p in (root / "miyamoto").rglob("*.py"))
    return [m for m in found if m not in MODULES and m not in UNCOVERED
            and Path(m).name not in TRIVIAL]


def stale_equivalents(root: Path) -> list[tuple[str, str, str]]:
    """EQUIVALENT keys that no mutant of today's source has (the line or mutation changed)."""
    keys: dict[str, set[tuple[str, str, str]]] = {}
    for key in EQUIVALENT:
        keys.setdefault(key[0], set()).add(key)
    stale = []
    for module, wanted in keys.items():
        have = {m.key for m in mutants_of(module, root)} if (root / module).exists() else set()
        stale += sorted(wanted - have)
    return stale


def _warn_about_the_tables(root: Path, selected: list[str], by_package: bool) -> None:
    for module, line, what in stale_equivalents(root):
        print(f"warning: EQUIVALENT entry matches no mutant any more: {module}: "
              f"{what!r} on {line!r}")
    for module in unlisted(root):
        print(f"warning: {module} is in neither MODULES nor UNCOVERED")
    chosen = {package_of(m) for m in selected}
    left = {m: why for m, why in UNCOVERED.items() if package_of(m) in chosen and by_package}
    if left:
        print("== not mutated (UNCOVERED):")
        for module, why in left.items():
            print(f"  {module}: {why}")


def _select(ap: argparse.ArgumentParser, opts: argparse.Namespace) -> list[str]:
    """The modules -m, -p and --all name, in MODULES order (every module by default)."""
    if not (opts.module or opts.package or opts.all):
        return list(MODULES)
    wanted: list[str] = []
    for w in opts.module or []:
        hits = [m for m in MODULES if m == w or Path(m).stem == w
                or m == f"miyamoto/{w}.py" or m == f"miyamoto/{w}"]
        if not hits:
            ap.error(f"no module {w!r} in MODULES ({', '.join(Path(m).stem for m in MODULES)})")
        wanted += hits
    names = packages() if opts.all else opts.package or []
    for name in names:
        hits = [m for m in MODULES if package_of(m) == name]
        if not hits:
            ap.error(f"no package {name!r} in MODULES ({', '.join(packages())})")
        wanted += hits
    return list(dict.fromkeys(wanted))


def _parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--module", action="append",
                    help="a module to mutate (name or path; default: every one in MODULES)")
    ap.add_argument("-p", "--package", action="append",
                    help="every module of this package (e.g. replicas; 'top' for "
                         "miyamoto/*.py); the budget is split between packages")
    ap.add_argument("--all", action="store_true",
                    help="every package in turn, each with its share of the budget")
    ap.add_argument("--budget", type=float, default=1800.0, help="seconds for the whole run")
    ap.add_argument("--max-mutants", type=int, default=400, help="per module; more are sampled")
    ap.add_argument("--timeout-factor", type=float, default=4.0,
                    help="a test run may take this many times the unmutated run (+5 s)")
    ap.add_argument("--no-fork", action="store_true", help="a fresh interpreter per test run")
    ap.add_argument("--list", action="store_true", help="list the mutants and stop")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--line", type=int, action="append",
                    help="only the mutants on this line (to re-check survivors)")
    return ap, ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ap, opts = _parse(argv)
    modules = _select(ap, opts)
    by_package = bool(opts.package or opts.all)
    # Ctrl-C and SIGTERM (also when started in the background, where SIGINT is ignored)
    # end the run cleanly: the copy is removed, the results so far are printed
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    deadline = started + opts.budget
    tmp = Path(tempfile.mkdtemp(prefix="miyamoto-mutate-"))
    results: dict[str, dict[str, list[Mutant]]] = {}
    try:
        copy_tree(tmp)
        _warn_about_the_tables(tmp, modules, by_package)
        runner = Runner(tmp, fork=not opts.no_fork) if not opts.list else None
        if by_package:
            groups = {p: [m for m in modules if package_of(m) == p]
                      for p in dict.fromkeys(package_of(m) for m in modules)}
            for i, (name, mods) in enumerate(groups.items()):
                # an equal share of what is left: a package that ends early hands its rest on
                share = (deadline - time.monotonic()) / (len(groups) - i)
                mine = _run_modules(mods, tmp, runner, opts, time.monotonic() + share,
                                    results, split=True)
                if not opts.list:
                    _print_package(name, mine)
        else:
            _run_modules(modules, tmp, runner, opts, deadline, results, split=False)
    except KeyboardInterrupt:
        print("\ninterrupted: the results so far")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if opts.list:
        return 0
    return report(results, time.monotonic() - started, by_package)


def _run_modules(modules: list[str], tmp: Path, runner: Runner | None,
                 opts: argparse.Namespace, deadline: float,
                 results: dict[str, dict[str, list[Mutant]]],
                 split: bool) -> dict[str, dict[str, list[Mutant]]]:
    """Mutate each module in turn until the deadline; with split, each module gets an
    equal share of the time left (one that ends early hands its rest on)."""
    mine: dict[str, dict[str, list[Mutant]]] = {}
    for i, module in enumerate(modules):
        until = time.monotonic() + (deadline - time.monotonic()) / (len(modules) - i) \
            if split else deadline
        res = mutate_module(module, tmp, runner, opts, until)
        if res is not None:
            results[module] = mine[module] = res
    return mine


def _prepare(module: str, tmp: Path, opts: argparse.Namespace) -> list[Mutant] | None:
    """The module's mutants (sampled, or only --line's), or None when it cannot be run."""
    if not (tmp / module).exists():
        print(f"== {module}: not in this tree, skipped")
        return None
    if not test_args(module, tmp):
        print(f"== {module}: no covering test file exists, skipped")
        return None
    mutants = mutants_of(module, tmp)
    if opts.line:
        mutants = [m for m in mutants if m.start[0] in opts.line]
    if len(mutants) > opts.max_mutants:
        mutants = sorted(random.Random(opts.seed).sample(mutants, opts.max_mutants),
                         key=lambda m: m.start)
    return mutants


def _baseline(module: str, groups: list[list[str]], runner: Runner) -> list[float] | None:
    """Each run's unmutated time (runs that select no test are dropped from groups), or
    None when the unmutated tests do not pass."""
    base_times = []
    for g in list(groups):
        state, took = runner.run(g, timeout=600)
        if state == "empty":
            groups.remove(g)
            continue
        if state != "passed":
            print(f"== {module}: the unmutated tests do not pass ({' '.join(g)}): skipped")
            return None
        base_times.append(took)
    return base_times


def mutate_module(module: str, tmp: Path, runner: Runner | None, opts: argparse.Namespace,
                  deadline: float) -> dict[str, list[Mutant]] | None:
    """Run the module's mutants until the deadline; the buckets, or None if not run."""
    mutants = _prepare(module, tmp, opts)
    if mutants is None:
        return None
    if opts.list or runner is None:
        print(f"== {module}: {len(mutants)} mutants")
        for m in mutants:
            print(f"  {m.where()}: {m.what}    | {m.line}")
        return None
    groups = test_args(module, tmp)
    base_times = _baseline(module, groups, runner)
    if base_times is None or not groups:
        return None
    print(f"== {module}: {len(mutants)} mutants; tests: "
          f"{' ; '.join(_brief(g) for g in groups)} "
          f"(unmutated: {sum(base_times):.1f} s)", flush=True)
    res: dict[str, list[Mutant]] = {"killed": [], "timeout": [], "survived": [],
                                    "equivalent": [], "untested": [], "invalid": []}
    original = (tmp / module).read_bytes()
    try:
        for m in mutants:
            if time.monotonic() > deadline:
                res["untested"].append(m)
                continue
            try:
                (tmp / module).write_bytes(apply(original, m))
                runner.forget(module)
            except SyntaxError:
                res["invalid"].append(m)
                continue
            bucket = _judge(m, groups, base_times, runner, opts.timeout_factor)
            res[bucket].append(m)
            print({"killed": ".", "timeout": "T", "survived": "S", "equivalent": "e"}[bucket],
                  end="", flush=True)
    finally:
        (tmp / module).write_bytes(original)
        runner.forget(module)
        print()
    return res


def _judge(m: Mutant, groups: list[list[str]], base_times: list[float], runner: Runner,
           factor: float) -> str:
    """'killed', 'timeout', 'survived' or 'equivalent' for the mutant now in the copy."""
    state = "passed"
    for g, base in zip(groups, base_times):
        state, _ = runner.run(g, timeout=base * factor + 5)
        if state != "passed":
            break
    if state == "passed":
        return "equivalent" if m.key in EQUIVALENT else "survived"
    return "killed" if state == "failed" else "timeout"


def _counts(results: dict[str, dict[str, list[Mutant]]]) -> tuple[int, int, int, int]:
    """(mutants run, killed incl. timed out, survivors, equivalent) over the results."""
    k = sum(len(r["killed"]) + len(r["timeout"]) for r in results.values())
    s = sum(len(r["survived"]) for r in results.values())
    e = sum(len(r["equivalent"]) for r in results.values())
    return k + s + e, k, s, e


def _pct(k: int, s: int) -> str:
    return f"{100.0 * k / (k + s):5.1f} %" if k + s else "  n/a  "


def _print_package(name: str, mine: dict[str, dict[str, list[Mutant]]]) -> None:
    n, k, s, e = _counts(mine)
    left = sum(len(r["untested"]) for r in mine.values())
    print(f"== package {name}: {_pct(k, s)}  {k}/{k + s} killed, {s} survivors, "
          f"{e} equivalent" + (f", {left} not run (budget)" if left else ""), flush=True)


def _package_table(results: dict[str, dict[str, list[Mutant]]]) -> None:
    print(f"\n== packages\n{'package':12s} {'mutants':>7s} {'killed':>6s} {'survivors':>9s} "
          f"{'score':>7s}")
    for name in dict.fromkeys(package_of(m) for m in results):
        n, k, s, _ = _counts({m: r for m, r in results.items() if package_of(m) == name})
        print(f"{name:12s} {n:7d} {k:6d} {s:9d} {_pct(k, s)}")
    n, k, s, _ = _counts(results)
    print(f"{'all':12s} {n:7d} {k:6d} {s:9d} {_pct(k, s)}")


def report(results: dict[str, dict[str, list[Mutant]]], took: float,
           by_package: bool = False) -> int:
    print(f"\n== score (killed + timed out) / (mutants run - equivalent), in {took:.0f} s")
    total_k = total_n = 0
    for module, res in results.items():
        k = len(res["killed"]) + len(res["timeout"])
        n = k + len(res["survived"])
        total_k += k
        total_n += n
        extra = []
        if res["equivalent"]:
            extra.append(f"{len(res['equivalent'])} equivalent")
        if res["timeout"]:
            extra.append(f"{len(res['timeout'])} by timeout")
        if res["untested"]:
            extra.append(f"{len(res['untested'])} not run (budget)")
        if res["invalid"]:
            extra.append(f"{len(res['invalid'])} did not compile")
        score = f"{100.0 * k / n:5.1f} %" if n else "  n/a  "
        print(f"{module:28s} {score}  {k}/{n}" + (f"  ({', '.join(extra)})" if extra else ""))
    if total_n:
        print(f"{'all':28s} {100.0 * total_k / total_n:5.1f} %  {total_k}/{total_n}")
    if by_package:
        _package_table(results)
    survivors = [m for res in results.values() for m in res["survived"]]
    if survivors:
        print("\n== survivors")
        for m in survivors:
            print(f"{m.where()}: {m.what}    | {m.line}")
    equivalent = [m for res in results.values() for m in res["equivalent"]]
    if equivalent:
        print("\n== equivalent (not scored)")
        for m in equivalent:
            print(f"{m.where()}: {m.what}    | {m.line}\n    {EQUIVALENT[m.key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The circuit breakers in /metrics (``metrics.NodeCollector`` yields these).

Labels stay a bounded set: at most ``MAX_TARGET_LABELS`` origins, the open and half-open
ones first, then the most recently attempted; an origin is ``scheme://host:port``, never
a path or a query (a URL carries no credentials: ``validate`` refuses them).
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from miyamoto.delivery.breaker import BreakerState

MAX_TARGET_LABELS = 100


def breaker_metrics(dispatcher: Any) -> Iterator[Metric]:
    breakers = dispatcher.breakers
    items = list(reversed(breakers.items()))  # most recent first
    items.sort(key=lambda kv: kv[1].state is BreakerState.CLOSED)  # stable: not closed first
    fam = GaugeMetricFamily("miyamoto_target_breaker_state", "1 for a target origin's "
                            "circuit breaker state (the origins attempted recently, not "
                            f"closed first, at most {MAX_TARGET_LABELS})",
                            labels=["origin", "state"])
    for origin, b in items[:MAX_TARGET_LABELS]:
        for state in BreakerState:
            fam.add_metric([origin, state.value], int(b.state is state))
    yield fam
    counts = GaugeMetricFamily("miyamoto_target_breakers", "target origins known to this "
                               "node by breaker state", labels=["state"])
    for state in BreakerState:
        counts.add_metric([state.value], sum(1 for _, b in items if b.state is state))
    yield counts
    yield CounterMetricFamily("miyamoto_target_breaker_opens", "times a target's circuit "
                              "breaker opened (or reopened after a failed probe)",
                              value=breakers.opens)

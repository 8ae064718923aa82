"""The benchmark's latency distribution as a PNG (``bench.py --plot FILE``).

matplotlib is an optional extra (``pip install -e '.[plot]'``): ``require()`` is called
while the options are checked, so a missing matplotlib is a usage error (exit 2) before
any node is started, not a crash after a long run. The figure has two panels over the
same samples, enqueue request start -> first delivery at the sink: a histogram (where
most tasks are) and a CDF on a log axis (the tail, with p50/p99/max marked), titled with
the run's parameters so that a PNG read later still says what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .fastload import Load, percentile
from .fastsink import Sink

INSTALL_HINT = "pip install 'matplotlib>=3.8' (or: pip install -e '.[plot]')"


class PlotUnavailable(RuntimeError):
    """matplotlib cannot be imported."""


def require() -> None:
    """Raise PlotUnavailable (with the install hint) unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise PlotUnavailable(f"--plot needs matplotlib ({e}); {INSTALL_HINT}") from None


def latency_samples(sink: Sink, load: Load) -> list[float]:
    """Seconds from each acknowledged enqueue's start to its first delivery (the
    ``latency_ms`` of fastload.delivery_report, every sample rather than a summary)."""
    first_at = sink.stats.first_at
    return [first_at[str(s)] - load.send_at[s] for s in load.acked_seqs() if str(s) in first_at]


def title(report: Mapping[str, Any]) -> str:
    """The run's parameters, as the bench's result line has them."""
    parts = [f"{report.get('mode')}", f"{report.get('tasks')} tasks",
             f"{report.get('nodes')} node(s)"]
    if report.get("replication") is not None:
        parts.append(f"replication {report['replication']}")
    if report.get("journal"):
        parts.append(f"{report['journal']} journal")
    parts.append(f"{report.get('connections')} connections")
    if report.get("paced_rate") is not None:
        parts.append(f"paced {report['paced_rate']:g}/s")
    return "Miyamoto bench: " + ", ".join(parts)


def write_png(path: str, seconds: Sequence[float], report: Mapping[str, Any]) -> None:
    """Histogram and CDF of ``seconds`` (as ms) to the PNG at ``path``."""
    require()
    import matplotlib

    matplotlib.use("Agg")  # no display; the bench may run over ssh or in CI
    import matplotlib.pyplot as plt

    ms = sorted(s * 1000.0 for s in seconds)
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(12, 4.8))
    try:
        fig.suptitle(title(report), fontsize=11)
        for ax in (hist, cdf):
            ax.set_xlabel("enqueue → first delivery latency (ms)")
            ax.grid(True, alpha=0.3)
        hist.set_ylabel("tasks")
        cdf.set_ylabel("fraction of delivered tasks")
        if not ms:
            for ax in (hist, cdf):
                ax.text(0.5, 0.5, "no deliveries", ha="center", va="center",
                        transform=ax.transAxes)
        else:
            _panels(hist, cdf, ms)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def _panels(hist: Any, cdf: Any, ms: list[float]) -> None:
    n = len(ms)
    hist.hist(ms, bins=min(100, max(10, n // 20)), color="tab:blue")
    hist.set_title(f"histogram ({n} deliveries)", fontsize=10)
    cdf.plot(ms, [(i + 1) / n for i in range(n)], color="tab:blue", drawstyle="steps-post")
    if ms[0] > 0 and ms[-1] > ms[0]:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        cdf.set_xscale("log")
        cdf.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        cdf.xaxis.set_minor_formatter(NullFormatter())
    cdf.set_ylim(0, 1.02)
    marks = (("p50", percentile(ms, 0.50)), ("p99", percentile(ms, 0.99)), ("max", ms[-1]))
    for (label, value), color in zip(marks, ("tab:green", "tab:orange", "tab:red")):
        cdf.axvline(value, color=color, linestyle="--", linewidth=1,
                    label=f"{label} {value:.2f} ms")
    cdf.legend(loc="lower right", fontsize=9)
    cdf.set_title("cumulative distribution", fontsize=10)

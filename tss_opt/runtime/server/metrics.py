"""Prometheus metrics of one server (its own registry: two servers in one process, as in the
tests, never share counters).

- ``tss_requests_total{endpoint, domain}``: requests served (domain ``none``: dense, no domain).
- ``tss_request_errors_total{status}``: requests refused or failed, by HTTP status.
- ``tss_requests_cancelled_total{endpoint}``: requests whose client left before the answer.
- ``tss_generated_tokens_total{domain}``: tokens generated (cancelled requests' included).
- ``tss_accept_length{domain}``: each request's accepted length (histogram).
- ``tss_queue_depth``: requests waiting for a place in the batch (not counting the rows decoding).
- ``tss_batch_size``: requests decoding now in the continuous batch.
- ``tss_batch_rows{skip_set}``: of those, how many run on each skip set (``"3,14"``;
  ``"dense"``: none); bounded by the mapping's entries.
- ``tss_request_latency_seconds{endpoint}``: arrival to last token (histogram).
- ``tss_mapping_reloads_total{result}``: mapping reloads (``ok`` / ``refused``).
- ``tss_connections_closed_total{reason}``: connections the server closed (``connections.py``).

Label values are bounded: a ``domain`` the mapping lacks counts as ``other`` (a
client chooses the string; each distinct one would be a new series).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "OTHER_DOMAIN", "ServerMetrics", "domain_label"]

ACCEPT_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0)


OTHER_DOMAIN = "other"


def domain_label(domain: str | None, known: Collection[str] = ()) -> str:
    """The metric label of a request's domain: ``none`` without one, the name when the
    mapping has it, else ``other``."""
    if not domain:
        return "none"
    return domain if domain in known else OTHER_DOMAIN


class ServerMetrics:
    """The server's counters, gauges and histograms.

    Args:
        queue_depth: Returns the number of waiting requests when scraped.
        known_domains: Returns the mapped domains (their own label; others count as ``other``).
        batch_size: Returns the number of decoding rows when scraped.
        rows_per_skip_set: Returns the decoding rows per skip set (``"3,14"``; ``""``: dense).
    """

    def __init__(
        self,
        queue_depth: Callable[[], int],
        known_domains: Callable[[], Collection[str]] = tuple,
        batch_size: Callable[[], int] = lambda: 0,
        rows_per_skip_set: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.known_domains = known_domains
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tss_requests", "Requests served", ["endpoint", "domain"], registry=r)
        self.errors = Counter("tss_request_errors", "Requests refused or failed, by HTTP status", ["status"], registry=r)
        self.tokens = Counter("tss_generated_tokens", "Tokens generated", ["domain"], registry=r)
        self.accept_length = Histogram(
            "tss_accept_length", "Accepted length per request (tokens per verification step)", ["domain"],
            buckets=ACCEPT_BUCKETS, registry=r,
        )
        self.queue_depth = Gauge("tss_queue_depth", "Requests waiting for the model", registry=r)
        self.queue_depth.set_function(lambda: float(queue_depth()))
        self.batch_size = Gauge("tss_batch_size", "Requests decoding now in the continuous batch", registry=r)
        self.batch_size.set_function(lambda: float(batch_size()))
        r.register(_RowsPerSkipSet(rows_per_skip_set))
        self.latency = Histogram(
            "tss_request_latency_seconds", "Seconds from arrival to the last token", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.reloads = Counter("tss_mapping_reloads", "Mapping file reloads", ["result"], registry=r)
        self.cancelled = Counter("tss_requests_cancelled", "Requests whose client left before the answer", ["endpoint"], registry=r)
        self.connections_closed = Counter(
            "tss_connections_closed", "Connections the server closed: deadlines, eviction, refusal", ["reason"], registry=r,
        )

    def label(self, domain: str | None) -> str:
        return domain_label(domain, self.known_domains())

    def served(self, endpoint: str, domain: str | None, new_tokens: int, accept_length: float, seconds: float) -> None:
        d = self.label(domain)
        self.requests.labels(endpoint=endpoint, domain=d).inc()
        self.tokens.labels(domain=d).inc(new_tokens)
        self.accept_length.labels(domain=d).observe(accept_length)
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def cancelled_request(self, endpoint: str, domain: str | None, new_tokens: int) -> None:
        """A request its client left: counted, and the tokens it had generated."""
        self.cancelled.labels(endpoint=endpoint).inc()
        self.tokens.labels(domain=self.label(domain)).inc(new_tokens)

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)


class _RowsPerSkipSet:
    """``tss_batch_rows{skip_set}``, read from the scheduler when scraped (a custom collector:
    the skip sets in the batch come and go with the rows)."""

    def __init__(self, rows: Callable[[], Mapping[str, int]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("tss_batch_rows", "Requests decoding now, per skip set", labels=["skip_set"])
        for skip, n in sorted(self._rows().items()):
            g.add_metric([skip or "dense"], float(n))
        yield g

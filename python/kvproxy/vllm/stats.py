# SPDX-License-Identifier: BSD-3-Clause
"""Transfer statistics for vLLM's logging and Prometheus paths, fed from kvproxy completions.

Each worker counts into a :class:`KvproxyConnectorStats` as completions
arrive (prefill side: ``done``; decode side: ``landed`` and the load errors
it reports); vLLM collects them each step (``get_kv_connector_stats``),
aggregates the workers' and engines' objects, logs :meth:`reduce` and hands
the raw ``data`` to :class:`KvproxyPromMetrics`.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

from ._compat import KVConnectorPromMetrics, KVConnectorStats

__all__ = ["KvproxyConnectorStats", "KvproxyPromMetrics", "new_data"]

# Transfer times kept per interval (the rest are counted, not timed).
_MAX_SAMPLES = 4096
_COUNTERS = ("transfers", "bytes", "landed", "landed_bytes", "load_error_blocks", "requests_sent",
             "requests_received", "lease_expired", "fences")


def new_data() -> Dict[str, Any]:
    d: Dict[str, Any] = {k: 0 for k in _COUNTERS}
    d["failed"] = {}  # kvproxy status name (or the connector's code) -> transfers
    d["xfer_s"] = []  # submit -> done of ok transfers
    return d


class KvproxyConnectorStats(KVConnectorStats):
    """Counters of one interval. ``data`` keys:

    ``transfers``/``bytes``: transfers that ended ok on the prefill side and
    their payload; ``failed``: transfers that did not, by kvproxy status
    (``timeout``, ``peer``, ``remote``, ...) or the connector's code
    (``lease-expired``, ``peer-unknown``, ...); ``xfer_s``: submit-to-done
    seconds of ok transfers; ``landed``/``landed_bytes``: transfers that
    landed on the decode side; ``load_error_blocks``: blocks reported to vLLM
    as failed loads; ``requests_sent``/``requests_received``: requests
    finished on each side; ``lease_expired``: prefill requests released by
    the lease; ``fences``: decode requests given up through a kvproxyd fence.
    """

    def __init__(self, data: Dict[str, Any] | None = None) -> None:
        base = new_data()
        if data:
            for k, v in data.items():
                base[k] = copy.deepcopy(v)
        try:
            super().__init__(data=base)  # vLLM's dataclass
        except TypeError:  # pragma: no cover - a base without a data field
            super().__init__()
            self.data = base

    def reset(self) -> None:
        self.data = new_data()

    def clone_and_reset(self) -> "KvproxyConnectorStats":
        old = KvproxyConnectorStats(self.data)
        self.reset()
        return old

    def is_empty(self) -> bool:
        d = self.data
        return not any(d.get(k) for k in _COUNTERS) and not d.get("failed") and not d.get("xfer_s")

    def aggregate(self, other: Any) -> "KvproxyConnectorStats":
        od = getattr(other, "data", other) or {}
        for k in _COUNTERS:
            self.data[k] = self.data.get(k, 0) + int(od.get(k, 0))
        failed = self.data.setdefault("failed", {})
        for k, v in (od.get("failed") or {}).items():
            failed[k] = failed.get(k, 0) + int(v)
        xs = self.data.setdefault("xfer_s", [])
        xs.extend(od.get("xfer_s") or [])
        del xs[:-_MAX_SAMPLES]
        return self

    def reduce(self) -> Dict[str, Any]:
        d = self.data
        xs: List[float] = sorted(d.get("xfer_s") or [])
        n = int(d.get("transfers", 0))
        out: Dict[str, Any] = {
            "Num successful transfers": n,
            "Num failed transfers": sum((d.get("failed") or {}).values()),
            "Landed transfers": int(d.get("landed", 0)),
            "Load error blocks": int(d.get("load_error_blocks", 0)),
            "Lease expirations": int(d.get("lease_expired", 0)),
        }
        if xs:
            out["Avg xfer time (ms)"] = round(sum(xs) / len(xs) * 1e3, 3)
            out["P90 xfer time (ms)"] = round(xs[min(len(xs) - 1, int(len(xs) * 0.9))] * 1e3, 3)
        if n:
            out["Avg MB per transfer"] = round(int(d.get("bytes", 0)) / n / 1e6, 3)
        for k, v in sorted((d.get("failed") or {}).items()):
            out[f"Failed ({k})"] = v
        return out

    # Worker-side recording (the caller holds its own lock).
    def record_done(self, ok: bool, status: str, nbytes: int, seconds: float) -> None:
        if ok:
            self.data["transfers"] += 1
            self.data["bytes"] += nbytes
            xs = self.data["xfer_s"]
            if len(xs) < _MAX_SAMPLES:
                xs.append(seconds)
        else:
            self.record_failed(status)

    def record_failed(self, code: str, n: int = 1) -> None:
        f = self.data["failed"]
        f[code] = f.get(code, 0) + n

    def count(self, key: str, n: int = 1) -> None:
        self.data[key] = self.data.get(key, 0) + n


class KvproxyPromMetrics(KVConnectorPromMetrics):
    """vLLM's Prometheus hook: ``vllm:kvproxy_*`` counters and a transfer-time histogram."""

    def __init__(self, vllm_config: Any, metric_types: Dict[Any, Any], labelnames: List[str],
                 per_engine_labelvalues: Dict[int, List[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter_cls, hist_cls = self._classes(metric_types)
        self._labelnames = list(labelnames)
        self._engines = per_engine_labelvalues
        self._counters: Dict[str, Dict[int, Any]] = {}
        docs = {
            "transfers": "kvproxy transfers that ended ok (prefill side)",
            "bytes": "payload bytes of the ok transfers (prefill side)",
            "landed": "kvproxy transfers that landed (decode side)",
            "landed_bytes": "payload bytes that landed (decode side)",
            "load_error_blocks": "KV blocks reported to vLLM as failed loads (decode side)",
            "lease_expired": "prefill requests whose blocks the lease released",
            "fences": "decode requests given up through a kvproxyd fence",
        }
        for k, doc in docs.items():
            c = counter_cls(name=f"vllm:kvproxy_{k}", documentation=doc, labelnames=self._labelnames)
            self._counters[k] = {i: c.labels(*v) for i, v in per_engine_labelvalues.items()}
        self._failed = counter_cls(name="vllm:kvproxy_failed_transfers",
                                   documentation="kvproxy transfers that did not end ok, by status",
                                   labelnames=self._labelnames + ["status"])
        h = hist_cls(name="vllm:kvproxy_transfer_time_seconds",
                     documentation="submit to done of ok kvproxy transfers",
                     labelnames=self._labelnames,
                     buckets=[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30])
        self._hist = {i: h.labels(*v) for i, v in per_engine_labelvalues.items()}

    @staticmethod
    def _classes(metric_types: Dict[Any, Any]) -> Any:
        """The counter and histogram classes vLLM hands in (keyed by prometheus_client's)."""
        by_name = {getattr(k, "__name__", str(k)): v for k, v in metric_types.items()}
        return by_name["Counter"], by_name["Histogram"]

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        d = transfer_stats_data or {}
        for k, per in self._counters.items():
            v = int(d.get(k, 0) or 0)
            if v and engine_idx in per:
                per[engine_idx].inc(v)
        labels = self._engines.get(engine_idx)
        if labels is not None:
            for status, v in (d.get("failed") or {}).items():
                self._failed.labels(*labels, str(status)).inc(int(v))
        if engine_idx in self._hist:
            for s in d.get("xfer_s") or ():
                self._hist[engine_idx].observe(float(s))

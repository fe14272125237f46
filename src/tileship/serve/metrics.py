"""Prometheus metrics of a serving process, in a registry of their own (never the global one).

Request latency, load and warm-up are separate families so a slow load never shows up as
request latency. ``tileship_serve_compile_attempts`` reads ``tileship.runtime.nojit.attempts()`` at
scrape time, less its value when these metrics were created with the server (so only this server's loads, warm-ups and
requests count), and must stay 0: anything else means a call reached TileLang's JIT.

    tileship_requests_total{model,version,path,code}     requests answered (path: kernel|reference|mixed|none)
    tileship_request_seconds{model,version,path}         latency of answered inference requests
    tileship_fallbacks_total{model,version,reason}       calls served by the reference, by reason
    tileship_rejected_total{reason}                      requests refused before running (overloaded, timeout...)
                                                         and gRPC RPCs ended before their answer (``grpc_gate``:
                                                         request_not_received, deadline_exceeded, cancelled)
    tileship_inflight_requests                           inference requests admitted and not yet answered
    tileship_release_load_seconds / _warmup_seconds      duration of the last load / warm-up of the live release
    tileship_warmup_spec_seconds{spec}                   per specialization, the last warm-up of the live release
    tileship_release_load_failures_total{stage}          failed loads (stage: load|warmup)
    tileship_warmup_failures_total{model}                specializations whose warm-up call failed
    tileship_circuit_open_total{model,version}           kernels switched to the reference at serve time
    tileship_reloads_total{result}                       reloads: swapped|unchanged|failed
    tileship_ready                                       1 when /v2/health/ready says ready
    tileship_serve_compile_attempts                      compile attempts since this server was created
    tileship_release_info{release_id,kernel_revision,lock_digest,device}
    tileship_reference_calls_total / _seconds_total{operator,dtype,shape,reason}
                                                         reference calls by shape, read from the release's
                                                         telemetry at scrape time (serve.telemetry; top 20
                                                         shapes per operator, the rest as shape="other")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

#: 50 us .. 30 s: a CPU add answers in well under a millisecond, a large GEMM over HTTP in tens of ms.
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)


#: (model, version, path) label children ``ServeMetrics.answered`` keeps; past it, it forgets them all
ANSWERED_KEYS = 4096


class ServeMetrics:
    """All metrics of one app. ``render()`` gives the Prometheus text exposition."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, compile_attempts: Callable[[], float]) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._answered: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.requests = Counter("tileship_requests", "Inference requests answered",
                                ("model", "version", "path", "code"), registry=r)
        self.latency = Histogram("tileship_request_seconds",
                                 "Latency of answered inference requests (receive to response)",
                                 ("model", "version", "path"), buckets=LATENCY_BUCKETS, registry=r)
        self.fallbacks = Counter("tileship_fallbacks", "Calls served by the PyTorch reference, by reason",
                                 ("model", "version", "reason"), registry=r)
        self.rejected = Counter("tileship_rejected",
                                "Requests refused before or instead of running, and gRPC RPCs that ended unanswered",
                                ("reason",), registry=r)
        self.inflight = Gauge("tileship_inflight_requests",
                              "Inference requests admitted and not yet answered", registry=r)
        self.load_seconds = Gauge("tileship_release_load_seconds",
                                  "Seconds the last successful release load took (integrity, lock, dlopen)", registry=r)
        self.warmup_seconds = Gauge("tileship_release_warmup_seconds",
                                    "Seconds the last successful warm-up took (one call per specialization)",
                                    registry=r)
        self.warmup_spec_seconds = Gauge("tileship_warmup_spec_seconds",
                                         "Seconds each specialization's warm-up took in the live release's last "
                                         "warm-up (its call, the reference's, the comparison)", ("spec",), registry=r)
        self.load_failures = Counter("tileship_release_load_failures", "Release loads that failed, by stage",
                                     ("stage",), registry=r)
        self.warmup_failures = Counter("tileship_warmup_failures",
                                       "Specializations whose warm-up call raised or disagreed with the reference",
                                       ("model",), registry=r)
        self.circuit_open = Counter("tileship_circuit_open",
                                    "Specializations switched to the reference at serve time (raised or non-finite)",
                                    ("model", "version"), registry=r)
        self.reloads = Counter("tileship_reloads", "Reload requests by result", ("result",), registry=r)
        self.ready = Gauge("tileship_ready", "1 when the server reports ready", registry=r)
        self.compile_attempts = Gauge("tileship_serve_compile_attempts",
                                      "TileLang compile attempts since this server was created (must be 0)",
                                      registry=r)
        base = compile_attempts()  # this server's attempts, not those of earlier work in the process
        self.compile_attempts.set_function(lambda: compile_attempts() - base)
        self.info = Info("tileship_release", "The release being served", registry=r)
        self.info.info({"release_id": "none", "kernel_revision": "none", "lock_digest": "none", "device": "none",
                        "image_digest": "none", "release_image_digest": "none", "evidence_digest": "none",
                        "evidence": "none"})
        self.image_mismatch = Gauge("tileship_image_digest_mismatch",
                                    "1 when the image this server runs in (TILESHIP_IMAGE_DIGEST) is not the one the "
                                    "release's lock pins", registry=r)

    def answered(self, model: str, version: str, path: str, seconds: float) -> None:
        """One inference request answered 200: ``tileship_requests_total{code="200"}`` and its latency. The
        label children are kept (the hot path: ``labels()`` takes a lock and builds its key on every call);
        none of these series is ever removed, so a kept child is the registry's own."""
        key = (model, version, path)
        pair = self._answered.get(key)
        if pair is None:
            if len(self._answered) >= ANSWERED_KEYS:
                self._answered.clear()
            pair = self._answered[key] = (self.requests.labels(model, version, path, "200"),
                                          self.latency.labels(model, version, path))
        pair[0].inc()
        pair[1].observe(seconds)

    def set_release(self, release_id: str, kernel_revision: str, lock_digest: str, device: str,
                    image: Mapping[str, Any] | None = None, evidence: Any = None) -> None:
        """``image``: ``image_check`` of the release (the running and the pinned image digest);
        ``evidence``: the release's evidence seal (``Release.evidence_seal``: digest and state), so two
        servers of one release with different evidence are told apart."""
        image = image or {}
        self.info.info({"release_id": release_id, "kernel_revision": kernel_revision, "lock_digest": lock_digest,
                        "device": device, "image_digest": image.get("running") or "none",
                        "release_image_digest": image.get("pinned") or "none",
                        "evidence_digest": getattr(evidence, "label", "none"),
                        "evidence": getattr(evidence, "state", "none")})
        self.image_mismatch.set(1 if image.get("mismatch") else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)

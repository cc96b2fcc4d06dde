package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The gateway's metrics: requests to upstream MCP servers (the broker as
// their client), by provider, JSON-RPC method (or "discovery",
// "registration"), the upstream's protocol era and outcome.
//
//	credbroker_upstream_requests_total{provider,method,era,outcome}
//	credbroker_upstream_request_duration_seconds{provider,method,era,outcome}

// Outcomes of an upstream request (the outcome label).
const (
	UpstreamOK            = "ok"             // a result
	UpstreamInputRequired = "input_required" // the upstream asked the host for input
	UpstreamRPCError      = "rpc_error"      // a JSON-RPC error, relayed
	UpstreamUnauthorized  = "unauthorized"   // 401 after the one forced refresh
	UpstreamScope         = "insufficient_scope"
	UpstreamTimeout       = "timeout"
	UpstreamFailed        = "failed" // no usable answer: transport, oversize, not MCP
)

var upstreamOutcomes = []string{UpstreamOK, UpstreamInputRequired, UpstreamRPCError, UpstreamUnauthorized, UpstreamScope, UpstreamTimeout, UpstreamFailed}

var upstreamEras = []string{"none", "2026-07-28", "2025-11-25"}

var upstreamMethods = []string{"discovery", "registration", "server/discover", "initialize", "tools/list", "tools/call",
	"prompts/list", "prompts/get", "resources/list", "resources/read", "resources/templates/list", "completion/complete", "ping"}

type upstreamMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newUpstreamMetrics(reg *prometheus.Registry) *upstreamMetrics {
	m := &upstreamMetrics{
		requests: counterVec("credbroker_upstream_requests_total",
			"Requests to upstream MCP servers (the gateway), by provider, method, the upstream's era and outcome.", "provider", "method", "era", "outcome"),
		duration: histogramVec("credbroker_upstream_request_duration_seconds", providerBuckets,
			"Latency of requests to upstream MCP servers, by provider, method, the upstream's era and outcome.", "provider", "method", "era", "outcome"),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// Upstream records one request to an upstream MCP server: a relayed
// JSON-RPC method, or "discovery" or "registration" (the broker as the
// server's OAuth client; each recorded ok or failed). era is the
// upstream's protocol version, "" when there is none (discovery,
// registration, no session opened), recorded as "none"; versions other
// than 2026-07-28 and 2025-11-25, and outcomes other than the Upstream*
// ones, are recorded as "other". elapsed zero: not timed.
func (r *Recorder) Upstream(provider, method, era, outcome string, elapsed time.Duration) {
	if r == nil {
		return
	}
	p, m := r.provider(provider), bounded(method, upstreamMethods)
	if era == "" {
		era = "none"
	}
	e, o := bounded(era, upstreamEras), bounded(outcome, upstreamOutcomes)
	r.upstream.requests.WithLabelValues(p, m, e, o).Inc()
	if elapsed > 0 {
		r.upstream.duration.WithLabelValues(p, m, e, o).Observe(elapsed.Seconds())
	}
}

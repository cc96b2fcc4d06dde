// Package telemetry is what credbroker tells its operator: Prometheus
// metrics (one registry per Recorder, served by Handler) and the audit log
// (structured slog events for connect, disconnect, revoke, refresh failure,
// needs_reconnect, identity mismatch, key rotation and sidecar token export).
//
// A nil *Recorder is valid and records nothing, so every hook is optional.
// Labels are bounded: method, tool, era and provider values outside the
// known or configured sets are folded into "other"; no label ever carries a
// principal, a grant id or a connection id (those go to the audit log only).
//
// Metrics:
//
//	credbroker_mcp_requests_total{method,tool,era,outcome}
//	credbroker_mcp_request_duration_seconds{method,tool,era}
//	credbroker_elicitations_total{event}      issued|completed|declined|cancelled|expired
//	credbroker_identity_mismatches_total
//	credbroker_token_refreshes_total{provider,outcome}
//	credbroker_provider_requests_total{provider,status}
//	credbroker_provider_request_duration_seconds{provider}
//	credbroker_vault_operation_duration_seconds{op,outcome}   every store operation (StoreObserver)
//	credbroker_audit_events_total{event}
//	credbroker_sidecar_requests_total{server,route,status}
//	credbroker_idjag_grants_total{outcome}    granted, or why a JWT bearer grant was refused (idjag.go)
//	credbroker_store_unavailable_total{door}  requests refused (503) while the store was unavailable (outage.go)
//	credbroker_upstream_idjag_total{provider,outcome}  ID-JAGs asked for upstream MCP servers (idjag_upstream.go)
//
// The server label of the sidecar series is the configured name of the
// co-located server (Options.SidecarServers, "unnamed" for the unnamed
// secret), "none" when the request did not authenticate, "other" otherwise.
package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"credbroker/vault"
)

// Options configures a Recorder.
type Options struct {
	// Providers are the configured provider names; other values are
	// recorded as "other".
	Providers []string
	// Audit receives the audit events (it should sit behind the redacting
	// handler). Nil: audit events are counted but not logged.
	Audit *slog.Logger
	// ProcessMetrics adds the Go runtime and process collectors.
	ProcessMetrics bool
	// SidecarServers are the configured names of co-located servers (the
	// sidecar's named secrets); other values are recorded as "other".
	SidecarServers []string
	// WebhookEndpoints are the configured webhook endpoint names; other
	// values are recorded as "other".
	WebhookEndpoints []string
}

// Recorder holds the metrics and the audit logger. Its methods are safe for
// concurrent use and do nothing on a nil *Recorder.
type Recorder struct {
	reg       *prometheus.Registry
	audit     *slog.Logger
	providers []string
	servers   []string

	mcpRequests   *prometheus.CounterVec
	mcpDuration   *prometheus.HistogramVec
	mcpSeries     *mcpSeries // their children, found without hashing labels (series.go)
	elicitations  *prometheus.CounterVec
	mismatches    prometheus.Counter
	refreshes     *prometheus.CounterVec
	provRequests  *prometheus.CounterVec
	provDuration  *prometheus.HistogramVec
	vaultDuration *prometheus.HistogramVec
	auditEvents   *prometheus.CounterVec
	sidecar       *prometheus.CounterVec
	ops           *opsMetrics            // webhooks, keep-alive (ops.go)
	idjag         *prometheus.CounterVec // JWT bearer grants (idjag.go)
	upstream      *upstreamMetrics       // the gateway (upstream.go)
	outage        *outageMetrics         // requests a storage outage refused (outage.go)
	upstreamIDJAG *prometheus.CounterVec // ID-JAGs asked for upstream (idjag_upstream.go)
}

// Latency buckets: the broker answers in well under a millisecond; provider
// calls take tens to hundreds of milliseconds.
var (
	fastBuckets     = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	providerBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
)

// counterVec and histogramVec are the constructors of the package's
// labelled metrics: name, help, (buckets,) labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func histogramVec(name string, buckets []float64, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

// New builds a Recorder with its own registry.
func New(opts Options) *Recorder {
	r := &Recorder{
		reg:       prometheus.NewRegistry(),
		audit:     opts.Audit,
		providers: slices.Clone(opts.Providers),
		servers:   append(slices.Clone(opts.SidecarServers), vault.UnnamedServer),
		mcpRequests: counterVec("credbroker_mcp_requests_total",
			"MCP requests by JSON-RPC method, tool, protocol era and outcome.", "method", "tool", "era", "outcome"),
		mcpDuration: histogramVec("credbroker_mcp_request_duration_seconds", fastBuckets,
			"Time to answer an MCP request, from the first byte of the handler to the last byte written.", "method", "tool", "era"),
		elicitations: counterVec("credbroker_elicitations_total",
			"URL elicitations (connect requests) by event: issued, completed, declined, cancelled, expired.", "event"),
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "credbroker_identity_mismatches_total",
			Help: "Connect links opened by a different user than the one who started them.",
		}),
		refreshes: counterVec("credbroker_token_refreshes_total",
			"Provider token refreshes by provider and outcome (ok, failed, invalid_grant).", "provider", "outcome"),
		provRequests: counterVec("credbroker_provider_requests_total",
			"API calls to providers made for provider_request and the sidecar, by provider and HTTP status (\"error\" when no answer).", "provider", "status"),
		provDuration: histogramVec("credbroker_provider_request_duration_seconds", providerBuckets,
			"Latency of API calls to providers.", "provider"),
		vaultDuration: histogramVec("credbroker_vault_operation_duration_seconds", fastBuckets,
			"Latency of vault store operations by operation and outcome (ok, not_found, conflict, limited, unavailable, error).", "op", "outcome"),
		auditEvents: counterVec("credbroker_audit_events_total",
			"Audit events by kind.", "event"),
		sidecar: counterVec("credbroker_sidecar_requests_total",
			"Sidecar API requests by co-located server (its configured name; none: not authenticated), route (require, proxy, token) and HTTP status.", "server", "route", "status"),
	}
	r.mcpSeries = newMCPSeries()
	r.reg.MustRegister(r.mcpRequests, r.mcpDuration, r.elicitations, r.mismatches, r.refreshes,
		r.provRequests, r.provDuration, r.vaultDuration, r.auditEvents, r.sidecar)
	r.ops = newOpsMetrics(r.reg, opts.WebhookEndpoints)
	r.idjag = newIDJAGMetric(r.reg)
	r.upstream = newUpstreamMetrics(r.reg)
	r.outage = newOutageMetrics(r.reg)
	r.upstreamIDJAG = newUpstreamIDJAGMetric(r.reg)
	if opts.ProcessMetrics {
		r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return r
}

// Handler serves the metrics in the Prometheus exposition format.
func (r *Recorder) Handler() http.Handler {
	if r == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{MaxRequestsInFlight: 4, Timeout: 10 * time.Second})
}

// Registry returns the registry (tests, extra collectors).
func (r *Recorder) Registry() *prometheus.Registry {
	if r == nil {
		return nil
	}
	return r.reg
}

// Known label values. Anything else becomes "other".
var (
	knownMethods = []string{"server/discover", "tools/list", "tools/call", "initialize", "ping",
		"notifications/initialized", "notifications/cancelled", ""}
	knownTools = []string{"connect_account", "list_connections", "disconnect_account", "provider_request", ""}
	knownEras  = []string{"2026-07-28", "2025-11-25", "none"}
	// Outcomes of an MCP request.
	knownOutcomes = []string{OutcomeComplete, OutcomeInputRequired, OutcomeToolError, OutcomeRPCError,
		OutcomeUnauthorized, OutcomeInternal, OutcomeUnavailable, OutcomeAccepted}
	knownElicitations = []string{ElicitationIssued, ElicitationCompleted, ElicitationDeclined,
		ElicitationCancelled, ElicitationExpired}
)

// Outcomes of an MCP request (the outcome label).
const (
	OutcomeComplete      = "complete"       // a result, resultType complete
	OutcomeInputRequired = "input_required" // MRTR input_required, or legacy -32042
	OutcomeToolError     = "tool_error"     // a tool result with isError
	OutcomeRPCError      = "rpc_error"      // a JSON-RPC error (bad request, headers, params)
	OutcomeUnauthorized  = "unauthorized"   // 401 / 403
	OutcomeInternal      = "internal"       // 5xx
	OutcomeUnavailable   = "unavailable"    // 503: the store was unavailable; retry
	OutcomeAccepted      = "accepted"       // a notification (202)
)

// Elicitation events (the event label of credbroker_elicitations_total).
const (
	ElicitationIssued    = "issued"
	ElicitationCompleted = "completed"
	ElicitationDeclined  = "declined"
	ElicitationCancelled = "cancelled"
	ElicitationExpired   = "expired"
)

func bounded(v string, known []string) string {
	if slices.Contains(known, v) {
		return v
	}
	return "other"
}

func (r *Recorder) provider(name string) string {
	if slices.Contains(r.providers, name) {
		return name
	}
	return "other"
}

// MCPRequest records one answered MCP request.
func (r *Recorder) MCPRequest(method, tool, era, outcome string, elapsed time.Duration) {
	if r == nil {
		return
	}
	r.mcpSeries.record(r, method, tool, era, outcome, elapsed.Seconds())
}

// Elicitation records a connect-request event (Elicitation* constants).
func (r *Recorder) Elicitation(event string) {
	if r == nil {
		return
	}
	r.elicitations.WithLabelValues(bounded(event, knownElicitations)).Inc()
}

// Refresh outcomes.
const (
	RefreshOK           = "ok"
	RefreshFailed       = "failed"        // transport error or a provider 5xx: the token stays usable
	RefreshInvalidGrant = "invalid_grant" // the refresh token is dead: needs_reconnect
)

// Refresh records a token refresh at a provider (Refresh* outcomes).
func (r *Recorder) Refresh(provider, outcome string) {
	if r == nil {
		return
	}
	r.refreshes.WithLabelValues(r.provider(provider), bounded(outcome, []string{RefreshOK, RefreshFailed, RefreshInvalidGrant})).Inc()
}

// ProviderCall records an API call to a provider: status is the HTTP status
// answered, or 0 when no answer came (transport error, timeout).
func (r *Recorder) ProviderCall(provider string, status int, elapsed time.Duration) {
	if r == nil {
		return
	}
	p := r.provider(provider)
	s := "error"
	if status >= 100 && status <= 599 {
		s = strconv.Itoa(status)
	}
	r.provRequests.WithLabelValues(p, s).Inc()
	r.provDuration.WithLabelValues(p).Observe(elapsed.Seconds())
}

// Sidecar routes (the route label).
const (
	SidecarRequire = "require"
	SidecarProxy   = "proxy"
	SidecarToken   = "token"
)

// SidecarRequest records one answered sidecar API request: server is the
// co-located server's configured name ("" when it did not authenticate),
// route a Sidecar* route, status the HTTP status answered.
func (r *Recorder) SidecarRequest(server, route string, status int) {
	if r == nil {
		return
	}
	label := "none"
	if server != "" {
		label = bounded(server, r.servers)
	}
	s := "other"
	if status >= 100 && status <= 599 {
		s = strconv.Itoa(status)
	}
	r.sidecar.WithLabelValues(label, bounded(route, []string{SidecarRequire, SidecarProxy, SidecarToken}), s).Inc()
}

// vaultOp records one store operation.
func (r *Recorder) vaultOp(op string, err error, elapsed time.Duration) {
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, vault.ErrNotFound):
		outcome = "not_found"
	case isConflict(err):
		outcome = "conflict"
	case errors.Is(err, vault.ErrTooManyOpenGrants), errors.Is(err, vault.ErrTooManyRecentGrants):
		outcome = "limited" // a person's limit refused a grant: not a store failure
	case errors.Is(err, vault.ErrUnavailable):
		outcome = "unavailable" // the database is down, the disk full
	default:
		outcome = "error"
	}
	r.vaultDuration.WithLabelValues(op, outcome).Observe(elapsed.Seconds())
}

// Audit writes e to the audit log and counts it. Identity mismatches also
// count in credbroker_identity_mismatches_total.
func (r *Recorder) Audit(ctx context.Context, e Event) {
	if r == nil {
		return
	}
	r.auditEvents.WithLabelValues(eventLabel(e.Kind)).Inc()
	if e.Kind == EventIdentityMismatch {
		r.mismatches.Inc()
	}
	if r.audit == nil {
		return
	}
	level := slog.LevelInfo
	switch e.Kind {
	case EventIdentityMismatch:
		level = slog.LevelWarn
	case EventRefreshFailed, EventNeedsReconnect, EventTokenReplay, EventIDJAGRefused, EventUpstreamIDJAGRefused, EventUpstreamRegistrationDropped, EventStepUpRefused:
		level = slog.LevelWarn
	}
	if e.Err != nil && level < slog.LevelWarn {
		level = slog.LevelWarn
	}
	r.audit.LogAttrs(ctx, level, "audit: "+e.Kind, e.attrs()...)
}

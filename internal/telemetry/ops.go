package telemetry

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Audit event kinds of operators' work (Event.Kind). Each names the admin
// (Event.Admin) who acted.
const (
	// EventAdminList: an admin listed a person's connections.
	EventAdminList = "admin_list"
	// EventOffboard: an admin offboarded a person (Outcome sums it up);
	// each connection removed is also a revoke and a disconnect event.
	EventOffboard = "offboard"
	// EventProviderDisable: an admin disabled every connection to a
	// provider (Outcome: needs_reconnect or deleted, and how many).
	EventProviderDisable = "provider_disable"
	// EventAdminRefused: a request to the admin API was refused (no or
	// a bad token, or a person without the admin claim); Principal is
	// the person when the token was valid.
	EventAdminRefused = "admin_refused"
	// EventWebhookExpired: a webhook delivery was given up (too old, or
	// the endpoint answered 410 Gone).
	EventWebhookExpired = "webhook_expired"
)

var knownOpsEvents = []string{EventAdminList, EventOffboard, EventProviderDisable, EventAdminRefused, EventWebhookExpired,
	EventIDJAGGranted, EventIDJAGRefused, EventUpstreamIDJAGIssued, EventUpstreamIDJAGRefused}

// eventLabel bounds an audit event kind for the metric label.
func eventLabel(kind string) string {
	if slices.Contains(knownOpsEvents, kind) {
		return kind
	}
	return bounded(kind, knownEvents)
}

// Webhook delivery outcomes (the outcome label).
const (
	WebhookDelivered = "delivered" // the endpoint answered 2xx
	WebhookFailed    = "failed"    // an attempt failed; it is retried later
	WebhookExpired   = "expired"   // given up after the maximum age
	WebhookGone      = "gone"      // the endpoint answered 410 Gone: given up
	WebhookDropped   = "dropped"   // for an endpoint no longer configured
)

// Keep-alive outcomes (the outcome label).
const (
	KeepAliveRefreshed = "refreshed"       // the tokens were refreshed
	KeepAliveFailed    = "failed"          // the provider did not answer properly; tried again later
	KeepAliveReconnect = "needs_reconnect" // the provider refused: the connection needs reconnecting
)

// opsMetrics are the series of webhook delivery and keep-alive:
//
//	credbroker_webhook_outbox_depth                  deliveries waiting (all endpoints)
//	credbroker_webhook_outbox_oldest_seconds         age of the oldest waiting event
//	credbroker_webhook_deliveries_total{endpoint,outcome}
//	credbroker_keepalive_refreshes_total{provider,outcome}
type opsMetrics struct {
	endpoints  []string
	depth      prometheus.Gauge
	oldest     prometheus.Gauge
	deliveries *prometheus.CounterVec
	keepAlive  *prometheus.CounterVec
}

func newOpsMetrics(reg *prometheus.Registry, endpoints []string) *opsMetrics {
	m := &opsMetrics{
		endpoints: slices.Clone(endpoints),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "credbroker_webhook_outbox_depth",
			Help: "Webhook deliveries waiting in the store's outbox (one per event and endpoint), as last counted by this replica.",
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "credbroker_webhook_outbox_oldest_seconds",
			Help: "Age of the oldest event waiting in the outbox (0 when it is empty).",
		}),
		deliveries: counterVec("credbroker_webhook_deliveries_total",
			"Webhook delivery attempts by endpoint and outcome (delivered, failed, expired, gone, dropped).", "endpoint", "outcome"),
		keepAlive: counterVec("credbroker_keepalive_refreshes_total",
			"Background refreshes of idle connections (keep_alive) by provider and outcome (refreshed, failed, needs_reconnect).", "provider", "outcome"),
	}
	reg.MustRegister(m.depth, m.oldest, m.deliveries, m.keepAlive)
	return m
}

// WebhookDelivery counts one delivery attempt's outcome (Webhook*).
func (r *Recorder) WebhookDelivery(endpoint, outcome string) {
	if r == nil {
		return
	}
	r.ops.deliveries.WithLabelValues(bounded(endpoint, r.ops.endpoints),
		bounded(outcome, []string{WebhookDelivered, WebhookFailed, WebhookExpired, WebhookGone, WebhookDropped})).Inc()
}

// OutboxDepth records how many deliveries wait and the age of the oldest.
func (r *Recorder) OutboxDepth(n int, oldest time.Duration) {
	if r == nil {
		return
	}
	r.ops.depth.Set(float64(n))
	r.ops.oldest.Set(max(oldest, 0).Seconds())
}

// KeepAlive counts one background refresh of an idle connection.
func (r *Recorder) KeepAlive(provider, outcome string) {
	if r == nil {
		return
	}
	r.ops.keepAlive.WithLabelValues(r.provider(provider), bounded(outcome, []string{KeepAliveRefreshed, KeepAliveFailed, KeepAliveReconnect})).Inc()
}

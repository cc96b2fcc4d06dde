package telemetry

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// Enterprise-managed authorization upstream: the broker, as the client of
// an upstream MCP server (the gateway, mcp.auth: enterprise), asks the
// organisation's IdP for an ID-JAG for that server (RFC 8693) and redeems
// it at the server's authorization server (RFC 7523). Each attempt is an
// audit event (Principal the person, Provider the entry, Via who asked:
// "mcp", "sidecar" or "background" for a renewal; Outcome the
// UpstreamIDJAG* code of a refusal, Err its reason in words, naming no
// secret) and counts in
//
//	credbroker_upstream_idjag_total{provider,outcome}
const (
	EventUpstreamIDJAGIssued  = "upstream_idjag_issued"  // the IdP issued an ID-JAG and the server's authorization server redeemed it
	EventUpstreamIDJAGRefused = "upstream_idjag_refused" // no access token that way; the person is asked to connect in the browser
)

// Outcomes of an attempt (the outcome label, and the refusal's Outcome).
const (
	UpstreamIDJAGIssued = "issued"
	// UpstreamIDJAGNoSession: the broker holds no IdP session of the
	// person (never signed in with offline access, or signed out).
	UpstreamIDJAGNoSession = "no_idp_session"
	// UpstreamIDJAGSessionEnded: the IdP refused the person's refresh
	// token (invalid_grant): the session ended there.
	UpstreamIDJAGSessionEnded = "idp_session_ended"
	// UpstreamIDJAGIdPRefused: the IdP refused the token exchange (its
	// policy, the audience or resource not allowed).
	UpstreamIDJAGIdPRefused = "idp_refused"
	// UpstreamIDJAGServerRefused: the server's authorization server
	// refused the ID-JAG (invalid_grant, invalid_client, …).
	UpstreamIDJAGServerRefused = "server_refused"
	// UpstreamIDJAGNotSupported: the server's authorization server does
	// not advertise the JWT bearer grant.
	UpstreamIDJAGNotSupported = "not_supported"
	// UpstreamIDJAGUnavailable: the IdP or the authorization server gave
	// no usable answer (network, 5xx, a malformed answer).
	UpstreamIDJAGUnavailable = "unavailable"
)

var upstreamIDJAGOutcomes = []string{UpstreamIDJAGIssued, UpstreamIDJAGNoSession, UpstreamIDJAGSessionEnded, UpstreamIDJAGIdPRefused,
	UpstreamIDJAGServerRefused, UpstreamIDJAGNotSupported, UpstreamIDJAGUnavailable}

func newUpstreamIDJAGMetric(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "credbroker_upstream_idjag_total",
		Help: "ID-JAGs the broker asked the organisation's IdP for, for upstream MCP servers (mcp.auth: enterprise), by provider and outcome: issued (and redeemed), or why not.",
	}, []string{"provider", "outcome"})
	reg.MustRegister(c)
	return c
}

// UpstreamIDJAG counts one attempt for provider by outcome
// (UpstreamIDJAG*).
func (r *Recorder) UpstreamIDJAG(provider, outcome string) {
	if r == nil {
		return
	}
	if !slices.Contains(upstreamIDJAGOutcomes, outcome) {
		outcome = "other"
	}
	r.upstreamIDJAG.WithLabelValues(r.provider(provider), outcome).Inc()
}

package telemetry

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// Audit event kinds of enterprise-managed authorization: the broker's
// authorization server redeeming ID-JAGs (JWT bearer grant). Principal is
// the ID-JAG's (iss, sub) once its signature checked, else empty; Client
// is the authenticated client; Outcome is the IDJAG* reason of a refusal.
const (
	EventIDJAGGranted = "idjag_granted" // an ID-JAG was redeemed for an access token
	EventIDJAGRefused = "idjag_refused" // a JWT bearer grant request was refused; nothing was stored
)

// Outcomes of a JWT bearer grant (the outcome label of
// credbroker_idjag_grants_total and the Outcome of the audit events).
const (
	IDJAGGranted          = "granted"
	IDJAGPolicyOff        = "policy_off"         // the grant is turned off
	IDJAGClientNotAllowed = "client_not_allowed" // the client is not let use the grant
	IDJAGMalformed        = "malformed"          // not a JWS, or claims missing or of the wrong type
	IDJAGType             = "type"               // typ is not oauth-id-jag+jwt
	IDJAGAlgorithm        = "algorithm"          // alg not on the allow-list (none, HMAC, …)
	IDJAGUntrustedIssuer  = "untrusted_issuer"
	IDJAGSignature        = "signature"          // no trusted key verifies it (unknown kid included)
	IDJAGIssuerDown       = "issuer_unreachable" // the issuer's discovery or keys could not be fetched
	IDJAGAudience         = "audience"           // aud is not this broker's issuer
	IDJAGResource         = "resource"           // resource is not this broker's MCP endpoint
	IDJAGClientMismatch   = "client_mismatch"    // client_id is not the authenticated client
	IDJAGExpired          = "expired"            // exp passed
	IDJAGNotYetValid      = "not_yet_valid"      // iat or nbf in the future
	IDJAGTooLongLived     = "too_long_lived"     // exp - iat beyond the maximum lifetime
	IDJAGReplayed         = "replayed"           // the jti was redeemed before
	IDJAGScope            = "scope"              // a scope the broker does not offer
	IDJAGStoreFailed      = "store_failed"       // the store failed; nothing was issued
)

var idjagOutcomes = []string{IDJAGGranted, IDJAGPolicyOff, IDJAGClientNotAllowed, IDJAGMalformed, IDJAGType,
	IDJAGAlgorithm, IDJAGUntrustedIssuer, IDJAGSignature, IDJAGIssuerDown, IDJAGAudience, IDJAGResource,
	IDJAGClientMismatch, IDJAGExpired, IDJAGNotYetValid, IDJAGTooLongLived, IDJAGReplayed, IDJAGScope, IDJAGStoreFailed}

func newIDJAGMetric(reg *prometheus.Registry) *prometheus.CounterVec {
	c := counterVec("credbroker_idjag_grants_total",
		"JWT bearer grant requests (ID-JAGs, enterprise-managed authorization) at the broker's authorization server by outcome: granted, or the reason of the refusal.", "outcome")
	reg.MustRegister(c)
	return c
}

// IDJAGGrant counts one JWT bearer grant request by outcome (IDJAG*).
func (r *Recorder) IDJAGGrant(outcome string) {
	if r == nil {
		return
	}
	if !slices.Contains(idjagOutcomes, outcome) {
		outcome = "other"
	}
	r.idjag.WithLabelValues(outcome).Inc()
}

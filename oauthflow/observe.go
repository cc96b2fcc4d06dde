package oauthflow

import (
	"context"
	"time"

	"credbroker/internal/telemetry"
)

// Observer receives the flow's audit events and provider metrics.
// *telemetry.Recorder implements it. A nil Observer records nothing.
type Observer interface {
	// Audit records connect, disconnect, revoke, identity mismatch,
	// refresh failure and needs_reconnect events.
	Audit(ctx context.Context, e telemetry.Event)
	// Refresh counts a token refresh (telemetry.Refresh* outcomes).
	Refresh(provider, outcome string)
	// ProviderCall times an API call to a provider; status 0 = no answer.
	ProviderCall(provider string, status int, elapsed time.Duration)
}

var _ Observer = (*telemetry.Recorder)(nil)

// audit records e with the Observer, if any.
func (f *Flow) audit(ctx context.Context, e telemetry.Event) {
	if f.opts.Observer != nil {
		if e.Via == "" {
			e.Via = "browser"
		}
		f.opts.Observer.Audit(ctx, e)
	}
}

// observeRefresh counts a refresh outcome (for the token refresher).
func (f *Flow) observeRefresh(provider, outcome string) {
	if f.opts.Observer != nil {
		f.opts.Observer.Refresh(provider, outcome)
	}
}

// observeProviderCall times a provider API call (for provider_request and
// the sidecar).
func (f *Flow) observeProviderCall(provider string, status int, elapsed time.Duration) {
	if f.opts.Observer != nil {
		f.opts.Observer.ProviderCall(provider, status, elapsed)
	}
}

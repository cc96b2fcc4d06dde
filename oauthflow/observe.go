package oauthflow

import (
	"context"

	"credbroker/internal/telemetry"
)

// audit records e (as done in the browser unless it says otherwise).
func (f *Flow) audit(ctx context.Context, e telemetry.Event) {
	if e.Via == "" {
		e.Via = "browser"
	}
	f.opts.Telemetry.Audit(ctx, e)
}

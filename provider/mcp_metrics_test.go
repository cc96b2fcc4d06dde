package provider

import (
	"context"
	"slices"
	"strings"
	"testing"

	"credbroker/internal/telemetry"
)

// upstreamSeries is what rec holds of credbroker_upstream_requests_total
// ("provider method era outcome" → count) and of the count of
// credbroker_upstream_request_duration_seconds (the same keys → count of
// observations).
func upstreamSeries(t *testing.T, rec *telemetry.Recorder) (requests, timed map[string]float64) {
	t.Helper()
	mfs, err := rec.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	requests, timed = map[string]float64{}, map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "credbroker_upstream_requests_total":
				requests[strings.Join([]string{labels["provider"], labels["method"], labels["era"], labels["outcome"]}, " ")] = m.GetCounter().GetValue()
			case "credbroker_upstream_request_duration_seconds":
				timed[strings.Join([]string{labels["provider"], labels["method"], labels["era"], labels["outcome"]}, " ")] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return requests, timed
}

// TestMCPUpstreamMetrics: discovery and dynamic registration are each
// recorded as one upstream request, with the outcome ok when they worked
// as when they failed (era "none": no MCP session), and timed; a
// discovery reused from the cache is not recorded.
func TestMCPUpstreamMetrics(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(r *mcpRig)
		want  []string
	}{
		{name: "both work", want: []string{"linear discovery none ok", "linear registration none ok"}},
		{name: "registration fails", setup: func(r *mcpRig) { r.as.with(func() { r.as.regFail = 1 }) },
			want: []string{"linear discovery none ok", "linear registration none failed"}},
		{name: "discovery fails", setup: func(r *mcpRig) { r.as.set("code_challenge_methods_supported", nil) },
			want: []string{"linear discovery none failed"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			if c.setup != nil {
				c.setup(r)
			}
			rec := telemetry.New(telemetry.Options{Providers: []string{"linear"}})
			k := r.client(r.registry("", ""), func(o *Options) { o.Telemetry = rec })
			p, _ := k.opts.Providers.Lookup("linear")
			_, err := k.AuthRequest(context.Background(), p, nil, mcpRedirect)
			if failed := strings.HasSuffix(c.want[len(c.want)-1], "failed"); failed != (err != nil) {
				t.Fatalf("AuthRequest: %v", err)
			}
			if err == nil {
				// Discovery cached, the registration stored: nothing more
				// is asked of the upstream, nor recorded.
				if _, err := k.AuthRequest(context.Background(), p, nil, mcpRedirect); err != nil {
					t.Fatal(err)
				}
			}
			requests, timed := upstreamSeries(t, rec)
			var got []string
			for series, n := range requests {
				if n != 1 {
					t.Errorf("%s recorded %v times, want once", series, n)
				}
				got = append(got, series)
			}
			slices.Sort(got)
			if !slices.Equal(got, c.want) {
				t.Errorf("credbroker_upstream_requests_total{provider,method,era,outcome}: %q, want %q", got, c.want)
			}
			for _, series := range c.want {
				if n := timed[series]; n != 1 {
					t.Errorf("credbroker_upstream_request_duration_seconds{provider,method,era,outcome} %s: %v observations, want 1", series, n)
				}
			}
			if len(timed) != len(c.want) {
				t.Errorf("credbroker_upstream_request_duration_seconds series: %v, want one for each of %q", timed, c.want)
			}
		})
	}
}

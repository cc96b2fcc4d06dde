package telemetry

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMCPSeriesMatchesTheVectors: MCPRequest finding its series in the
// table gives the /metrics text the vectors give when every request's
// labels are bounded and looked up (what MCPRequest did before), for
// every known value of every label, "other", and requests recorded at
// once from many goroutines.
func TestMCPSeriesMatchesTheVectors(t *testing.T) {
	got, want := New(Options{}), New(Options{})
	values := func(known []string) []string { return append(append([]string{}, known...), "evil", "other") }
	var wg sync.WaitGroup
	for _, m := range values(knownMethods) {
		for _, tool := range values(knownTools) {
			for _, e := range values(knownEras) {
				for _, o := range values(knownOutcomes) {
					wg.Go(func() { got.MCPRequest(m, tool, e, o, 3*time.Millisecond) })
					wm, wt, we := bounded(m, knownMethods), bounded(tool, knownTools), bounded(e, knownEras)
					want.mcpRequests.WithLabelValues(wm, wt, we, bounded(o, knownOutcomes)).Inc()
					want.mcpDuration.WithLabelValues(wm, wt, we).Observe((3 * time.Millisecond).Seconds())
				}
			}
		}
	}
	wg.Wait()
	mcp := func(r *Recorder) string {
		var out []string
		for _, l := range strings.Split(scrape(t, r), "\n") {
			if strings.HasPrefix(l, "credbroker_mcp_") {
				out = append(out, l)
			}
		}
		return strings.Join(out, "\n")
	}
	g, w := mcp(got), mcp(want)
	if g != w {
		t.Errorf("the table's /metrics differ from the vectors':\n%s\nwant:\n%s", g, w)
	}
	if !strings.Contains(g, `credbroker_mcp_requests_total{era="other",method="other",outcome="other",tool="other"} 16`) {
		t.Errorf("no folded series counted 16 times (evil and other, four labels):\n%.2000s", g)
	}
}

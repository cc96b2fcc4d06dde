package telemetry

import (
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// mcpSeries finds the series of an answered MCP request without hashing
// its label values: every label of credbroker_mcp_requests_total and
// credbroker_mcp_request_duration_seconds has a known set of values plus
// "other" (bounded), so a label set is a position in a fixed table, whose
// slot keeps the child the vector returned the first time (the vector's
// own, so what /metrics shows is unchanged).
type mcpSeries struct {
	requests []atomic.Pointer[prometheus.Counter]  // by method, tool, era, outcome
	duration []atomic.Pointer[prometheus.Observer] // by method, tool, era
}

func newMCPSeries() *mcpSeries {
	n := (len(knownMethods) + 1) * (len(knownTools) + 1) * (len(knownEras) + 1)
	return &mcpSeries{requests: make([]atomic.Pointer[prometheus.Counter], n*(len(knownOutcomes)+1)),
		duration: make([]atomic.Pointer[prometheus.Observer], n)}
}

// boundedIndex is v's position in known, or len(known) for "other".
func boundedIndex(v string, known []string) int {
	if i := slices.Index(known, v); i >= 0 {
		return i
	}
	return len(known)
}

// labelAt is the label value of position i in known ("other" past it).
func labelAt(i int, known []string) string {
	if i < len(known) {
		return known[i]
	}
	return "other"
}

// child returns the metric in slot, made by get the first time.
func child[T any](slot *atomic.Pointer[T], get func() T) T {
	if p := slot.Load(); p != nil {
		return *p
	}
	v := get()
	slot.CompareAndSwap(nil, &v)
	return v
}

// record counts one request and observes its duration in seconds.
func (s *mcpSeries) record(r *Recorder, method, tool, era, outcome string, seconds float64) {
	m, t, e := boundedIndex(method, knownMethods), boundedIndex(tool, knownTools), boundedIndex(era, knownEras)
	o := boundedIndex(outcome, knownOutcomes)
	d := (m*(len(knownTools)+1)+t)*(len(knownEras)+1) + e
	labels := func() []string {
		return []string{labelAt(m, knownMethods), labelAt(t, knownTools), labelAt(e, knownEras)}
	}
	child(&s.requests[d*(len(knownOutcomes)+1)+o], func() prometheus.Counter {
		return r.mcpRequests.WithLabelValues(append(labels(), labelAt(o, knownOutcomes))...)
	}).Inc()
	child(&s.duration[d], func() prometheus.Observer {
		return r.mcpDuration.WithLabelValues(labels()...)
	}).Observe(seconds)
}

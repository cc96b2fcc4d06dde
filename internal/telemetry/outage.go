package telemetry

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Doors of the broker (the door label of credbroker_store_unavailable_total).
const (
	DoorMCP        = "mcp"        // the MCP endpoint and the gateway endpoints
	DoorSidecar    = "sidecar"    // the sidecar API
	DoorPage       = "page"       // the browser pages (connect links, connections, consent)
	DoorAuthServer = "authserver" // the authorization server's endpoints (token, registration, revocation)
	DoorAdmin      = "admin"      // the operators' admin API
)

var knownDoors = []string{DoorMCP, DoorSidecar, DoorPage, DoorAuthServer, DoorAdmin}

// outageMetrics counts the requests a storage outage refused:
//
//	credbroker_store_unavailable_total{door}
type outageMetrics struct {
	refused *prometheus.CounterVec
	last    atomic.Int64 // Unix nanoseconds of the last refusal; 0: none
}

func newOutageMetrics(reg *prometheus.Registry) *outageMetrics {
	m := &outageMetrics{refused: counterVec("credbroker_store_unavailable_total",
		"Requests answered 503 because the store was unavailable (database down or restarting, disk full), by door (mcp, sidecar, page, authserver, admin).", "door")}
	reg.MustRegister(m.refused)
	return m
}

// StoreUnavailable counts one request that door (a Door* constant)
// refused with 503 because the store was unavailable, and remembers when,
// for readiness (LastStoreUnavailable).
func (r *Recorder) StoreUnavailable(door string) {
	if r == nil {
		return
	}
	r.outage.refused.WithLabelValues(bounded(door, knownDoors)).Inc()
	r.outage.last.Store(time.Now().UnixNano())
}

// LastStoreUnavailable is when a door last refused a request because the
// store was unavailable (zero: never, or a nil Recorder).
func (r *Recorder) LastStoreUnavailable() time.Time {
	if r == nil {
		return time.Time{}
	}
	if n := r.outage.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

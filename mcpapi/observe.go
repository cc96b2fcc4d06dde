package mcpapi

import (
	"bytes"
	"net/http"
	"time"

	"credbroker/internal/telemetry"
)

// observedWriter notes what serveMCP learned about a request so that one
// MCPRequest call can describe it when the handler returns.
type observedWriter struct {
	http.ResponseWriter
	start   time.Time
	status  int
	method  string
	tool    string
	era     string
	outcome string // set by writeOutcome and serveLegacy; else derived from status
}

func (o *observedWriter) WriteHeader(status int) {
	if o.status == 0 {
		o.status = status
	}
	o.ResponseWriter.WriteHeader(status)
}

func (o *observedWriter) Write(b []byte) (int, error) {
	if o.status == 0 {
		o.status = http.StatusOK
	}
	return o.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (o *observedWriter) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// observeStart wraps w when an Observer is configured.
func (s *Server) observeStart(w http.ResponseWriter) (http.ResponseWriter, *observedWriter) {
	if s.opts.Telemetry == nil {
		return w, nil
	}
	ow := &observedWriter{ResponseWriter: w, start: time.Now(), era: "none"}
	return ow, ow
}

// observeEnd reports the request described by ow.
func (s *Server) observeEnd(ow *observedWriter) {
	if ow == nil {
		return
	}
	outcome := ow.outcome
	switch {
	case ow.status == http.StatusUnauthorized || ow.status == http.StatusForbidden:
		outcome = telemetry.OutcomeUnauthorized
	case ow.status >= 500:
		outcome = telemetry.OutcomeInternal
	case ow.status == http.StatusAccepted:
		outcome = telemetry.OutcomeAccepted
	case ow.status >= 400:
		outcome = telemetry.OutcomeRPCError
	case outcome == "":
		outcome = telemetry.OutcomeComplete
	}
	s.opts.Telemetry.MCPRequest(ow.method, ow.tool, ow.era, outcome, time.Since(ow.start))
}

// note records facts about the request on w when it is observed.
func note(w http.ResponseWriter, f func(*observedWriter)) {
	if ow, ok := w.(*observedWriter); ok {
		f(ow)
	}
}

// legacyOutcome classifies a 2025-11-25 answer the SDK produced (JSON, one
// message) without decoding it.
func legacyOutcome(body []byte) string {
	switch {
	case bytes.Contains(body, []byte(`"code":-32042`)):
		return telemetry.OutcomeInputRequired
	case bytes.Contains(body, []byte(`"error":{`)):
		return telemetry.OutcomeRPCError
	case bytes.Contains(body, []byte(`"isError":true`)):
		return telemetry.OutcomeToolError
	}
	return telemetry.OutcomeComplete
}

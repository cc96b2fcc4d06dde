package mcpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"credbroker/internal/outage"
	"credbroker/internal/telemetry"
)

// A storage outage (vault.ErrUnavailable, whichever store read failed
// first: the bearer token's check in broker mode, the call's own reads and
// writes) is answered alike on /mcp in both eras and on the gateway
// endpoints: HTTP 503, Retry-After, and a JSON-RPC error with the
// request's id, codeStorageUnavailable (in JSON-RPC's range for
// implementation-defined server errors) and data.retryable. The cause is
// logged, never shown; the refusal is counted
// (credbroker_store_unavailable_total{door="mcp"}).

// codeStorageUnavailable is the JSON-RPC error code of a storage outage.
const codeStorageUnavailable = -32050

// unavailableData is the data member of a storage outage's error.
type unavailableData struct {
	Retryable         bool `json:"retryable"`
	RetryAfterSeconds int  `json:"retryAfterSeconds"`
}

var unavailableJSON, _ = json.Marshal(unavailableData{Retryable: true, RetryAfterSeconds: int(outage.RetryAfter / time.Second)})

// unavailableError is the JSON-RPC error of a storage outage.
func unavailableError() *rpcError {
	return &rpcError{Code: codeStorageUnavailable, Message: outage.Message, Data: unavailableJSON}
}

// storageUnavailable logs err (a storage outage), counts the refusal and
// answers the request id with the outage's 503.
func (s *Server) storageUnavailable(w http.ResponseWriter, id json.RawMessage, err error) {
	s.unavailableLogged(err)
	writeUnavailable(w, id)
}

// unavailableLogged logs a storage outage's cause and counts the refusal.
func (s *Server) unavailableLogged(err error) {
	s.log.Warn("mcpapi: store unavailable; answered 503", "err", err.Error())
	s.opts.Telemetry.StoreUnavailable(telemetry.DoorMCP)
}

// writeUnavailable writes the outage's 503 for request id.
func writeUnavailable(w http.ResponseWriter, id json.RawMessage) {
	note(w, func(o *observedWriter) { o.outcome = telemetry.OutcomeUnavailable })
	outage.SetRetryAfter(w.Header())
	writeRPCErrorValue(w, http.StatusServiceUnavailable, id, unavailableError())
}

// isUnavailableAnswer reports whether body, a JSON-RPC answer the go-sdk
// wrote for a 2025-11-25 request, is a storage outage's error.
func isUnavailableAnswer(body []byte) bool {
	if !bytes.Contains(body, []byte(strconv.Itoa(codeStorageUnavailable))) {
		return false
	}
	var msg struct {
		Error *struct {
			Code int64 `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &msg) == nil && msg.Error != nil && msg.Error.Code == codeStorageUnavailable
}

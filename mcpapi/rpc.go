package mcpapi

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// JSON-RPC and MCP error codes (the SDK's constants, named here once).
const (
	codeParse              = jsonrpc.CodeParseError
	codeInvalidRequest     = jsonrpc.CodeInvalidRequest
	codeMethodNotFound     = jsonrpc.CodeMethodNotFound
	codeInvalidParams      = jsonrpc.CodeInvalidParams
	codeInternal           = jsonrpc.CodeInternalError
	codeHeaderMismatch     = mcp.CodeHeaderMismatch
	codeMissingCapability  = mcp.CodeMissingRequiredClientCapabilities
	codeUnsupportedVersion = mcp.CodeUnsupportedProtocolVersion
)

// rpcMessage is one incoming JSON-RPC message. Params stay raw until the
// method is known.
type rpcMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

func (m *rpcMessage) isNotification() bool { return len(m.ID) == 0 }

// validID reports whether id is a JSON string or number (MCP forbids null).
func validID(id json.RawMessage) bool {
	if len(id) == 0 {
		return false
	}
	switch c := id[0]; {
	case c == '"':
		var s string
		return json.Unmarshal(id, &s) == nil
	case c == '-' || c >= '0' && c <= '9':
		_, err := strconv.ParseFloat(string(id), 64)
		return err == nil
	}
	return false
}

// rpcError is the error member of a response: the SDK's wire error.
type rpcError = jsonrpc.Error

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

var nullID = json.RawMessage("null")

// writeRPCError writes a JSON-RPC error response with the given HTTP status.
// id may be nil (unknown): it is written as null.
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int64, msg string, data any) {
	e := &rpcError{Code: code, Message: msg}
	if data != nil {
		b, err := json.Marshal(data)
		if err == nil {
			e.Data = b
		}
	}
	writeRPCErrorValue(w, status, id, e)
}

func writeRPCErrorValue(w http.ResponseWriter, status int, id json.RawMessage, e *rpcError) {
	note(w, func(ow *observedWriter) { ow.code = e.Code })
	if len(id) == 0 {
		id = nullID
	}
	b, err := json.Marshal(rpcResponse{JSONRPC: "2.0", ID: id, Error: e})
	if err != nil {
		b = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}`)
	}
	setJSONHeaders(w.Header())
	w.WriteHeader(status)
	w.Write(b)
}

// writeRPCResult writes {"jsonrpc":"2.0","id":<id>,"result":<result>} where
// result is already encoded JSON.
func writeRPCResult(w http.ResponseWriter, id json.RawMessage, result []byte) {
	writeRPCAnswer(w, append(rpcResultStart(id, len(result)), result...))
}

// rpcResultStart begins a result answer to id, with room for n bytes of
// result: {"jsonrpc":"2.0","id":<id>,"result":
func rpcResultStart(id json.RawMessage, n int) []byte {
	return appendResultStart(make([]byte, 0, n+len(id)+40), id)
}

// appendResultStart appends the start of a result answer to id to b.
func appendResultStart(b []byte, id json.RawMessage) []byte {
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	return append(b, `,"result":`...)
}

// writeRPCAnswer ends a result answer begun by rpcResultStart and writes
// it, 200.
func writeRPCAnswer(w http.ResponseWriter, b []byte) { writeAnswer(w, b, false) }

// flushRPCResult is writeRPCResult, sized and flushed: the host has its
// answer before the handler's remaining work (releasing the call, ending
// the upstream's exchange, telemetry) runs.
func flushRPCResult(w http.ResponseWriter, id json.RawMessage, result []byte) {
	writeAnswer(w, append(rpcResultStart(id, len(result)), result...), true)
}

// writeAnswer ends a result answer begun by rpcResultStart and writes it,
// 200; flush: with its Content-Length, and flushed.
func writeAnswer(w http.ResponseWriter, b []byte, flush bool) {
	b = append(b, "}\n"...)
	h := w.Header()
	setJSONHeaders(h)
	if flush {
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
	}
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	if flush {
		flushWriter(w)
	}
}

// flushWriter flushes w, or the first writer it wraps that flushes
// (http.ResponseController's search, without allocating one).
func flushWriter(w http.ResponseWriter) {
	for {
		switch v := w.(type) {
		case http.Flusher:
			v.Flush()
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return
		}
	}
}

// The values of every JSON answer's two headers, shared by every answer
// rather than allocated for each (Header.Set would): capacity one, so an
// Add elsewhere copies instead of writing into them.
var (
	jsonContentType = []string{"application/json"}[:1:1]
	noSniff         = []string{"nosniff"}[:1:1]
)

// setJSONHeaders sets Content-Type application/json and nosniff on h.
func setJSONHeaders(h http.Header) {
	h["Content-Type"] = jsonContentType
	h["X-Content-Type-Options"] = noSniff
}

package mcpapi

import (
	"bytes"
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
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(b)
}

// writeRPCResult writes {"jsonrpc":"2.0","id":<id>,"result":<result>} where
// result is already encoded JSON.
func writeRPCResult(w http.ResponseWriter, id json.RawMessage, result []byte) {
	var buf bytes.Buffer
	buf.Grow(len(result) + len(id) + 40)
	buf.WriteString(`{"jsonrpc":"2.0","id":`)
	buf.Write(id)
	buf.WriteString(`,"result":`)
	buf.Write(result)
	buf.WriteString("}\n")
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	w.Write(buf.Bytes())
}

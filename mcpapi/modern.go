package mcpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/bearer"
	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
)

// reqMeta is the per-request _meta of a 2026-07-28 request.
type reqMeta struct {
	Version      *string             `json:"io.modelcontextprotocol/protocolVersion"`
	Capabilities json.RawMessage     `json:"io.modelcontextprotocol/clientCapabilities"`
	ClientInfo   *mcp.Implementation `json:"io.modelcontextprotocol/clientInfo"`
	// W3C trace context (SEP-414 reserves these unprefixed keys).
	TraceParent string `json:"traceparent"`
	TraceState  string `json:"tracestate"`
	// ProgressToken asks for progress notifications (relayed by the
	// gateway; /mcp's own tools report none).
	ProgressToken json.RawMessage `json:"progressToken"`
}

// modernParams is the union of the params this handler reads: _meta for
// every method, cursor for tools/list, the rest for tools/call (the fields
// of mcp.CallToolParamsRaw, with typed _meta); uri for the gateway's
// resources/read.
type modernParams struct {
	Meta           reqMeta              `json:"_meta"`
	Cursor         *string              `json:"cursor"`
	Name           string               `json:"name"`
	Arguments      json.RawMessage      `json:"arguments"`
	InputResponses mcp.InputResponseMap `json:"inputResponses"`
	RequestState   string               `json:"requestState"`
	URI            string               `json:"uri"`
}

// inputRequiredResult is InputRequiredResult on the wire. The SDK's
// CallToolResult would add "content":null and no resultType.
type inputRequiredResult struct {
	ResultType    string              `json:"resultType"`
	Meta          mcp.Meta            `json:"_meta,omitempty"`
	InputRequests mcp.InputRequestMap `json:"inputRequests,omitempty"`
	RequestState  string              `json:"requestState,omitempty"`
}

// acceptsJSONAndSSE reports whether the Accept header lists both media types
// the 2026-07-28 transport requires (wildcards count).
func acceptsJSONAndSSE(values []string) bool {
	var jsonOK, sseOK bool
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
			switch strings.ToLower(strings.TrimSpace(mt)) {
			case "*/*":
				jsonOK, sseOK = true, true
			case "application/*", "application/json":
				jsonOK = true
			case "text/*", "text/event-stream":
				sseOK = true
			}
		}
	}
	return jsonOK && sseOK
}

// decodeHeaderValue undoes the =?base64?…?= form of non-ASCII header values.
func decodeHeaderValue(v string) (string, bool) {
	if inner, ok := strings.CutPrefix(v, "=?base64?"); ok {
		if inner, ok = strings.CutSuffix(inner, "?="); ok {
			b, err := base64.StdEncoding.DecodeString(inner)
			return string(b), err == nil
		}
	}
	return v, true
}

// modernChecks applies the 2026-07-28 rules to a request: its _meta
// protocolVersion and the headers that must repeat it, the method and
// Accept headers, the required clientCapabilities. A notification is
// answered 202. ok is false when the request was answered.
func (s *Server) modernChecks(w http.ResponseWriter, r *http.Request, msg *rpcMessage, meta *reqMeta, header string) (capsInfo, bool) {
	note(w, func(o *observedWriter) { o.era = versionModern })
	id := msg.ID
	if meta.Version == nil {
		writeRPCError(w, http.StatusBadRequest, id, codeInvalidParams,
			"Invalid params: _meta[\""+mcp.MetaKeyProtocolVersion+"\"] is required", nil)
		return capsInfo{}, false
	}
	version := *meta.Version
	switch {
	case header == "":
		writeRPCError(w, http.StatusBadRequest, id, codeHeaderMismatch, "Header mismatch: the MCP-Protocol-Version header is required", nil)
		return capsInfo{}, false
	case header != version:
		writeRPCError(w, http.StatusBadRequest, id, codeHeaderMismatch,
			fmt.Sprintf("Header mismatch: MCP-Protocol-Version header %s does not match _meta protocolVersion %s", quote(header), quote(version)), nil)
		return capsInfo{}, false
	case version != versionModern:
		writeRPCError(w, http.StatusBadRequest, id, codeUnsupportedVersion, "Unsupported protocol version",
			mcp.UnsupportedProtocolVersionData{Supported: supportedVersions, Requested: version})
		return capsInfo{}, false
	}
	if m := canonical(r.Header, "Mcp-Method"); m != msg.Method {
		text := "Header mismatch: the Mcp-Method header is required"
		if m != "" {
			text = fmt.Sprintf("Header mismatch: Mcp-Method header %s does not match method %s", quote(m), quote(msg.Method))
		}
		writeRPCError(w, http.StatusBadRequest, id, codeHeaderMismatch, text, nil)
		return capsInfo{}, false
	}
	if !acceptsJSONAndSSE(r.Header["Accept"]) {
		writeRPCError(w, http.StatusBadRequest, id, codeInvalidRequest, "The Accept header must list application/json and text/event-stream", nil)
		return capsInfo{}, false
	}
	if msg.isNotification() {
		w.WriteHeader(http.StatusAccepted)
		return capsInfo{}, false
	}
	if caps := bytes.TrimSpace(meta.Capabilities); len(caps) == 0 || string(caps) == "null" {
		writeRPCError(w, http.StatusBadRequest, id, codeInvalidParams,
			"Invalid params: _meta[\""+mcp.MetaKeyClientCapabilities+"\"] is required ({} declares none)", nil)
		return capsInfo{}, false
	}
	cc := s.caps.get(meta.Capabilities, capsFrom)
	if !cc.ok {
		writeRPCError(w, http.StatusBadRequest, id, codeInvalidParams,
			"Invalid params: _meta[\""+mcp.MetaKeyClientCapabilities+"\"] must be an object", nil)
		return capsInfo{}, false
	}
	return cc, true
}

// serveModern serves a 2026-07-28 request; ctx is the request's (r's own
// context, traced), info its verified bearer token.
func (s *Server) serveModern(ctx context.Context, w http.ResponseWriter, r *http.Request, msg *rpcMessage, p *modernParams, header string, info bearer.TokenInfo) {
	id := msg.ID
	cc, ok := s.modernChecks(w, r, msg, &p.Meta, header)
	if !ok {
		return
	}
	switch msg.Method {
	case "server/discover":
		writeRPCResult(w, id, s.discoverJSON)
	case "tools/list":
		if p.Cursor != nil && *p.Cursor != "" {
			writeRPCError(w, http.StatusBadRequest, id, codeInvalidParams, "Invalid params: unknown cursor (tools/list has one page)", nil)
			return
		}
		writeRPCResult(w, id, s.toolsListJSON)
	case "tools/call":
		s.serveModernCall(ctx, w, r, id, p, cc, info)
	default:
		writeRPCError(w, http.StatusNotFound, id, codeMethodNotFound, "Method not found: "+quote(msg.Method), nil)
	}
}

// paramsProblem names what is wrong with params, which failed to decode
// with err, without echoing input.
func paramsProblem(params json.RawMessage, err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) && ute.Field != "" {
		return fmt.Sprintf("field %q has the wrong type", ute.Field)
	}
	var raw struct {
		InputResponses json.RawMessage `json:"inputResponses"`
	}
	if json.Unmarshal(params, &raw) == nil && len(raw.InputResponses) > 0 {
		var m mcp.InputResponseMap
		if json.Unmarshal(raw.InputResponses, &m) != nil {
			return "inputResponses must map keys to elicitation results"
		}
	}
	return "params must be a JSON object"
}

func (s *Server) serveModernCall(ctx context.Context, w http.ResponseWriter, r *http.Request, id json.RawMessage, p *modernParams, cc capsInfo, info bearer.TokenInfo) {
	rawName := canonical(r.Header, "Mcp-Name")
	nameHeader, ok := decodeHeaderValue(rawName)
	switch {
	case rawName == "":
		writeRPCError(w, http.StatusBadRequest, id, codeHeaderMismatch, "Header mismatch: the Mcp-Name header is required for tools/call", nil)
		return
	case !ok || nameHeader != p.Name:
		writeRPCError(w, http.StatusBadRequest, id, codeHeaderMismatch,
			fmt.Sprintf("Header mismatch: Mcp-Name header does not match tool name %s", quote(p.Name)), nil)
		return
	}
	tool, ok := s.tools[p.Name]
	if !ok {
		writeRPCError(w, http.StatusBadRequest, id, codeInvalidParams, "Invalid params: unknown tool "+quote(p.Name), nil)
		return
	}
	c := &callContext{
		principal:   info.Principal,
		urlCapable:  cc.urlCapable,
		formCapable: cc.formCapable,
		modern:      true,
		args:        p.Arguments,
		responses:   p.InputResponses,
		state:       p.RequestState,
	}
	if p.Meta.ClientInfo != nil {
		c.clientName = clientName(p.Meta.ClientInfo)
	}
	s.writeOutcome(w, id, tool(ctx, c))
}

// clientName is the client's self-asserted name (untrusted): its title or
// name, valid UTF-8, at most 100 characters.
func clientName(impl *mcp.Implementation) string {
	name := impl.Title
	if name == "" {
		name = impl.Name
	}
	return untrusted.Clip(name, 100)
}

func (s *Server) writeOutcome(w http.ResponseWriter, id json.RawMessage, o outcome) {
	note(w, func(ow *observedWriter) {
		switch {
		case o.rpcErr != nil:
			ow.outcome = telemetry.OutcomeRPCError
		case o.input != nil:
			ow.outcome = telemetry.OutcomeInputRequired
		case o.failedTool():
			ow.outcome = telemetry.OutcomeToolError
		}
	})
	switch {
	case o.rpcErr != nil && o.rpcErr.Code == codeStorageUnavailable:
		writeUnavailable(w, id)
	case o.rpcErr != nil:
		status := http.StatusBadRequest
		if o.rpcErr.Code == codeInternal {
			status = http.StatusInternalServerError
		}
		writeRPCErrorValue(w, status, id, o.rpcErr)
	case o.input != nil:
		if b, ok := s.encodeInputRequired(o.input); ok {
			writeRPCResult(w, id, b)
			return
		}
		b, err := json.Marshal(inputRequiredResult{
			ResultType:    "input_required",
			Meta:          s.serverMeta(),
			InputRequests: mcp.InputRequestMap{o.input.key: o.input.params},
			RequestState:  o.input.state,
		})
		if err != nil {
			writeRPCError(w, http.StatusInternalServerError, id, codeInternal, "internal error", nil)
			return
		}
		writeRPCResult(w, id, b)
	case o.structured != nil:
		// The text content is the structured content's own bytes.
		buf := answerBufs.Get().(*[]byte)
		b := appendComplete(appendResultStart((*buf)[:0], id), s.implJSON, o.structured, o.structured, o.isError)
		writeRPCAnswer(w, b)
		putAnswerBuf(buf, b)
		if o.buf != nil {
			putAnswerBuf(o.buf, o.structured)
		}
	default:
		if b, ok := s.encodeToolResult(o.result); ok {
			writeRPCResult(w, id, b)
			return
		}
		res := o.result
		res.Meta = s.serverMeta()
		b, err := json.Marshal(res)
		if err != nil {
			writeRPCError(w, http.StatusInternalServerError, id, codeInternal, "internal error", nil)
			return
		}
		writeRPCResult(w, id, withResultType("complete", b))
	}
}

// answerBufs holds the buffers connected answers are built in: the
// ResponseWriter copies what it is written (an io.Writer never keeps p),
// so each buffer is used again rather than a new one allocated, and
// collected, for every call.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// putAnswerBuf returns buf to answerBufs, grown to b, unless it grew past
// what answers usually need.
func putAnswerBuf(buf *[]byte, b []byte) {
	if cap(b) > 64<<10 {
		return
	}
	*buf = b[:0]
	answerBufs.Put(buf)
}

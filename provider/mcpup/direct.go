package mcpup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/egress"
	"credbroker/internal/plainjson"
	"credbroker/internal/sse"
)

// The pool's own exchange for a relayed tools/call (CallTool).
//
// The go-sdk's client decodes each message it writes or reads (the
// request's name and _meta again for its headers, the answer's envelope,
// the result, its content) with a fresh 32 KiB decoder buffer: on a
// relayed call that was most of the broker's own CPU and nearly all its
// garbage (make bench's gateway profile). A 2026-07-28 exchange keeps no
// state at the session (no session id, no initialize), so for the common
// call the pool makes it itself, as the go-sdk's streamable transport
// makes it: the same body (the _meta triple, the arguments, an empty
// object for none), the same headers (Mcp-Protocol-Version, Mcp-Method,
// Mcp-Name, the connection's token) and the same token handling (on a
// 401 one forced refresh and one retry, a second 401 is ErrUnauthorized;
// a 403 insufficient_scope is a *NeedScope), the answer read as JSON or
// as an event stream. It hands back the result undecoded (ToolResult.Raw).
// Everything else goes through the session: another era, a session id, a
// call asking for progress or without the caller's client capabilities,
// and a tool whose listing on the session gave it x-mcp-header
// parameters, which the go-sdk sends as headers.
//
// Where they differ: an answer larger than the caller reads fails with
// ErrTooLarge (the go-sdk reads a JSON answer whole, an event up to 16
// MiB); an answer that is not the call's (another id) fails at once
// rather than at the call's timeout; requests the server sends on the
// stream, which 2026-07-28 has none of, are not answered; closing the
// request is the cancellation (2026-07-28 streamable HTTP has no
// notifications/cancelled).

// ErrTooLarge: the upstream's answer is larger than the caller reads.
var ErrTooLarge = errors.New("mcpup: the upstream's answer is larger than the broker reads")

// ToolResult is the answer of a relayed tools/call: Decoded by the
// go-sdk, or Raw, the JSON-RPC result as the upstream sent it (the pool's
// own exchange), for the caller to decode (mcp.CallToolResult's
// UnmarshalJSON reads it as the go-sdk would). The caller calls Finish
// once it has answered its own caller.
type ToolResult struct {
	Decoded *mcp.CallToolResult
	Raw     json.RawMessage
	finish  func()
}

// Finish ends the exchange once its answer was used: what an event
// stream sends after the answer (its end, so the connection carries the
// next request) is read in the background from then on, not while the
// caller writes its own answer. Call it once, after writing (until then
// the stream's connection carries nothing else); a result with nothing
// left to read (a JSON answer, the go-sdk's) does nothing.
func (r ToolResult) Finish() {
	if r.finish != nil {
		r.finish()
	}
}

// errRejected is the go-sdk transport's error for a request that did not
// reach the server or was refused before it answered (code -32005): the
// session stays usable, and the gateway does not relay it as the
// upstream's error.
var errRejected = &jsonrpc.Error{Code: -32005, Message: "rejected by transport"}

// modernEra is the first protocol version without sessions.
const modernEra = "2026-07-28"

// CallTool runs tools/call on cs, t's session (within Do): through the
// pool's own exchange when it can (see above; maxBytes bounds the answer
// it reads, the JSON body or one event), else through cs.
func (p *Pool) CallTool(ctx context.Context, cs *mcp.ClientSession, t Target, params *mcp.CallToolParams, maxBytes int64) (ToolResult, error) {
	w, ok := p.direct(cs, params)
	if !ok {
		res, err := cs.CallTool(ctx, params)
		return ToolResult{Decoded: res}, err
	}
	raw, finish, err := p.exchange(ctx, cs, w, params, maxBytes)
	return ToolResult{Raw: raw, finish: finish}, err
}

// ListTools is cs.ListTools, noting the tools that carry x-mcp-header
// parameters (which CallTool leaves to the go-sdk).
func (p *Pool) ListTools(ctx context.Context, cs *mcp.ClientSession, params *mcp.ListToolsParams) (*mcp.ListToolsResult, error) {
	res, err := cs.ListTools(ctx, params)
	if err != nil {
		return res, err
	}
	v, ok := p.wires.Load(cs)
	if !ok {
		return res, nil
	}
	for _, tool := range res.Tools {
		if tool == nil {
			continue
		}
		// Conservative: the words anywhere in the schema will do.
		if b, err := json.Marshal(tool.InputSchema); err != nil || bytes.Contains(b, []byte("x-mcp-header")) {
			v.(*wire).headerTools.add(tool.Name)
		}
	}
	return res, nil
}

// wire is what the pool's own exchange uses of a session: its HTTP client
// (whose transport, answers, redacts what the upstream answers of the
// session's tokens, routes progress and notes 401s), its token handler
// (nil for a server that takes no token) and its tools with x-mcp-header
// parameters.
type wire struct {
	url         string
	hc          *http.Client
	auth        *oauthHandler
	headerTools toolNames
}

// toolNames are a session's tools with x-mcp-header parameters.
type toolNames struct {
	mu    sync.Mutex // guards names
	names map[string]bool
}

func (n *toolNames) add(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names == nil {
		n.names = map[string]bool{}
	}
	n.names[name] = true
}

func (n *toolNames) has(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.names[name]
}

// direct reports whether params can go through the pool's own exchange
// on cs.
func (p *Pool) direct(cs *mcp.ClientSession, params *mcp.CallToolParams) (*wire, bool) {
	v, ok := p.wires.Load(cs)
	if !ok || params == nil || Era(cs) < modernEra || cs.ID() != "" {
		return nil, false
	}
	w := v.(*wire)
	for _, k := range []string{mcp.MetaKeyProtocolVersion, mcp.MetaKeyClientInfo, "progressToken"} {
		if _, ok := params.Meta[k]; ok {
			return nil, false
		}
	}
	if _, ok := params.Meta[mcp.MetaKeyClientCapabilities]; !ok || w.headerTools.has(params.Name) {
		return nil, false
	}
	return w, true
}

// callHeader is the header of every call (the go-sdk's), but for
// Mcp-Protocol-Version, Mcp-Name and Authorization.
var callHeader = http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}, "Mcp-Method": {"tools/call"}}

// callRequest is a tools/call request on the wire.
type callRequest struct {
	JSONRPC string              `json:"jsonrpc"`
	ID      int64               `json:"id"`
	Method  string              `json:"method"`
	Params  *mcp.CallToolParams `json:"params"`
}

// exchange makes the call and returns its result (see above), and what
// ends it (ToolResult.Finish: nil when nothing is left).
func (p *Pool) exchange(ctx context.Context, cs *mcp.ClientSession, w *wire, params *mcp.CallToolParams, maxBytes int64) (json.RawMessage, func(), error) {
	era := Era(cs)
	id := p.ids.Add(1)
	payload, ok := p.appendCall(make([]byte, 0, 512), id, era, params)
	if !ok {
		// The _meta triple and the arguments as the go-sdk completes them.
		call := *params
		call.Meta = make(mcp.Meta, len(params.Meta)+2)
		for k, v := range params.Meta {
			call.Meta[k] = v
		}
		call.Meta[mcp.MetaKeyProtocolVersion] = era
		call.Meta[mcp.MetaKeyClientInfo] = p.impl
		if call.Arguments == nil {
			call.Arguments = map[string]any{}
		}
		var body bytes.Buffer
		enc := json.NewEncoder(&body)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(callRequest{JSONRPC: "2.0", ID: id, Method: "tools/call", Params: &call}); err != nil {
			return nil, nil, fmt.Errorf("mcpup: encode tools/call: %w", err)
		}
		payload = bytes.TrimSuffix(body.Bytes(), []byte("\n"))
	}

	// The request ends with the call (closing it is the cancellation), but
	// an event stream's end is read after the answer, off the call's time.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	done := func() { stop(); cancel() }
	auth := w.auth
	send := func() (*http.Request, *http.Response, error) {
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, w.url, bytes.NewReader(payload))
		if err != nil {
			return nil, nil, err
		}
		req.Header = make(http.Header, 6)
		for k, v := range callHeader {
			req.Header[k] = v // never changed: shared
		}
		req.Header["Mcp-Protocol-Version"], req.Header["Mcp-Name"] = []string{era}, []string{params.Name}
		if auth != nil {
			// As on the session's requests: the token is noted among the
			// session's secrets, which its answers are redacted of.
			if err := auth.put(ctx, req.Header); err != nil {
				return nil, nil, fmt.Errorf("mcpup: sending tools/call: %w: %w", errRejected, err)
			}
		}
		resp, err := w.hc.Do(req)
		if err != nil {
			err = fmt.Errorf("mcpup: sending tools/call: %w: %w", errRejected, err)
		}
		return req, resp, err
	}
	fail := func(err error) (json.RawMessage, func(), error) {
		done()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	req, resp, err := send()
	if err != nil {
		return fail(err)
	}
	if (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) && auth != nil {
		if err := auth.Authorize(ctx, req, resp); err != nil {
			return fail(fmt.Errorf("mcpup: sending tools/call: %w: %w", errRejected, err))
		}
		if _, resp, err = send(); err != nil {
			return fail(err)
		}
	}
	res, finish, err := readCallAnswer(resp, id, maxBytes, stop, cancel)
	if err != nil {
		return fail(err)
	}
	return res, finish, nil
}

// appendCall appends the request of the usual relayed call (its _meta
// the host's client capabilities as members, its arguments and those
// members' values raw JSON, names plain, no input responses or request
// state) without reflection: what encoding/json writes for it, but for
// the raw values, which go as they are instead of compacted. ok is false
// for any other call, which encoding/json writes.
func (p *Pool) appendCall(b []byte, id int64, era string, params *mcp.CallToolParams) ([]byte, bool) {
	caps, isRaw := params.Meta[mcp.MetaKeyClientCapabilities].(map[string]json.RawMessage)
	args, argsRaw := params.Arguments.(json.RawMessage)
	if !isRaw || len(params.Meta) != 1 || params.Arguments != nil && !argsRaw || params.InputResponses != nil || params.RequestState != "" {
		return b, false
	}
	if params.Arguments == nil {
		args = json.RawMessage(`{}`)
	}
	if !json.Valid(args) {
		return b, false
	}
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"method":"tools/call","params":{"_meta":{"`+mcp.MetaKeyClientCapabilities+`":{`...)
	keys := make([]string, 0, len(caps))
	for k := range caps {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		if b, ok = plainjson.AppendString(b, k); !ok || !json.Valid(caps[k]) {
			return b, false
		}
		b = append(b, ':')
		b = append(b, caps[k]...)
	}
	b = append(b, `},"`+mcp.MetaKeyClientInfo+`":`...)
	b = append(b, p.implJSON...)
	b = append(b, `,"`+mcp.MetaKeyProtocolVersion+`":`...)
	var ok bool
	if b, ok = plainjson.AppendString(b, era); !ok {
		return b, false
	}
	b = append(b, `},"name":`...)
	if b, ok = plainjson.AppendString(b, params.Name); !ok {
		return b, false
	}
	b = append(b, `,"arguments":`...)
	b = append(b, args...)
	return append(b, "}}"...), true
}

// drainTimeout bounds reading what follows the answer in an event stream
// (its end, so the connection is kept), in the background.
const drainTimeout = 5 * time.Second

// readCallAnswer reads the answer to request id from resp, each message at
// most maxBytes. On success the request is ended: at once for a JSON
// answer (finish is nil); for an event stream, once what follows the
// answer is read, in the background from when finish is called (detach
// first unhooks the request from the call: false when the call ended
// meanwhile). On failure the body is closed and the caller ends the
// request.
func readCallAnswer(resp *http.Response, id, maxBytes int64, detach func() bool, end context.CancelFunc) (json.RawMessage, func(), error) {
	if err := answered(resp, maxBytes); err != nil {
		resp.Body.Close()
		return nil, nil, err
	}
	switch mediaType(resp.Header.Get("Content-Type")) {
	case "application/json":
		b, err := readLimited(resp.Body, maxBytes)
		resp.Body.Close()
		if err != nil {
			return nil, nil, err
		}
		msg, err := decodeMessage(b)
		switch {
		case err != nil:
			return nil, nil, err
		case msg.request:
			return nil, nil, errors.New("mcpup: tools/call: the upstream answered with a request")
		}
		res, err := msg.answer(id)
		if err == nil {
			detach()
			end()
		}
		return res, nil, err
	case "text/event-stream":
		events := readers.Get().(*sse.Reader)
		events.Reset(resp.Body, maxBytes)
		closeBody := func() {
			resp.Body.Close()
			events.Reset(nil, 0)
			readers.Put(events)
		}
		for {
			data, err := events.Next()
			switch {
			case errors.Is(err, io.EOF):
				err = errors.New("mcpup: tools/call: the stream ended without the answer")
			case errors.Is(err, sse.ErrTooLarge):
				err = ErrTooLarge
			case err != nil:
				err = fmt.Errorf("mcpup: tools/call: %w", err)
			}
			if err != nil {
				closeBody()
				return nil, nil, err
			}
			msg, err := decodeMessage(data)
			if err != nil {
				closeBody()
				return nil, nil, err
			}
			if msg.request {
				// A notification (no progress was asked for; logging is
				// not relayed), or a request 2026-07-28 servers do not send.
				continue
			}
			res, err := msg.answer(id)
			if err != nil {
				closeBody()
				return nil, nil, err
			}
			if !detach() {
				closeBody()
				return nil, nil, context.Canceled
			}
			return res, func() {
				go func() {
					// What follows the answer, to the stream's end, so
					// the connection carries the next request.
					t := time.AfterFunc(drainTimeout, end)
					drain(resp.Body, 1<<20)
					t.Stop()
					closeBody()
					end()
				}()
			}, nil
		}
	}
	resp.Body.Close()
	return nil, nil, fmt.Errorf("mcpup: tools/call: unsupported content type %q", resp.Header.Get("Content-Type"))
}

// drain reads body to its end, at most limit bytes, from the body itself
// into a pooled buffer (what the event reader holds is not needed): the
// goroutine that finishes a stream starts with a small stack, which
// reading through the reader's buffer and io.CopyN's chain grew (make
// bench's c=1 profile showed the growth under that read).
func drain(body io.Reader, limit int64) {
	buf := drainBufs.Get().(*[]byte)
	defer drainBufs.Put(buf)
	for n := int64(0); n < limit; {
		m, err := body.Read(*buf)
		if n += int64(m); err != nil {
			return
		}
	}
}

// drainBufs are drain's buffers.
var drainBufs = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}

// mediaType is a Content-Type's media type, as mime.ParseMediaType reads
// it (the two an MCP server sends, without parameters, at once).
func mediaType(v string) string {
	if v == "application/json" || v == "text/event-stream" {
		return v
	}
	mt, _, _ := mime.ParseMediaType(v)
	return mt
}

// answered checks an answer's status as the go-sdk's transport does: a
// transient failure; an error with a JSON-RPC error in its body (relayed
// as that error); any other failure.
func answered(resp *http.Response, maxBytes int64) error {
	switch resp.StatusCode {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusTooManyRequests:
		return fmt.Errorf("mcpup: tools/call: %w: %s", errRejected, http.StatusText(resp.StatusCode))
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	if b, err := readLimited(resp.Body, min(maxBytes, 1<<20)); err == nil {
		if msg, err := decodeMessage(b); err == nil && !msg.request && msg.err != nil {
			return fmt.Errorf("mcpup: tools/call: %w: %w (HTTP %d)", msg.err, errRejected, resp.StatusCode)
		}
	}
	return fmt.Errorf("mcpup: tools/call: %s", http.StatusText(resp.StatusCode))
}

// readLimited reads r whole, at most limit bytes (egress.ReadAll, its
// refusal as this package's ErrTooLarge).
func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := egress.ReadAll(r, limit)
	switch {
	case errors.Is(err, egress.ErrTooLarge):
		return nil, ErrTooLarge
	case err != nil:
		return nil, fmt.Errorf("mcpup: tools/call: reading the answer: %w", err)
	}
	return b, nil
}

// readers are the event streams' readers, reused.
var readers = sync.Pool{New: func() any { return sse.NewReader(nil, 0) }}

// message is a JSON-RPC message as the exchange reads it.
type message struct {
	// request: it has a method (a notification or a request).
	request bool
	id      json.RawMessage
	result  json.RawMessage
	err     *jsonrpc.Error
}

// decodeMessage reads one JSON-RPC message: its members by exact name,
// as the go-sdk's decoder matches them (the usual message in one pass
// over it, scanMembers; any other through encoding/json).
func decodeMessage(b []byte) (message, error) {
	m, ok := scanMembers(b)
	if !ok {
		m = nil
		if err := json.Unmarshal(b, &m); err != nil {
			return message{}, fmt.Errorf("mcpup: tools/call: the answer is not a JSON-RPC message: %w", err)
		}
	}
	var v string
	if string(m["jsonrpc"]) != `"2.0"` && (json.Unmarshal(m["jsonrpc"], &v) != nil || v != "2.0") {
		return message{}, errors.New(`mcpup: tools/call: the answer is not a JSON-RPC 2.0 message`)
	}
	if _, ok := m["method"]; ok {
		return message{request: true}, nil
	}
	msg := message{id: m["id"], result: m["result"]}
	if e, ok := m["error"]; ok && string(e) != "null" {
		msg.err = &jsonrpc.Error{}
		if err := json.Unmarshal(e, msg.err); err != nil {
			return message{}, fmt.Errorf("mcpup: tools/call: the answer's error: %w", err)
		}
	}
	return msg, nil
}

// members are a message's members that matter, by name.
type members map[string]json.RawMessage

// scanMembers reads the object b into members, as json.Unmarshal into a
// map does, when every key is plain (plainjson.String) and present once;
// ok is false otherwise.
func scanMembers(b []byte) (members, bool) {
	i := plainjson.Space(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	m := make(members, 4)
	if i = plainjson.Space(b, i+1); i < len(b) && b[i] == '}' {
		return m, plainjson.Space(b, i+1) == len(b)
	}
	for {
		start, end, ok := plainjson.String(b, plainjson.Space(b, i))
		if !ok {
			return nil, false
		}
		key := plainjson.Intern(b[start:end], memberNames)
		if _, dup := m[key]; dup {
			return nil, false
		}
		if i = plainjson.Space(b, end+1); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		vstart := plainjson.Space(b, i+1)
		if i, ok = plainjson.ValueEnd(b, vstart); !ok {
			return nil, false
		}
		m[key] = b[vstart:i:i]
		switch i = plainjson.Space(b, i); {
		case i < len(b) && b[i] == '}':
			return m, plainjson.Space(b, i+1) == len(b)
		case i < len(b) && b[i] == ',':
			i++
		default:
			return nil, false
		}
	}
}

// memberNames are decodeMessage's member names, kept without allocating
// them (plainjson.Intern).
var memberNames = []string{"jsonrpc", "id", "method", "result", "error"}

// answer is msg's result as the answer to the request id: its error
// (wrapped) or its result.
func (msg message) answer(id int64) (json.RawMessage, error) {
	if !sameID(msg.id, id) {
		return nil, fmt.Errorf("mcpup: tools/call: the upstream answered another request (id %s)", msg.id)
	}
	if msg.err != nil {
		return nil, fmt.Errorf("calling %q: %w", "tools/call", msg.err)
	}
	if len(msg.result) == 0 {
		return nil, errors.New("mcpup: tools/call: the answer has neither result nor error")
	}
	return msg.result, nil
}

// sameID reports whether raw is the number id (the go-sdk reads ids
// through float64: 1.0 is 1).
func sameID(raw json.RawMessage, id int64) bool {
	if string(raw) == strconv.FormatInt(id, 10) {
		return true
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	return err == nil && f == float64(id)
}

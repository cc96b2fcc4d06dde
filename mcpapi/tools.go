package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/connections"
	"credbroker/internal/requeststate"
	"credbroker/internal/strictjson"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/vault"
)

// Tool names.
const (
	toolConnect    = "connect_account"
	toolList       = "list_connections"
	toolDisconnect = "disconnect_account"
	toolRequest    = "provider_request"
)

// callContext is one tools/call as both eras present it to the tools.
type callContext struct {
	principal   vault.Principal
	clientName  string
	urlCapable  bool // the client declared elicitation.url
	formCapable bool // the client declared elicitation.form (or an empty elicitation)
	modern      bool // 2026-07-28 (MRTR) rather than 2025-11-25
	args        json.RawMessage
	responses   mcp.InputResponseMap
	state       string
}

// outcome is what a tool produced: exactly one of result, structured,
// input, rpcErr.
type outcome struct {
	result *mcp.CallToolResult
	// structured is a complete result built by complete(): its structured
	// content and its one text content are these bytes (compact JSON, as
	// json.Marshal writes it); isError marks it a tool error. The modern
	// era encodes it as it is, without the SDK's types (toolResult builds
	// them for the others).
	structured []byte
	isError    bool
	// buf, when set, is the answerBufs buffer structured was built in:
	// writeOutcome returns it once the answer is written (the legacy
	// era's result keeps structured, and leaves buf to the collector).
	buf    *[]byte
	input  *inputRequired
	rpcErr *rpcError
}

// toolResult is the tool's result as the SDK's value (nil for input and
// errors).
func (o outcome) toolResult() *mcp.CallToolResult {
	if o.structured == nil {
		return o.result
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: string(o.structured)}},
		StructuredContent: json.RawMessage(o.structured),
		IsError:           o.isError,
	}
}

// failedTool reports whether the outcome is a tool error (isError).
func (o outcome) failedTool() bool {
	return o.isError || o.result != nil && o.result.IsError
}

// inputRequired is an MRTR answer: one url elicitation plus sealed state.
type inputRequired struct {
	key    string
	params *mcp.ElicitParams
	state  string
}

type toolFunc func(ctx context.Context, c *callContext) outcome

// connectionView describes a connection to clients. It has no secret fields
// by construction.
type connectionView struct {
	ID       string     `json:"id"`
	Provider string     `json:"provider"`
	Account  string     `json:"account"`
	Scopes   []string   `json:"scopes"`
	Status   string     `json:"status"`
	Created  time.Time  `json:"created"`
	LastUsed *time.Time `json:"lastUsed,omitempty"`
	// NotGranted are the scopes the connection's last connect request
	// asked for that the provider did not grant; Note says so in words
	// and how to ask again. Both absent when everything was granted.
	NotGranted []string `json:"notGranted,omitempty"`
	Note       string   `json:"note,omitempty"`
}

// viewOf describes c (p, its provider, may be nil when it is no longer
// configured). The view shares c's scopes: views are encoded, never
// changed.
func viewOf(c vault.Connection, p *provider.Provider) connectionView {
	v := connectionView{
		ID: c.ID, Provider: c.Provider, Account: connections.AccountName(c), Scopes: c.Scopes,
		Status: string(c.Status), Created: c.Created.UTC(),
	}
	if v.Scopes == nil {
		v.Scopes = []string{}
	}
	if !c.LastUsed.IsZero() {
		t := c.LastUsed.UTC()
		v.LastUsed = &t
	}
	if v.NotGranted = connections.NotGranted(p, c); len(v.NotGranted) > 0 {
		v.Note = notGrantedNote(p, c.Provider, v.NotGranted)
	}
	return v
}

// notGrantedNote says which scopes were not granted and how to ask again:
// connect_account with them (the person decides again in the browser).
func notGrantedNote(p *provider.Provider, name string, missing []string) string {
	asked, _ := json.Marshal(missing)
	return fmt.Sprintf("%s To ask again, call connect_account with provider %s and scopes %s; the user is asked in the browser and may grant them or not.",
		connections.NotGrantedWords(p, missing), quote(name), asked)
}

// view describes c with its configured provider.
func (s *Server) view(c vault.Connection) connectionView {
	p, _ := s.opts.Connections.Providers().Lookup(c.Provider)
	return viewOf(c, p)
}

type connectOutput struct {
	Status     string          `json:"status"` // connected | declined | cancelled
	Message    string          `json:"message"`
	Connection *connectionView `json:"connection,omitempty"`
}

type listOutput struct {
	Connections []connectionView `json:"connections"`
}

type disconnectOutput struct {
	Provider string `json:"provider"`
	Account  string `json:"account"`
	// Revocation: revoked | not_confirmed | not_supported | kept_shared.
	Revocation string `json:"revocation"`
	Deleted    bool   `json:"deleted"`
	Message    string `json:"message"`
}

const viewSchema = `{"type":"object","properties":{
"id":{"type":"string"},"provider":{"type":"string"},"account":{"type":"string"},
"scopes":{"type":"array","items":{"type":"string"}},
"status":{"type":"string","enum":["active","needs_reconnect"]},
"created":{"type":"string","format":"date-time"},"lastUsed":{"type":"string","format":"date-time"},
"notGranted":{"type":"array","items":{"type":"string"},"minItems":1,"description":"Scopes asked for that the user did not grant."},
"note":{"type":"string","description":"What was not granted, and how to ask again."}},
"required":["id","provider","account","scopes","status","created"],"additionalProperties":false,
"dependentRequired":{"notGranted":["note"],"note":["notGranted"]}}`

func compactJSON(s string) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		panic("mcpapi: bad built-in schema: " + err.Error())
	}
	return b.Bytes()
}

func boolPtr(b bool) *bool { return &b }

// toolDefs returns the tools' definitions, in tools/list order.
func toolDefs() []*mcp.Tool {
	return []*mcp.Tool{
		{
			Name:        toolConnect,
			Title:       "Connect an account",
			Description: "Ensure the user has connected their account at a provider (for example GitHub or Google, or a service used with an API key) with the given scopes. If not, the user is asked to open a link to the broker and connect there in the browser (signing in at the provider, or entering a key on the broker's page, never in this app); the result describes the connection, never a token or key.",
			InputSchema: compactJSON(`{"type":"object","properties":{
"provider":{"type":"string","description":"Provider name, as listed by the broker's configuration."},
"scopes":{"type":"array","items":{"type":"string"},"description":"Scopes the connection must cover; default: the provider's default scopes."}},
"required":["provider"],"additionalProperties":false}`),
			OutputSchema: compactJSON(`{"type":"object","properties":{
"status":{"type":"string","enum":["connected","declined","cancelled"]},
"message":{"type":"string"},"connection":` + viewSchema + `},
"required":["status","message"],"additionalProperties":false}`),
			Annotations: &mcp.ToolAnnotations{Title: "Connect an account", ReadOnlyHint: false,
				DestructiveHint: boolPtr(false), IdempotentHint: true, OpenWorldHint: boolPtr(true)},
		},
		{
			Name:         toolList,
			Title:        "List connected accounts",
			Description:  "List the user's connected provider accounts: provider, account login, scopes, status and times. Never returns tokens.",
			InputSchema:  compactJSON(`{"type":"object","properties":{},"additionalProperties":false}`),
			OutputSchema: compactJSON(`{"type":"object","properties":{"connections":{"type":"array","items":` + viewSchema + `}},"required":["connections"],"additionalProperties":false}`),
			Annotations: &mcp.ToolAnnotations{Title: "List connected accounts", ReadOnlyHint: true,
				DestructiveHint: boolPtr(false), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
		},
		{
			Name:        toolDisconnect,
			Title:       "Disconnect an account",
			Description: "Disconnect the user's account at a provider: revoke the broker's tokens at the provider when it supports revocation, then delete them from the broker. Give account when several accounts of the provider are connected.",
			InputSchema: compactJSON(`{"type":"object","properties":{
"provider":{"type":"string"},"account":{"type":"string","description":"Account login (or id) to disconnect."}},
"required":["provider"],"additionalProperties":false}`),
			OutputSchema: compactJSON(`{"type":"object","properties":{
"provider":{"type":"string"},"account":{"type":"string"},
"revocation":{"type":"string","enum":["revoked","not_confirmed","not_supported","kept_shared"]},
"deleted":{"type":"boolean"},"message":{"type":"string"}},
"required":["provider","account","revocation","deleted","message"],"additionalProperties":false}`),
			Annotations: &mcp.ToolAnnotations{Title: "Disconnect an account", ReadOnlyHint: false,
				DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(true)},
		},
		providerRequestTool(),
	}
}

func (s *Server) toolFuncs() map[string]toolFunc {
	return map[string]toolFunc{
		toolConnect:    s.connectAccount,
		toolList:       s.listConnections,
		toolDisconnect: s.disconnectAccount,
		toolRequest:    s.providerRequest,
	}
}

// complete builds a successful result with structured content and its JSON
// text form.
func complete(structured any) outcome {
	if co, ok := structured.(connectOutput); ok {
		return completeConnect(&co)
	}
	b, err := json.Marshal(structured)
	if err != nil {
		return internalError()
	}
	return outcome{structured: b}
}

// completeConnect is complete for connect_account's output, encoded in a
// buffer of answerBufs that the outcome hands back once written.
func completeConnect(co *connectOutput) outcome {
	buf := answerBufs.Get().(*[]byte)
	b, ok := encodeConnectOutput((*buf)[:0], co)
	if !ok {
		return internalError()
	}
	return outcome{structured: b, buf: buf}
}

// toolError is a tool failure the model can read and act on (isError).
func toolError(format string, args ...any) outcome {
	return outcome{result: &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}},
		IsError: true,
	}}
}

func internalError() outcome {
	return outcome{rpcErr: &rpcError{Code: codeInternal, Message: "internal error"}}
}

func invalidParams(msg string) outcome {
	return outcome{rpcErr: &rpcError{Code: codeInvalidParams, Message: msg}}
}

// quote renders untrusted text for a message: quoted, control characters
// escaped, bounded.
func quote(s string) string { return untrusted.Quote(s) }

type connectInput struct {
	Provider string   `json:"provider"`
	Scopes   []string `json:"scopes"`
}

func (in *connectInput) stringArgs() []stringArg {
	return []stringArg{{"provider", &in.Provider}}
}

type disconnectInput struct {
	Provider string `json:"provider"`
	Account  string `json:"account"`
}

func (in *disconnectInput) stringArgs() []stringArg {
	return []stringArg{{"provider", &in.Provider}, {"account", &in.Account}}
}

// decodeArgs decodes tool arguments strictly into v, a fresh zero value.
func decodeArgs(raw json.RawMessage, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" || string(raw) == "{}" {
		return nil // v is the caller's fresh zero value: nothing to decode
	}
	if f, ok := v.(stringArgser); ok && fastStringArgs(raw, f.stringArgs()) {
		return nil
	}
	return decodeArgsJSON(raw, v)
}

// decodeArgsJSON is decodeArgs with encoding/json alone.
func decodeArgsJSON(raw json.RawMessage, v any) error {
	err := strictjson.Decode(raw, v)
	var ute *json.UnmarshalTypeError
	var ufe *strictjson.UnknownFieldError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ute) && ute.Field != "":
		return fmt.Errorf("argument %q has the wrong type (want %s)", ute.Field, ute.Type)
	case errors.As(err, &ufe):
		return fmt.Errorf("unknown argument %s", strconv.Quote(ufe.Field))
	case errors.Is(err, strictjson.ErrTrailing):
		return errors.New("arguments must be one JSON object")
	}
	return errors.New("arguments must be a JSON object matching the tool's input schema")
}

// request builds the connections request of a tools/call.
func (c *callContext) request(provider string, scopes []string, account string) connections.Request {
	return connections.Request{Principal: c.principal, Provider: provider, Scopes: scopes, Account: account,
		ClientName: c.clientName, Via: "mcp", CanAsk: c.urlCapable,
		// A 2025-11-25 client retries the whole call while the person is in
		// the browser: give it the link it already has.
		ReuseOpen: !c.modern}
}

// answer reads the person's answer to the input request key from a retry.
func (c *callContext) answer(key string) (connections.Answer, *outcome) {
	r, ok := c.responses[key]
	if !ok {
		return connections.NoAnswer, nil
	}
	er, ok := r.(*mcp.ElicitResult)
	if !ok {
		o := invalidParams(fmt.Sprintf("inputResponses[%q] must be an elicitation result", key))
		return "", &o
	}
	a, ok := connections.ParseAnswer(er.Action)
	if !ok {
		o := invalidParams(fmt.Sprintf("inputResponses[%q].action must be accept, decline or cancel", key))
		return "", &o
	}
	return a, nil
}

// continued opens the sealed requestState of a retry of tool: the
// continuation's reference, or the outcome to answer.
func (s *Server) continued(c *callContext, tool string) (string, *outcome) {
	digest, err := requeststate.Digest(c.args)
	if err != nil {
		o := invalidParams(invalidState)
		return "", &o
	}
	st, err := requeststate.Open(s.opts.StateKeys, c.state, c.principal, tool, digest, s.opts.Now())
	if err != nil {
		o := invalidParams(invalidState)
		return "", &o
	}
	return st.Ref, nil
}

func (s *Server) connectAccount(ctx context.Context, c *callContext) outcome {
	var in connectInput
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	req := c.request(in.Provider, in.Scopes, "")
	var (
		o   connections.Outcome
		err error
	)
	if c.state == "" {
		o, err = s.opts.Connections.Ensure(ctx, req)
	} else {
		grant, bad := s.continued(c, toolConnect)
		if bad != nil {
			return *bad
		}
		answer, bad := c.answer("connect_" + in.Provider)
		if bad != nil {
			return *bad
		}
		o, err = s.opts.Connections.Resume(ctx, req, grant, answer)
	}
	if err != nil {
		return s.failed(err, in.Provider, toolConnect)
	}
	switch o := o.(type) {
	case connections.Connected:
		v := viewOf(o.Conn, o.Provider)
		msg := "Connected: " + o.Provider.DisplayName + " account " + v.Account + " (scopes: " + strings.Join(v.Scopes, " ") + ")."
		if v.Note != "" {
			msg += " " + v.Note
		}
		if connections.MissingRefreshToken(o.Provider, o.Conn) {
			msg += fmt.Sprintf(" %s gave no refresh token, so this connection stops working when its access token expires; the user can then remove the app's access in their %s settings and connect again.",
				o.Provider.DisplayName, o.Provider.DisplayName)
		}
		return completeConnect(&connectOutput{Status: "connected", Message: msg, Connection: &v})
	case connections.Declined:
		return declined(o)
	case connections.Cancelled:
		return complete(connectOutput{Status: "cancelled", Message: o.Message(toolConnect)})
	case connections.NeedsUser:
		return s.askToConnect(c, toolConnect, o)
	}
	return internalError()
}

// invalidState is the one answer to a requestState that does not open
// for this call, whatever the reason.
const invalidState = "Invalid or expired requestState"

// failed turns a connections error into the tool's answer, by its class: a
// tool error the model can act on, -32602 for a bad requestState, the
// storage outage's retryable error, or an internal error (logged, never
// shown).
func (s *Server) failed(err error, providerName string, tool string) outcome {
	p, _ := s.opts.Connections.Providers().Lookup(providerName)
	f := connections.Explain(err, p)
	switch f.Class {
	case connections.BadState:
		return invalidParams(invalidState)
	case connections.StorageUnavailable:
		s.unavailableLogged(err)
		return outcome{rpcErr: unavailableError()}
	case connections.Internal:
		s.log.Error("mcpapi: "+tool+" failed", "err", err.Error())
		if tool != toolRequest || p == nil {
			return internalError()
		}
	}
	if f.Next == connections.NextStartOver {
		return toolError("%s Call %s again to start over.", f.Message, tool)
	}
	return toolError("%s", f.Message)
}

// askToConnect answers with the url elicitation of a connect request:
// input_required (2026-07-28), or what linkWithoutMRTR answers.
func (s *Server) askToConnect(c *callContext, tool string, n connections.NeedsUser) outcome {
	if re, text, done := linkWithoutMRTR(c.modern, n, s.opts.Connections.PageURL()); done {
		if re != nil {
			return outcome{rpcErr: re}
		}
		return toolError("%s", text)
	}
	msg := n.Message()
	digest, err := requeststate.Digest(c.args)
	if err != nil {
		return invalidParams("arguments are not valid JSON")
	}
	st := requeststate.Seal(s.opts.StateKeys, requeststate.State{Principal: c.principal, Operation: tool,
		ArgDigest: digest, Ref: n.Grant.ID, Expires: n.Until(s.opts.Now(), s.opts.StateTTL)})
	return outcome{input: &inputRequired{
		key:    "connect_" + n.Provider.Name,
		params: &mcp.ElicitParams{Mode: "url", Message: msg, URL: n.URL},
		state:  st,
	}}
}

// linkWithoutMRTR is connect request n as both doors (/mcp and the
// gateway) give it to a client that gets no input_required: -32021 for a
// 2026-07-28 client without elicitation.url, a tool error's text naming
// the connections page at pageURL for a 2025-11-25 one (n carries no
// request then), -32042 carrying the link for a 2025-11-25 one with it.
// done is false for a 2026-07-28 client that can open links.
func linkWithoutMRTR(modern bool, n connections.NeedsUser, pageURL string) (re *rpcError, toolText string, done bool) {
	name := n.Provider.DisplayName
	switch {
	case n.Grant == nil && modern:
		data, _ := json.Marshal(map[string]any{"requiredCapabilities": urlCapability})
		return &rpcError{Code: codeMissingCapability, Message: fmt.Sprintf("Connecting %s needs the client capability elicitation.url (%s)", name, n.Why),
			Data: data}, "", true
	case n.Grant == nil:
		return nil, n.NoLinkMessage(pageURL), true
	case modern:
		return nil, "", false
	}
	err := mcp.URLElicitationRequiredError([]*mcp.ElicitParams{{Mode: "url", Message: n.Message(), URL: n.URL, ElicitationID: n.Grant.ID}})
	if !errors.As(err, &re) {
		return &rpcError{Code: codeInternal, Message: "internal error"}, "", true
	}
	re.Message = "Connect your " + name + " account in the browser, then retry"
	return re, "", true
}

var urlCapability = map[string]any{"elicitation": map[string]any{"url": map[string]any{}}}

func declined(d connections.Declined) outcome {
	return complete(connectOutput{Status: "declined", Message: d.Message()})
}

func (s *Server) listConnections(ctx context.Context, c *callContext) outcome {
	var in struct{}
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	conns, err := s.opts.Connections.List(ctx, c.principal)
	if err != nil {
		return s.failed(err, "", toolList)
	}
	out := listOutput{Connections: make([]connectionView, 0, len(conns))}
	for _, conn := range conns {
		out.Connections = append(out.Connections, s.view(conn))
	}
	return complete(out)
}

func (s *Server) disconnectAccount(ctx context.Context, c *callContext) outcome {
	var in disconnectInput
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	d, err := s.opts.Connections.Disconnect(ctx, c.request(in.Provider, nil, in.Account))
	if d.Provider == nil {
		var ae *connections.AccountError
		if errors.As(err, &ae) && ae.Several {
			return toolError("Several %s accounts are connected; say which with account: %s.", ae.Provider.DisplayName, strings.Join(ae.Accounts, ", "))
		}
		return s.failed(err, in.Provider, toolDisconnect)
	}
	name := d.Provider.DisplayName
	out := disconnectOutput{Provider: d.Provider.Name, Account: connections.AccountName(d.Conn), Revocation: string(d.Revocation), Deleted: err == nil}
	if errors.Is(err, vault.ErrUnavailable) {
		// Revoked (or not) at the provider, not deleted: a retry finishes.
		return s.failed(err, in.Provider, toolDisconnect)
	}
	if err != nil {
		s.log.Error("mcpapi: delete connection", "connection", d.Conn.ID, "err", err.Error())
		out.Message = fmt.Sprintf("The %s connection for %s could not be deleted; try again.", name, out.Account)
		o := complete(out)
		o.isError = true
		return o
	}
	form, isForm := d.Provider.Kind.(provider.FormStep)
	switch {
	case isForm:
		out.Message = fmt.Sprintf("Disconnected %s account %s: the key was deleted from the broker. The broker cannot revoke an API key; revoke it at %s as well: %s",
			name, out.Account, name, form.Form().InstructionsURL)
	case d.Revocation == provider.Revoked:
		out.Message = fmt.Sprintf("Disconnected %s account %s: the tokens were revoked at %s and deleted from the broker.", name, out.Account, name)
	case d.Revocation == provider.KeptShared:
		out.Message = fmt.Sprintf("Disconnected %s account %s: the tokens were deleted from the broker but not revoked at %s, because another connection uses the same %s account and revoking would end its access too.", name, out.Account, name, name)
	case d.Revocation == provider.NotConfirmed:
		out.Message = fmt.Sprintf("Disconnected %s account %s: %s did not confirm the revocation, so the grant may still be listed in your %s settings; the tokens were deleted from the broker.", name, out.Account, name, name)
	default:
		out.Message = fmt.Sprintf("Disconnected %s account %s: %s offers no revocation, so remove the broker's access in your %s settings if you wish; the tokens were deleted from the broker.", name, out.Account, name, name)
	}
	return complete(out)
}

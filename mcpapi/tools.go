package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/binding"
	"credbroker/internal/telemetry"
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

// outcome is what a tool produced: exactly one of result, input, rpcErr.
type outcome struct {
	result *mcp.CallToolResult
	input  *inputRequired
	rpcErr *rpcError
}

// inputRequired is an MRTR answer: one url elicitation plus sealed state.
type inputRequired struct {
	key     string
	params  *mcp.ElicitParams
	grantID string
	state   string
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
}

func viewOf(c vault.Connection) connectionView {
	v := connectionView{
		ID: c.ID, Provider: c.Provider, Account: c.AccountLogin, Scopes: slices.Clone(c.Scopes),
		Status: string(c.Status), Created: c.Created.UTC(),
	}
	if v.Account == "" {
		v.Account = c.AccountID
	}
	if v.Scopes == nil {
		v.Scopes = []string{}
	}
	if !c.LastUsed.IsZero() {
		t := c.LastUsed.UTC()
		v.LastUsed = &t
	}
	return v
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
	// Revocation: revoked | not_supported | not_revoked | failed.
	Revocation string `json:"revocation"`
	Deleted    bool   `json:"deleted"`
	Message    string `json:"message"`
}

const viewSchema = `{"type":"object","properties":{
"id":{"type":"string"},"provider":{"type":"string"},"account":{"type":"string"},
"scopes":{"type":"array","items":{"type":"string"}},
"status":{"type":"string","enum":["active","needs_reconnect"]},
"created":{"type":"string","format":"date-time"},"lastUsed":{"type":"string","format":"date-time"}},
"required":["id","provider","account","scopes","status","created"],"additionalProperties":false}`

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
			Description: "Ensure the user has connected their account at an OAuth provider (for example GitHub or Google) with the given scopes. If not, the user is asked to open a link to the broker and connect in the browser; the result describes the connection, never a token.",
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
"revocation":{"type":"string","enum":["revoked","not_supported","not_revoked","failed"]},
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
	b, err := json.Marshal(structured)
	if err != nil {
		return internalError()
	}
	return outcome{result: &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: string(b)}},
		StructuredContent: json.RawMessage(b),
	}}
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
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// decodeArgs decodes tool arguments strictly into v.
func decodeArgs(raw json.RawMessage, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field != "" {
			return fmt.Errorf("argument %q has the wrong type (want %s)", ute.Field, ute.Type)
		}
		if msg, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return fmt.Errorf("unknown argument %s", msg)
		}
		return errors.New("arguments must be a JSON object matching the tool's input schema")
	}
	if dec.More() {
		return errors.New("arguments must be one JSON object")
	}
	return nil
}

// provider resolves and checks a provider name and requested scopes.
func (s *Server) provider(name string, requested []string, checkScopes bool) (ProviderInfo, []string, *outcome) {
	names := s.opts.Catalog.ProviderNames()
	info, ok := s.opts.Catalog.Provider(name)
	if name == "" || !ok {
		o := toolError("Unknown provider %s. Valid providers: %s.", quote(name), strings.Join(names, ", "))
		return ProviderInfo{}, nil, &o
	}
	if !checkScopes {
		return info, nil, nil
	}
	allowed := info.AllowedScopes
	if len(allowed) == 0 {
		allowed = info.DefaultScopes
	}
	scopes := requested
	if len(scopes) == 0 {
		scopes = info.DefaultScopes
	}
	var out []string
	for _, sc := range scopes {
		if !slices.Contains(allowed, sc) {
			o := toolError("Scope %s is not allowed for %s. Allowed scopes: %s.", quote(sc), info.Name, strings.Join(allowed, ", "))
			return ProviderInfo{}, nil, &o
		}
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	return info, out, nil
}

func displayName(info ProviderInfo) string {
	if info.DisplayName != "" {
		return info.DisplayName
	}
	return info.Name
}

func (s *Server) connectAccount(ctx context.Context, c *callContext) outcome {
	var in struct {
		Provider string   `json:"provider"`
		Scopes   []string `json:"scopes"`
	}
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	info, scopes, bad := s.provider(in.Provider, in.Scopes, true)
	if bad != nil {
		return *bad
	}
	conn, out := s.ensureConnection(ctx, c, toolConnect, info, scopes)
	if conn == nil {
		return out
	}
	v := viewOf(*conn)
	return complete(connectOutput{
		Status:     "connected",
		Message:    fmt.Sprintf("Connected: %s account %s (scopes: %s).", displayName(info), v.Account, strings.Join(v.Scopes, " ")),
		Connection: &v,
	})
}

// missing returns what scopes wants that have does not.
func missing(have, want []string) []string {
	var m []string
	for _, s := range want {
		if !slices.Contains(have, s) {
			m = append(m, s)
		}
	}
	return m
}

// findConnection returns p's best active connection to provider covering
// scopes, or why there is none.
func (s *Server) findConnection(ctx context.Context, p vault.Principal, provider string, scopes []string) (*vault.Connection, string, error) {
	conns, err := s.opts.Store.ListConnections(ctx, p)
	if err != nil {
		return nil, "", err
	}
	reason := "it is not connected yet"
	var best *vault.Connection
	for i := range conns {
		c := &conns[i]
		if c.Provider != provider || !binding.SamePrincipal(c.Principal, p) {
			continue
		}
		switch {
		case c.Status == vault.StatusNeedsReconnect:
			reason = "the existing connection must be reconnected"
		case len(missing(c.Scopes, scopes)) > 0:
			reason = "the existing connection lacks the scopes " + strings.Join(missing(c.Scopes, scopes), " ")
		default:
			if best == nil || c.LastUsed.After(best.LastUsed) || c.LastUsed.Equal(best.LastUsed) && c.Created.After(best.Created) {
				best = c
			}
		}
	}
	if best != nil {
		return best, "", nil
	}
	return nil, reason, nil
}

// ensureConnection returns p's connection covering scopes, or (nil, the
// outcome to answer): input_required, a -32021/-32042 error, a tool error,
// or the user's decline/cancel.
func (s *Server) ensureConnection(ctx context.Context, c *callContext, tool string, info ProviderInfo, scopes []string) (*vault.Connection, outcome) {
	if c.state != "" {
		return s.resume(ctx, c, tool, info, scopes)
	}
	conn, reason, err := s.findConnection(ctx, c.principal, info.Name, scopes)
	if err != nil {
		s.log.Error("mcpapi: list connections", "err", err.Error())
		return nil, internalError()
	}
	if conn != nil {
		return conn, outcome{}
	}
	return nil, s.startConnect(ctx, c, tool, info, scopes, reason)
}

var urlCapability = map[string]any{"elicitation": map[string]any{"url": map[string]any{}}}

func (s *Server) startConnect(ctx context.Context, c *callContext, tool string, info ProviderInfo, scopes []string, reason string) outcome {
	if !c.urlCapable {
		if c.modern {
			data, _ := json.Marshal(map[string]any{"requiredCapabilities": urlCapability})
			return outcome{rpcErr: &rpcError{
				Code:    codeMissingCapability,
				Message: fmt.Sprintf("Connecting %s needs the client capability elicitation.url (%s)", displayName(info), reason),
				Data:    data,
			}}
		}
		return toolError("A %s connection is needed (%s), but this client cannot open connect links (it did not declare the elicitation.url capability). Connect %s on the broker's connections page at %s, then call again.",
			displayName(info), reason, displayName(info), s.opts.PublicURL+"/connections")
	}
	g, err := s.opts.Grants.Create(ctx, c.principal, info.Name, scopes, c.clientName)
	switch {
	case errors.Is(err, binding.ErrTooManyPending):
		return toolError("Too many connect requests are open for this user. Finish or let the earlier connect links expire, then try again.")
	case errors.Is(err, binding.ErrRateLimited):
		return toolError("Too many connect requests were started in the last hour. Try again later.")
	case err != nil:
		s.log.Error("mcpapi: create grant", "err", err.Error())
		return internalError()
	}
	s.log.Info("mcpapi: connect requested", "grant", g.ID, "provider", info.Name, "tool", tool)
	s.elicitation(telemetry.ElicitationIssued)
	msg := fmt.Sprintf("Connect your %s account to continue: %s. Open the link, sign in to the broker and approve access for scopes %s.",
		displayName(info), reason, strings.Join(scopes, " "))
	return s.askToConnect(c, tool, g, info, msg)
}

// askToConnect answers with the url elicitation for grant g: input_required
// (2026-07-28) or -32042 (2025-11-25).
func (s *Server) askToConnect(c *callContext, tool string, g vault.Grant, info ProviderInfo, msg string) outcome {
	url := s.connectURL(g.ID)
	if !c.modern {
		err := mcp.URLElicitationRequiredError([]*mcp.ElicitParams{{Mode: "url", Message: msg, URL: url, ElicitationID: g.ID}})
		var re *rpcError
		if errors.As(err, &re) {
			re.Message = "Connect your " + displayName(info) + " account in the browser, then retry"
			return outcome{rpcErr: re}
		}
		return internalError()
	}
	digest, err := argDigest(c.args)
	if err != nil {
		return invalidParams("arguments are not valid JSON")
	}
	exp := s.opts.Now().Add(s.opts.StateTTL)
	if g.Expires.Before(exp) {
		exp = g.Expires
	}
	st := sealState(s.opts.StateKeys, requestState{
		Issuer: c.principal.Issuer, Subject: c.principal.Subject, Tool: tool,
		ArgDigest: digest, GrantID: g.ID, Expires: exp.Unix(),
	})
	return outcome{input: &inputRequired{
		key:     "connect_" + info.Name,
		params:  &mcp.ElicitParams{Mode: "url", Message: msg, URL: url},
		grantID: g.ID,
		state:   st,
	}}
}

func (s *Server) connectURL(grantID string) string {
	return s.opts.PublicURL + "/connect/" + grantID
}

// resume handles an MRTR retry carrying requestState.
func (s *Server) resume(ctx context.Context, c *callContext, tool string, info ProviderInfo, scopes []string) (*vault.Connection, outcome) {
	digest, err := argDigest(c.args)
	if err != nil {
		return nil, invalidParams(errBadState.Error())
	}
	now := s.opts.Now()
	st, err := openState(s.opts.StateKeys, c.state, c.principal, tool, digest, now)
	if err != nil {
		return nil, invalidParams(errBadState.Error())
	}
	g, err := s.opts.Grants.Authorize(ctx, st.GrantID, c.principal)
	switch {
	case errors.Is(err, binding.ErrExpired):
		s.elicitation(telemetry.ElicitationExpired)
		return nil, toolError("The connect request for %s expired before it was completed. Call %s again to start over.", displayName(info), tool)
	case errors.Is(err, binding.ErrNotFound), errors.Is(err, binding.ErrWrongPrincipal):
		return nil, invalidParams(errBadState.Error())
	case err != nil:
		s.log.Error("mcpapi: authorize grant", "grant", st.GrantID, "err", err.Error())
		return nil, internalError()
	}
	if g.Provider != info.Name {
		return nil, invalidParams(errBadState.Error())
	}
	key := "connect_" + info.Name
	switch g.State {
	case vault.GrantCompleted:
		s.elicitation(telemetry.ElicitationCompleted)
		return s.completedGrant(ctx, c, g, info)
	case vault.GrantDenied:
		s.elicitation(telemetry.ElicitationDeclined)
		return nil, declined(info, tool)
	}
	var action string
	if r, ok := c.responses[key]; ok {
		er, ok := r.(*mcp.ElicitResult)
		if !ok {
			return nil, invalidParams(fmt.Sprintf("inputResponses[%q] must be an elicitation result", key))
		}
		action = er.Action
	}
	switch action {
	case "decline":
		if _, err := s.opts.Grants.Deny(ctx, g.ID, c.principal); err != nil && !errors.Is(err, binding.ErrClosed) {
			s.log.Error("mcpapi: deny grant", "grant", g.ID, "err", err.Error())
			return nil, internalError()
		}
		s.log.Info("mcpapi: connect declined by the user", "grant", g.ID, "provider", info.Name)
		s.elicitation(telemetry.ElicitationDeclined)
		return nil, declined(info, tool)
	case "cancel":
		s.elicitation(telemetry.ElicitationCancelled)
		return nil, complete(connectOutput{Status: "cancelled",
			Message: fmt.Sprintf("Nothing was connected: the user dismissed the request to connect %s. The link stays usable until %s; call %s again to continue.",
				displayName(info), g.Expires.UTC().Format(time.RFC3339), tool)})
	case "accept", "":
	default:
		return nil, invalidParams(fmt.Sprintf("inputResponses[%q].action must be accept, decline or cancel", key))
	}
	// Connected meanwhile by another route (the connections page)?
	if conn, _, err := s.findConnection(ctx, c.principal, info.Name, scopes); err == nil && conn != nil {
		s.elicitation(telemetry.ElicitationCompleted)
		return conn, outcome{}
	}
	g, err = s.opts.Grants.Round(ctx, g.ID, c.principal)
	switch {
	case errors.Is(err, binding.ErrTooManyRounds):
		return nil, toolError("The connect request for %s was retried too many times without being completed. Call %s again to start over.", displayName(info), tool)
	case errors.Is(err, binding.ErrExpired):
		s.elicitation(telemetry.ElicitationExpired)
		return nil, toolError("The connect request for %s expired before it was completed. Call %s again to start over.", displayName(info), tool)
	case err != nil:
		s.log.Error("mcpapi: count round", "grant", st.GrantID, "err", err.Error())
		return nil, internalError()
	}
	switch g.State {
	case vault.GrantCompleted:
		s.elicitation(telemetry.ElicitationCompleted)
		return s.completedGrant(ctx, c, g, info)
	case vault.GrantDenied:
		s.elicitation(telemetry.ElicitationDeclined)
		return nil, declined(info, tool)
	}
	msg := fmt.Sprintf("Connect your %s account to continue: open the link, sign in to the broker and approve access.", displayName(info))
	if action == "accept" {
		msg = fmt.Sprintf("Finish connecting your %s account in the browser, then retry.", displayName(info))
	}
	return nil, s.askToConnect(c, tool, g, info, msg)
}

func declined(info ProviderInfo, tool string) outcome {
	return complete(connectOutput{Status: "declined",
		Message: fmt.Sprintf("The user declined to connect %s. Do not ask again unless the user asks for it.", displayName(info))})
}

func (s *Server) completedGrant(ctx context.Context, c *callContext, g vault.Grant, info ProviderInfo) (*vault.Connection, outcome) {
	conn, err := s.opts.Store.GetConnection(ctx, g.ConnectionID)
	if err != nil || !binding.SamePrincipal(conn.Principal, c.principal) || conn.Provider != info.Name {
		if err != nil && !errors.Is(err, vault.ErrNotFound) {
			s.log.Error("mcpapi: get connection", "grant", g.ID, "err", err.Error())
			return nil, internalError()
		}
		return nil, toolError("The %s connection made through this request no longer exists. Call connect_account again.", displayName(info))
	}
	return &conn, outcome{}
}

func (s *Server) listConnections(ctx context.Context, c *callContext) outcome {
	var in struct{}
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	conns, err := s.opts.Store.ListConnections(ctx, c.principal)
	if err != nil {
		s.log.Error("mcpapi: list connections", "err", err.Error())
		return internalError()
	}
	out := listOutput{Connections: []connectionView{}}
	for _, conn := range conns {
		if binding.SamePrincipal(conn.Principal, c.principal) {
			out.Connections = append(out.Connections, viewOf(conn))
		}
	}
	return complete(out)
}

func (s *Server) disconnectAccount(ctx context.Context, c *callContext) outcome {
	var in struct {
		Provider string `json:"provider"`
		Account  string `json:"account"`
	}
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	info, _, bad := s.provider(in.Provider, nil, false)
	if bad != nil {
		return *bad
	}
	conns, err := s.opts.Store.ListConnections(ctx, c.principal)
	if err != nil {
		s.log.Error("mcpapi: list connections", "err", err.Error())
		return internalError()
	}
	var match []vault.Connection
	var accounts []string
	for _, conn := range conns {
		if conn.Provider != info.Name || !binding.SamePrincipal(conn.Principal, c.principal) {
			continue
		}
		accounts = append(accounts, viewOf(conn).Account)
		if in.Account == "" || in.Account == conn.AccountLogin || in.Account == conn.AccountID {
			match = append(match, conn)
		}
	}
	switch {
	case len(match) == 0 && in.Account != "" && len(accounts) > 0:
		return toolError("No %s connection for account %s. Connected accounts: %s.", displayName(info), quote(in.Account), strings.Join(accounts, ", "))
	case len(match) == 0:
		return toolError("No %s account is connected.", displayName(info))
	case len(match) > 1:
		return toolError("Several %s accounts are connected; say which with account: %s.", displayName(info), strings.Join(accounts, ", "))
	}
	conn := match[0]
	out := disconnectOutput{Provider: info.Name, Account: viewOf(conn).Account, Revocation: "not_supported"}
	log := s.log.With("provider", info.Name, "connection", conn.ID)
	if s.opts.Revoke != nil {
		revoked, err := s.opts.Revoke(ctx, conn)
		switch {
		case err != nil:
			out.Revocation = "failed"
			log.Warn("mcpapi: revocation at the provider failed", "err", err.Error())
		case revoked:
			out.Revocation = "revoked"
		default:
			out.Revocation = "not_revoked"
		}
		s.audit(ctx, telemetry.Event{Kind: telemetry.EventRevoke, Principal: c.principal, Provider: info.Name,
			Account: viewOf(conn).Account, Connection: conn.ID, Outcome: out.Revocation, Err: err})
	}
	if err := s.opts.Store.DeleteConnection(ctx, conn.ID); err != nil && !errors.Is(err, vault.ErrNotFound) {
		log.Error("mcpapi: delete connection", "err", err.Error())
		out.Message = fmt.Sprintf("The %s connection for %s could not be deleted; try again.", displayName(info), out.Account)
		o := complete(out)
		o.result.IsError = true
		return o
	}
	out.Deleted = true
	log.Info("mcpapi: connection deleted", "revocation", out.Revocation)
	s.audit(ctx, telemetry.Event{Kind: telemetry.EventDisconnect, Principal: c.principal, Provider: info.Name,
		Account: out.Account, Connection: conn.ID})
	switch out.Revocation {
	case "revoked":
		out.Message = fmt.Sprintf("Disconnected %s account %s: the tokens were revoked at %s and deleted from the broker.", displayName(info), out.Account, displayName(info))
	case "failed":
		out.Message = fmt.Sprintf("Disconnected %s account %s: revoking at %s failed, so the grant may still be listed in your %s settings; the tokens were deleted from the broker.", displayName(info), out.Account, displayName(info), displayName(info))
	case "not_revoked":
		out.Message = fmt.Sprintf("Disconnected %s account %s: %s did not confirm revocation; the tokens were deleted from the broker.", displayName(info), out.Account, displayName(info))
	default:
		out.Message = fmt.Sprintf("Disconnected %s account %s: %s offers no revocation, so remove the broker's access in your %s settings if you wish; the tokens were deleted from the broker.", displayName(info), out.Account, displayName(info), displayName(info))
	}
	return complete(out)
}

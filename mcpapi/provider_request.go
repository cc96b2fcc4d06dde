package mcpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/binding"
	"credbroker/oauthflow"
	"credbroker/vault"
)

// ProviderCaller performs a provider API request with connection connID's
// stored token (*oauthflow.Caller implements it). It never returns token
// material; refusals of the request itself are *oauthflow.RequestError.
type ProviderCaller interface {
	Do(ctx context.Context, connID string, req oauthflow.APIRequest) (oauthflow.APIResponse, error)
}

var _ ProviderCaller = (*oauthflow.Caller)(nil)

// accountChoice marks a requestState that carries a pending form
// elicitation (which account?) rather than a grant. It is never a valid
// grant id, so such a state can never resume a connect flow.
const accountChoice = "form:choose_account"

const chooseAccountKey = "choose_account"

// reconnectReason is the url elicitation's reason after the provider
// refused the stored grant.
const reconnectReason = "the broker's access was revoked or has expired, so the account must be reconnected"

type requestInput struct {
	Provider string                     `json:"provider"`
	Method   string                     `json:"method"`
	Path     string                     `json:"path"`
	Query    map[string]json.RawMessage `json:"query"`
	Headers  map[string]string          `json:"headers"`
	Body     json.RawMessage            `json:"body"`
	Account  string                     `json:"account"`
}

type requestOutput struct {
	Status       int               `json:"status"`
	Headers      map[string]string `json:"headers"`
	Body         string            `json:"body"`
	BodyEncoding string            `json:"body_encoding"` // text | base64
	Truncated    bool              `json:"truncated"`
}

func providerRequestTool() *mcp.Tool {
	return &mcp.Tool{
		Name:  toolRequest,
		Title: "Call a provider's API",
		Description: "Call the API of a connected provider (for example GitHub's REST API) as the user: the broker adds the user's stored token, " +
			"which is never shown. path is relative to the provider's API base URL. If the account is not connected yet, the user is asked " +
			"to connect it first; give account when several accounts of the provider are connected. The answer carries the HTTP status, " +
			"selected headers (content type, pagination, rate limits) and the body (text, or base64 for binary; capped, with truncated=true when cut).",
		InputSchema: compactJSON(`{"type":"object","properties":{
"provider":{"type":"string","description":"Provider name, as listed by the broker's configuration."},
"method":{"type":"string","enum":["GET","POST","PUT","PATCH","DELETE"]},
"path":{"type":"string","description":"Path relative to the provider's API base URL, starting with /, e.g. /user/repos."},
"query":{"type":"object","additionalProperties":{"anyOf":[{"type":"string"},{"type":"number"},{"type":"boolean"},{"type":"array","items":{"type":"string"}}]}},
"headers":{"type":"object","additionalProperties":{"type":"string"},"description":"Only ` + strings.Join(oauthflow.AllowedRequestHeaders(), ", ") + `."},
"body":{"description":"Request body: a JSON value (sent as JSON) or a string (sent as is)."},
"account":{"type":"string","description":"Account login (or id), needed only when several accounts of the provider are connected."}},
"required":["provider","method","path"],"additionalProperties":false}`),
		OutputSchema: compactJSON(`{"type":"object","properties":{
"status":{"type":"integer"},"headers":{"type":"object","additionalProperties":{"type":"string"}},
"body":{"type":"string"},"body_encoding":{"type":"string","enum":["text","base64"]},"truncated":{"type":"boolean"}},
"required":["status","headers","body","body_encoding","truncated"],"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{Title: "Call a provider's API", ReadOnlyHint: false,
			DestructiveHint: boolPtr(true), IdempotentHint: false, OpenWorldHint: boolPtr(true)},
	}
}

// buildAPIRequest validates the arguments that do not depend on the
// provider's configuration.
func buildAPIRequest(in requestInput) (oauthflow.APIRequest, error) {
	req := oauthflow.APIRequest{Method: strings.ToUpper(in.Method), Path: in.Path}
	if !slices.Contains(oauthflow.APIMethods, req.Method) {
		return req, fmt.Errorf("method %s is not allowed: use %s", quote(in.Method), strings.Join(oauthflow.APIMethods, ", "))
	}
	if len(in.Query) > 0 {
		req.Query = url.Values{}
		for k, raw := range in.Query {
			var s string
			var list []string
			var n json.Number
			var b bool
			switch {
			case json.Unmarshal(raw, &s) == nil:
				req.Query.Add(k, s)
			case json.Unmarshal(raw, &list) == nil:
				req.Query[k] = append(req.Query[k], list...)
			case json.Unmarshal(raw, &n) == nil:
				req.Query.Add(k, n.String())
			case json.Unmarshal(raw, &b) == nil:
				req.Query.Add(k, fmt.Sprint(b))
			default:
				return req, fmt.Errorf("query parameter %s must be a string, number, boolean or list of strings", quote(k))
			}
		}
	}
	if len(in.Headers) > 0 {
		req.Header = http.Header{}
		for k, v := range in.Headers {
			req.Header.Set(k, v)
		}
	}
	if body := bytes.TrimSpace(in.Body); len(body) > 0 && string(body) != "null" {
		var s string
		if json.Unmarshal(body, &s) == nil {
			req.Body = []byte(s)
		} else {
			req.Body = body
		}
	}
	// Check path and query now, against a placeholder base, so a bad
	// request never makes anyone connect an account first.
	if _, err := oauthflow.ResolveAPIURL("https://api.invalid", req.Path, req.Query); err != nil {
		return req, err
	}
	return req, nil
}

func (s *Server) providerRequest(ctx context.Context, c *callContext) outcome {
	var in requestInput
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	info, _, bad := s.provider(in.Provider, nil, false)
	if bad != nil {
		return *bad
	}
	req, err := buildAPIRequest(in)
	if err != nil {
		return toolError("Request refused: %v. Nothing was sent.", err)
	}
	if s.opts.Provider == nil {
		return toolError("Provider requests are not configured on this broker.")
	}
	if c.state != "" {
		digest, err := argDigest(c.args)
		if err != nil {
			return invalidParams(errBadState.Error())
		}
		st, err := openState(s.opts.StateKeys, c.state, c.principal, toolRequest, digest, s.opts.Now())
		if err != nil {
			return invalidParams(errBadState.Error())
		}
		if st.GrantID == accountChoice {
			return s.accountChosen(ctx, c, info, req)
		}
		conn, out := s.ensureConnection(ctx, c, toolRequest, info, info.DefaultScopes)
		if conn == nil {
			return out
		}
		if in.Account != "" && !accountMatches(*conn, in.Account) {
			// The browser step connected (or ensureConnection found) another
			// account than the one asked for: never run the request as it.
			return s.requestedAccount(ctx, c, info, req, in.Account)
		}
		return s.runRequest(ctx, c, info, *conn, req)
	}
	conns, err := s.providerConnections(ctx, c.principal, info.Name)
	if err != nil {
		s.log.Error("mcpapi: list connections", "err", err.Error())
		return internalError()
	}
	var accounts []string
	var match, active []vault.Connection
	for _, conn := range conns {
		accounts = append(accounts, viewOf(conn).Account)
		if in.Account == "" || accountMatches(conn, in.Account) {
			match = append(match, conn)
			if conn.Status != vault.StatusNeedsReconnect {
				active = append(active, conn)
			}
		}
	}
	switch {
	case len(conns) == 0:
		return s.startConnect(ctx, c, toolRequest, info, info.DefaultScopes, "it is not connected yet")
	case len(match) == 0:
		return toolError("No %s connection for account %s. Connected accounts: %s.", displayName(info), quote(in.Account), strings.Join(accounts, ", "))
	case len(active) == 0:
		return s.startConnect(ctx, c, toolRequest, info, info.DefaultScopes, reconnectReason)
	case len(active) > 1:
		return s.askAccount(c, info, active)
	}
	return s.runRequest(ctx, c, info, active[0], req)
}

// accountMatches reports whether c is the account a caller named (by login
// or by the provider's account id).
func accountMatches(c vault.Connection, account string) bool {
	return account == c.AccountLogin || account == c.AccountID
}

// requestedAccount runs req as the named account when it is connected and
// active, and otherwise refuses: a retry must not fall back to another
// account of the same provider.
func (s *Server) requestedAccount(ctx context.Context, c *callContext, info ProviderInfo, req oauthflow.APIRequest, account string) outcome {
	conns, err := s.providerConnections(ctx, c.principal, info.Name)
	if err != nil {
		s.log.Error("mcpapi: list connections", "err", err.Error())
		return internalError()
	}
	for _, conn := range conns {
		if accountMatches(conn, account) && conn.Status != vault.StatusNeedsReconnect {
			return s.runRequest(ctx, c, info, conn, req)
		}
	}
	return toolError("The %s account %s is still not connected (the browser step connected another account). Nothing was sent; connect %s and call again.",
		displayName(info), quote(account), quote(account))
}

// providerConnections returns p's connections to provider, ordered by login.
func (s *Server) providerConnections(ctx context.Context, p vault.Principal, provider string) ([]vault.Connection, error) {
	all, err := s.opts.Store.ListConnections(ctx, p)
	if err != nil {
		return nil, err
	}
	var out []vault.Connection
	for _, c := range all {
		if c.Provider == provider && binding.SamePrincipal(c.Principal, p) {
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return viewOf(out[i]).Account < viewOf(out[j]).Account })
	return out, nil
}

// askAccount asks which account to use: a form elicitation (a single-select
// enum of the logins, nothing secret) when the client can show forms,
// otherwise a tool error listing the accounts.
func (s *Server) askAccount(c *callContext, info ProviderInfo, active []vault.Connection) outcome {
	logins := make([]string, 0, len(active))
	for _, conn := range active {
		logins = append(logins, viewOf(conn).Account)
	}
	if !c.modern || !c.formCapable {
		return toolError("Several %s accounts are connected; call again with account set to one of: %s.", displayName(info), strings.Join(logins, ", "))
	}
	digest, err := argDigest(c.args)
	if err != nil {
		return invalidParams("arguments are not valid JSON")
	}
	st := sealState(s.opts.StateKeys, requestState{
		Issuer: c.principal.Issuer, Subject: c.principal.Subject, Tool: toolRequest,
		ArgDigest: digest, GrantID: accountChoice, Expires: s.opts.Now().Add(s.opts.StateTTL).Unix(),
	})
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{"account": map[string]any{
			"type": "string", "title": displayName(info) + " account", "enum": logins,
		}},
		"required": []string{"account"},
	}
	return outcome{input: &inputRequired{
		key: chooseAccountKey,
		params: &mcp.ElicitParams{Mode: "form", RequestedSchema: schema,
			Message: fmt.Sprintf("Several %s accounts are connected. Which one should this request use?", displayName(info))},
		state: st,
	}}
}

// accountChosen handles the retry that answers askAccount's form.
func (s *Server) accountChosen(ctx context.Context, c *callContext, info ProviderInfo, req oauthflow.APIRequest) outcome {
	conns, err := s.providerConnections(ctx, c.principal, info.Name)
	if err != nil {
		s.log.Error("mcpapi: list connections", "err", err.Error())
		return internalError()
	}
	var active []vault.Connection
	for _, conn := range conns {
		if conn.Status != vault.StatusNeedsReconnect {
			active = append(active, conn)
		}
	}
	r, ok := c.responses[chooseAccountKey]
	if !ok {
		if len(active) > 1 {
			return s.askAccount(c, info, active) // no answer yet: ask again
		}
		return toolError("The account choice was not answered. Call provider_request again.")
	}
	er, ok := r.(*mcp.ElicitResult)
	if !ok {
		return invalidParams(fmt.Sprintf("inputResponses[%q] must be an elicitation result", chooseAccountKey))
	}
	switch er.Action {
	case "decline", "cancel":
		return toolError("No request was sent: the user did not choose a %s account.", displayName(info))
	case "accept":
	default:
		return invalidParams(fmt.Sprintf("inputResponses[%q].action must be accept, decline or cancel", chooseAccountKey))
	}
	chosen, _ := er.Content["account"].(string)
	for _, conn := range active {
		if chosen != "" && chosen == viewOf(conn).Account {
			return s.runRequest(ctx, c, info, conn, req)
		}
	}
	return toolError("The chosen account %s is not a connected %s account. No request was sent.", quote(chosen), displayName(info))
}

// runRequest performs the API request on conn and renders the answer.
func (s *Server) runRequest(ctx context.Context, c *callContext, info ProviderInfo, conn vault.Connection, req oauthflow.APIRequest) outcome {
	log := s.log.With("provider", info.Name, "connection", conn.ID)
	resp, err := s.opts.Provider.Do(ctx, conn.ID, req)
	var re *oauthflow.RequestError
	switch {
	case err == nil:
	case errors.As(err, &re):
		return toolError("Request refused: %s. Nothing was sent.", re.Msg)
	case errors.Is(err, oauthflow.ErrNeedsReconnect):
		log.Info("mcpapi: connection needs reconnecting; asking the user")
		return s.startConnect(ctx, c, toolRequest, info, info.DefaultScopes, reconnectReason)
	case errors.Is(err, oauthflow.ErrProviderUnavailable):
		log.Warn("mcpapi: provider unavailable", "err", err.Error())
		return toolError("%s did not answer properly (timeouts or server errors, after retries). Nothing was changed; try again later.", displayName(info))
	case errors.Is(err, vault.ErrNotFound):
		return toolError("The %s connection no longer exists. Call provider_request again to connect.", displayName(info))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return toolError("The request to %s was cancelled or timed out.", displayName(info))
	default:
		log.Error("mcpapi: provider request failed", "err", err.Error())
		return toolError("The request to %s failed inside the broker. Nothing was returned.", displayName(info))
	}
	out := requestOutput{Status: resp.Status, Headers: map[string]string{}, Truncated: resp.Truncated}
	for k, vs := range resp.Header {
		out.Headers[strings.ToLower(k)] = strings.Join(vs, ", ")
	}
	out.Body, out.BodyEncoding = encodeBody(resp.Header.Get("Content-Type"), resp.Body)
	o := complete(out)
	if resp.Status >= 400 {
		o.result.IsError = true
	}
	return o
}

// encodeBody returns body as text when it is UTF-8 of a textual media type
// (or untyped), else base64.
func encodeBody(contentType string, body []byte) (string, string) {
	textual := contentType == ""
	if mt, _, err := mime.ParseMediaType(contentType); err == nil {
		textual = strings.HasPrefix(mt, "text/") || mt == "application/json" || strings.HasSuffix(mt, "+json") ||
			mt == "application/xml" || strings.HasSuffix(mt, "+xml") || mt == "application/x-www-form-urlencoded" ||
			mt == "application/javascript"
	}
	if textual && utf8.Valid(body) {
		return string(body), "text"
	}
	if textual && len(body) > 0 {
		// A truncated body may end inside a UTF-8 sequence.
		if cut := bytes.ToValidUTF8(body, nil); len(body)-len(cut) <= 3 && utf8.Valid(body[:len(cut)]) {
			return string(cut), "text"
		}
	}
	return base64.StdEncoding.EncodeToString(body), "base64"
}

// SidecarRequireTool is the tool name sidecar request states are bound to.
const SidecarRequireTool = "sidecar/require"

// RequireResult is the outcome of Require: exactly one of Connection,
// Input (with RequestState) or Code is set.
type RequireResult struct {
	// Connection is the caller's connection covering the scopes (it holds
	// token material: describe it, never serialise it).
	Connection *vault.Connection
	// Input is the url elicitation to show the user; RequestState goes back
	// on the retry.
	Input        *mcp.ElicitParams
	RequestState string
	// Code is a refusal: invalid_request, invalid_request_state, declined,
	// refused or internal; Message says why in words for the caller.
	Code, Message string
}

// Require is connect_account for callers outside MCP (the sidecar API):
// the same grants, url elicitation and sealed state, bound to principal p,
// SidecarRequireTool and the digest of {provider, scopes}.
func (s *Server) Require(ctx context.Context, p vault.Principal, clientName, provider string, scopes []string, state string) RequireResult {
	args, _ := json.Marshal(struct {
		Provider string   `json:"provider"`
		Scopes   []string `json:"scopes,omitempty"`
	}{provider, scopes})
	c := &callContext{principal: p, clientName: clientName, urlCapable: true, modern: true, args: args, state: state}
	info, sc, bad := s.provider(provider, scopes, true)
	if bad != nil {
		return RequireResult{Code: "invalid_request", Message: resultText(bad.result)}
	}
	conn, o := s.ensureConnection(ctx, c, SidecarRequireTool, info, sc)
	switch {
	case conn != nil:
		return RequireResult{Connection: conn}
	case o.input != nil:
		return RequireResult{Input: o.input.params, RequestState: o.input.state}
	case o.rpcErr != nil && o.rpcErr.Message == errBadState.Error():
		return RequireResult{Code: "invalid_request_state", Message: o.rpcErr.Message}
	case o.rpcErr != nil:
		return RequireResult{Code: "internal", Message: "internal error"}
	case o.result != nil && o.result.IsError:
		return RequireResult{Code: "refused", Message: resultText(o.result)}
	case o.result != nil:
		var co connectOutput
		_ = json.Unmarshal(o.result.StructuredContent.(json.RawMessage), &co)
		return RequireResult{Code: co.Status, Message: co.Message}
	}
	return RequireResult{Code: "internal", Message: "internal error"}
}

func resultText(r *mcp.CallToolResult) string {
	if r != nil && len(r.Content) > 0 {
		if t, ok := r.Content[0].(*mcp.TextContent); ok {
			return t.Text
		}
	}
	return ""
}

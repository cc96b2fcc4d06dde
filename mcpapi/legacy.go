package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/bearer"
	"credbroker/internal/buffered"
	"credbroker/internal/outage"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// legacySessionTTL bounds how long a legacy client's sealed session id
// (its recorded initialize capabilities) is honoured.
const legacySessionTTL = 24 * time.Hour

const principalExtraKey = "credbroker/principal"

// newLegacyHandler builds the go-sdk stateless handler serving 2025-11-25
// clients with the same tool implementations as the modern path.
func (s *Server) newLegacyHandler() http.Handler {
	srv := mcp.NewServer(s.impl, &mcp.ServerOptions{
		Logger:                    s.log,
		SupportedProtocolVersions: []string{versionLegacy},
		// Stateless: no list-changed notifications, no logging.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		Instructions: "credbroker connects the user's accounts at OAuth providers and keeps their tokens: call connect_account before acting on a provider; tokens are never returned.",
	})
	funcs := s.toolFuncs()
	for _, t := range toolDefs() {
		srv.AddTool(t, s.legacyTool(funcs[t.Name]))
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:    true,
		JSONResponse: true,
		Logger:       s.log,
		// Origin is checked before routing; the Host check would reject
		// a loopback listener behind a reverse proxy.
		DisableLocalhostProtection: true,
	})
	// The bearer token was verified before routing; this hands the
	// principal to the SDK's RequestExtra.TokenInfo.
	verify := func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		p, ok := PrincipalFromContext(r.Context())
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: p.Issuer + " " + p.Subject, Extra: map[string]any{principalExtraKey: p}}, nil
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}

// legacyTool adapts a tool to the SDK: -32042 instead of input_required.
func (s *Server) legacyTool(fn toolFunc) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var p vault.Principal
		if req.Extra != nil && req.Extra.TokenInfo != nil {
			p, _ = req.Extra.TokenInfo.Extra[principalExtraKey].(vault.Principal)
		}
		if p.IsZero() {
			return nil, &rpcError{Code: codeInternal, Message: "internal error"}
		}
		c := &callContext{principal: p, args: req.Params.Arguments, responses: req.Params.InputResponses, state: req.Params.RequestState}
		if req.Extra.Header != nil {
			if ls, ok := openSession(s.opts.StateKeys, req.Extra.Header.Get("Mcp-Session-Id"), p, s.opts.Now()); ok {
				c.urlCapable, c.clientName = ls.URLCapable, ls.ClientName
			}
		}
		o := fn(ctx, c)
		if o.rpcErr != nil {
			return nil, o.rpcErr
		}
		if res := o.toolResult(); res != nil {
			return res, nil
		}
		return nil, &rpcError{Code: codeInternal, Message: "internal error"}
	}
}

// legacyMethods are the requests the broker serves to 2025-11-25 clients.
var legacyMethods = map[string]bool{"initialize": true, "ping": true, "tools/list": true, "tools/call": true}

func (s *Server) serveLegacy(w http.ResponseWriter, r *http.Request, body []byte, msg *rpcMessage, info bearer.TokenInfo) {
	note(w, func(o *observedWriter) { o.era = versionLegacy })
	if !msg.isNotification() && !legacyMethods[msg.Method] {
		// 2025-11-25 carries JSON-RPC errors in a 200 response.
		writeRPCError(w, http.StatusOK, msg.ID, codeMethodNotFound, "Method not found: "+quote(msg.Method), nil)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	// buf captures the SDK handler's answer so that plain-text errors can be
	// rewritten as JSON-RPC errors.
	buf := buffered.NewResponse()
	if msg.Method == "initialize" {
		var ip struct {
			Capabilities *mcp.ClientCapabilities `json:"capabilities"`
			ClientInfo   *mcp.Implementation     `json:"clientInfo"`
		}
		if json.Unmarshal(msg.Params, &ip) == nil {
			ls := legacySession{Issuer: info.Principal.Issuer, Subject: info.Principal.Subject,
				Expires: s.opts.Now().Add(legacySessionTTL).Unix()}
			if ip.Capabilities != nil && ip.Capabilities.Elicitation != nil && ip.Capabilities.Elicitation.URL != nil {
				ls.URLCapable = true
			}
			if ip.ClientInfo != nil {
				ls.ClientName = clientName(ip.ClientInfo)
			}
			buf.Header().Set("Mcp-Session-Id", sealSession(s.opts.StateKeys, ls))
		}
	}
	s.legacy.ServeHTTP(buf, r)
	if buf.Status == 0 {
		buf.Status = http.StatusOK
	}
	if buf.Status >= 400 && !isJSONType(buf.Header().Get("Content-Type")) {
		text := strings.TrimSpace(buf.Body.String())
		if len(text) > 200 {
			text = text[:200]
		}
		code := int64(codeInvalidRequest)
		switch buf.Status {
		case http.StatusNotFound:
			code = codeMethodNotFound
		case http.StatusInternalServerError:
			code = codeInternal
		}
		if allow := buf.Header().Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		writeRPCError(w, buf.Status, validOrNull(msg.ID), code, text, nil)
		return
	}
	note(w, func(o *observedWriter) { o.outcome = legacyOutcome(buf.Body.Bytes()) })
	if buf.Status == http.StatusOK && isUnavailableAnswer(buf.Body.Bytes()) {
		// A storage outage is a 503 in this era too (the SDK writes
		// JSON-RPC errors with 200).
		buf.Status = http.StatusServiceUnavailable
		note(w, func(o *observedWriter) { o.outcome = telemetry.OutcomeUnavailable })
		outage.SetRetryAfter(buf.Header())
	}
	for k, v := range buf.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(buf.Status)
	w.Write(buf.Body.Bytes())
}

package sidecar

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	"credbroker/binding"
	"credbroker/internal/telemetry"
	"credbroker/mcpapi"
	"credbroker/oauthflow"
	"credbroker/vault"
)

// Header names of the sidecar API.
const (
	SecretHeader    = "Broker-Sidecar-Secret"
	AccountHeader   = "Broker-Account"
	TruncatedHeader = "Broker-Truncated"
	ErrorHeader     = "Broker-Error"
)

// Requirer is the broker's connect logic (*mcpapi.Server implements it).
type Requirer interface {
	Require(ctx context.Context, p vault.Principal, clientName, provider string, scopes []string, state string) mcpapi.RequireResult
}

// APICaller gets tokens and performs API requests (*oauthflow.Caller).
type APICaller interface {
	Token(ctx context.Context, connID string) (vault.Connection, error)
	Do(ctx context.Context, connID string, req oauthflow.APIRequest) (oauthflow.APIResponse, error)
}

// Auditor records audit events (*telemetry.Recorder implements it).
type Auditor interface {
	Audit(ctx context.Context, e telemetry.Event)
}

var (
	_ Requirer  = (*mcpapi.Server)(nil)
	_ APICaller = (*oauthflow.Caller)(nil)
	_ Auditor   = (*telemetry.Recorder)(nil)
)

// Options configures a Server.
type Options struct {
	// Secret is the shared sidecar secret (BROKER_SIDECAR_SECRET), at
	// least 16 bytes.
	Secret vault.Secret
	// Verify validates the end user's bearer token (mcpapi.NewTokenVerifier).
	Verify    mcpapi.TokenVerifier
	Broker    Requirer
	Caller    APICaller
	Store     vault.Store
	Providers *oauthflow.Registry
	// RequiredScope, when set, must be among the user token's scopes (as
	// on the MCP endpoint, broker --required-scope); tokens without it get
	// 403 insufficient_scope on every route.
	RequiredScope string
	// ClientName is shown on the consent page as the requesting client
	// (default "a co-located MCP server").
	ClientName   string
	MaxBodyBytes int64 // request bodies, default 1 MiB
	Logger       *slog.Logger
	// Audit receives an EventTokenExport for every token handed out by
	// /v1/token (nil: log line only).
	Audit Auditor
}

// Server serves the sidecar API.
type Server struct {
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux
}

// New validates opts and builds the Server.
func New(opts Options) (*Server, error) {
	var missing []string
	if len(opts.Secret.Reveal()) < 16 {
		missing = append(missing, "Secret (at least 16 bytes)")
	}
	for _, m := range []struct {
		ok   bool
		name string
	}{{opts.Verify != nil, "Verify"}, {opts.Broker != nil, "Broker"}, {opts.Caller != nil, "Caller"},
		{opts.Store != nil, "Store"}, {opts.Providers != nil, "Providers"}} {
		if !m.ok {
			missing = append(missing, m.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("sidecar: missing options: %s", strings.Join(missing, ", "))
	}
	if opts.ClientName == "" {
		opts.ClientName = "a co-located MCP server"
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	s := &Server{opts: opts, log: opts.Logger, mux: http.NewServeMux()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("POST /v1/require", s.handleRequire)
	s.mux.HandleFunc("POST /v1/token", s.handleToken)
	s.mux.HandleFunc("/v1/proxy/{provider}/{path...}", s.handleProxy)
	return s, nil
}

type principalKey struct{}

// ServeHTTP checks both credentials, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	given := r.Header.Get(SecretHeader)
	if subtle.ConstantTimeCompare([]byte(given), []byte(s.opts.Secret.Reveal())) != 1 {
		s.log.Warn("sidecar: wrong or missing sidecar secret", "event", "sidecar_secret_rejected", "remote", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, "unauthorized", "the "+SecretHeader+" header is missing or wrong", nil)
		return
	}
	h := r.Header.Values("Authorization")
	scheme, raw, ok := "", "", false
	if len(h) == 1 {
		scheme, raw, ok = strings.Cut(h[0], " ")
		raw = strings.TrimSpace(raw)
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || raw == "" {
		writeError(w, http.StatusUnauthorized, "unauthorized", "the end user's token is required: Authorization: Bearer <token>", nil)
		return
	}
	info, err := s.opts.Verify(r.Context(), raw)
	if err != nil || info.Principal.Issuer == "" || info.Principal.Subject == "" {
		if err != nil && !errors.Is(err, mcpapi.ErrInvalidToken) {
			s.log.Error("sidecar: cannot verify user tokens", "err", err.Error())
			writeError(w, http.StatusServiceUnavailable, "internal", "user tokens cannot be verified right now", nil)
			return
		}
		s.log.Info("sidecar: user token rejected")
		writeError(w, http.StatusUnauthorized, "unauthorized", "the end user's token is invalid, expired or not meant for this broker", nil)
		return
	}
	if s.opts.RequiredScope != "" && !slices.Contains(info.Scopes, s.opts.RequiredScope) {
		s.log.Info("sidecar: user token lacks the required scope", "event", "sidecar_insufficient_scope")
		w.Header().Set("WWW-Authenticate", fmt.Sprintf("Bearer error=\"insufficient_scope\", scope=%q", s.opts.RequiredScope))
		writeError(w, http.StatusForbidden, "insufficient_scope", fmt.Sprintf("the end user's token lacks the required scope %q", s.opts.RequiredScope), nil)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, info.Principal)))
}

func principal(r *http.Request) vault.Principal {
	p, _ := r.Context().Value(principalKey{}).(vault.Principal)
	return p
}

// errorBody is every error answer.
type errorBody struct {
	Error    string   `json:"error"`
	Message  string   `json:"message"`
	Accounts []string `json:"accounts,omitempty"`
}

func writeError(w http.ResponseWriter, status int, code, msg string, accounts []string) {
	// Tells the broker's own refusals from relayed provider answers.
	w.Header().Set(ErrorHeader, "true")
	writeJSON(w, status, errorBody{Error: code, Message: msg, Accounts: accounts})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal","message":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// readJSON decodes a capped application/json body strictly into v.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "invalid_request", "Content-Type must be application/json", nil)
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body exceeds %d bytes", mbe.Limit), nil)
			return false
		}
		msg := "the body must be one JSON object matching the route's fields"
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			msg = "unknown field " + f
		}
		writeError(w, http.StatusBadRequest, "invalid_request", msg, nil)
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "invalid_request", "the body must be one JSON object", nil)
		return false
	}
	return true
}

// ConnectionView describes a connection; it has no secret fields.
type ConnectionView struct {
	ID       string   `json:"id"`
	Provider string   `json:"provider"`
	Account  string   `json:"account"`
	Scopes   []string `json:"scopes"`
	Status   string   `json:"status"`
}

func viewOf(c vault.Connection) ConnectionView {
	v := ConnectionView{ID: c.ID, Provider: c.Provider, Account: c.AccountLogin, Scopes: slices.Clone(c.Scopes), Status: string(c.Status)}
	if v.Account == "" {
		v.Account = c.AccountID
	}
	if v.Scopes == nil {
		v.Scopes = []string{}
	}
	return v
}

type requireRequest struct {
	Provider     string   `json:"provider"`
	Scopes       []string `json:"scopes"`
	RequestState string   `json:"request_state"`
}

type inputRequest struct {
	Method string `json:"method"`
	Params any    `json:"params"`
}

type requireResponse struct {
	Status       string          `json:"status"`
	Connection   *ConnectionView `json:"connection,omitempty"`
	InputRequest *inputRequest   `json:"input_request,omitempty"`
	RequestState string          `json:"request_state,omitempty"`
	Message      string          `json:"message,omitempty"`
}

func (s *Server) handleRequire(w http.ResponseWriter, r *http.Request) {
	var in requireRequest
	if !s.readJSON(w, r, &in) {
		return
	}
	if in.Provider == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "provider is required", nil)
		return
	}
	res := s.opts.Broker.Require(r.Context(), principal(r), s.opts.ClientName, in.Provider, in.Scopes, in.RequestState)
	switch {
	case res.Connection != nil:
		v := viewOf(*res.Connection)
		writeJSON(w, http.StatusOK, requireResponse{Status: "connected", Connection: &v})
	case res.Input != nil:
		writeJSON(w, http.StatusOK, requireResponse{Status: "input_required",
			InputRequest: &inputRequest{Method: "elicitation/create", Params: res.Input}, RequestState: res.RequestState})
	case res.Code == "declined" || res.Code == "cancelled":
		writeJSON(w, http.StatusOK, requireResponse{Status: res.Code, Message: res.Message})
	case res.Code == "invalid_request", res.Code == "invalid_request_state":
		writeError(w, http.StatusBadRequest, res.Code, res.Message, nil)
	case res.Code == "refused":
		writeError(w, http.StatusConflict, "refused", res.Message, nil)
	default:
		writeError(w, http.StatusInternalServerError, "internal", "internal error", nil)
	}
}

// pick returns the caller's one usable connection to provider, or writes
// why there is none.
func (s *Server) pick(w http.ResponseWriter, r *http.Request, provider, account string) (vault.Connection, *oauthflow.Provider, bool) {
	p, ok := s.opts.Providers.Lookup(provider)
	if !ok {
		writeError(w, http.StatusNotFound, "unknown_provider", fmt.Sprintf("provider %q is not configured; known: %s", truncate(provider), strings.Join(s.opts.Providers.Names(), ", ")), nil)
		return vault.Connection{}, nil, false
	}
	pr := principal(r)
	all, err := s.opts.Store.ListConnections(r.Context(), pr)
	if err != nil {
		s.log.Error("sidecar: list connections", "err", err.Error())
		writeError(w, http.StatusInternalServerError, "internal", "internal error", nil)
		return vault.Connection{}, nil, false
	}
	var accounts []string
	var any, active []vault.Connection
	for _, c := range all {
		if c.Provider != provider || !binding.SamePrincipal(c.Principal, pr) {
			continue
		}
		v := viewOf(c)
		accounts = append(accounts, v.Account)
		if account == "" || account == c.AccountLogin || account == c.AccountID {
			any = append(any, c)
			if c.Status != vault.StatusNeedsReconnect {
				active = append(active, c)
			}
		}
	}
	switch {
	case len(any) == 0 && account != "" && len(accounts) > 0:
		writeError(w, http.StatusConflict, "not_connected", fmt.Sprintf("no %s connection for account %q", p.DisplayName, truncate(account)), accounts)
	case len(any) == 0:
		writeError(w, http.StatusConflict, "not_connected", fmt.Sprintf("no %s account is connected: call POST /v1/require first", p.DisplayName), nil)
	case len(active) == 0:
		writeError(w, http.StatusConflict, "needs_reconnect", fmt.Sprintf("the %s access was revoked or has expired: call POST /v1/require to reconnect", p.DisplayName), nil)
	case len(active) > 1:
		writeError(w, http.StatusConflict, "account_required", fmt.Sprintf("several %s accounts are connected: name one in the %s header (or account field)", p.DisplayName, AccountHeader), accounts)
	default:
		return active[0], p, true
	}
	return vault.Connection{}, nil, false
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// callError answers a failed token or API call.
func (s *Server) callError(w http.ResponseWriter, p *oauthflow.Provider, conn vault.Connection, err error) {
	var re *oauthflow.RequestError
	switch {
	case errors.As(err, &re):
		writeError(w, http.StatusBadRequest, "request_refused", re.Msg, nil)
	case errors.Is(err, oauthflow.ErrNeedsReconnect):
		writeError(w, http.StatusConflict, "needs_reconnect", fmt.Sprintf("the %s access was revoked or has expired: call POST /v1/require to reconnect", p.DisplayName), nil)
	case errors.Is(err, oauthflow.ErrProviderUnavailable):
		s.log.Warn("sidecar: provider unavailable", "provider", p.Name, "connection", conn.ID, "err", err.Error())
		writeError(w, http.StatusBadGateway, "provider_unavailable", p.DisplayName+" did not answer properly (timeouts or server errors, after retries); nothing was changed", nil)
	case errors.Is(err, vault.ErrNotFound):
		writeError(w, http.StatusConflict, "not_connected", "the connection no longer exists: call POST /v1/require", nil)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusGatewayTimeout, "provider_unavailable", "the request was cancelled or timed out", nil)
	default:
		s.log.Error("sidecar: provider call failed", "provider", p.Name, "connection", conn.ID, "err", err.Error())
		writeError(w, http.StatusInternalServerError, "internal", "internal error", nil)
	}
}

func (s *Server) handleProxy(w http.ResponseWriter, r *http.Request) {
	provider := r.PathValue("provider")
	// The raw (still encoded) path, so encoded slashes and dots are seen
	// and refused rather than decoded away.
	raw := r.URL.EscapedPath()
	prefix := "/v1/proxy/" + provider
	path, ok := strings.CutPrefix(raw, prefix)
	if !ok || path == "" {
		writeError(w, http.StatusBadRequest, "request_refused", "the path after /v1/proxy/{provider} must start with /", nil)
		return
	}
	conn, p, ok := s.pick(w, r, provider, r.Header.Get(AccountHeader))
	if !ok {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the request body exceeds %d bytes", mbe.Limit), nil)
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request", "the request body could not be read", nil)
		return
	}
	req := oauthflow.APIRequest{Method: r.Method, Path: path, Query: r.URL.Query(), Header: http.Header{}, Body: body}
	if len(req.Query) == 0 {
		req.Query = nil
	}
	for _, name := range oauthflow.AllowedRequestHeaders() {
		if vs := r.Header.Values(name); len(vs) > 0 {
			req.Header[name] = vs
		}
	}
	resp, err := s.opts.Caller.Do(r.Context(), conn.ID, req)
	if err != nil {
		s.callError(w, p, conn, err)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	if resp.Truncated {
		w.Header().Set(TruncatedHeader, "true")
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

type tokenRequest struct {
	Provider string `json:"provider"`
	Account  string `json:"account"`
}

type tokenResponse struct {
	AccessToken string     `json:"access_token"`
	TokenType   string     `json:"token_type"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
}

func (s *Server) handleToken(w http.ResponseWriter, r *http.Request) {
	var in tokenRequest
	if !s.readJSON(w, r, &in) {
		return
	}
	if p, ok := s.opts.Providers.Lookup(in.Provider); ok && !p.SidecarTokenExport {
		s.log.Warn("sidecar: token export refused", "event", "token_export_refused", "provider", p.Name)
		writeError(w, http.StatusForbidden, "token_export_disabled",
			fmt.Sprintf("handing out %s tokens is disabled; use /v1/proxy/%s/… (an operator can set sidecar_token_export: true in providers.yaml)", p.DisplayName, p.Name), nil)
		return
	}
	conn, p, ok := s.pick(w, r, in.Provider, in.Account)
	if !ok {
		return
	}
	c, err := s.opts.Caller.Token(r.Context(), conn.ID)
	if err != nil {
		s.callError(w, p, conn, err)
		return
	}
	out := tokenResponse{AccessToken: c.Token.AccessToken.Reveal(), TokenType: c.Token.TokenType}
	if out.TokenType == "" {
		out.TokenType = "Bearer"
	}
	if !c.Token.Expiry.IsZero() {
		t := c.Token.Expiry.UTC()
		out.ExpiresAt = &t
	}
	s.log.Info("sidecar: access token exported", "event", "token_exported", "provider", p.Name, "connection", c.ID)
	if s.opts.Audit != nil {
		v := viewOf(c)
		s.opts.Audit.Audit(r.Context(), telemetry.Event{Kind: telemetry.EventTokenExport, Principal: principal(r),
			Provider: p.Name, Account: v.Account, Connection: c.ID, Via: "sidecar"})
	}
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(out)
	w.Header().Set("Content-Type", "application/json")
	w.Write(buf.Bytes())
}

package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/outage"
	"credbroker/internal/requeststate"
	"credbroker/internal/strictjson"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/sidecar/client"
	"credbroker/vault"
)

// Header names of the sidecar API.
const (
	SecretHeader  = "Broker-Sidecar-Secret"
	AccountHeader = "Broker-Account"
	// APIHostHeader names one of the provider's API hosts (Google serves
	// its APIs from several); absent: the provider's main API base.
	APIHostHeader   = "Broker-Api-Host"
	TruncatedHeader = "Broker-Truncated"
	// DecodedHeader names the content encoding (gzip, deflate) the provider
	// applied unasked, which the broker undid to check the answer.
	DecodedHeader = "Broker-Decoded"
	ErrorHeader   = "Broker-Error"
)

// Caller is one co-located MCP server allowed to use the sidecar API: its
// configured name and its own secret.
type Caller struct {
	// Name is the server's configured name (lowercase letters, digits,
	// '.', '_' and '-', at most 64), shown on the consent page and in audit
	// events and metrics; vault.UnnamedServer for the single unnamed secret.
	Name string
	// Secret is what the server sends in Broker-Sidecar-Secret, at least
	// 16 bytes, different from every other caller's.
	Secret vault.Secret
	// Providers limits the server to these providers (empty: all).
	Providers []string
}

// Audience is one audience accepted in end-user tokens, with the scope
// such tokens must carry.
type Audience struct {
	URI string
	// RequiredScope, when set, must be among the scopes of a token
	// accepted for this audience.
	RequiredScope string
}

// Options configures a Server.
type Options struct {
	// Callers are the co-located servers allowed in (at least one).
	Callers []Caller
	// Verify validates the end user's bearer token (its audience among
	// Audiences' URIs).
	Verify bearer.Verifier
	// Audiences are the accepted token audiences with their policies. A
	// token is accepted when it names one of them and carries that
	// audience's required scope; tokens that name some but carry none of
	// their scopes get 403 insufficient_scope. Empty: whatever Verify
	// accepts, no scope required.
	Audiences []Audience
	// Connections makes every decision about connections.
	Connections *connections.Service
	// StateKeys seal request_state (pass kr.Derive("requestState")).
	StateKeys *vault.Keyring
	// StateTTL bounds a request_state's life (default 10 minutes).
	StateTTL time.Duration
	// Telemetry counts requests per caller, route and status (nil: none).
	Telemetry    *telemetry.Recorder
	MaxBodyBytes int64 // request bodies, default 1 MiB
	Logger       *slog.Logger
	Now          func() time.Time
	// Tracing puts every request in a "sidecar.request" span, the parent
	// of what the connections layer and the provider do for it (nil: off).
	Tracing trace.TracerProvider
}

// callerNameRE is what a caller's configured name may look like: fit for
// a metric label, an audit field and a sentence.
var callerNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ValidCallerName reports whether name can name a co-located server.
func ValidCallerName(name string) bool { return callerNameRE.MatchString(name) }

// Server serves the sidecar API.
type Server struct {
	opts    Options
	log     *slog.Logger
	mux     *http.ServeMux
	callers []caller
	tracer  trace.Tracer // nil: tracing off
}

// caller is a Caller with its secret's digest, compared in constant time.
type caller struct {
	Caller
	digest    [32]byte
	providers map[string]bool // nil: all
}

// New validates opts (reporting every problem at once) and builds the
// Server.
func New(opts Options) (*Server, error) {
	var problems []string
	for _, m := range []struct {
		ok   bool
		name string
	}{{opts.Verify != nil, "Verify"}, {opts.Connections != nil, "Connections"}, {opts.StateKeys != nil, "StateKeys"}, {len(opts.Callers) > 0, "Callers"}} {
		if !m.ok {
			problems = append(problems, "missing option "+m.name)
		}
	}
	s := &Server{opts: opts, log: opts.Logger, mux: http.NewServeMux(), tracer: tracing.Tracer(opts.Tracing)}
	names, digests := map[string]bool{}, map[[32]byte]bool{}
	for i, c := range opts.Callers {
		label := fmt.Sprintf("caller %d (%q)", i+1, c.Name)
		if !ValidCallerName(c.Name) {
			problems = append(problems, label+": a name is lowercase letters, digits, '.', '_' and '-' (at most 64)")
		}
		if names[c.Name] {
			problems = append(problems, label+": the name is taken by another caller")
		}
		names[c.Name] = true
		if len(c.Secret.Reveal()) < 16 {
			problems = append(problems, label+": the secret must be at least 16 bytes")
		}
		cc := caller{Caller: c, digest: sha256.Sum256([]byte(c.Secret.Reveal()))}
		if digests[cc.digest] {
			problems = append(problems, label+": the secret is another caller's too (each server needs its own)")
		}
		digests[cc.digest] = true
		if len(c.Providers) > 0 {
			cc.providers = map[string]bool{}
			for _, p := range c.Providers {
				if opts.Connections != nil {
					if _, ok := opts.Connections.Providers().Lookup(p); !ok {
						problems = append(problems, fmt.Sprintf("%s: unknown provider %q", label, p))
					}
				}
				cc.providers[p] = true
			}
		}
		s.callers = append(s.callers, cc)
	}
	for _, a := range opts.Audiences {
		if a.URI == "" {
			problems = append(problems, "an audience without a URI")
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("sidecar: %s", strings.Join(problems, "; "))
	}
	if s.opts.MaxBodyBytes <= 0 {
		s.opts.MaxBodyBytes = 1 << 20
	}
	if s.opts.StateTTL <= 0 {
		s.opts.StateTTL = 10 * time.Minute
	}
	if s.opts.Now == nil {
		s.opts.Now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("POST /v1/require", s.handleRequire)
	s.mux.HandleFunc("POST /v1/token", s.handleToken)
	s.mux.HandleFunc("/v1/proxy/{provider}/{path...}", s.handleProxy)
	return s, nil
}

type ctxKey struct{}

// identity is who a request comes from: the co-located server and the
// person whose token it carries.
type identity struct {
	caller    *caller
	principal vault.Principal
}

// route names a request path for the metrics.
func route(path string) string {
	switch {
	case path == "/v1/require":
		return telemetry.SidecarRequire
	case path == "/v1/token":
		return telemetry.SidecarToken
	case strings.HasPrefix(path, "/v1/proxy/"):
		return telemetry.SidecarProxy
	}
	return "other"
}

// ServeHTTP checks both credentials and the audience's policy, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &telemetry.StatusWriter{ResponseWriter: w}
	var from *caller
	var span trace.Span
	if s.tracer != nil {
		// Attributes are the route's fixed name, the configured server's
		// name and the status: never a path, a principal or a token.
		var ctx context.Context
		ctx, span = s.tracer.Start(r.Context(), "sidecar.request", trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("sidecar.route", route(r.URL.Path)), attribute.String("http.request.method", r.Method)))
		r = r.WithContext(ctx)
	}
	defer func() {
		name := ""
		if from != nil {
			name = from.Name
		}
		s.opts.Telemetry.SidecarRequest(name, route(r.URL.Path), sw.Status)
		if span != nil {
			if name != "" {
				span.SetAttributes(attribute.String("sidecar.server", name))
			}
			tracing.EndServer(span, sw.Status)
		}
	}()
	w = sw
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	from = s.identify(r.Header.Get(SecretHeader))
	if from == nil {
		s.log.Warn("sidecar: wrong or missing sidecar secret", "event", "sidecar_secret_rejected", "remote", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, "unauthorized", "the "+SecretHeader+" header is missing or wrong", nil)
		return
	}
	log := s.log.With("server", from.Name)
	raw, err := bearer.FromHeader(r.Header.Values("Authorization"))
	if err != nil {
		writeError(w, http.StatusUnauthorized, "unauthorized", "the end user's token is required: Authorization: Bearer <token>", nil)
		return
	}
	info, err := s.opts.Verify(r.Context(), raw)
	if err != nil || info.Principal.Issuer == "" || info.Principal.Subject == "" {
		if errors.Is(err, vault.ErrUnavailable) {
			s.storageUnavailable(w, log, err)
			return
		}
		if err != nil && !errors.Is(err, bearer.ErrInvalidToken) {
			log.Error("sidecar: cannot verify user tokens", "err", err.Error())
			writeError(w, http.StatusServiceUnavailable, "internal", "user tokens cannot be verified right now", nil)
			return
		}
		log.Info("sidecar: user token rejected")
		writeError(w, http.StatusUnauthorized, "unauthorized", "the end user's token is invalid, expired or not meant for this broker", nil)
		return
	}
	if ok, scopes := s.allowed(info); !ok {
		if len(scopes) == 0 {
			log.Info("sidecar: user token names no accepted audience")
			writeError(w, http.StatusUnauthorized, "unauthorized", "the end user's token is invalid, expired or not meant for this broker", nil)
			return
		}
		log.Info("sidecar: user token lacks the required scope", "event", "sidecar_insufficient_scope")
		w.Header().Set("WWW-Authenticate", fmt.Sprintf("Bearer error=\"insufficient_scope\", scope=%q", strings.Join(scopes, " ")))
		writeError(w, http.StatusForbidden, "insufficient_scope", fmt.Sprintf("the end user's token lacks the required scope %s", quoteAll(scopes)), nil)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, identity{caller: from, principal: info.Principal})))
}

// identify returns the caller whose secret was given, comparing digests
// in constant time against every caller.
func (s *Server) identify(given string) *caller {
	if given == "" {
		return nil
	}
	d := sha256.Sum256([]byte(given))
	var found *caller
	for i := range s.callers {
		if subtle.ConstantTimeCompare(d[:], s.callers[i].digest[:]) == 1 {
			found = &s.callers[i]
		}
	}
	return found
}

// allowed applies the audience policies to a verified token: accepted
// when one audience it names has its required scope (or none). Otherwise
// the scopes the named audiences require (none: it names no configured
// audience).
func (s *Server) allowed(info bearer.TokenInfo) (bool, []string) {
	if len(s.opts.Audiences) == 0 {
		return true, nil
	}
	var want []string
	named := false
	for _, a := range s.opts.Audiences {
		if !slices.Contains(info.Audiences, a.URI) {
			continue
		}
		named = true
		if a.RequiredScope == "" || slices.Contains(info.Scopes, a.RequiredScope) {
			return true, nil
		}
		if !slices.Contains(want, a.RequiredScope) {
			want = append(want, a.RequiredScope)
		}
	}
	if !named {
		return false, nil
	}
	return false, want
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, " or ")
}

func who(r *http.Request) identity {
	id, _ := r.Context().Value(ctxKey{}).(identity)
	return id
}

// providerAllowed answers 403 provider_not_allowed when the calling server
// is limited to other providers.
func providerAllowed(w http.ResponseWriter, r *http.Request, provider string) bool {
	c := who(r).caller
	if c == nil || c.providers == nil || c.providers[provider] {
		return true
	}
	writeError(w, http.StatusForbidden, "provider_not_allowed",
		fmt.Sprintf("this server may not use the provider %s (its broker configuration limits it to: %s)", untrusted.Quote(provider), strings.Join(c.Providers, ", ")), nil)
	return false
}

// storageUnavailable answers a request a storage outage stopped: 503 with
// Retry-After, code storage_unavailable; the cause goes to log, the
// refusal to credbroker_store_unavailable_total{door="sidecar"}.
func (s *Server) storageUnavailable(w http.ResponseWriter, log *slog.Logger, err error) {
	log.Warn("sidecar: store unavailable; answered 503", "err", err.Error())
	s.opts.Telemetry.StoreUnavailable(telemetry.DoorSidecar)
	outage.SetRetryAfter(w.Header())
	writeError(w, http.StatusServiceUnavailable, string(connections.CodeStorageUnavailable), outage.Message, nil)
}

func writeError(w http.ResponseWriter, status int, code, msg string, accounts []string) {
	// Tells the broker's own refusals from relayed provider answers.
	w.Header().Set(ErrorHeader, "true")
	writeJSON(w, status, client.Error{Code: code, Message: msg, Accounts: accounts})
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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body exceeds %d bytes", mbe.Limit), nil)
		return false
	}
	if err == nil {
		err = strictjson.Decode(body, v)
	}
	var ufe *strictjson.UnknownFieldError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ufe):
		writeError(w, http.StatusBadRequest, "invalid_request", "unknown field "+strconv.Quote(ufe.Field), nil)
	case errors.Is(err, strictjson.ErrTrailing):
		writeError(w, http.StatusBadRequest, "invalid_request", "the body must be one JSON object", nil)
	default:
		writeError(w, http.StatusBadRequest, "invalid_request", "the body must be one JSON object matching the route's fields", nil)
	}
	return false
}

// The API's answers are sidecar/client's types, the one definition of its
// wire: client.Error for every refusal, client.Connection (no secret
// fields) and client.RequireResult.

// viewOf describes c: Note says which scopes the provider did not grant
// and how to ask again.
func viewOf(c vault.Connection, p *provider.Provider) client.Connection {
	v := client.Connection{ID: c.ID, Provider: c.Provider, Account: connections.AccountName(c), Scopes: slices.Clone(c.Scopes), Status: string(c.Status)}
	if v.Scopes == nil {
		v.Scopes = []string{}
	}
	if v.NotGranted = connections.NotGranted(p, c); len(v.NotGranted) > 0 {
		v.Note = connections.NotGrantedWords(p, v.NotGranted) +
			" To ask again, call POST /v1/require with these scopes; the user is asked in the browser and may grant them or not."
	}
	return v
}

type requireRequest struct {
	Provider     string   `json:"provider"`
	Scopes       []string `json:"scopes"`
	RequestState string   `json:"request_state"`
	// InputResponses are the host's answers to the server's input
	// requests (MCP inputResponses), passed through as they are; the
	// broker reads the one under its own key (input_key).
	InputResponses map[string]json.RawMessage `json:"input_responses"`
	// ClientName is the host's self-asserted name (untrusted), shown on
	// the consent page as not verified.
	ClientName string `json:"client_name"`
}

// inputKey is the key of the broker's input request for provider, in the
// server's inputRequests and the host's inputResponses (the MCP tools use
// the same).
func inputKey(provider string) string { return "connect_" + provider }

// elicitResult is an MCP ElicitResult as the host sent it.
type elicitResult struct {
	Action  string          `json:"action"`
	Content json.RawMessage `json:"content"`
	Meta    json.RawMessage `json:"_meta"`
}

// answer reads the person's answer to the broker's input request from
// responses: NoAnswer when there is none, an error message when it is not
// an elicitation result.
func answer(responses map[string]json.RawMessage, key string) (connections.Answer, string) {
	raw, ok := responses[key]
	if !ok {
		return connections.NoAnswer, ""
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var er elicitResult
	if err := dec.Decode(&er); err != nil {
		return "", fmt.Sprintf("input_responses[%q] must be an elicitation result {action, content?}", key)
	}
	a, ok := connections.ParseAnswer(er.Action)
	if !ok {
		return "", fmt.Sprintf("input_responses[%q].action must be accept, decline or cancel", key)
	}
	return a, ""
}

// requireOperation is what a sidecar request_state is bound to, with the
// digest of {provider, scopes}.
const requireOperation = "sidecar/require"

func (s *Server) request(r *http.Request, provider string, scopes []string, account string) connections.Request {
	id := who(r)
	return connections.Request{Principal: id.principal, Provider: provider, Scopes: scopes, Account: account,
		Via: "sidecar", Server: id.caller.Name, CanAsk: true}
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
	if !providerAllowed(w, r, in.Provider) {
		return
	}
	if in.InputResponses != nil && in.RequestState == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "input_responses answer an earlier input_required: send its request_state with them", nil)
		return
	}
	ans, bad := answer(in.InputResponses, inputKey(in.Provider))
	if bad != "" {
		writeError(w, http.StatusBadRequest, "invalid_request", bad, nil)
		return
	}
	args, _ := json.Marshal(struct {
		Provider string   `json:"provider"`
		Scopes   []string `json:"scopes,omitempty"`
	}{in.Provider, in.Scopes})
	digest, _ := requeststate.Digest(args)
	req := s.request(r, in.Provider, in.Scopes, "")
	req.ClientName = untrusted.Clip(in.ClientName, 100)
	var (
		o   connections.Outcome
		err error
	)
	if in.RequestState == "" {
		o, err = s.opts.Connections.Ensure(r.Context(), req)
	} else {
		st, serr := requeststate.Open(s.opts.StateKeys, in.RequestState, req.Principal, requireOperation, digest, s.opts.Now())
		if serr != nil {
			writeError(w, http.StatusBadRequest, string(connections.CodeInvalidState), invalidState, nil)
			return
		}
		o, err = s.opts.Connections.Resume(r.Context(), req, st.Ref, ans)
	}
	if connections.Classify(err) == connections.NotFound {
		// An unknown provider named in a body is a bad body here (404 is
		// for an unknown provider in the path).
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error(), nil)
		return
	}
	if err != nil {
		s.failed(w, err, in.Provider)
		return
	}
	switch o := o.(type) {
	case connections.Connected:
		v := viewOf(o.Conn, o.Provider)
		writeJSON(w, http.StatusOK, client.RequireResult{Status: "connected", Connection: &v})
	case connections.NeedsUser:
		state := requeststate.Seal(s.opts.StateKeys, requeststate.State{Principal: req.Principal, Operation: requireOperation,
			ArgDigest: digest, Ref: o.Grant.ID, Expires: o.Until(s.opts.Now(), s.opts.StateTTL)})
		writeJSON(w, http.StatusOK, client.RequireResult{Status: "input_required", InputKey: inputKey(in.Provider),
			InputRequest: &client.InputRequest{Method: "elicitation/create", Params: &mcp.ElicitParams{Mode: "url", Message: o.Message(), URL: o.URL}},
			RequestState: state})
	case connections.Declined:
		writeJSON(w, http.StatusOK, client.RequireResult{Status: "declined", Message: o.Message()})
	case connections.Cancelled:
		writeJSON(w, http.StatusOK, client.RequireResult{Status: "cancelled", Message: o.Message("")})
	default:
		writeError(w, http.StatusInternalServerError, "internal", "internal error", nil)
	}
}

// pick returns the caller's one usable connection to provider, or writes
// why there is none.
func (s *Server) pick(w http.ResponseWriter, r *http.Request, provider, account string) (vault.Connection, bool) {
	req := s.request(r, provider, nil, account)
	req.CanAsk = false // /v1/require starts connect requests; these routes only say so
	o, err := s.opts.Connections.Pick(r.Context(), req)
	if err != nil {
		s.failed(w, err, provider)
		return vault.Connection{}, false
	}
	switch o := o.(type) {
	case connections.Connected:
		return o.Conn, true
	case connections.Ambiguous:
		writeError(w, http.StatusConflict, "account_required", fmt.Sprintf("several %s accounts are connected: name one in the %s header (or account field)", o.Provider.DisplayName, AccountHeader), o.Accounts)
	case connections.NeedsUser:
		if o.Why.Kind == connections.Reconnect {
			writeError(w, http.StatusConflict, "needs_reconnect", fmt.Sprintf("the %s access was revoked or has expired: call POST /v1/require to reconnect", o.Provider.DisplayName), nil)
		} else {
			writeError(w, http.StatusConflict, "not_connected", fmt.Sprintf("no %s account is connected: call POST /v1/require first", o.Provider.DisplayName), nil)
		}
	default:
		writeError(w, http.StatusInternalServerError, "internal", "internal error", nil)
	}
	return vault.Connection{}, false
}

// invalidState is the one answer to a request_state that does not open
// for this request, whatever the reason.
const invalidState = "Invalid or expired requestState"

// statusOf is the HTTP status of each class of failure.
var statusOf = map[connections.Class]int{
	connections.BadRequest:         http.StatusBadRequest,
	connections.BadState:           http.StatusBadRequest,
	connections.NotFound:           http.StatusNotFound,
	connections.NeedsConnection:    http.StatusConflict,
	connections.Refused:            http.StatusConflict,
	connections.Conflict:           http.StatusConflict,
	connections.Forbidden:          http.StatusForbidden,
	connections.Unavailable:        http.StatusBadGateway,
	connections.TimedOut:           http.StatusGatewayTimeout,
	connections.Internal:           http.StatusInternalServerError,
	connections.StorageUnavailable: http.StatusServiceUnavailable,
}

// failed answers a connections or provider error: the status of its class,
// its code, the words from connections.Explain and what to do next in this
// API's terms.
func (s *Server) failed(w http.ResponseWriter, err error, providerName string) {
	p, _ := s.opts.Connections.Providers().Lookup(providerName)
	f := connections.Explain(err, p)
	msg := f.Message
	var re *provider.RequestError
	switch {
	case f.Class == connections.StorageUnavailable:
		s.storageUnavailable(w, s.log, err)
		return
	case f.Class == connections.BadState:
		msg = invalidState
	case errors.As(err, &re):
		msg = re.Msg
	case f.Class == connections.Internal:
		s.log.Error("sidecar: request failed", "provider", providerName, "err", err.Error())
		msg = "internal error"
	case f.Class == connections.Unavailable:
		s.log.Warn("sidecar: provider unavailable or its answer refused", "provider", providerName, "err", err.Error())
	}
	switch f.Next {
	case connections.NextStartOver:
		msg += " Start over."
	case connections.NextConnect:
		msg += " Call POST /v1/require."
	case connections.NextReconnect:
		msg += " Call POST /v1/require to reconnect."
	}
	writeError(w, statusOf[f.Class], string(f.Code), msg, f.Accounts)
}

func (s *Server) handleProxy(w http.ResponseWriter, r *http.Request) {
	providerName := r.PathValue("provider")
	// The raw (still encoded) path, so encoded slashes and dots are seen
	// and refused rather than decoded away.
	raw := r.URL.EscapedPath()
	prefix := "/v1/proxy/" + providerName
	path, ok := strings.CutPrefix(raw, prefix)
	if !ok || path == "" {
		writeError(w, http.StatusBadRequest, "request_refused", "the path after /v1/proxy/{provider} must start with /", nil)
		return
	}
	if !providerAllowed(w, r, providerName) {
		return
	}
	conn, ok := s.pick(w, r, providerName, r.Header.Get(AccountHeader))
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
	req := provider.APIRequest{Method: r.Method, Host: r.Header.Get(APIHostHeader), Path: path, Query: r.URL.Query(), Header: http.Header{}, Body: body}
	if len(req.Query) == 0 {
		req.Query = nil
	}
	for _, name := range provider.AllowedRequestHeaders() {
		if vs := r.Header.Values(name); len(vs) > 0 {
			req.Header[name] = vs
		}
	}
	resp, err := s.opts.Connections.Call(r.Context(), conn, req)
	if err != nil {
		s.failed(w, err, providerName)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	if resp.Truncated {
		w.Header().Set(TruncatedHeader, "true")
	}
	if resp.Decoded != "" {
		w.Header().Set(DecodedHeader, resp.Decoded)
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
	if !providerAllowed(w, r, in.Provider) {
		return
	}
	if p, ok := s.opts.Connections.Providers().Lookup(in.Provider); ok {
		if err := connections.ExportAllowed(p); err != nil {
			s.log.Warn("sidecar: token export refused", "event", "token_export_refused", "provider", p.Name, "server", who(r).caller.Name)
			writeError(w, http.StatusForbidden, string(connections.CodeExportDisabled),
				fmt.Sprintf("%s Use /v1/proxy/%s/… instead.", connections.Describe(err, p), p.Name), nil)
			return
		}
	}
	conn, ok := s.pick(w, r, in.Provider, in.Account)
	if !ok {
		return
	}
	ex, err := s.opts.Connections.Export(r.Context(), s.request(r, in.Provider, nil, in.Account), conn)
	if err != nil {
		s.failed(w, err, in.Provider)
		return
	}
	out := tokenResponse{AccessToken: ex.AccessToken.Reveal(), TokenType: ex.TokenType}
	if !ex.Expiry.IsZero() {
		t := ex.Expiry.UTC()
		out.ExpiresAt = &t
	}
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(out)
	w.Header().Set("Content-Type", "application/json")
	w.Write(buf.Bytes())
}

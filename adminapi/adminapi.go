// Package adminapi is the operators' HTTP API, served on its own listener
// (broker serve --admin-addr, loopback by default): a person's connections,
// offboarding, and disabling a provider. It is a front door: the decisions
// are connections', and this package only checks who calls and translates.
//
// Every request carries a bearer JWT from the organisation's IdP whose
// audience is the admin API's and which holds the configured claim value
// (--admin-claim groups=credbroker-admins: the "groups" claim is, or
// contains, "credbroker-admins"; a dotted name reaches into objects, as
// realm_access.roles). No token or a bad one answers 401, a valid token
// without the claim 403; both are audited (admin_refused). Every action is
// an audit event naming the admin. While the store is unavailable every
// route answers as every door of the broker does (internal/outage): 503,
// Retry-After, {"error":"storage_unavailable"}; the actions are resumable,
// so running one again afterwards finishes it.
//
//	GET  /admin/v1/connections?iss=ISS&sub=SUB      a person's connections (metadata)
//	GET  /admin/v1/apps?iss=ISS&sub=SUB             the apps (MCP hosts) with access as the person,
//	                                                 marked when the organisation's IdP let them in (ID-JAG)
//	POST /admin/v1/offboard                          {"iss": …, "sub": …}
//	POST /admin/v1/providers/{name}/disable          {"delete": false}
package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"credbroker/apps"
	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/outage"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/vault"
)

// Claim is the condition an admin's token must meet: the claim at Path
// equals Value, or is a list (or a space-separated string) holding it.
type Claim struct {
	Path  []string
	Value string
}

var claimNameRE = regexp.MustCompile(`^[A-Za-z0-9_:/.\-]+$`)

// ParseClaim parses NAME=VALUE ("groups=credbroker-admins"); a dotted
// NAME reaches into nested objects ("realm_access.roles=admin").
func ParseClaim(s string) (Claim, error) {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" || value == "" || !claimNameRE.MatchString(name) || strings.Contains(name, "..") ||
		strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") {
		return Claim{}, fmt.Errorf("%q: want CLAIM=VALUE, e.g. groups=credbroker-admins (a dotted CLAIM reaches into objects)", s)
	}
	return Claim{Path: strings.Split(name, "."), Value: value}, nil
}

func (c Claim) String() string { return strings.Join(c.Path, ".") + "=" + c.Value }

// Holds reports whether the claim set has c.
func (c Claim) Holds(claims json.RawMessage) bool {
	cur := claims
	for _, k := range c.Path {
		var m map[string]json.RawMessage
		if json.Unmarshal(cur, &m) != nil {
			return false
		}
		v, ok := m[k]
		if !ok {
			return false
		}
		cur = v
	}
	var one string
	if json.Unmarshal(cur, &one) == nil {
		return one == c.Value || strings.Contains(one, " ") && containsField(strings.Fields(one), c.Value)
	}
	var list []string
	if json.Unmarshal(cur, &list) == nil {
		return containsField(list, c.Value)
	}
	return false
}

func containsField(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}

// Options configures a Server.
type Options struct {
	Connections *connections.Service
	// Verify checks admin tokens (issuer and the admin API's audience).
	Verify bearer.Verifier
	// Claim is what an admin's token must hold.
	Claim     Claim
	Telemetry *telemetry.Recorder
	Logger    *slog.Logger
	// Apps lists the apps a person allowed at the broker's authorization
	// server: the apps core's List (wired by cmd/broker; nil: the route
	// answers 404, as in issuer mode).
	Apps func(ctx context.Context, p vault.Principal) ([]apps.App, error)
	// Tracing, when set, makes each request an "adminapi.request" server
	// span with the route and the status; never the people a request
	// names (they travel in its query or body). Nil: off.
	Tracing trace.TracerProvider
}

// Server is the admin API.
type Server struct {
	opts   Options
	log    *slog.Logger
	tracer trace.Tracer // nil: tracing off
}

// New validates opts and builds a Server.
func New(opts Options) (*Server, error) {
	if opts.Connections == nil || opts.Verify == nil || len(opts.Claim.Path) == 0 {
		return nil, errors.New("adminapi: New needs Connections, Verify and Claim")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{opts: opts, log: log, tracer: tracing.Tracer(opts.Tracing)}, nil
}

// Handler returns the API's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /admin/v1/connections", s.admin(s.listConnections))
	mux.Handle("GET /admin/v1/apps", s.admin(s.listApps))
	mux.Handle("POST /admin/v1/offboard", s.admin(s.offboard))
	mux.Handle("POST /admin/v1/providers/{name}/disable", s.admin(s.disable))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such admin route")
	})
	// The matched pattern is the route ("/" for an unknown path).
	return tracing.Handler(s.tracer, "adminapi.request", mux, nil)
}

type adminHandler func(w http.ResponseWriter, r *http.Request, admin connections.Admin)

// admin authenticates and authorises the caller, then runs h.
func (s *Server) admin(h adminHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		raw, err := bearer.FromHeader(r.Header.Values("Authorization"))
		if err != nil {
			s.refuse(r, vault.Principal{}, "no bearer token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="credbroker-admin"`)
			writeError(w, http.StatusUnauthorized, "invalid_token", "a bearer token from the identity provider is required")
			return
		}
		info, err := s.opts.Verify(r.Context(), raw)
		if err != nil {
			if errors.Is(err, vault.ErrUnavailable) {
				s.unavailable(w, "verify a token", err)
				return
			}
			if !errors.Is(err, bearer.ErrInvalidToken) {
				s.log.Error("adminapi: verifying a token failed", "err", err)
				writeError(w, http.StatusServiceUnavailable, "temporarily_unavailable", "the identity provider could not be reached")
				return
			}
			s.refuse(r, vault.Principal{}, "invalid token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="credbroker-admin", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "invalid_token", "the bearer token is invalid, expired or not meant for the admin API")
			return
		}
		if !s.opts.Claim.Holds(info.Claims) {
			s.refuse(r, info.Principal, "the token lacks "+s.opts.Claim.String())
			w.Header().Set("WWW-Authenticate", `Bearer realm="credbroker-admin", error="insufficient_scope"`)
			writeError(w, http.StatusForbidden, "forbidden", "this person is not an administrator of the broker")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		h(w, r, connections.Admin{Principal: info.Principal, Via: "admin-api"})
	})
}

func (s *Server) refuse(r *http.Request, who vault.Principal, why string) {
	s.opts.Telemetry.Audit(r.Context(), telemetry.Event{Kind: telemetry.EventAdminRefused, Principal: who, Via: "admin-api",
		Outcome: r.Method + " " + r.URL.Path, Err: errors.New(why)})
}

// PrincipalJSON names a person.
type PrincipalJSON struct {
	Issuer  string `json:"iss"`
	Subject string `json:"sub"`
}

// ConnectionJSON is a connection's metadata (never a token).
type ConnectionJSON struct {
	ID            string     `json:"id"`
	Provider      string     `json:"provider"`
	AccountID     string     `json:"account_id"`
	AccountLogin  string     `json:"account_login,omitempty"`
	Scopes        []string   `json:"scopes"`
	Status        string     `json:"status"`
	Created       time.Time  `json:"created"`
	LastUsed      *time.Time `json:"last_used,omitempty"`
	LastRefreshed *time.Time `json:"last_refreshed,omitempty"`
}

// ConnectionsJSON answers GET /admin/v1/connections.
type ConnectionsJSON struct {
	Principal   PrincipalJSON    `json:"principal"`
	Connections []ConnectionJSON `json:"connections"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Connections renders a listing.
func Connections(p vault.Principal, conns []vault.Connection) ConnectionsJSON {
	out := ConnectionsJSON{Principal: PrincipalJSON{p.Issuer, p.Subject}, Connections: []ConnectionJSON{}}
	for _, c := range conns {
		out.Connections = append(out.Connections, ConnectionJSON{ID: c.ID, Provider: c.Provider, AccountID: c.AccountID,
			AccountLogin: c.AccountLogin, Scopes: append([]string{}, c.Scopes...), Status: string(c.Status), Created: c.Created,
			LastUsed: optTime(c.LastUsed), LastRefreshed: optTime(c.LastRefreshed)})
	}
	return out
}

// OffboardJSON answers POST /admin/v1/offboard.
type OffboardJSON struct {
	Principal PrincipalJSON `json:"principal"`
	// Complete is false while a revocation awaits the next run.
	Complete      bool                 `json:"complete"`
	GrantsDeleted int                  `json:"connect_requests_deleted"`
	Connections   []OffboardedConnJSON `json:"connections"`
	Steps         []StepJSON           `json:"steps"`
}

// OffboardedConnJSON is one connection of an offboarding.
type OffboardedConnJSON struct {
	ID         string `json:"id"`
	Provider   string `json:"provider"`
	Account    string `json:"account"`
	Revocation string `json:"revocation"`
	Retry      bool   `json:"retry,omitempty"`
	Pending    bool   `json:"revocation_pending,omitempty"`
	Error      string `json:"error,omitempty"`
}

// StepJSON is one extension step of an offboarding.
type StepJSON struct {
	Name    string `json:"name"`
	Removed int    `json:"removed"`
	Error   string `json:"error,omitempty"`
}

// Offboard renders an offboarding report.
func Offboard(rep connections.OffboardReport) OffboardJSON {
	out := OffboardJSON{Principal: PrincipalJSON{rep.Principal.Issuer, rep.Principal.Subject}, Complete: rep.Complete(),
		GrantsDeleted: rep.Grants, Connections: []OffboardedConnJSON{}, Steps: []StepJSON{}}
	for _, c := range rep.Connections {
		out.Connections = append(out.Connections, OffboardedConnJSON{ID: c.ID, Provider: c.Provider, Account: c.Account,
			Revocation: string(c.Revocation), Retry: c.Retry, Pending: c.Pending, Error: c.Error})
	}
	for _, st := range rep.Steps {
		out.Steps = append(out.Steps, StepJSON(st))
	}
	return out
}

// DisableJSON answers POST /admin/v1/providers/{name}/disable.
type DisableJSON struct {
	Provider    string         `json:"provider"`
	Marked      int            `json:"marked_needs_reconnect"`
	Deleted     int            `json:"deleted"`
	Revocations map[string]int `json:"revocations,omitempty"`
}

// Disable renders a provider disable report.
func Disable(rep connections.DisableReport) DisableJSON {
	out := DisableJSON{Provider: rep.Provider, Marked: rep.Marked, Deleted: rep.Deleted}
	if len(rep.Revocations) > 0 {
		out.Revocations = map[string]int{}
		for k, v := range rep.Revocations {
			out.Revocations[string(k)] = v
		}
	}
	return out
}

func (s *Server) listConnections(w http.ResponseWriter, r *http.Request, admin connections.Admin) {
	p := vault.Principal{Issuer: r.URL.Query().Get("iss"), Subject: r.URL.Query().Get("sub")}
	if p.Issuer == "" || p.Subject == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "query parameters iss and sub are required")
		return
	}
	conns, err := s.opts.Connections.AdminList(r.Context(), admin, p)
	if err != nil {
		s.internal(w, "list", err)
		return
	}
	writeJSON(w, http.StatusOK, Connections(p, conns))
}

// AppJSON is an app in GET /admin/v1/apps.
type AppJSON struct {
	ID       string `json:"id"`
	ClientID string `json:"client_id"`
	// Name is the app's self-asserted name (not verified).
	Name           string     `json:"name"`
	VerifiedDomain string     `json:"verified_domain,omitempty"`
	Authorized     time.Time  `json:"authorized"`
	LastUsed       *time.Time `json:"last_used,omitempty"`
	Active         bool       `json:"active"`
	// ByOrganisation: the organisation's IdP let the app in with an
	// ID-JAG (enterprise-managed authorization).
	ByOrganisation bool `json:"by_organisation"`
}

// AppsJSON answers GET /admin/v1/apps.
type AppsJSON struct {
	Principal PrincipalJSON `json:"principal"`
	Apps      []AppJSON     `json:"apps"`
}

func (s *Server) listApps(w http.ResponseWriter, r *http.Request, admin connections.Admin) {
	if s.opts.Apps == nil {
		writeError(w, http.StatusNotFound, "not_found", "this broker has no authorization server of its own (--mcp-auth issuer), so no apps")
		return
	}
	p := vault.Principal{Issuer: r.URL.Query().Get("iss"), Subject: r.URL.Query().Get("sub")}
	if p.Issuer == "" || p.Subject == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "query parameters iss and sub are required")
		return
	}
	list, err := s.opts.Apps(r.Context(), p)
	if err != nil {
		s.internal(w, "list apps", err)
		return
	}
	s.opts.Telemetry.Audit(r.Context(), telemetry.Event{Kind: telemetry.EventAdminList, Admin: admin.Principal, Principal: p,
		Via: "admin-api", Outcome: "apps"})
	out := AppsJSON{Principal: PrincipalJSON{p.Issuer, p.Subject}, Apps: []AppJSON{}}
	for _, a := range list {
		out.Apps = append(out.Apps, AppJSON{ID: a.ID, ClientID: a.ClientID, Name: a.Name, VerifiedDomain: a.VerifiedDomain,
			Authorized: a.Authorized, LastUsed: optTime(a.LastUsed), Active: a.Active, ByOrganisation: a.ByOrganisation})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) offboard(w http.ResponseWriter, r *http.Request, admin connections.Admin) {
	var body PrincipalJSON
	if !readJSON(w, r, &body) {
		return
	}
	if body.Issuer == "" || body.Subject == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "iss and sub are required")
		return
	}
	rep, err := s.opts.Connections.Offboard(r.Context(), admin, vault.Principal{Issuer: body.Issuer, Subject: body.Subject})
	if err != nil {
		s.internal(w, "offboard", err)
		return
	}
	writeJSON(w, http.StatusOK, Offboard(rep))
}

func (s *Server) disable(w http.ResponseWriter, r *http.Request, admin connections.Admin) {
	var body struct {
		Delete bool `json:"delete"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	name := r.PathValue("name")
	if _, ok := s.opts.Connections.Providers().Lookup(name); !ok && !body.Delete {
		writeError(w, http.StatusNotFound, "unknown_provider", "no such provider in the catalogue (connections to a removed provider can still be deleted with delete: true)")
		return
	}
	rep, err := s.opts.Connections.DisableProvider(r.Context(), admin, name, body.Delete)
	if err != nil {
		s.internal(w, "disable", err)
		return
	}
	writeJSON(w, http.StatusOK, Disable(rep))
}

// internal answers a request whose action failed: a storage outage as
// every door answers it (unavailable), anything else 500.
func (s *Server) internal(w http.ResponseWriter, what string, err error) {
	if errors.Is(err, vault.ErrUnavailable) {
		s.unavailable(w, what, err)
		return
	}
	s.log.Error("adminapi: "+what+" failed", "err", err)
	writeError(w, http.StatusInternalServerError, "internal_error", what+" failed inside the broker; see its log (it can be run again)")
}

// unavailable answers a request a storage outage stopped: 503 with
// Retry-After and code storage_unavailable (the sidecar's); the cause goes
// to the log, the refusal to credbroker_store_unavailable_total{door="admin"}.
// Nothing the action did is lost: running it again continues it.
func (s *Server) unavailable(w http.ResponseWriter, what string, err error) {
	s.log.Warn("adminapi: store unavailable; answered 503", "action", what, "err", err.Error())
	s.opts.Telemetry.StoreUnavailable(telemetry.DoorAdmin)
	outage.SetRetryAfter(w.Header())
	writeError(w, http.StatusServiceUnavailable, string(connections.CodeStorageUnavailable), outage.Message)
}

// readJSON decodes a JSON body strictly (an empty body is {}).
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request", "the body is too large")
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	} else if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "invalid_request", "the body must be application/json")
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil || dec.More() {
		writeError(w, http.StatusBadRequest, "invalid_request", "the body is not the expected JSON object")
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, desc string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}

// Package sidecartest starts a complete broker core for tests of the
// sidecar API and of servers built on it: a development IdP (real JWTs),
// the demo provider (rotating refresh tokens, event log), an encrypted
// in-memory store, the MCP server's connect logic, the token Caller and
// the sidecar API, all on loopback.
package sidecartest

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"credbroker/binding"
	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/telemetry"
	"credbroker/mcpapi"
	"credbroker/oauthflow"
	"credbroker/sidecar"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// Audience is the audience the sidecar accepts for user tokens.
const Audience = "https://broker.example.test/mcp"

// PublicURL is the broker's public URL in connect links.
const PublicURL = "https://broker.example.test"

const redirectURI = PublicURL + "/oauth/demo/callback"

// Options adjust the stack.
type Options struct {
	// Export sets sidecar_token_export on the demo provider.
	Export bool
	// RequiredScope is the sidecar's Options.RequiredScope.
	RequiredScope string
}

// Stack is the running broker core.
type Stack struct {
	tb        testing.TB
	IdP       *devidp.IdP
	Demo      *demoprovider.Provider
	DemoURL   string
	Store     *memstore.Store
	Grants    *binding.Service
	Providers *oauthflow.Registry
	Caller    *oauthflow.Caller
	MCP       *mcpapi.Server
	Sidecar   *sidecar.Server
	URL       string // the sidecar listener
	Secret    string
	Logs      *SyncBuffer
	// Telemetry is the sidecar's Auditor; its audit log goes to AuditLog.
	Telemetry *telemetry.Recorder
	AuditLog  *SyncBuffer

	mu     sync.Mutex // guards tokens
	tokens []string
}

// SyncBuffer collects log output from concurrent handlers.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

const demoSecret = "demo-client-secret-value-0123"

// Start builds and starts the stack; everything stops at test cleanup.
func Start(tb testing.TB, o Options) *Stack {
	tb.Helper()
	s := &Stack{tb: tb, Logs: &SyncBuffer{}, AuditLog: &SyncBuffer{}, Secret: "sidecar-secret-0123456789abcdef"}
	log := slog.New(slog.NewTextHandler(s.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s.IdP = devidptest.Start(tb, nil, nil)
	mux := http.NewServeMux()
	demoSrv := httptest.NewServer(mux)
	tb.Cleanup(demoSrv.Close)
	var err error
	s.Demo, err = demoprovider.New(demoprovider.Options{BaseURL: demoSrv.URL + "/demo", ClientID: "demo-client",
		ClientSecret: demoSecret, RedirectURIs: []string{redirectURI}})
	if err != nil {
		tb.Fatal(err)
	}
	mux.Handle("/demo/", s.Demo.Handler())
	s.DemoURL = demoSrv.URL + "/demo"
	export := ""
	if o.Export {
		export = "    sidecar_token_export: true\n"
	}
	doc := `providers:
  demo:
    display_name: Demo
    type: oauth2
    authorization_url: ` + s.DemoURL + `/authorize
    token_url: ` + s.DemoURL + `/token
    client_id: demo-client
    client_secret: ${DEMO_SECRET}
    default_scopes: [profile]
    allowed_scopes: [profile, repos]
    account: {url: ` + s.DemoURL + `/api/user, id_field: id, login_field: login}
    api: {base_url: ` + s.DemoURL + `/api}
    revocation: {style: rfc7009, url: ` + s.DemoURL + `/revoke}
` + export
	s.Providers, err = oauthflow.ParseProviders("test", []byte(doc), func(string) string { return demoSecret })
	if err != nil {
		tb.Fatal(err)
	}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		tb.Fatal(err)
	}
	s.Store = memstore.New(kr)
	s.Grants = binding.New(s.Store, binding.Options{})
	verify, err := mcpapi.NewTokenVerifier(s.IdP.Issuer(), []string{Audience}, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	s.Caller, err = oauthflow.NewCaller(oauthflow.CallerOptions{Store: s.Store, Providers: s.Providers,
		Logger: log.With("component", "caller"), RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	s.MCP, err = mcpapi.New(context.Background(), mcpapi.Options{
		PublicURL: PublicURL, Verifier: verify, Store: s.Store, Grants: s.Grants, Catalog: catalog{s.Providers},
		StateKeys: kr.Derive("requestState"), Provider: s.Caller, Logger: log.With("component", "mcpapi"),
	})
	if err != nil {
		tb.Fatal(err)
	}
	s.Telemetry = telemetry.New(telemetry.Options{Providers: s.Providers.Names(),
		Audit: slog.New(slog.NewTextHandler(s.AuditLog, nil))})
	s.Sidecar, err = sidecar.New(sidecar.Options{
		Secret: vault.Secret(s.Secret), Verify: verify, Broker: s.MCP, Caller: s.Caller,
		Store: s.Store, Providers: s.Providers, Logger: log.With("component", "sidecar"),
		RequiredScope: o.RequiredScope, Audit: s.Telemetry,
	})
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(s.Sidecar)
	tb.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// catalog presents the registry to mcpapi.
type catalog struct{ r *oauthflow.Registry }

func (c catalog) Provider(name string) (mcpapi.ProviderInfo, bool) {
	p, ok := c.r.Lookup(name)
	if !ok {
		return mcpapi.ProviderInfo{}, false
	}
	return mcpapi.ProviderInfo{Name: p.Name, DisplayName: p.DisplayName, DefaultScopes: p.DefaultScopes, AllowedScopes: p.AllowedScopes}, true
}

func (c catalog) ProviderNames() []string { return c.r.Names() }

// UserToken mints an access token for a development user (alice, bob) with
// audience aud (Audience when "").
func (s *Stack) UserToken(user, aud string) string {
	s.tb.Helper()
	return s.UserTokenWithScopes(user, aud, nil)
}

// UserTokenWithScopes is UserToken with a scope claim.
func (s *Stack) UserTokenWithScopes(user, aud string, scopes []string) string {
	s.tb.Helper()
	if aud == "" {
		aud = Audience
	}
	tok, _, err := s.IdP.MintAccessToken(user, aud, scopes, time.Hour)
	if err != nil {
		s.tb.Fatal(err)
	}
	return tok
}

// Principal is the principal of a development user's tokens.
func (s *Stack) Principal(user string) vault.Principal {
	return vault.Principal{Issuer: s.IdP.Issuer(), Subject: user}
}

// ProviderTokens returns every demo provider token value issued so far
// (they must never appear in answers or logs).
func (s *Stack) ProviderTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tokens...)
}

var requestRE = regexp.MustCompile(`name="request" value="([^"]+)"`)

// Authorize runs the demo provider's consent for account (1001 alice-demo,
// 1002 bob-demo) the way a browser would and returns the tokens.
func (s *Stack) Authorize(accountID string, scopes []string) *oauth2.Token {
	s.tb.Helper()
	conf := oauth2.Config{ClientID: "demo-client", ClientSecret: demoSecret, RedirectURL: redirectURI, Scopes: scopes,
		Endpoint: oauth2.Endpoint{AuthURL: s.DemoURL + "/authorize", TokenURL: s.DemoURL + "/token", AuthStyle: oauth2.AuthStyleInHeader}}
	verifier := oauth2.GenerateVerifier()
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Get(conf.AuthCodeURL("st", oauth2.S256ChallengeOption(verifier)))
	if err != nil {
		s.tb.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := requestRE.FindSubmatch(page)
	if m == nil {
		s.tb.Fatalf("demo consent page without request id: %s", page)
	}
	resp, err = hc.PostForm(s.DemoURL+"/authorize", url.Values{"request": {string(m[1])}, "account": {accountID}, "decision": {"approve"}})
	if err != nil {
		s.tb.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		s.tb.Fatalf("demo consent: no code in %q", resp.Header.Get("Location"))
	}
	tok, err := conf.Exchange(context.Background(), loc.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		s.tb.Fatal(err)
	}
	s.mu.Lock()
	s.tokens = append(s.tokens, tok.AccessToken, tok.RefreshToken)
	s.mu.Unlock()
	return tok
}

// CompleteConnect completes the connect link as user would in the
// browser: approve the grant, authorize demo account accountID, store the
// connection (updating an existing one of the same account) and complete
// the grant.
func (s *Stack) CompleteConnect(link, user, accountID string) vault.Connection {
	s.tb.Helper()
	ctx := context.Background()
	id, ok := strings.CutPrefix(link, PublicURL+"/connect/")
	if !ok {
		s.tb.Fatalf("connect link %q is not under %s/connect/", link, PublicURL)
	}
	p := s.Principal(user)
	g, err := s.Grants.Approve(ctx, id, p)
	if err != nil {
		s.tb.Fatalf("approve: %v", err)
	}
	tok := s.Authorize(accountID, g.Scopes)
	login := map[string]string{"1001": "alice-demo", "1002": "bob-demo"}[accountID]
	ts := vault.TokenSet{AccessToken: vault.Secret(tok.AccessToken), RefreshToken: vault.Secret(tok.RefreshToken), TokenType: tok.Type(), Expiry: tok.Expiry}
	now := time.Now()
	var conn vault.Connection
	existing, _ := s.Store.ListConnections(ctx, p)
	for _, c := range existing {
		if c.Provider == "demo" && c.AccountID == accountID {
			conn, err = s.Store.UpdateConnection(ctx, c.ID, func(old vault.Connection) (vault.Connection, error) {
				old.Token, old.Status, old.Updated = ts, vault.StatusActive, now
				return old, nil
			})
		}
	}
	if conn.ID == "" {
		conn, err = s.Store.CreateConnection(ctx, vault.Connection{ID: "conn_" + binding.NewID(), Principal: p, Provider: "demo",
			AccountID: accountID, AccountLogin: login, Scopes: g.Scopes, Token: ts, Status: vault.StatusActive, Created: now, Updated: now})
	}
	if err != nil {
		s.tb.Fatalf("store connection: %v", err)
	}
	if _, err := s.Grants.Complete(ctx, id, p, conn.ID); err != nil {
		s.tb.Fatalf("complete: %v", err)
	}
	return conn
}

// CheckNoTokens fails the test if any provider token issued so far appears in text.
func (s *Stack) CheckNoTokens(where, text string) {
	s.tb.Helper()
	for _, t := range s.ProviderTokens() {
		if t != "" && strings.Contains(text, t) {
			s.tb.Errorf("%s contains a provider token", where)
		}
	}
}

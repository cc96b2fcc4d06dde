// Package sidecartest starts a complete broker core for tests of the
// sidecar API and of servers built on it: a development IdP (real JWTs),
// the demo provider (rotating refresh tokens, event log), an encrypted
// in-memory store, the provider client, the connections layer and the
// sidecar API, all on loopback. Every exchange with the sidecar is checked
// against the API's OpenAPI document (docs/sidecar.openapi.yaml, see
// Contract), so every test that uses the stack also tests the contract.
package sidecartest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/oauth2"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/demoprovider"
	"credbroker/internal/demoprovider/demotest"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/logbuf"
	"credbroker/internal/logredact"
	"credbroker/internal/telemetry"
	"credbroker/provider"
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
	// RequiredScope is the scope user tokens for Audience must carry.
	RequiredScope string
	// ExtraProviders are more providers.yaml entries (indented two spaces,
	// under providers:), e.g. one whose API is a test server.
	ExtraProviders string
	// Callers replace the default single caller: the unnamed server
	// (vault.UnnamedServer) with Stack.Secret.
	Callers []sidecar.Caller
	// Audiences replace the default policy: Audience with RequiredScope.
	Audiences []sidecar.Audience
	// DemoKeys also configures the demo provider's API-key service as
	// "demo-keys" (type api_key, X-Api-Key), as broker dev does.
	DemoKeys bool
	// Tracing traces the sidecar and the provider client (nil: off).
	Tracing trace.TracerProvider
}

// Stack is the running broker core. Its catalogue has the demo provider
// and a second one, notes (the same demo endpoints under another name).
type Stack struct {
	tb        testing.TB
	IdP       *devidp.IdP
	Demo      *demoprovider.Provider
	DemoURL   string
	Store     *memstore.Store
	Grants    *binding.Service
	Providers *provider.Registry
	Client    *provider.Client
	Conns     *connections.Service
	Sidecar   *sidecar.Server
	URL       string // the sidecar listener
	// Contract checks every exchange with the sidecar against the
	// OpenAPI document; a mismatch fails the test.
	Contract *Contract
	Secret   string
	Logs     *logbuf.Buffer
	// Telemetry records the connections layer's audit events in AuditLog.
	Telemetry *telemetry.Recorder
	AuditLog  *logbuf.Buffer

	mu     sync.Mutex // guards tokens
	tokens []string
}

const demoSecret = "demo-client-secret-value-0123"

// Start builds and starts the stack; everything stops at test cleanup.
func Start(tb testing.TB, o Options) *Stack {
	tb.Helper()
	s := &Stack{tb: tb, Logs: &logbuf.Buffer{}, AuditLog: &logbuf.Buffer{}, Secret: "sidecar-secret-0123456789abcdef"}
	// The logs pass the redacting handler, as the broker's own do.
	log := slog.New(logredact.New(slog.NewTextHandler(s.Logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
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
	doc := "providers:\n" +
		demoOAuth("demo", "Demo", s.DemoURL, `    default_scopes: [profile]
    allowed_scopes: [profile, repos]
    revocation: {style: rfc7009, url: `+s.DemoURL+`/revoke}
`+export) +
		demoOAuth("notes", "Notes", s.DemoURL, "") +
		o.ExtraProviders
	if o.DemoKeys {
		doc += `  demo-keys:
    display_name: Demo keys
    type: api_key
    instructions: Copy your demo account's key from the demo provider's key page.
    instructions_url: ` + s.Demo.KeysURL() + `
    fields: [{name: api_key, label: API key, secret: true, pattern: '` + demoprovider.KeyPattern + `'}]
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {path: /me, account_id: /id, account_login: /login}
    api: {base_url: ` + s.Demo.KeysAPIBase() + `}
`
	}
	s.Providers, err = provider.ParseProviders("test", []byte(doc), func(string) string { return demoSecret })
	if err != nil {
		tb.Fatal(err)
	}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		tb.Fatal(err)
	}
	s.Store = memstore.New(kr)
	s.Grants = binding.New(s.Store, binding.Options{})
	callers := o.Callers
	if len(callers) == 0 {
		callers = []sidecar.Caller{{Name: vault.UnnamedServer, Secret: vault.Secret(s.Secret)}}
	}
	auds := o.Audiences
	if len(auds) == 0 {
		auds = []sidecar.Audience{{URI: Audience, RequiredScope: o.RequiredScope}}
	}
	var uris, names []string
	for _, a := range auds {
		uris = append(uris, a.URI)
	}
	for _, c := range callers {
		names = append(names, c.Name)
	}
	verify, err := bearer.NewJWTVerifier(s.IdP.Issuer(), uris, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	s.Telemetry = telemetry.New(telemetry.Options{Providers: s.Providers.Names(), SidecarServers: names,
		Audit: slog.New(slog.NewTextHandler(s.AuditLog, nil))})
	s.Client, err = provider.New(provider.Options{Store: s.Store, Providers: s.Providers,
		Logger: log.With("component", "provider"), RetryBackoff: 10 * time.Millisecond, Telemetry: s.Telemetry,
		Tracing: o.Tracing})
	if err != nil {
		tb.Fatal(err)
	}
	s.Conns, err = connections.New(connections.Options{Store: s.Store, Grants: s.Grants, Client: s.Client,
		PublicURL: PublicURL, Telemetry: s.Telemetry, Logger: log.With("component", "connections")})
	if err != nil {
		tb.Fatal(err)
	}
	s.Sidecar, err = sidecar.New(sidecar.Options{
		Callers: callers, Verify: verify, Audiences: auds, Connections: s.Conns,
		StateKeys: kr.Derive("requestState"), Logger: log.With("component", "sidecar"),
		Telemetry: s.Telemetry, Tracing: o.Tracing,
	})
	if err != nil {
		tb.Fatal(err)
	}
	// Every exchange is checked against docs/sidecar.openapi.yaml.
	s.Contract = NewContract(tb)
	srv := httptest.NewServer(s.Contract.Handler(s.Sidecar))
	tb.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

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

// demoOAuth is the providers: entry of an oauth2 provider called name on
// the demo provider at demoURL, with the lines of extra (indented as an
// entry's fields) added.
func demoOAuth(name, display, demoURL, extra string) string {
	return `  ` + name + `:
    display_name: ` + display + `
    type: oauth2
    authorization_url: ` + demoURL + `/authorize
    token_url: ` + demoURL + `/token
    client_id: demo-client
    client_secret: ${DEMO_SECRET}
    account: {url: ` + demoURL + `/api/user, id_field: id, login_field: login}
    api: {base_url: ` + demoURL + `/api}
` + extra
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

// Authorize runs the demo provider's consent for account (1001 alice-demo,
// 1002 bob-demo) the way a browser would and returns the tokens.
func (s *Stack) Authorize(accountID string, scopes []string) *oauth2.Token {
	s.tb.Helper()
	tok := demotest.Client{AuthURL: s.DemoURL + "/authorize", TokenURL: s.DemoURL + "/token", ClientID: "demo-client",
		ClientSecret: demoSecret, RedirectURL: redirectURI}.CodeFlow(s.tb, accountID, scopes)
	s.mu.Lock()
	s.tokens = append(s.tokens, tok.AccessToken, tok.RefreshToken)
	s.mu.Unlock()
	return tok
}

// CompleteConnect completes the connect link as user would in the
// browser: check the grant is theirs (the consent form writes nothing),
// authorize demo account accountID, and save the result through the
// connections layer (which updates an existing connection of the same
// account, and approves and completes the grant).
func (s *Stack) CompleteConnect(link, user, accountID string) vault.Connection {
	s.tb.Helper()
	return s.CompleteConnectGranting(link, user, accountID, nil)
}

// CompleteConnectGranting is CompleteConnect where the person grants only
// the scopes granted (nil: every scope the link asks for), as on a
// granular consent screen.
func (s *Stack) CompleteConnectGranting(link, user, accountID string, granted []string) vault.Connection {
	s.tb.Helper()
	ctx := context.Background()
	p, g := s.openLink(ctx, link, user)
	if granted == nil {
		granted = g.Scopes
	}
	tok := s.Authorize(accountID, granted)
	login := map[string]string{"1001": "alice-demo", "1002": "bob-demo"}[accountID]
	demo, _ := s.Providers.Lookup("demo")
	return s.save(ctx, p, g, demo, provider.Exchanged{Account: provider.Account{ID: accountID, Login: login},
		Scopes: granted, Token: provider.TokenSet(tok)})
}

// CompleteKeyConnect completes the connect link of a demo-keys request as
// user would on the key entry page: check the grant is theirs, verify the
// demo account login's current key at the demo provider, and save it
// through the connections layer.
func (s *Stack) CompleteKeyConnect(link, user, login string) vault.Connection {
	s.tb.Helper()
	ctx := context.Background()
	p, g := s.openLink(ctx, link, user)
	keys, _ := s.Providers.Lookup("demo-keys")
	key := s.Demo.APIKey(login)
	s.mu.Lock()
	s.tokens = append(s.tokens, key)
	s.mu.Unlock()
	ex, err := s.Client.VerifyKey(ctx, keys, map[string]string{"api_key": key})
	if err != nil {
		s.tb.Fatalf("verify key: %v", err)
	}
	return s.save(ctx, p, g, keys, ex)
}

// openLink checks, as the connect page does, that the grant behind link
// is user's, and returns the user's principal and the grant.
func (s *Stack) openLink(ctx context.Context, link, user string) (vault.Principal, vault.Grant) {
	s.tb.Helper()
	id, ok := strings.CutPrefix(link, PublicURL+"/connect/")
	if !ok {
		s.tb.Fatalf("connect link %q is not under %s/connect/", link, PublicURL)
	}
	p := s.Principal(user)
	g, err := s.Grants.Authorize(ctx, id, p)
	if err != nil {
		s.tb.Fatalf("authorize: %v", err)
	}
	return p, g
}

// save stores what the provider answered through the connections layer.
func (s *Stack) save(ctx context.Context, p vault.Principal, g vault.Grant, prov *provider.Provider, ex provider.Exchanged) vault.Connection {
	s.tb.Helper()
	conn, err := s.Conns.Save(ctx, p, g, prov, ex)
	if err != nil {
		s.tb.Fatalf("store connection: %v", err)
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

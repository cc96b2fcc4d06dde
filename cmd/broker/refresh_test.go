package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/oauth2"

	"credbroker/internal/demoprovider"
	"credbroker/internal/demoprovider/demotest"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// demoBroker is an in-process broker (mount) with the dev IdP, the demo
// provider on its own loopback server, a memstore and telemetry.
type demoBroker struct {
	srv      *httptest.Server
	idp      *devidp.IdP
	demo     *demoprovider.Provider
	store    *memstore.Store
	logs     *logbuf.Buffer
	redirect string
}

func startDemoBroker(t *testing.T, ctx context.Context) *demoBroker {
	t.Helper()
	return startDemoBrokerTraced(t, ctx, nil)
}

// startDemoBrokerTraced is startDemoBroker with tracing to tp (nil: off).
func startDemoBrokerTraced(t *testing.T, ctx context.Context, tp trace.TracerProvider) *demoBroker {
	t.Helper()
	b := &demoBroker{idp: devidptest.Start(t, nil, nil), logs: &logbuf.Buffer{}}
	pmux := http.NewServeMux()
	psrv := httptest.NewServer(pmux)
	t.Cleanup(psrv.Close)
	mux := http.NewServeMux()
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	b.redirect = b.srv.URL + "/oauth/demo/callback"
	var err error
	b.demo, err = demoprovider.New(demoprovider.Options{
		BaseURL: psrv.URL + devProviderPath, ClientID: devDemoClientID, ClientSecret: "demo-secret",
		RedirectURIs: []string{b.redirect},
	})
	if err != nil {
		t.Fatal(err)
	}
	pmux.Handle(devProviderPath+"/", b.demo.Handler())
	if err := b.idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret", RedirectURIs: []string{b.srv.URL + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	providers, err := provider.ParseProviders("test providers",
		[]byte(devProviders(psrv.URL)),
		func(string) string { return "demo-secret" })
	if err != nil {
		t.Fatal(err)
	}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	b.store = memstore.New(kr)
	log := newLogger(b.logs, "json", slog.LevelDebug)
	rec := telemetry.New(telemetry.Options{Providers: providers.Names(), Audit: log})
	if _, err := mount(ctx, mux, brokerDeps{
		PublicURL: b.srv.URL, Resource: b.srv.URL + "/mcp", Issuer: b.idp.Issuer(),
		ClientID: devClientID, ClientSecret: "idp-secret", DevMode: true,
		GrantTTL: 10 * time.Minute, StateTTL: 10 * time.Minute,
		Store: b.store, Keys: kr, Providers: providers,
		Logger: log, HTTPClient: outboundClient(),
		Telemetry: rec, MetricsOnMain: true, Tracing: tp,
	}); err != nil {
		t.Fatal(err)
	}
	return b
}

// connectAlice stores alice's demo connection from a real code flow, its
// access token already expired.
func (b *demoBroker) connectAlice(t *testing.T, ctx context.Context) *oauth2.Token {
	t.Helper()
	tok := demoCodeFlow(t, b.demo, b.redirect)
	if _, err := b.store.CreateConnection(ctx, vault.Connection{
		ID: "conn-alice-demo", Principal: vault.Principal{Issuer: b.idp.Issuer(), Subject: "alice"},
		Provider: "demo", AccountID: "1001", AccountLogin: "alice-demo", Scopes: []string{"profile"},
		Status: vault.StatusActive, Created: time.Now(), Updated: time.Now(),
		Token: vault.TokenSet{AccessToken: vault.Secret(tok.AccessToken), RefreshToken: vault.Secret(tok.RefreshToken),
			TokenType: "Bearer", Expiry: time.Now().Add(-time.Minute)},
	}); err != nil {
		t.Fatal(err)
	}
	return tok
}

func (b *demoBroker) bearer(t *testing.T, user string) string {
	t.Helper()
	tok, _, err := b.idp.MintAccessToken(user, b.srv.URL+"/mcp", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestConcurrentProviderRequestsRefreshOnce is issue 6's refresh property
// through the whole MCP endpoint: 100 concurrent provider_request calls on a
// connection whose access token has expired reach the rotating demo
// provider with exactly one refresh, all succeed, every API call uses the
// refreshed token, and no token appears in any answer or log line.
func TestConcurrentProviderRequestsRefreshOnce(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	b := startDemoBroker(t, ctx)
	srv, demo, store, logs := b.srv, b.demo, b.store, b.logs
	tok := b.connectAlice(t, ctx)
	bearer := b.bearer(t, "alice")

	const n = 100
	answers := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = providerRequest(t, srv.URL, bearer, i) })
	}
	wg.Wait()
	for i, a := range answers {
		if !strings.Contains(a, `"status":200`) || !strings.Contains(a, `alice-demo`) {
			t.Fatalf("call %d answered %s", i, a)
		}
	}

	var refreshes, apiCalls int
	var refreshSeq int
	var newToken string
	events := demo.Events()
	for _, e := range events {
		if e.Kind == "token" && e.GrantType == "refresh_token" {
			refreshes++
			refreshSeq, newToken = e.Seq, e.Token
		}
	}
	for _, e := range events {
		if e.Kind == "api" {
			apiCalls++
			if e.Seq < refreshSeq || e.Token != newToken {
				t.Errorf("API call #%d came before the refresh #%d or used another token", e.Seq, refreshSeq)
			}
		}
	}
	if refreshes != 1 || apiCalls != n {
		t.Fatalf("%d refreshes and %d API calls reached the provider, want 1 and %d", refreshes, apiCalls, n)
	}
	// The rotated pair is what the store holds now.
	c, err := store.GetConnection(ctx, "conn-alice-demo")
	if err != nil {
		t.Fatal(err)
	}
	if c.Token.RefreshToken.Reveal() == tok.RefreshToken || demoprovider.Fingerprint(c.Token.AccessToken.Reveal()) != newToken {
		t.Fatal("the store does not hold the rotated tokens")
	}
	// The metrics saw the same: one refresh, 100 provider calls.
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`credbroker_token_refreshes_total{outcome="ok",provider="demo"} 1`,
		`credbroker_provider_requests_total{provider="demo",status="200"} 100`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// No token in any answer or log line: the original pair and the new one.
	secrets := []string{tok.AccessToken, tok.RefreshToken, c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal(), bearer}
	all := strings.Join(answers, "\n") + logs.String()
	for _, s := range secrets {
		if strings.Contains(all, s) {
			t.Fatalf("a token value appears in an answer or log line")
		}
	}
}

// providerRequest sends one 2026-07-28 tools/call provider_request.
func providerRequest(t *testing.T, base, bearer string, id int) string {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"provider_request",
		"arguments":{"provider":"demo","method":"GET","path":"/user"},
		"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, id)
	req, _ := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
	for k, v := range map[string]string{
		"Authorization": "Bearer " + bearer, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
		"Mcp-Method": "tools/call", "Mcp-Name": "provider_request",
	} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var compact bytes.Buffer
	if json.Compact(&compact, b) != nil {
		return string(b)
	}
	return compact.String()
}

// demoCodeFlow runs the authorization code flow at the demo provider as a
// browser would (consent form posted) and exchanges the code.
func demoCodeFlow(t *testing.T, demo *demoprovider.Provider, redirect string) *oauth2.Token {
	t.Helper()
	return demotest.Client{AuthURL: demo.AuthURL(), TokenURL: demo.TokenURL(), ClientID: devDemoClientID,
		ClientSecret: "demo-secret", RedirectURL: redirect}.CodeFlow(t, "1001", []string{"profile"})
}

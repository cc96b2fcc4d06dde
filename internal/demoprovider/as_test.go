package demoprovider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"credbroker/internal/demoprovider"
)

// asEnv is the provider as the authorization server of one resource,
// mounted with Mount under /dev/provider.
type asEnv struct {
	p        *demoprovider.Provider
	base     string
	resource string
	clock    *clock
}

const dcrCallback = "http://127.0.0.1:1/callback" // never dialled

func startAS(t *testing.T) asEnv {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	resource := srv.URL + "/dev/mcp-upstream"
	p, err := demoprovider.New(demoprovider.Options{
		BaseURL: srv.URL + "/dev/provider", ClientID: "broker", ClientSecret: "demo-secret",
		RedirectURIs: []string{callback}, Now: clk.Now, Resources: []string{resource},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.Mount(mux)
	return asEnv{p: p, base: srv.URL + "/dev/provider", resource: resource, clock: clk}
}

// register posts client metadata and returns the answer's status and body.
func (e asEnv) register(t *testing.T, meta any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(meta)
	resp, err := http.Post(e.p.RegisterURL(), "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// registered registers a client with method and grants and returns its
// oauth2 configuration (redirect dcrCallback).
func (e asEnv) registered(t *testing.T, method string, grants ...string) oauth2.Config {
	t.Helper()
	status, out := e.register(t, map[string]any{"redirect_uris": []string{dcrCallback}, "token_endpoint_auth_method": method,
		"grant_types": grants, "client_name": "Test <host>"})
	if status != http.StatusCreated {
		t.Fatalf("register: %d %v", status, out)
	}
	secret, _ := out["client_secret"].(string)
	if (method == "none") != (secret == "") {
		t.Fatalf("%s client: secret %q", method, secret)
	}
	style := oauth2.AuthStyleInHeader
	if method != "client_secret_basic" {
		style = oauth2.AuthStyleInParams
	}
	return oauth2.Config{ClientID: out["client_id"].(string), ClientSecret: secret, RedirectURL: dcrCallback, Scopes: []string{"notes:read"},
		Endpoint: oauth2.Endpoint{AuthURL: e.p.AuthURL(), TokenURL: e.p.TokenURL(), AuthStyle: style}}
}

// approve opens authURL's consent page, approves as alice and returns the
// redirect's query (or fails when there is no consent page).
func approve(t *testing.T, authURL string) url.Values {
	t.Helper()
	resp, err := noFollow.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if loc != nil && loc.Query().Get("error") != "" {
			return loc.Query()
		}
		t.Fatalf("authorize: %d %s", resp.StatusCode, body)
	}
	m := requestField.FindStringSubmatch(string(body))
	u, _ := url.Parse(authURL)
	u.RawQuery = ""
	resp, err = noFollow.PostForm(u.String(), url.Values{"request": {m[1]}, "decision": {"approve"}, "account": {"1001"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.StatusCode != http.StatusFound {
		t.Fatalf("decision: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc.Query()
}

func withResource(r string) oauth2.AuthCodeOption { return oauth2.SetAuthURLParam("resource", r) }

// TestMetadata: the RFC 8414 document sits at the issuer's path-inserted
// well-known URL and passes the go-sdk's discovery (issuer, PKCE).
func TestMetadata(t *testing.T) {
	e := startAS(t)
	if !strings.HasSuffix(e.p.MetadataURL(), "/.well-known/oauth-authorization-server/dev/provider") {
		t.Fatalf("metadata URL %s", e.p.MetadataURL())
	}
	asm, err := auth.GetAuthServerMetadata(context.Background(), e.p.Issuer(), nil)
	if err != nil || asm == nil {
		t.Fatalf("discovery: %v, %v", asm, err)
	}
	want := oauthex.AuthServerMeta{Issuer: e.base, AuthorizationEndpoint: e.base + "/authorize", TokenEndpoint: e.base + "/token",
		RegistrationEndpoint: e.base + "/register", RevocationEndpoint: e.base + "/revoke"}
	if asm.Issuer != want.Issuer || asm.AuthorizationEndpoint != want.AuthorizationEndpoint || asm.TokenEndpoint != want.TokenEndpoint ||
		asm.RegistrationEndpoint != want.RegistrationEndpoint || asm.RevocationEndpoint != want.RevocationEndpoint {
		t.Fatalf("metadata %+v", asm)
	}
	if !slices.Equal(asm.CodeChallengeMethodsSupported, []string{"S256"}) || !asm.AuthorizationResponseIssParameterSupported ||
		!slices.Contains(asm.TokenEndpointAuthMethodsSupported, "none") || asm.ClientIDMetadataDocumentSupported {
		t.Fatalf("metadata %+v", asm)
	}
	// This server signs nothing: the document names no key set (not even
	// an empty jwks_uri, which the go-sdk's type would write).
	resp, err := http.Get(e.p.MetadataURL())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if jwks, ok := doc["jwks_uri"]; ok {
		t.Errorf("metadata has jwks_uri %s", jwks)
	}
}

// TestDynamicRegistration: public and confidential clients register, go
// through the code flow with PKCE and a resource, refresh with rotation,
// and authenticate only the way they registered.
func TestDynamicRegistration(t *testing.T) {
	e := startAS(t)
	ctx := context.Background()
	for _, method := range []string{"none", "client_secret_basic", "client_secret_post"} {
		t.Run(method, func(t *testing.T) {
			conf := e.registered(t, method, "authorization_code", "refresh_token")
			v := oauth2.GenerateVerifier()
			q := approve(t, conf.AuthCodeURL("st", oauth2.S256ChallengeOption(v), withResource(e.resource)))
			if q.Get("iss") != e.p.Issuer() || q.Get("state") != "st" || q.Get("code") == "" {
				t.Fatalf("authorization response %v", q)
			}
			tok, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v), withResource(e.resource))
			if err != nil {
				t.Fatal(err)
			}
			in, ok := e.p.Introspect(tok.AccessToken)
			if !ok || in.Resource != e.resource || in.ClientID != conf.ClientID || in.Account.Login != "alice-demo" || !slices.Equal(in.Scopes, []string{"notes:read"}) {
				t.Fatalf("introspection %+v, %v", in, ok)
			}
			next, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
			if err != nil || next.RefreshToken == tok.RefreshToken || next.RefreshToken == "" {
				t.Fatalf("refresh: %v %+v", err, next)
			}
			if in, _ := e.p.Introspect(next.AccessToken); in.Resource != e.resource {
				t.Fatalf("the refreshed token is bound to %q", in.Resource)
			}

			// Another authentication method than the registered one is refused.
			other := conf
			switch method {
			case "none":
				other.ClientSecret = "made-up"
			case "client_secret_basic":
				other.Endpoint.AuthStyle = oauth2.AuthStyleInParams
			case "client_secret_post":
				other.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
			}
			if _, err := other.TokenSource(ctx, &oauth2.Token{RefreshToken: next.RefreshToken}).Token(); oauthErr(t, err) != "invalid_client" {
				t.Fatal("authenticated another way than registered")
			}
			if method != "none" {
				wrong := conf
				wrong.ClientSecret = "wrong"
				if _, err := wrong.TokenSource(ctx, &oauth2.Token{RefreshToken: next.RefreshToken}).Token(); oauthErr(t, err) != "invalid_client" {
					t.Fatal("a wrong secret was accepted")
				}
			}
		})
	}
}

// TestRedirectURIsMatchedExactly: a registered client's redirect URI is
// compared as a whole string; anything else gets an error page and no
// redirect.
func TestRedirectURIsMatchedExactly(t *testing.T) {
	e := startAS(t)
	conf := e.registered(t, "none")
	for _, r := range []string{"http://127.0.0.1:2/callback", "http://127.0.0.1:1/callback/x", "http://127.0.0.1:1/callback?x=1",
		"http://localhost:1/callback", "HTTP://127.0.0.1:1/callback", callback} {
		c := conf
		c.RedirectURL = r
		resp, err := noFollow.Get(c.AuthCodeURL("s", oauth2.S256ChallengeOption(oauth2.GenerateVerifier())))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Location") != "" {
			t.Fatalf("%s: %d %q", r, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
}

func TestRegistrationRefusals(t *testing.T) {
	e := startAS(t)
	tests := []struct {
		name string
		meta any
		want string
	}{
		{"no redirect URIs", map[string]any{"client_name": "x"}, "invalid_redirect_uri"},
		{"relative redirect", map[string]any{"redirect_uris": []string{"/cb"}}, "invalid_redirect_uri"},
		{"http off loopback", map[string]any{"redirect_uris": []string{"http://example.com/cb"}}, "invalid_redirect_uri"},
		{"fragment", map[string]any{"redirect_uris": []string{"https://example.com/cb#x"}}, "invalid_redirect_uri"},
		{"javascript", map[string]any{"redirect_uris": []string{"javascript:alert(1)"}}, "invalid_redirect_uri"},
		{"user info", map[string]any{"redirect_uris": []string{"https://u:p@example.com/cb"}}, "invalid_redirect_uri"},
		{"unknown auth method", map[string]any{"redirect_uris": []string{dcrCallback}, "token_endpoint_auth_method": "private_key_jwt"}, "invalid_client_metadata"},
		{"implicit grant", map[string]any{"redirect_uris": []string{dcrCallback}, "grant_types": []string{"implicit"}}, "invalid_client_metadata"},
		{"refresh only", map[string]any{"redirect_uris": []string{dcrCallback}, "grant_types": []string{"refresh_token"}}, "invalid_client_metadata"},
		{"token response type", map[string]any{"redirect_uris": []string{dcrCallback}, "response_types": []string{"token"}}, "invalid_client_metadata"},
		{"long name", map[string]any{"redirect_uris": []string{dcrCallback}, "client_name": strings.Repeat("n", 201)}, "invalid_client_metadata"},
		{"not an object", []string{"x"}, "invalid_client_metadata"},
		{"wrong type", map[string]any{"redirect_uris": "https://example.com/cb"}, "invalid_client_metadata"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, out := e.register(t, tc.meta)
			if status != http.StatusBadRequest || out["error"] != tc.want || out["client_id"] != nil {
				t.Fatalf("%d %v", status, out)
			}
		})
	}
	resp, err := http.Post(e.p.RegisterURL(), "application/x-www-form-urlencoded", strings.NewReader("redirect_uris="+dcrCallback))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("form body: %d", resp.StatusCode)
	}
	for _, ev := range e.p.Events() {
		if ev.Kind == "register" && (ev.Client != "" || ev.Error == "") {
			t.Fatalf("a refused registration left a client: %+v", ev)
		}
	}
}

// TestResourceBinding: the grant is bound to the resource of the
// authorization request; a token request naming another is refused with
// invalid_target (a refused refresh spends nothing); the token is for that
// resource only.
func TestResourceBinding(t *testing.T) {
	e := startAS(t)
	ctx := context.Background()
	conf := e.registered(t, "client_secret_basic", "authorization_code", "refresh_token")
	code := func(opts ...oauth2.AuthCodeOption) (string, string) {
		v := oauth2.GenerateVerifier()
		q := approve(t, conf.AuthCodeURL("s", append(opts, oauth2.S256ChallengeOption(v))...))
		return q.Get("code"), v
	}
	other := "http://127.0.0.1:1/elsewhere"

	t.Run("authorize refuses an unknown resource", func(t *testing.T) {
		for _, opts := range [][]oauth2.AuthCodeOption{
			{withResource(other)},
			{withResource(e.resource + "#frag")},
			{withResource("relative/path")},
		} {
			q := approve(t, conf.AuthCodeURL("s", append(opts, oauth2.S256ChallengeOption(oauth2.GenerateVerifier()))...))
			if q.Get("error") != "invalid_target" || q.Get("code") != "" || q.Get("iss") != e.p.Issuer() {
				t.Fatalf("%v", q)
			}
		}
		// Two resources at once.
		u := conf.AuthCodeURL("s", oauth2.S256ChallengeOption(oauth2.GenerateVerifier()), withResource(e.resource)) + "&resource=" + url.QueryEscape(e.resource)
		if q := approve(t, u); q.Get("error") != "invalid_target" {
			t.Fatalf("two resources: %v", q)
		}
	})
	t.Run("code exchange with another resource", func(t *testing.T) {
		c, v := code(withResource(e.resource))
		if _, err := conf.Exchange(ctx, c, oauth2.VerifierOption(v), withResource(other)); oauthErr(t, err) != "invalid_target" {
			t.Fatal("accepted")
		}
		c, v = code() // no resource at authorize, one at the token endpoint
		if _, err := conf.Exchange(ctx, c, oauth2.VerifierOption(v), withResource(e.resource)); oauthErr(t, err) != "invalid_target" {
			t.Fatal("a resource was added at the token endpoint")
		}
	})
	t.Run("code exchange without resource keeps the grant's", func(t *testing.T) {
		c, v := code(withResource(e.resource))
		tok, err := conf.Exchange(ctx, c, oauth2.VerifierOption(v))
		if err != nil {
			t.Fatal(err)
		}
		if in, _ := e.p.Introspect(tok.AccessToken); in.Resource != e.resource {
			t.Fatalf("bound to %q", in.Resource)
		}
		// The demo API is another resource: it refuses the token.
		req, _ := http.NewRequest(http.MethodGet, e.p.APIBase()+"/user", nil)
		req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "another resource") {
			t.Fatalf("demo API: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	})
	t.Run("refresh with another resource spends nothing", func(t *testing.T) {
		c, v := code(withResource(e.resource))
		tok, err := conf.Exchange(ctx, c, oauth2.VerifierOption(v), withResource(e.resource))
		if err != nil {
			t.Fatal(err)
		}
		// x/oauth2 adds no parameters to a refresh: post it by hand.
		form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "resource": {other}}
		if _, err := postToken(ctx, conf, form); err == nil || !strings.Contains(err.Error(), "invalid_target") {
			t.Fatalf("another resource: %v", err)
		}
		form.Set("resource", e.resource)
		next, err := postToken(ctx, conf, form)
		if err != nil {
			t.Fatalf("the refused refresh spent the token: %v", err)
		}
		if in, _ := e.p.Introspect(next.AccessToken); in.Resource != e.resource {
			t.Fatalf("bound to %q", in.Resource)
		}
	})
	// The event log shows the resource of every leg.
	var legs []string
	for _, ev := range e.p.Events() {
		if (ev.Kind == "authorize" || ev.Kind == "token") && ev.Resource == e.resource && ev.Error == "" {
			legs = append(legs, ev.Kind+":"+ev.GrantType)
		}
	}
	if !slices.Contains(legs, "authorize:") || !slices.Contains(legs, "token:authorization_code") || !slices.Contains(legs, "token:refresh_token") {
		t.Fatalf("legs with the resource: %v", legs)
	}
}

// postToken posts form to conf's token endpoint with basic authentication
// and returns the tokens, or the error answer as an error.
func postToken(ctx context.Context, conf oauth2.Config, form url.Values) (*oauth2.Token, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, conf.Endpoint.TokenURL, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(conf.ClientID), url.QueryEscape(conf.ClientSecret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, &httpError{resp.StatusCode, string(b)}
	}
	var tok struct {
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
	}
	if err := json.Unmarshal(b, &tok); err != nil {
		return nil, err
	}
	return &oauth2.Token{AccessToken: tok.AccessToken, RefreshToken: tok.RefreshToken}, nil
}

type httpError struct {
	status int
	body   string
}

func (e *httpError) Error() string { return e.body }

// TestGrantsBoundToClient: a code, refresh token or revocation from
// another client than the one the grant was issued to changes nothing.
func TestGrantsBoundToClient(t *testing.T) {
	e := startAS(t)
	ctx := context.Background()
	a := e.registered(t, "client_secret_basic", "authorization_code", "refresh_token")
	b := e.registered(t, "client_secret_basic", "authorization_code", "refresh_token")
	v := oauth2.GenerateVerifier()
	q := approve(t, a.AuthCodeURL("s", oauth2.S256ChallengeOption(v)))
	if _, err := b.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v)); oauthErr(t, err) != "invalid_grant" {
		t.Fatal("b redeemed a's code")
	}
	q = approve(t, a.AuthCodeURL("s", oauth2.S256ChallengeOption(v)))
	tok, err := a.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); oauthErr(t, err) != "invalid_grant" {
		t.Fatal("b refreshed a's grant")
	}
	req, _ := http.NewRequest(http.MethodPost, e.p.RevokeURL(), strings.NewReader(url.Values{"token": {tok.AccessToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(b.ClientID, b.ClientSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("revocation by b: %d", resp.StatusCode)
	}
	if _, ok := e.p.Introspect(tok.AccessToken); !ok {
		t.Fatal("b revoked a's token")
	}
	if _, err := a.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); err != nil {
		t.Fatalf("a's grant after b's attempts: %v", err)
	}
}

// TestRefreshTokensOnlyForTheRefreshGrant: a client that did not register
// the refresh_token grant gets no refresh token, and may not use one.
func TestRefreshTokensOnlyForTheRefreshGrant(t *testing.T) {
	e := startAS(t)
	ctx := context.Background()
	conf := e.registered(t, "client_secret_basic")
	v := oauth2.GenerateVerifier()
	q := approve(t, conf.AuthCodeURL("s", oauth2.S256ChallengeOption(v)))
	tok, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v))
	if err != nil || tok.RefreshToken != "" {
		t.Fatalf("%v, refresh token %q", err, tok.RefreshToken)
	}
	if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: "x"}).Token(); oauthErr(t, err) != "unauthorized_client" {
		t.Fatal("refresh grant used")
	}
}

// TestStaticClientUnchanged: the static client keeps authenticating with
// basic or the form, and its authorization responses now carry iss.
func TestStaticClientUnchanged(t *testing.T) {
	e := start(t)
	for _, style := range []oauth2.AuthStyle{oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams} {
		e.cfg.Endpoint.AuthStyle = style
		v := oauth2.GenerateVerifier()
		q := e.consent(t, e.cfg.AuthCodeURL("st", oauth2.S256ChallengeOption(v)), "approve", "")
		if q.Get("iss") != e.p.Issuer() {
			t.Fatalf("iss %q", q.Get("iss"))
		}
		tok, err := e.cfg.Exchange(context.Background(), q.Get("code"), oauth2.VerifierOption(v))
		if err != nil || tok.RefreshToken == "" {
			t.Fatalf("style %v: %v", style, err)
		}
	}
	// A resource on the static client's authorization is refused when the
	// provider serves none.
	resp, err := noFollow.Get(e.cfg.AuthCodeURL("st", oauth2.S256ChallengeOption(oauth2.GenerateVerifier()), withResource("https://example.com/mcp")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || loc.Query().Get("error") != "invalid_target" {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

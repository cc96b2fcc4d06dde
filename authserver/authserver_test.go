package authserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/apps"
	"credbroker/internal/bearer"
	"credbroker/internal/clientaddr"
	"credbroker/internal/devidp/devidptest"
	"credbroker/vault"
	"credbroker/webhook"
)

func TestMetadata(t *testing.T) {
	for _, open := range []bool{true, false} {
		t.Run(fmt.Sprint("registration open ", open), func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.Registration = open; o.Scopes = []string{"broker"} })
			resp, err := http.Get(h.srv.URL + "/.well-known/oauth-authorization-server")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
			var m map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
				t.Fatal(err)
			}
			base := h.srv.URL
			want := map[string]any{
				"issuer": base, "authorization_endpoint": base + "/authorize", "token_endpoint": base + "/token",
				"revocation_endpoint": base + "/revoke", "jwks_uri": base + "/.well-known/jwks.json",
				"code_challenge_methods_supported":               []any{"S256"},
				"grant_types_supported":                          []any{"authorization_code", "refresh_token"},
				"response_types_supported":                       []any{"code"},
				"scopes_supported":                               []any{"broker", "offline_access"},
				"client_id_metadata_document_supported":          true,
				"authorization_response_iss_parameter_supported": true,
				"response_modes_supported":                       []any{"query"},
				"token_endpoint_auth_methods_supported":          []any{"none", "client_secret_basic", "client_secret_post"},
				"revocation_endpoint_auth_methods_supported":     []any{"none", "client_secret_basic", "client_secret_post"},
			}
			if open {
				want["registration_endpoint"] = base + "/register"
			}
			if len(m) != len(want) {
				t.Errorf("metadata %v: %d keys, want %d", m, len(m), len(want))
			}
			for k, v := range want {
				if fmt.Sprint(m[k]) != fmt.Sprint(v) {
					t.Errorf("%s = %v, want %v", k, m[k], v)
				}
			}
			if _, has := m["registration_endpoint"]; has != open {
				t.Errorf("registration_endpoint present: %v, want %v", has, open)
			}
		})
	}
}

// TestDynamicRegistrationFlow: register, sign in, consent, code, token,
// refresh rotation, the verifier's principal, replay detection.
func TestDynamicRegistrationFlow(t *testing.T) {
	h := newHarness(t)
	clientID, redirect := h.publicClient()
	b := h.browser("")
	pk := newPKCE()
	authURL := h.authorizeURL(clientID, redirect, pk, map[string]string{"state": "xyz", "scope": "offline_access unknown"})

	// Not signed in: the browser is sent to sign in and back here.
	p := b.get(authURL)
	if p.status != http.StatusFound || !strings.HasPrefix(p.location, "/test/login?return=") {
		t.Fatalf("unsigned: HTTP %d to %q", p.status, p.location)
	}
	ret, _ := url.QueryUnescape(strings.TrimPrefix(p.location, "/test/login?return="))
	if h.srv.URL+ret != authURL {
		t.Fatalf("sign-in returns to %q, want the authorization request", ret)
	}

	b = h.browser("alice")
	p = b.get(authURL)
	if p.status != http.StatusOK {
		t.Fatalf("consent page: HTTP %d %s", p.status, p.body)
	}
	for _, want := range []string{"Test host", "(the name the app gives itself; not checked)", "<strong class=\"domain\">127.0.0.1 (this computer)</strong>",
		"registered dynamically, not verified", "never receives your provider tokens", `name="decision" value="approve"`, `name="decision" value="deny"`} {
		if !strings.Contains(p.body, want) {
			t.Errorf("consent page lacks %q", want)
		}
	}
	if csp := p.header.Get("Content-Security-Policy"); !strings.Contains(csp, "form-action 'self' http://127.0.0.1:41234") {
		t.Errorf("CSP %q does not let the form's redirect reach the client", csp)
	}
	p = b.submit(p, "/authorize/decision", url.Values{"decision": {"approve"}})
	q := h.callback(p, redirect)
	if q.Get("state") != "xyz" || q.Get("code") == "" {
		t.Fatalf("callback %v", q)
	}

	tok := h.exchange(clientID, q.Get("code"), redirect, pk, nil)
	if tok.Status != 200 || tok.TokenType != "Bearer" || tok.RefreshToken == "" || tok.ExpiresIn != 3600 || tok.Scope != "offline_access" {
		t.Fatalf("token answer %+v", tok)
	}
	if cc := tok.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("token answer Cache-Control %q", cc)
	}
	info, err := h.as.Verifier()(t.Context(), tok.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	if info.Principal != (vault.Principal{Issuer: testIdP, Subject: "alice"}) || info.ClientID != clientID ||
		!slices.Equal(info.Audiences, []string{h.srv.URL + "/mcp"}) {
		t.Fatalf("the token names %+v for %s; want the IdP's (iss, sub) of alice", info.Principal, info.ClientID)
	}

	// Claims as documented: iss is the broker, the person is the IdP's.
	claims, err := h.as.keys.parse(tok.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	if claims.Issuer != h.srv.URL || claims.Subject != "alice" || claims.SubID != (subjectID{"iss_sub", testIdP, "alice"}) ||
		!slices.Equal(claims.Audience, []string{h.srv.URL + "/mcp"}) || claims.ClientID != clientID {
		t.Fatalf("claims %+v", claims)
	}

	// Rotation: each refresh token works once.
	r1 := h.refresh(clientID, tok.RefreshToken)
	if r1.Status != 200 || r1.RefreshToken == "" || r1.RefreshToken == tok.RefreshToken || r1.AccessToken == "" {
		t.Fatalf("refresh: %+v", r1)
	}
	if err := h.verify(r1.AccessToken); err != nil {
		t.Fatal(err)
	}
	r2 := h.refresh(clientID, r1.RefreshToken)
	if r2.Status != 200 {
		t.Fatalf("second refresh: %+v", r2)
	}
	// Replaying a spent refresh token revokes the whole family.
	replay := h.refresh(clientID, tok.RefreshToken)
	if replay.Status != 400 || replay.Error != "invalid_grant" || !strings.Contains(replay.Desc, "already used") {
		t.Fatalf("replay: %+v", replay)
	}
	for i, at := range []string{tok.AccessToken, r1.AccessToken, r2.AccessToken} {
		if err := h.verify(at); !errors.Is(err, bearer.ErrInvalidToken) {
			t.Fatalf("access token %d after the replay: %v, want revoked", i, err)
		}
	}
	if again := h.refresh(clientID, r2.RefreshToken); again.Error != "invalid_grant" {
		t.Fatalf("the newest refresh token of a revoked family: %+v", again)
	}
	if !strings.Contains(h.logs.String(), "refresh_token_replayed") {
		t.Error("the replay was not logged as a security event")
	}
	for _, secret := range []string{tok.AccessToken, tok.RefreshToken, r1.RefreshToken, q.Get("code"), pk.verifier} {
		if strings.Contains(h.logs.String(), secret) {
			t.Fatal("a token, code or verifier was logged")
		}
	}
}

// TestCIMDFlow: a client identified by a metadata document over https.
func TestCIMDFlow(t *testing.T) {
	h := newHarness(t)
	redirect := "http://127.0.0.1:5555/cb"
	id := h.docs.URL + "/claude/client.json"
	h.serveDoc("/claude/client.json", docAnswer{body: cimdDoc(id, redirect)})
	b := h.browser("alice")
	pk := newPKCE()
	p := b.get(h.authorizeURL(id, redirect, pk, nil))
	if p.status != 200 {
		t.Fatalf("HTTP %d %s", p.status, p.body)
	}
	host := strings.TrimPrefix(h.docs.URL, "https://")
	for _, want := range []string{"Claude &lt;i&gt;Desktop&lt;/i&gt;", "verified by its metadata document at <strong class=\"domain\">" + host + "</strong>"} {
		if !strings.Contains(p.body, want) {
			t.Errorf("consent page lacks %q:\n%s", want, p.body)
		}
	}
	p = b.submit(p, "/authorize/decision", url.Values{"decision": {"approve"}})
	code := h.callback(p, redirect).Get("code")
	tok := h.exchange(id, code, redirect, pk, nil)
	if tok.Status != 200 || tok.RefreshToken == "" {
		t.Fatalf("token: %+v", tok)
	}
	apps, err := h.as.apps.List(t.Context(), vault.Principal{Issuer: testIdP, Subject: "alice"})
	if err != nil || len(apps) != 1 || apps[0].VerifiedDomain != host || apps[0].Name != "Claude <i>Desktop</i>" || !apps[0].Active {
		t.Fatalf("apps %+v, %v", apps, err)
	}
}

// TestConsentRemembered: a remembered consent spares the person the full
// consent page, but a code goes out without any page only where the
// client's identity is assured (RFC 8252 section 8.6): a confidential
// client with an https redirect, or a metadata-document client whose https
// redirect is on its document's host. A public client, and any loopback
// or private-use redirect, gets the one-click page naming the app and the
// redirect target, whatever the port; another redirect URI or a new scope
// asks again in full.
func TestConsentRemembered(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Scopes = []string{"broker"} })
	alice := vault.Principal{Issuer: testIdP, Subject: "alice"}
	b := h.browser("alice")

	// Which page an authorization request gets.
	const (
		silent   = "no page"
		oneClick = "one-click page"
		full     = "full consent page"
	)
	pageOf := func(t *testing.T, p page) string {
		t.Helper()
		switch {
		case p.status == http.StatusFound:
			return silent
		case p.status == http.StatusOK && strings.Contains(p.body, "Continue to this app?"):
			return oneClick
		case p.status == http.StatusOK && strings.Contains(p.body, "Allow an app to use credbroker as you?"):
			return full
		}
		t.Fatalf("HTTP %d to %q:\n%.1500s", p.status, p.location, p.body)
		return ""
	}

	// Metadata documents come from https://example.com (a name the test
	// server's certificate carries, dialled to it): a host that is not
	// loopback, as a real client's is.
	docOrigin := "https://example.com"
	docAddr := h.docs.Listener.Addr().String()
	tr := h.as.docs.client.Transport.(*http.Transport)
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != "example.com:443" {
			return nil, fmt.Errorf("test dials only example.com, not %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, docAddr)
	}
	// newClient registers (or publishes) a client of kind with redirect
	// and approves it once; it returns the client id.
	n := 0
	newClient := func(t *testing.T, kind, redirect string) string {
		t.Helper()
		n++
		var id string
		switch kind {
		case "public", "confidential":
			method := "none"
			if kind == "confidential" {
				method = "client_secret_basic"
			}
			status, out := h.register(map[string]any{"client_name": "Host " + kind, "redirect_uris": []string{redirect},
				"token_endpoint_auth_method": method})
			if status != 201 {
				t.Fatal(out)
			}
			id = out["client_id"].(string)
		case "cimd":
			path := fmt.Sprintf("/web%d/client.json", n)
			id = docOrigin + path
			h.serveDoc(path, docAnswer{body: cimdDoc(id, redirect)})
		}
		h.approve(b, h.authorizeURL(id, redirect, newPKCE(), nil), redirect)
		return id
	}
	docHost := docOrigin + "/web/cb"

	for _, tc := range []struct {
		name, kind, approved, redirect, scope, prompt string
		want                                          string
	}{
		{"public, loopback, same request", "public", "http://127.0.0.1:41234/callback", "", "", "", oneClick},
		{"public, loopback on another port", "public", "http://127.0.0.1:41234/callback", "http://127.0.0.1:9999/callback", "", "", oneClick},
		{"public, private-use scheme", "public", "com.example.app:/cb", "", "", "", oneClick},
		{"public, https", "public", "https://app.example/cb", "", "", "", oneClick},
		{"public, a new scope", "public", "http://127.0.0.1:41234/callback", "", "broker", "", full},
		{"public, prompt=consent", "public", "http://127.0.0.1:41234/callback", "", "", "consent", full},
		{"confidential, https", "confidential", "https://web.example/cb", "", "", "", silent},
		{"confidential, loopback", "confidential", "http://127.0.0.1:5000/cb", "", "", "", oneClick},
		{"confidential, private-use scheme", "confidential", "com.example.web:/cb", "", "", "", oneClick},
		{"metadata document, https on its host", "cimd", docHost, "", "", "", silent},
		{"metadata document, https elsewhere", "cimd", "https://elsewhere.example/cb", "", "", "", oneClick},
		{"metadata document, loopback", "cimd", "http://127.0.0.1:6000/cb", "http://127.0.0.1:6001/cb", "", "", oneClick},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := newClient(t, tc.kind, tc.approved)
			redirect := tc.redirect
			if redirect == "" {
				redirect = tc.approved
			}
			before, err := h.store.FindAppAccess(t.Context(), alice, client)
			if err != nil {
				t.Fatal(err)
			}
			pk := newPKCE()
			p := b.get(h.authorizeURL(client, redirect, pk, map[string]string{"scope": tc.scope, "prompt": tc.prompt}))
			got := pageOf(t, p)
			if got != tc.want {
				t.Fatalf("got the %s (HTTP %d to %q), want the %s", got, p.status, p.location, tc.want)
			}
			switch got {
			case silent:
				if q := h.callback(p, redirect); q.Get("code") == "" {
					t.Fatalf("no code: %v", q)
				}
				return
			case full:
				return
			}
			// The one-click page names the app and where it sends the
			// person, port included, and says it was allowed before.
			for _, want := range []string{"Continue to this app?", "You allowed", `<code class="target">` + redirect + `</code>`,
				`name="decision" value="approve"`, `name="decision" value="deny"`} {
				if !strings.Contains(p.body, want) {
					t.Errorf("the one-click page lacks %q:\n%s", want, p.body)
				}
			}
			if name := map[string]string{"public": "Host public", "confidential": "Host confidential", "cimd": "Claude &lt;i&gt;Desktop&lt;/i&gt;"}[tc.kind]; !strings.Contains(p.body, name) {
				t.Errorf("the one-click page does not name the app %q:\n%s", name, p.body)
			}
			// prompt=none cannot be answered without the click.
			none := b.get(h.authorizeURL(client, redirect, newPKCE(), map[string]string{"prompt": "none"}))
			if q := h.callback(none, redirect); q.Get("error") != "interaction_required" || q.Get("code") != "" {
				t.Fatalf("prompt=none answered %v, want interaction_required", q)
			}
			// One click issues a code for this very redirect.
			q := h.callback(b.submit(p, "/authorize/decision", url.Values{"decision": {"approve"}}), redirect)
			if q.Get("code") == "" {
				t.Fatalf("Continue answered %v", q)
			}
			if tc.kind == "public" {
				if tok := h.exchange(client, q.Get("code"), redirect, pk, nil); tok.Status != 200 {
					t.Fatalf("the code of the one-click page: %+v", tok)
				}
			}
			// The click changed nothing in the remembered consent.
			after, err := h.store.FindAppAccess(t.Context(), alice, client)
			if err != nil {
				t.Fatal(err)
			}
			if after.RedirectURI != before.RedirectURI || !slices.Equal(after.Scopes, before.Scopes) || !after.Updated.Equal(before.Updated) {
				t.Fatalf("a one-click approval rewrote the consent: %+v, was %+v", after, before)
			}
		})
	}

	t.Run("removed before the click", func(t *testing.T) {
		loop := "http://127.0.0.1:41234/callback"
		public := newClient(t, "public", loop)
		app, err := h.store.FindAppAccess(t.Context(), alice, public)
		if err != nil {
			t.Fatal(err)
		}
		p := b.get(h.authorizeURL(public, loop, newPKCE(), nil))
		if got := pageOf(t, p); got != oneClick {
			t.Fatalf("got the %s", got)
		}
		if err := h.as.apps.Remove(t.Context(), alice, app.ID, apps.Actor{Via: "browser"}); err != nil {
			t.Fatal(err)
		}
		// Continue on a page whose consent is gone asks in full again
		// and issues nothing.
		p = b.submit(p, "/authorize/decision", url.Values{"decision": {"approve"}})
		if got := pageOf(t, p); got != full {
			t.Fatalf("after the app was removed, Continue gave the %s", got)
		}
		if apps := h.apps("alice"); slices.ContainsFunc(apps, func(a vault.AppAccess) bool { return a.ClientID == public }) {
			t.Fatal("Continue after removal recreated the app's access")
		}
	})
}

// TestRefusals: every refusal the issue lists, each with a precise error,
// and nothing stored.
func TestRefusals(t *testing.T) {
	h := newHarness(t)
	clientID, redirect := h.publicClient()
	alice := vault.Principal{Issuer: testIdP, Subject: "alice"}
	b := h.browser("alice")

	// nothingStored checks that alice has no app access and no code was
	// left redeemable.
	nothingStored := func(t *testing.T) {
		t.Helper()
		if apps := h.apps("alice"); len(apps) != 0 {
			t.Fatalf("a refused request stored app access: %+v", apps)
		}
	}

	redirectErrors := []struct {
		name, code, desc string
		params           map[string]string
	}{
		{"wrong resource", "invalid_target", "resource must be this broker's MCP endpoint", map[string]string{"resource": "https://other.example/mcp"}},
		{"PKCE missing", "invalid_request", "PKCE is required", map[string]string{"code_challenge": "", "code_challenge_method": ""}},
		{"PKCE plain", "invalid_request", "code_challenge_method must be S256", map[string]string{"code_challenge_method": "plain"}},
		{"PKCE method absent", "invalid_request", "code_challenge_method must be S256", map[string]string{"code_challenge_method": ""}},
		{"response type token", "unsupported_response_type", "response_type must be code", map[string]string{"response_type": "token"}},
	}
	for _, tc := range redirectErrors {
		t.Run(tc.name, func(t *testing.T) {
			p := b.get(h.authorizeURL(clientID, redirect, newPKCE(), tc.params))
			q := h.callback(p, redirect)
			if q.Get("error") != tc.code || !strings.Contains(q.Get("error_description"), tc.desc) || q.Get("code") != "" {
				t.Fatalf("answer %v, want %s (%s)", q, tc.code, tc.desc)
			}
			nothingStored(t)
		})
	}

	pageErrors := []struct {
		name, heading string
		url           func() string
	}{
		{"unregistered redirect URI", "return address is not registered", func() string {
			return h.authorizeURL(clientID, "https://attacker.example/cb", newPKCE(), nil)
		}},
		{"loopback redirect on another path", "return address is not registered", func() string {
			return h.authorizeURL(clientID, "http://127.0.0.1:41234/other", newPKCE(), nil)
		}},
		{"unknown client", "Unknown app", func() string { return h.authorizeURL("nope", redirect, newPKCE(), nil) }},
		{"metadata document whose client_id differs from its URL", "differs from the URL it was fetched from", func() string {
			id := h.docs.URL + "/liar.json"
			h.serveDoc("/liar.json", docAnswer{body: cimdDoc(h.docs.URL+"/other.json", redirect)})
			return h.authorizeURL(id, redirect, newPKCE(), nil)
		}},
		{"metadata document behind a redirect", "redirects are not followed", func() string {
			id := h.docs.URL + "/moved.json"
			h.serveDoc("/moved.json", docAnswer{status: 302, headers: map[string]string{"Location": "/claude/client.json"}})
			return h.authorizeURL(id, redirect, newPKCE(), nil)
		}},
		{"metadata document too large", "larger than 5120 bytes", func() string {
			id := h.docs.URL + "/big.json"
			h.serveDoc("/big.json", docAnswer{body: `{"client_name":"` + strings.Repeat("x", 6000) + `"}`})
			return h.authorizeURL(id, redirect, newPKCE(), nil)
		}},
		{"metadata document with a secret", "client_secret", func() string {
			id := h.docs.URL + "/secret.json"
			h.serveDoc("/secret.json", docAnswer{body: `{"client_id":"` + id + `","client_name":"x","redirect_uris":["` + redirect + `"],"client_secret":"s"}`})
			return h.authorizeURL(id, redirect, newPKCE(), nil)
		}},
		{"client_id URL without a path", "must have a path", func() string {
			return h.authorizeURL(h.docs.URL+"/", redirect, newPKCE(), nil)
		}},
	}
	for _, tc := range pageErrors {
		t.Run(tc.name, func(t *testing.T) {
			p := b.get(tc.url())
			if p.status != http.StatusBadRequest || p.location != "" {
				t.Fatalf("HTTP %d to %q; want an error page and no redirect", p.status, p.location)
			}
			if !strings.Contains(p.body, tc.heading) {
				t.Fatalf("page lacks %q:\n%s", tc.heading, p.body)
			}
			nothingStored(t)
		})
	}

	t.Run("metadata document at a private address", func(t *testing.T) {
		hp := newHarness(t, func(o *Options) { o.AllowPrivateMetadata = false })
		id := hp.serveDoc("/c.json", docAnswer{body: cimdDoc(hp.docs.URL+"/c.json", redirect)})
		p := hp.browser("alice").get(hp.authorizeURL(id, redirect, newPKCE(), nil))
		if p.status != 400 || !strings.Contains(p.body, "loopback, private or other special-use address") {
			t.Fatalf("HTTP %d:\n%s", p.status, p.body)
		}
		if list, _ := hp.store.ListAppAccess(t.Context(), alice); len(list) != 0 {
			t.Fatal("stored app access")
		}
	})

	t.Run("consent denied", func(t *testing.T) {
		p := b.get(h.authorizeURL(clientID, redirect, newPKCE(), map[string]string{"state": "s1"}))
		p = b.submit(p, "/authorize/decision", url.Values{"decision": {"deny"}})
		q := h.callback(p, redirect)
		if q.Get("error") != "access_denied" || q.Get("state") != "s1" || q.Get("code") != "" {
			t.Fatalf("deny answered %v", q)
		}
		nothingStored(t)
	})

	t.Run("consent form of another person", func(t *testing.T) {
		p := b.get(h.authorizeURL(clientID, redirect, newPKCE(), nil))
		bob := h.browser("bob")
		target, vals, err := htmlformFind(p, "/authorize/decision")
		if err != nil {
			t.Fatal(err)
		}
		vals.Set("decision", "approve")
		vals.Set("csrf", "csrf-bob") // bob's own token: the sealed request still names alice
		req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(vals.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		got := bob.do(req)
		if got.status != http.StatusForbidden || got.location != "" || !strings.Contains(got.body, "Signed in as someone else") {
			t.Fatalf("HTTP %d to %q:\n%s", got.status, got.location, got.body)
		}
		nothingStored(t)
		if apps := h.apps("bob"); len(apps) != 0 {
			t.Fatal("bob got app access")
		}
	})

	t.Run("code used twice", func(t *testing.T) {
		pk := newPKCE()
		code := h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect)
		first := h.exchange(clientID, code, redirect, pk, nil)
		if first.Status != 200 {
			t.Fatalf("first exchange: %+v", first)
		}
		second := h.exchange(clientID, code, redirect, pk, nil)
		if second.Status != 400 || second.Error != "invalid_grant" || !strings.Contains(second.Desc, "already used") {
			t.Fatalf("second exchange: %+v", second)
		}
		if err := h.verify(first.AccessToken); !errors.Is(err, bearer.ErrInvalidToken) {
			t.Fatalf("the first exchange's access token after the replay: %v", err)
		}
		if r := h.refresh(clientID, first.RefreshToken); r.Error != "invalid_grant" {
			t.Fatalf("the first exchange's refresh token after the replay: %+v", r)
		}
	})

	t.Run("code of another client", func(t *testing.T) {
		other, otherRedirect := h.publicClient()
		pk := newPKCE()
		code := h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect)
		before := h.apps("alice")
		got := h.exchange(other, code, otherRedirect, pk, nil)
		if got.Status != 400 || got.Error != "invalid_grant" || got.Desc != "authorization code was issued to another client" || got.AccessToken != "" {
			t.Fatalf("exchange by another client: %+v", got)
		}
		if after := h.apps("alice"); len(after[0].Families) != len(before[0].Families) {
			t.Fatal("a token family was stored for the refused exchange")
		}
	})

	tokenErrors := []struct {
		name, code, desc string
		extra            map[string]string
	}{
		{"wrong verifier", "invalid_grant", "code_verifier does not match", map[string]string{"code_verifier": newPKCE().verifier}},
		{"no verifier", "invalid_request", "code_verifier is required", map[string]string{"code_verifier": ""}},
		{"wrong resource at the token endpoint", "invalid_target", "resource must be", map[string]string{"resource": "https://other.example/mcp"}},
		{"another redirect_uri", "invalid_grant", "redirect_uri differs", map[string]string{"redirect_uri": "http://127.0.0.1:41234/other"}},
	}
	for _, tc := range tokenErrors {
		t.Run(tc.name, func(t *testing.T) {
			pk := newPKCE()
			code := h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect)
			before := len(h.apps("alice")[0].Families)
			got := h.exchange(clientID, code, redirect, pk, tc.extra)
			if got.Status != 400 || got.Error != tc.code || !strings.Contains(got.Desc, tc.desc) || got.AccessToken != "" {
				t.Fatalf("answer %+v, want %s (%s)", got, tc.code, tc.desc)
			}
			if after := len(h.apps("alice")[0].Families); after != before {
				t.Fatal("a token family was stored for the refused exchange")
			}
		})
	}

	t.Run("registration turned off", func(t *testing.T) {
		ho := newHarness(t, func(o *Options) { o.Registration = false })
		status, out := ho.register(map[string]any{"redirect_uris": []string{redirect}})
		if status != http.StatusForbidden || out["error"] != "access_denied" || !strings.Contains(fmt.Sprint(out["error_description"]), "registration is turned off") {
			t.Fatalf("HTTP %d %v", status, out)
		}
		if n, err := ho.store.DeleteUnusedOAuthClients(t.Context(), time.Now().Add(time.Hour)); err != nil || n != 0 {
			t.Fatalf("a client was stored: %d, %v", n, err)
		}
	})

	t.Run("registration with a bad redirect URI", func(t *testing.T) {
		for _, bad := range []string{"http://example.com/cb", "javascript:alert(1)", "https://x.example/cb#frag", "relative/cb"} {
			status, out := h.register(map[string]any{"redirect_uris": []string{"https://ok.example/cb", bad}})
			if status != 400 || out["error"] != "invalid_redirect_uri" {
				t.Fatalf("%q: HTTP %d %v", bad, status, out)
			}
		}
	})

	t.Run("token from issuer mode", func(t *testing.T) {
		idp := devidptest.Start(t, nil, nil)
		jwt, _, err := idp.MintAccessToken("alice", h.opts.Resource, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.verify(jwt); !errors.Is(err, bearer.ErrInvalidToken) || !strings.Contains(err.Error(), "not a valid access token of this broker") {
			t.Fatalf("an IdP JWT for the resource: %v; want refused as not this broker's", err)
		}
	})
}

func htmlformFind(p page, action string) (string, url.Values, error) {
	i := strings.Index(p.body, `action="`+action+`"`)
	if i < 0 {
		return "", nil, fmt.Errorf("no form posting to %s", action)
	}
	vals := url.Values{}
	rest := p.body[i:]
	for _, name := range []string{"csrf", "request"} {
		j := strings.Index(rest, `name="`+name+`" value="`)
		if j < 0 {
			return "", nil, fmt.Errorf("no %s field", name)
		}
		v := rest[j+len(`name="`+name+`" value="`):]
		vals.Set(name, v[:strings.IndexByte(v, '"')])
	}
	return p.url.Scheme + "://" + p.url.Host + action, vals, nil
}

// TestExpiry: codes, access tokens, idle refresh tokens and families end.
func TestExpiry(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.Apps = mustApps(t, apps.Options{Store: o.Store, Now: o.Now, Policy: apps.Policy{RefreshIdleTTL: 2 * time.Hour, FamilyTTL: 5 * time.Hour}})
	})
	clientID, redirect := h.publicClient()
	b := h.browser("alice")

	pk := newPKCE()
	code := h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect)
	h.clock.Advance(61 * time.Second)
	if got := h.exchange(clientID, code, redirect, pk, nil); got.Error != "invalid_grant" || got.Desc != "authorization code expired" {
		t.Fatalf("a code after a minute: %+v", got)
	}

	pk = newPKCE()
	tok := h.exchange(clientID, h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect), redirect, pk, nil)
	if err := h.verify(tok.AccessToken); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(time.Hour + time.Minute)
	if err := h.verify(tok.AccessToken); !errors.Is(err, bearer.ErrInvalidToken) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an access token after its hour: %v", err)
	}
	r := h.refresh(clientID, tok.RefreshToken) // within the idle lifetime
	if r.Status != 200 {
		t.Fatalf("refresh within the idle lifetime: %+v", r)
	}
	h.clock.Advance(2*time.Hour + time.Minute)
	if got := h.refresh(clientID, r.RefreshToken); got.Error != "invalid_grant" || !strings.Contains(got.Desc, "expired") {
		t.Fatalf("refresh after the idle lifetime: %+v", got)
	}

	// The absolute lifetime ends a family however often it is refreshed.
	pk = newPKCE()
	tok = h.exchange(clientID, h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect), redirect, pk, nil)
	rt := tok.RefreshToken
	for range 5 {
		h.clock.Advance(time.Hour)
		got := h.refresh(clientID, rt)
		if got.Status != 200 {
			if got.Error != "invalid_grant" || !strings.Contains(got.Desc, "expired") {
				t.Fatalf("refresh: %+v", got)
			}
			return
		}
		if exp := time.Duration(got.ExpiresIn) * time.Second; exp > time.Hour {
			t.Fatalf("access token lives %s", exp)
		}
		rt = got.RefreshToken
	}
	t.Fatal("a family outlived its absolute lifetime")
}

// TestRevocation: RFC 7009 for either token revokes the family.
func TestRevocation(t *testing.T) {
	h := newHarness(t)
	clientID, redirect := h.publicClient()
	otherID, _ := h.publicClient()
	b := h.browser("alice")
	newTokens := func() tokenAnswer {
		pk := newPKCE()
		return h.exchange(clientID, h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect), redirect, pk, nil)
	}
	for _, which := range []string{"refresh_token", "access_token"} {
		t.Run(which, func(t *testing.T) {
			tok := newTokens()
			target := tok.RefreshToken
			if which == "access_token" {
				target = tok.AccessToken
			}
			if got := h.post("/revoke", url.Values{"token": {target}, "client_id": {otherID}}); got.Status != 400 || got.Error != "unauthorized_client" {
				t.Fatalf("revocation by another client: %+v", got)
			}
			if err := h.verify(tok.AccessToken); err != nil {
				t.Fatalf("another client's revocation took effect: %v", err)
			}
			if got := h.post("/revoke", url.Values{"token": {target}, "token_type_hint": {which}, "client_id": {clientID}}); got.Status != 200 {
				t.Fatalf("revoke: %+v", got)
			}
			if err := h.verify(tok.AccessToken); !errors.Is(err, bearer.ErrInvalidToken) {
				t.Fatalf("access token after revocation: %v", err)
			}
			if got := h.refresh(clientID, tok.RefreshToken); got.Error != "invalid_grant" {
				t.Fatalf("refresh after revocation: %+v", got)
			}
			if got := h.post("/revoke", url.Values{"token": {target}, "client_id": {clientID}}); got.Status != 200 {
				t.Fatalf("revoking again: %+v", got)
			}
		})
	}
	t.Run("unknown token", func(t *testing.T) {
		for _, tok := range []string{"garbage", "cbrt1.a.b.c", "eyJhbGciOiJub25lIn0.e30."} {
			if got := h.post("/revoke", url.Values{"token": {tok}, "client_id": {clientID}}); got.Status != 200 {
				t.Fatalf("%q: %+v", tok, got)
			}
		}
	})
	t.Run("a guessed refresh token of a real family revokes nothing", func(t *testing.T) {
		tok := newTokens()
		appID, famID, _ := parseRefresh(tok.RefreshToken)
		forged := refreshPrefix + appID + "." + famID + "." + randomID(32)
		h.post("/revoke", url.Values{"token": {forged}, "client_id": {clientID}})
		if r := h.refresh(clientID, forged); r.Error != "invalid_grant" || strings.Contains(r.Desc, "already used") {
			t.Fatalf("a forged refresh token: %+v", r)
		}
		if err := h.verify(tok.AccessToken); err != nil {
			t.Fatalf("a forged token revoked the family: %v", err)
		}
	})
}

// TestRemoveApp: removing an app revokes its tokens and forgets consent,
// and its app.authorized and app.removed events are in the store's outbox
// with the changes; signing out revokes nothing (the session is not part
// of the grant).
func TestRemoveApp(t *testing.T) {
	h := newHarness(t, withAppEvents)
	clientID, redirect := h.publicClient()
	b := h.browser("alice")
	pk := newPKCE()
	tok := h.exchange(clientID, h.approve(b, h.authorizeURL(clientID, redirect, pk, nil), redirect), redirect, pk, nil)
	alice := vault.Principal{Issuer: testIdP, Subject: "alice"}
	list, err := h.as.apps.List(t.Context(), alice)
	if err != nil || len(list) != 1 || list[0].ClientID != clientID || list[0].VerifiedDomain != "" || list[0].LastUsed.IsZero() {
		t.Fatalf("apps %+v, %v", list, err)
	}
	bob := vault.Principal{Issuer: testIdP, Subject: "bob"}
	if err := h.as.apps.Remove(t.Context(), bob, list[0].ID, apps.Actor{Via: "browser"}); !errors.Is(err, apps.ErrNoSuchApp) {
		t.Fatalf("bob removing alice's app: %v", err)
	}
	if err := h.verify(tok.AccessToken); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(time.Second) // the events' times order them
	if err := h.as.apps.Remove(t.Context(), alice, list[0].ID, apps.Actor{Via: "browser"}); err != nil {
		t.Fatal(err)
	}
	if err := h.verify(tok.AccessToken); !errors.Is(err, bearer.ErrInvalidToken) || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("after removal: %v", err)
	}
	if got, want := h.appEvents(), []string{webhook.AppAuthorized + " alice " + clientID, webhook.AppRemoved + " alice " + clientID}; !slices.Equal(got, want) {
		t.Fatalf("app events %q, want %q", got, want)
	}
	if r := h.refresh(clientID, tok.RefreshToken); r.Error != "invalid_grant" {
		t.Fatalf("refresh after removal: %+v", r)
	}
	// Consent is forgotten: the app must ask again.
	if p := b.get(h.authorizeURL(clientID, redirect, newPKCE(), nil)); p.status != 200 {
		t.Fatalf("after removal the app got a code without asking: HTTP %d", p.status)
	}
}

// TestKeyRotation: a new primary key signs new tokens; tokens signed
// before stay valid while the old key is in the ring; the JWKS lists both.
func TestKeyRotation(t *testing.T) {
	h := newHarness(t)
	clientID, redirect := h.publicClient()
	pk := newPKCE()
	old := h.exchange(clientID, h.approve(h.browser("alice"), h.authorizeURL(clientID, redirect, pk, nil), redirect), redirect, pk, nil)

	rotated, err := h.keys.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	opts := h.opts
	opts.Keys = rotated
	as2, err := New(opts) // another replica, or this one restarted, with the rotated ring
	if err != nil {
		t.Fatal(err)
	}
	if _, err := as2.Verifier()(t.Context(), old.AccessToken); err != nil {
		t.Fatalf("a token signed before the rotation: %v", err)
	}
	var jwks struct {
		Keys []struct{ Kid, Alg string }
	}
	if err := json.Unmarshal(as2.keys.jwks, &jwks); err != nil || len(jwks.Keys) != 2 || jwks.Keys[0].Alg != "ES256" {
		t.Fatalf("JWKS %s, %v", as2.keys.jwks, err)
	}
	claims, _ := h.as.keys.parse(old.AccessToken)
	newTok, _, err := as2.MintAccessToken(t.Context(), vault.Principal{Issuer: testIdP, Subject: "alice"}, "urn:credbroker:test", "t", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.as.Verifier()(t.Context(), newTok); err == nil {
		t.Fatal("the old ring verified a token of a key it does not hold")
	}
	if c2, err := as2.keys.parse(newTok); err != nil || c2.ID == claims.ID {
		t.Fatalf("parse: %v", err)
	}
	resp, err := http.Get(h.srv.URL + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(b), `"d"`) {
		t.Fatal("the JWKS publishes a private key")
	}
}

// TestLimits: registration per address and the cap on clients.
func TestLimits(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RegistrationRate = 3; o.MaxClients = 4 })
	meta := map[string]any{"redirect_uris": []string{"https://app.example/cb"}}
	for i := range 3 {
		if status, out := h.register(meta); status != 201 {
			t.Fatalf("registration %d: %d %v", i, status, out)
		}
	}
	if status, out := h.register(meta); status != http.StatusTooManyRequests {
		t.Fatalf("fourth registration in a minute: %d %v", status, out)
	}
	h.clock.Advance(time.Minute)
	if status, _ := h.register(meta); status != 201 {
		t.Fatal("after a minute")
	}
	h.clock.Advance(time.Minute)
	if status, out := h.register(meta); status != http.StatusServiceUnavailable || out["error"] != "temporarily_unavailable" {
		t.Fatalf("fifth client under a cap of four: %d %v", status, out)
	}
	// Clients never used expire; used ones stay.
	h.clock.Advance(25 * time.Hour)
	codes, clients, err := h.as.GC(t.Context())
	if err != nil || clients != 4 || codes != 0 {
		t.Fatalf("GC = %d codes, %d clients, %v", codes, clients, err)
	}
}

// TestConfidentialClient: a registered client with a secret must present
// it, with the method it registered.
func TestConfidentialClient(t *testing.T) {
	h := newHarness(t)
	redirect := "https://app.example/cb"
	status, out := h.register(map[string]any{"redirect_uris": []string{redirect}, "token_endpoint_auth_method": "client_secret_basic"})
	if status != 201 || out["client_secret"] == nil || out["client_secret_expires_at"] != float64(0) {
		t.Fatalf("register: %d %v", status, out)
	}
	id, secret := out["client_id"].(string), out["client_secret"].(string)
	b := h.browser("alice")
	pk := newPKCE()
	code := h.approve(b, h.authorizeURL(id, redirect, pk, nil), redirect)
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect}, "code_verifier": {pk.verifier}}
	if got := h.post("/token", form, id, "wrong"); got.Status != 401 || got.Error != "invalid_client" || got.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("wrong secret: %+v", got)
	}
	withID := url.Values{"client_id": {id}}
	for k, v := range form {
		withID[k] = v
	}
	if got := h.post("/token", withID); got.Status != 401 || !strings.Contains(got.Desc, "client_secret_basic") {
		t.Fatalf("no secret: %+v", got)
	}
	if got := h.post("/token", form, id, secret); got.Status != 200 || got.RefreshToken != "" {
		t.Fatalf("right secret: %+v (no refresh grant registered, so no refresh token)", got)
	}
}

// TestLimitsBehindTrustedProxy: behind a trusted proxy, the registration
// limit counts each client address X-Forwarded-For names, not the proxy's;
// from a peer that is not trusted the header changes nothing.
func TestLimitsBehindTrustedProxy(t *testing.T) {
	loopback, err := clientaddr.Parse("127.0.0.0/8, ::1")
	if err != nil {
		t.Fatal(err)
	}
	register := func(h *harness, xff string) int {
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/register",
			strings.NewReader(`{"redirect_uris":["https://app.example/cb"]}`))
		req.Header.Set("Content-Type", "application/json")
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	h := newHarness(t, func(o *Options) { o.RegistrationRate = 2; o.ClientAddr = loopback.Addr })
	for _, xff := range []string{"198.51.100.1", "198.51.100.1", "203.0.113.5", "203.0.113.5"} {
		if status := register(h, xff); status != 201 {
			t.Fatalf("registration from %s: %d", xff, status)
		}
	}
	if status := register(h, "198.51.100.1"); status != http.StatusTooManyRequests {
		t.Fatalf("third registration from 198.51.100.1 in a minute: %d", status)
	}
	// A client cannot escape its quota by claiming another address to the
	// left of the one the proxy saw.
	if status := register(h, "192.0.2.99, 198.51.100.1"); status != http.StatusTooManyRequests {
		t.Fatalf("spoofed left entry: %d", status)
	}

	// Not trusting the peer: every request counts as the peer's, whatever
	// the header says.
	untrusted, _ := clientaddr.Parse("10.0.0.0/8")
	h = newHarness(t, func(o *Options) { o.RegistrationRate = 2; o.ClientAddr = untrusted.Addr })
	for i, xff := range []string{"198.51.100.1", "203.0.113.5", "192.0.2.1"} {
		want := 201
		if i == 2 {
			want = http.StatusTooManyRequests
		}
		if status := register(h, xff); status != want {
			t.Fatalf("registration %d (X-Forwarded-For %s) from an untrusted peer: %d, want %d", i, xff, status, want)
		}
	}
}

package oauthflow

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/internal/fakeprovider"
	"credbroker/provider"
	"credbroker/vault"
)

// These tests run the shipped providers.yaml, pointed at the fake GitHub
// and Google, through the real pages: each one pins a way the real
// services behave (docs/TESTING.md, "Provider quirks the fakes
// reproduce") that the broker must handle.

const (
	calendarScope = "https://www.googleapis.com/auth/calendar.readonly"
	driveScope    = "https://www.googleapis.com/auth/drive.readonly"
	gmailScope    = "https://www.googleapis.com/auth/gmail.readonly"
)

// shipped describes the fakes the shipped catalogue is pointed at.
type shipped struct {
	gh, google fakeprovider.Options
	// edit changes the providers.yaml text before it is parsed.
	edit func(doc string) string
}

// shippedCatalogue returns the repository's providers.yaml with GitHub's
// and Google's hosts replaced by fakes on loopback (which share the
// harness clock unless given their own). The broker's clock cannot move
// more than its session's life while pages are used: the IdP keeps real
// time.
func shippedCatalogue(s shipped) func(h *harness) (string, map[string]string) {
	return func(h *harness) (string, map[string]string) {
		b, err := os.ReadFile(filepath.Join("..", "providers.yaml"))
		if err != nil {
			h.t.Fatal(err)
		}
		s.gh.ClientID, s.gh.ClientSecret = "gh-client", "gh-secret-value"
		if s.gh.Now == nil {
			s.gh.Now = h.clock.Now
		}
		s.gh.RedirectURIs = []string{h.srv.URL + "/oauth/github/callback"}
		s.google.ClientID, s.google.ClientSecret = "google-client", "google-secret-value"
		if s.google.Now == nil {
			s.google.Now = h.clock.Now
		}
		s.google.RedirectURIs = []string{h.srv.URL + "/oauth/google/callback"}
		if s.google.Email == "" {
			s.google.Email = "alice.g@example.test"
		}
		h.gh = fakeprovider.NewGitHub(h.t, s.gh)
		h.google = fakeprovider.NewGoogle(h.t, s.google)
		doc := strings.NewReplacer(
			"https://github.com", h.gh.URL(),
			"https://api.github.com", h.gh.URL(),
			"https://accounts.google.com", h.google.Issuer(),
			"base_url: https://www.googleapis.com", "base_url: "+h.google.APIURL("www"),
			"base_url: https://gmail.googleapis.com", "base_url: "+h.google.APIURL("gmail"),
			"base_url: https://people.googleapis.com", "base_url: "+h.google.APIURL("people"),
		).Replace(string(b))
		if s.edit != nil {
			doc = s.edit(doc)
		}
		return doc, map[string]string{
			"GITHUB_CLIENT_ID": "gh-client", "GITHUB_CLIENT_SECRET": "gh-secret-value",
			"GOOGLE_CLIENT_ID": "google-client", "GOOGLE_CLIENT_SECRET": "google-secret-value",
		}
	}
}

func (h *harness) principal(user string) vault.Principal {
	return vault.Principal{Issuer: h.idp.Issuer(), Subject: user}
}

// ensure is connect_account as the connections layer answers it.
func (h *harness) ensure(user, prov string, scopes ...string) (connections.Outcome, error) {
	return h.conns.Ensure(context.Background(), connections.Request{Principal: h.principal(user), Provider: prov,
		Scopes: scopes, Via: "mcp", CanAsk: true, ClientName: "Agent"})
}

// mustNeed asserts that Ensure asks the person to connect, with a link.
func (h *harness) mustNeed(user, prov string, scopes ...string) connections.NeedsUser {
	h.t.Helper()
	o, err := h.ensure(user, prov, scopes...)
	need, ok := o.(connections.NeedsUser)
	if err != nil || !ok || need.Grant == nil {
		h.t.Fatalf("Ensure(%s, %v) = %#v, %v; want NeedsUser with a connect link", prov, scopes, o, err)
	}
	return need
}

// mustConnected asserts that Ensure answers Connected (no new link).
func (h *harness) mustConnected(user, prov string, scopes ...string) vault.Connection {
	h.t.Helper()
	o, err := h.ensure(user, prov, scopes...)
	c, ok := o.(connections.Connected)
	if err != nil || !ok {
		h.t.Fatalf("Ensure(%s, %v) = %#v, %v; want Connected", prov, scopes, o, err)
	}
	return c.Conn
}

// complete opens the connect link of need as user, approves it, and at
// the provider approves with atProvider (Google's granular choices).
func (a *agent) complete(need connections.NeedsUser, user string, atProvider url.Values) page {
	a.h.t.Helper()
	consent := a.openConnect(*need.Grant, user)
	mustStatus(a.h.t, consent, http.StatusOK)
	p := a.submit(consent, "/connect/", url.Values{"decision": {"approve"}})
	if p.status == http.StatusOK && strings.Contains(p.body, `name="request"`) {
		extra := url.Values{"decision": {"approve"}}
		for k, v := range atProvider {
			extra[k] = v
		}
		p = a.submit(p, "auth", extra)
	}
	return p
}

// connectNew runs Ensure then the browser step, and returns the stored
// connection (tokens opened) and the page the browser ended on.
func (h *harness) connectNew(a *agent, user, prov string, scopes []string, atProvider url.Values) (vault.Connection, page) {
	h.t.Helper()
	need := h.mustNeed(user, prov, scopes...)
	done := a.complete(need, user, atProvider)
	mustStatus(h.t, done, http.StatusOK)
	mustContain(h.t, done, "Connected: return to your app")
	g, err := h.store.GetGrant(context.Background(), need.Grant.ID)
	if err != nil || g.ConnectionID == "" {
		h.t.Fatalf("grant after the browser step: %+v, %v", g, err)
	}
	c, err := h.store.GetConnection(context.Background(), g.ConnectionID)
	if err != nil {
		h.t.Fatal(err)
	}
	h.secret(c.Token.AccessToken.Reveal())
	h.secret(c.Token.RefreshToken.Reveal())
	h.secret(c.Token.IDToken.Reveal())
	return c, done
}

func (h *harness) call(c vault.Connection, req provider.APIRequest) (provider.APIResponse, error) {
	if req.Method == "" {
		req.Method = http.MethodGet
	}
	return h.conns.Call(context.Background(), c, req)
}

func hostOf(raw string) string {
	u, _ := url.Parse(raw)
	return u.Host
}

// TestShippedGitHubEntry: GitHub documents client_id and client_secret as
// body parameters of the code exchange (the fake reads nothing else), and
// asks every client to name itself in User-Agent.
func TestShippedGitHubEntry(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	c, done := h.connectNew(h.newAgent(), "alice", "github", nil, nil)
	mustContain(t, done, "octocat")
	if c.AccountLogin != "octocat" || !slices.Equal(c.Scopes, []string{"read:user"}) {
		t.Fatalf("stored %s %v", c.AccountLogin, c.Scopes)
	}
	resp, err := h.call(c, provider.APIRequest{Path: "/user"})
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("GET /user: %v %v", resp.Status, err)
	}
	seen := 0
	for _, e := range h.gh.Events() {
		if e.Kind == "token" || e.Kind == "api" {
			seen++
			if !strings.HasPrefix(e.UserAgent, "credbroker/") {
				t.Errorf("%s %s sent User-Agent %q, want credbroker/<version>", e.Method, e.Path, e.UserAgent)
			}
		}
	}
	if seen < 3 {
		t.Fatalf("GitHub saw %d token and API requests, want the exchange, the account lookup and the call", seen)
	}
	h.finalCheck()
}

// TestGoogleScopeRoundTrip: Google answers email and profile under their
// long names (and adds openid). After the first connect, connect_account
// again is connected, with no new link.
func TestGoogleScopeRoundTrip(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	c, _ := h.connectNew(h.newAgent(), "alice", "google", nil, nil)
	if !slices.Equal(c.Scopes, []string{"email", "openid", "profile"}) {
		t.Fatalf("stored scopes %v, want the catalogue's names email openid profile", c.Scopes)
	}
	if got := h.mustConnected("alice", "google"); got.ID != c.ID {
		t.Fatalf("connected as %s, want %s", got.ID, c.ID)
	}
	h.mustConnected("alice", "google", "openid", "email")
	h.finalCheck()
}

// TestGoogleAllowedScopesAndAPIHosts: the scopes the shipped Google entry
// describes can be requested (and no other), and provider_request reaches
// each of Google's API hosts, with each host's allow-list, and the token
// only ever goes to the host a request names.
func TestGoogleAllowedScopesAndAPIHosts(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	scopes := []string{"openid", "email", calendarScope, gmailScope}
	c, _ := h.connectNew(h.newAgent(), "alice", "google", scopes, url.Values{"scope": {calendarScope, gmailScope}})
	var se *connections.ScopeError
	if _, err := h.ensure("alice", "google", "https://www.googleapis.com/auth/drive"); !errors.As(err, &se) {
		t.Fatalf("full Drive access: %v, want a ScopeError", err)
	}
	if need := h.mustNeed("alice", "google", driveScope); need.Why.Kind != connections.MissingScopes {
		t.Fatalf("drive.readonly: %v, want missing scopes", need.Why)
	}
	www, gmail := hostOf(h.google.APIURL("www")), hostOf(h.google.APIURL("gmail"))
	for _, tc := range []struct {
		name, host, path, wantHost string
	}{
		{"default host", "", "/calendar/v3/users/me/calendarList", "www"},
		{"named default host", www, "/calendar/v3/users/me/calendarList", "www"},
		{"gmail host", gmail, "/gmail/v1/users/me/profile", "gmail"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.google.Events())
			resp, err := h.call(c, provider.APIRequest{Host: tc.host, Path: tc.path})
			if err != nil || resp.Status != http.StatusOK {
				t.Fatalf("%s %s: %d %v", tc.host, tc.path, resp.Status, err)
			}
			evs := h.google.Events()[before:]
			if len(evs) != 1 || evs[0].Host != tc.wantHost || evs[0].Path != tc.path {
				t.Fatalf("Google saw %+v, want one call on %s", evs, tc.wantHost)
			}
		})
	}
	for _, tc := range []struct{ name, host, path string }{
		{"path of another host", gmail, "/calendar/v3/users/me/calendarList"},
		{"gmail path on the default host", "", "/gmail/v1/users/me/profile"},
		{"unconfigured host", "evil.example", "/calendar/v3/users/me/calendarList"},
		{"dot segments", gmail, "/gmail/v1/users/me/../../../calendar/v3/users/me/calendarList"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.google.Events())
			var re *provider.RequestError
			if _, err := h.call(c, provider.APIRequest{Host: tc.host, Path: tc.path}); !errors.As(err, &re) {
				t.Fatalf("%s %s: %v, want a refusal before sending", tc.host, tc.path, err)
			}
			if n := len(h.google.Events()) - before; n != 0 {
				t.Fatalf("Google saw %d requests", n)
			}
		})
	}
	h.finalCheck()
}

// TestIncrementalScopesKeepEarlierOnes: asking for more scopes asks the
// provider for the union, so the new grant keeps what the connection held
// (GitHub grants exactly what is asked; Google also gets
// include_granted_scopes=true).
func TestIncrementalScopesKeepEarlierOnes(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	a := h.newAgent()
	t.Run("github", func(t *testing.T) {
		first, _ := h.connectNew(a, "alice", "github", nil, nil)
		need := h.mustNeed("alice", "github", "gist")
		if need.Why.Kind != connections.MissingScopes || !slices.Equal(need.Grant.Scopes, []string{"read:user", "gist"}) {
			t.Fatalf("upgrade asks for %v (%v), want read:user gist", need.Grant.Scopes, need.Why)
		}
		mustContain(t, a.complete(need, "alice", nil), "Connected: return to your app")
		c := h.mustConnected("alice", "github", "read:user")
		if c.ID != first.ID || !slices.Equal(c.Scopes, []string{"read:user", "gist"}) {
			t.Fatalf("after the upgrade: %s %v", c.ID, c.Scopes)
		}
		h.mustConnected("alice", "github", "gist")
	})
	t.Run("google", func(t *testing.T) {
		h.connectNew(a, "alice", "google", nil, nil)
		need := h.mustNeed("alice", "google", calendarScope)
		if !slices.Equal(need.Grant.Scopes, []string{"email", "openid", "profile", calendarScope}) {
			t.Fatalf("upgrade asks for %v", need.Grant.Scopes)
		}
		mustContain(t, a.complete(need, "alice", url.Values{"scope": {calendarScope}}), "Connected: return to your app")
		var sawIncremental bool
		for _, e := range h.google.Events() {
			sawIncremental = sawIncremental || e.Kind == "authorize" && e.Query.Get("include_granted_scopes") == "true"
		}
		if !sawIncremental {
			t.Error("the authorization request did not carry include_granted_scopes=true")
		}
		h.mustConnected("alice", "google", "email", calendarScope)
	})
	h.finalCheck()
}

// TestGitHubImpliedScopes: GitHub drops a requested scope another
// requested scope includes (repo includes public_repo) from its answer.
func TestGitHubImpliedScopes(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	c, _ := h.connectNew(h.newAgent(), "alice", "github", []string{"repo", "public_repo"}, nil)
	if !slices.Equal(c.Scopes, []string{"repo"}) {
		t.Fatalf("stored %v, want GitHub's normalised answer [repo]", c.Scopes)
	}
	h.mustConnected("alice", "github", "repo", "public_repo")
	h.mustConnected("alice", "github", "public_repo")
	h.finalCheck()
}

// TestGoogleGranularConsent: the person grants only some of the scopes on
// Google's granular consent screen; the connection holds what was granted
// and asks again for the rest only when it is needed.
func TestGoogleGranularConsent(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	c, done := h.connectNew(h.newAgent(), "alice", "google", []string{"openid", "email", calendarScope, driveScope},
		url.Values{"scope": {driveScope}})
	if !slices.Equal(c.Scopes, []string{"email", "openid", driveScope}) {
		t.Fatalf("stored %v, want what was granted", c.Scopes)
	}
	mustContain(t, done, driveScope)
	if strings.Contains(done.body, calendarScope) {
		t.Error("the done page lists a scope that was not granted")
	}
	// What was asked for is kept beside it: the model is told what it did
	// not get (connections.NotGranted).
	p, _ := h.providers().Lookup("google")
	if got := connections.NotGranted(p, h.mustConnected("alice", "google", "email", driveScope)); !slices.Equal(got, []string{calendarScope}) {
		t.Fatalf("not granted %v, want [%s]", got, calendarScope)
	}
	if need := h.mustNeed("alice", "google", calendarScope); !slices.Equal(need.Why.Missing, []string{calendarScope}) {
		t.Fatalf("calendar: %v", need.Why)
	}
	h.finalCheck()
}

// TestGoogleRefreshTokenOnFirstConsentOnly: without prompt=consent,
// Google issues a refresh token the first time only. The second person to
// connect the same Google account gets none, and is told on the done page,
// on My connections and in the connect result.
func TestGoogleRefreshTokenOnFirstConsentOnly(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{edit: func(doc string) string {
		return strings.Replace(doc, "      prompt: consent\n", "", 1)
	}}))
	bob, _ := h.connectNew(h.newAgent(), "bob", "google", nil, nil)
	if bob.Token.RefreshToken == "" || bob.NoRefreshToken {
		t.Fatal("the first consent gave no refresh token")
	}
	a := h.newAgent()
	alice, done := h.connectNew(a, "alice", "google", nil, nil)
	if alice.Token.RefreshToken != "" {
		t.Fatal("Google gave a second refresh token without prompt=consent")
	}
	mustContain(t, done, `id="no-refresh"`, "did not give the broker a refresh token")
	mustContain(t, a.get(h.srv.URL+"/connections"), "No refresh token")
	p, _ := h.providers().Lookup("google")
	if c := h.mustConnected("alice", "google"); !connections.MissingRefreshToken(p, c) {
		t.Error("the connect result does not know the refresh token is missing")
	}
	if c := h.mustConnected("bob", "google"); connections.MissingRefreshToken(p, c) {
		t.Error("bob's connection has its refresh token")
	}
	h.finalCheck()
}

func (h *harness) providers() *provider.Registry { return h.client.Providers() }

// TestHostedDomainMismatch: hd= only steers Google's account chooser; an
// account of another domain (or a consumer account) stores nothing and
// gets a clear page.
func TestHostedDomainMismatch(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{edit: func(doc string) string {
		return strings.Replace(doc, "    # hosted_domain: example.com\n", "    hosted_domain: corp.example\n", 1)
	}}))
	a := h.newAgent()
	for _, hd := range []string{"", "other.example"} {
		u := h.google.User()
		u.HostedDomain = hd
		h.google.SetUser(u)
		need := h.mustNeed("alice", "google")
		p := a.complete(need, "alice", nil)
		mustStatus(t, p, http.StatusForbidden)
		mustContain(t, p, "is not allowed here", "the domain corp.example", "nothing was stored")
		if n := len(h.connections("alice")); n != 0 {
			t.Fatalf("account of %q: %d connections stored", hd, n)
		}
		if st := h.grantState(need.Grant.ID); st == vault.GrantCompleted {
			t.Fatal("the grant was completed")
		}
	}
	var hdSent bool
	for _, e := range h.google.Events() {
		hdSent = hdSent || e.Kind == "authorize" && e.Query.Get("hd") == "corp.example"
	}
	if !hdSent {
		t.Error("the authorization request did not carry hd=corp.example")
	}
	u := h.google.User()
	u.HostedDomain = "corp.example"
	h.google.SetUser(u)
	h.connectNew(a, "alice", "google", nil, nil)
	h.finalCheck()
}

// TestRevokedTokenNeedsReconnect: a GitHub OAuth app token does not expire
// and has no refresh token; revoked outside the broker (by its owner, or
// after a year unused) every call gets 401. The first 401 marks the
// connection needs_reconnect and the next call asks the person again; so
// does a 401 right after a refresh.
func TestRevokedTokenNeedsReconnect(t *testing.T) {
	reelicit := func(t *testing.T, h *harness, a *agent, c vault.Connection) {
		t.Helper()
		if _, err := h.call(c, provider.APIRequest{Path: "/user"}); !errors.Is(err, provider.ErrNeedsReconnect) {
			t.Fatalf("call: %v, want ErrNeedsReconnect", err)
		}
		if got, _ := h.store.GetConnection(context.Background(), c.ID); got.Status != vault.StatusNeedsReconnect {
			t.Fatalf("status %s, want needs_reconnect", got.Status)
		}
		need := h.mustNeed("alice", "github")
		if need.Why.Kind != connections.Reconnect {
			t.Fatalf("why = %v, want reconnect", need.Why)
		}
		mustContain(t, a.complete(need, "alice", nil), "Connected: return to your app")
		again := h.mustConnected("alice", "github")
		if resp, err := h.call(again, provider.APIRequest{Path: "/user"}); err != nil || resp.Status != http.StatusOK || again.ID != c.ID {
			t.Fatalf("after reconnecting: %d %v (connection %s, was %s)", resp.Status, err, again.ID, c.ID)
		}
	}
	t.Run("revoked by the owner", func(t *testing.T) {
		h := newHarness(t, shippedCatalogue(shipped{}))
		a := h.newAgent()
		c, _ := h.connectNew(a, "alice", "github", nil, nil)
		h.gh.UserRevokesAccess(h.gh.User())
		reelicit(t, h, a, c)
		h.finalCheck()
	})
	t.Run("unused for a year", func(t *testing.T) {
		// Only GitHub's clock moves: the broker's pages keep the IdP's time.
		ghClock := &testClock{}
		h := newHarness(t, shippedCatalogue(shipped{gh: fakeprovider.Options{Now: ghClock.Now}}))
		a := h.newAgent()
		c, _ := h.connectNew(a, "alice", "github", nil, nil)
		ghClock.Advance(366 * 24 * time.Hour)
		reelicit(t, h, a, c)
		h.finalCheck()
	})
	t.Run("401 right after a refresh", func(t *testing.T) {
		h := newHarness(t, shippedCatalogue(shipped{gh: fakeprovider.Options{ExpiringTokens: true}}))
		a := h.newAgent()
		c, _ := h.connectNew(a, "alice", "github", nil, nil)
		h.gh.FailNextAPI(2)
		before := h.gh.Counts().Refresh
		reelicit(t, h, a, c)
		if n := h.gh.Counts().Refresh - before; n != 1 {
			t.Errorf("%d refreshes, want the one before the second 401", n)
		}
		h.finalCheck()
	})
}

// disconnectOnPage disconnects c on My connections and returns the page.
func (a *agent) disconnectOnPage(c vault.Connection) page {
	a.h.t.Helper()
	return a.submit(a.get(a.h.srv.URL+"/connections"), "/connections/"+c.ID+"/disconnect", nil)
}

// TestRevokeWithExpiredGitHubToken: GitHub deletes a grant only when given
// a valid access token, and GitHub App tokens expire after eight hours:
// the broker refreshes first.
func TestRevokeWithExpiredGitHubToken(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{gh: fakeprovider.Options{ExpiringTokens: true}}))
	h.connectNew(h.newAgent(), "alice", "github", nil, nil)
	h.clock.Advance(9 * time.Hour)
	// disconnect_account (the page would need a new IdP sign-in by now).
	d, err := h.conns.Disconnect(context.Background(), connections.Request{Principal: h.principal("alice"), Provider: "github", Via: "mcp"})
	if err != nil || d.Revocation != provider.Revoked {
		t.Fatalf("disconnect: %s, %v; want revoked", d.Revocation, err)
	}
	var kinds []string
	for _, e := range h.gh.Events() {
		if e.Kind == "token" || e.Kind == "revoke" {
			kinds = append(kinds, e.Kind+":"+e.GrantType+":"+e.Error)
		}
	}
	if got := strings.Join(kinds, " "); got != "token:authorization_code: token:refresh_token: revoke::" {
		t.Fatalf("GitHub saw %s, want the exchange, a refresh, then the grant deletion", got)
	}
	for _, e := range h.gh.Events() {
		if e.Token != "" && h.gh.TokenValid(e.Token) {
			t.Error("a token survived the grant deletion")
		}
	}
	h.finalCheck()
}

// TestGoogleRevokeOfDeadToken: Google answers 400 invalid_token when the
// token is already dead (the person removed the app): access is gone, so
// the page says revoked.
func TestGoogleRevokeOfDeadToken(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	a := h.newAgent()
	c, _ := h.connectNew(a, "alice", "google", nil, nil)
	h.google.UserRevokesAccess(h.google.User())
	mustContain(t, a.disconnectOnPage(c), "revoked access at the provider")
	if n := h.google.Counts().Revoke; n != 1 {
		t.Fatalf("%d revocations", n)
	}
	h.finalCheck()
}

// TestSharedAccountRevocation: alice and bob connected the same provider
// account. Deleting GitHub's grant or revoking at Google would end bob's
// tokens too: GitHub gets alice's token deleted alone, Google is not asked
// (its revocation is account-wide) and the page says why.
func TestSharedAccountRevocation(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	aliceA, bobA := h.newAgent(), h.newAgent()
	t.Run("github", func(t *testing.T) {
		alice, _ := h.connectNew(aliceA, "alice", "github", nil, nil)
		bob, _ := h.connectNew(bobA, "bob", "github", nil, nil)
		mustContain(t, aliceA.disconnectOnPage(alice), "revoked access at the provider")
		if h.gh.TokenValid(alice.Token.AccessToken.Reveal()) || !h.gh.TokenValid(bob.Token.AccessToken.Reveal()) {
			t.Fatalf("alice's token valid %v, bob's %v; want only alice's revoked",
				h.gh.TokenValid(alice.Token.AccessToken.Reveal()), h.gh.TokenValid(bob.Token.AccessToken.Reveal()))
		}
		evs := h.gh.Events()
		if last := evs[len(evs)-1]; last.Kind != "revoke" || !strings.HasSuffix(last.Path, "/token") {
			t.Fatalf("last GitHub request %s %s, want the token deletion", last.Method, last.Path)
		}
		if resp, err := h.call(bob, provider.APIRequest{Path: "/user"}); err != nil || resp.Status != http.StatusOK {
			t.Fatalf("bob's call: %d %v", resp.Status, err)
		}
	})
	t.Run("google", func(t *testing.T) {
		alice, _ := h.connectNew(aliceA, "alice", "google", nil, nil)
		bob, _ := h.connectNew(bobA, "bob", "google", nil, nil)
		mustContain(t, aliceA.disconnectOnPage(alice), "was not revoked because another connection uses the same provider account")
		if n := h.google.Counts().Revoke; n != 0 || !h.google.TokenValid(bob.Token.AccessToken.Reveal()) {
			t.Fatalf("Google saw %d revocations; bob's token valid %v", n, h.google.TokenValid(bob.Token.AccessToken.Reveal()))
		}
		// Once nobody else uses the account, disconnecting revokes.
		mustContain(t, bobA.disconnectOnPage(bob), "revoked access at the provider")
		if h.google.TokenValid(bob.Token.AccessToken.Reveal()) {
			t.Fatal("bob's token survived")
		}
	})
	h.finalCheck()
}

// TestRefreshAnswerScopes: a refresh answer that lists scopes is recorded.
// Google keeps one grant per account and app: after bob adds Calendar to
// the same Google account, alice's next refresh covers it too.
func TestRefreshAnswerScopes(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{}))
	alice, _ := h.connectNew(h.newAgent(), "alice", "google", nil, nil)
	h.connectNew(h.newAgent(), "bob", "google", []string{"openid", "email", calendarScope}, url.Values{"scope": {calendarScope}})
	h.clock.Advance(2 * time.Hour) // alice's access token has expired
	resp, err := h.call(alice, provider.APIRequest{Path: "/calendar/v3/users/me/calendarList"})
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("calendar with the refreshed token: %d %v", resp.Status, err)
	}
	got, _ := h.store.GetConnection(context.Background(), alice.ID)
	h.secret(got.Token.AccessToken.Reveal())
	if !slices.Equal(got.Scopes, []string{"email", "openid", "profile", calendarScope}) {
		t.Fatalf("after the refresh alice's connection says %v", got.Scopes)
	}
	h.mustConnected("alice", "google", calendarScope)
	h.finalCheck()
}

// TestRefreshTokenExpiryShown: GitHub App refresh tokens come with
// refresh_token_expires_in; the broker keeps it, updates it when the token
// rotates, and shows it on My connections.
func TestRefreshTokenExpiryShown(t *testing.T) {
	h := newHarness(t, shippedCatalogue(shipped{gh: fakeprovider.Options{ExpiringTokens: true}}))
	a := h.newAgent()
	start := h.clock.Now()
	c, _ := h.connectNew(a, "alice", "github", nil, nil)
	const life = 15897600 * time.Second
	if d := c.RefreshExpires.Sub(start.Add(life)); d < 0 || d > time.Minute {
		t.Fatalf("refresh token expires %v, want about %v", c.RefreshExpires, start.Add(life))
	}
	mustContain(t, a.get(h.srv.URL+"/connections"), "Refresh token expires "+c.RefreshExpires.UTC().Format("2006-01-02"))
	h.clock.Advance(9 * time.Hour)
	if resp, err := h.call(c, provider.APIRequest{Path: "/user"}); err != nil || resp.Status != http.StatusOK {
		t.Fatalf("call: %d %v", resp.Status, err)
	}
	after, _ := h.store.GetConnection(context.Background(), c.ID)
	h.secret(after.Token.AccessToken.Reveal())
	h.secret(after.Token.RefreshToken.Reveal())
	if after.Token.RefreshToken == c.Token.RefreshToken || !after.RefreshExpires.After(c.RefreshExpires.Add(8*time.Hour)) {
		t.Fatalf("after rotation the refresh token expires %v (was %v)", after.RefreshExpires, c.RefreshExpires)
	}
	h.finalCheck()
}

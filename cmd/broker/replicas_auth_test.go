package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/internal/htmlform"
	"credbroker/internal/testskip"
)

// tokenReply is a token endpoint answer.
type tokenReply struct {
	Status       int
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	Error        string `json:"error"`
	Desc         string `json:"error_description"`
}

// postToken sends a token request to replica through the balancer.
func (s *replicaStack) postToken(t *testing.T, replica string, form url.Values) tokenReply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.lb.srv.URL+"/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Test-Replica", replica)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := tokenReply{Status: resp.StatusCode}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("/token on %s: HTTP %d %s", replica, resp.StatusCode, b)
	}
	return r
}

// TestReplicasAuthServer: two `broker serve` replicas in broker mode on one
// PostgreSQL database. A host registers on one, the person signs in and
// allows it on the other, tokens signed by either are accepted by both (the
// signing keys come from the shared key ring), a refresh token spent on one
// is spent on both, a replay on the other revokes the family everywhere
// (at once where it happened, within apps.Bound on the other), and an app
// removed on one replica is refused by the other.
func TestReplicasAuthServer(t *testing.T) {
	testskip.Short(t, "multi-process test")
	s := newReplicaStackMode(t, []string{"alice"}, "broker")
	public := s.lb.srv.URL
	redirect := "http://127.0.0.1:9/callback" // never contacted: the test stops at the redirect

	reg, _ := json.Marshal(map[string]any{"redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code", "refresh_token"}, "client_name": "Replica host"})
	req, _ := http.NewRequest(http.MethodPost, public+"/register", strings.NewReader(string(reg)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Test-Replica", "a")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var client struct {
		ClientID string `json:"client_id"`
	}
	json.NewDecoder(resp.Body).Decode(&client)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("register on a: HTTP %d", resp.StatusCode)
	}

	// Alice's browser reaches only replica b; it stops at the redirect to
	// the host.
	br := s.browserOn("b")
	br.CheckRedirect = func(r *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(r.URL.String(), redirect) {
			return http.ErrUseLastResponse
		}
		return nil
	}
	verifier := randomSecret() + randomSecret()
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {client.ClientID}, "redirect_uri": {redirect}, "state": {"s"},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}, "resource": {public + "/mcp"}}
	areq, _ := http.NewRequest(http.MethodGet, public+"/authorize?"+q.Encode(), nil)
	p := fetch(t, br, areq)
	p = submitForm(t, br, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
	if !strings.Contains(p.body, "Replica host") {
		t.Fatalf("no consent page on b (HTTP %d %s):\n%.1500s", p.status, p.url, p.body)
	}
	target, vals, err := htmlform.Find(p.url, p.body, "/authorize/decision", url.Values{"decision": {"approve"}})
	if err != nil {
		t.Fatal(err)
	}
	dreq, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	dreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	dresp, err := br.Do(dreq)
	if err != nil {
		t.Fatal(err)
	}
	dresp.Body.Close()
	loc, _ := url.Parse(dresp.Header.Get("Location"))
	code := loc.Query().Get("code")
	if dresp.StatusCode != http.StatusSeeOther || code == "" || loc.Query().Get("iss") != public {
		t.Fatalf("decision on b: HTTP %d to %s", dresp.StatusCode, loc)
	}

	tok := s.postToken(t, "a", url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect},
		"code_verifier": {verifier}, "client_id": {client.ClientID}, "resource": {public + "/mcp"}})
	if tok.Status != 200 || tok.RefreshToken == "" {
		t.Fatalf("code exchange on a: %+v", tok)
	}
	if again := s.postToken(t, "b", url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect},
		"code_verifier": {verifier}, "client_id": {client.ClientID}}); again.Error != "invalid_grant" {
		t.Fatalf("the code redeemed on a, again on b: %+v", again)
	}
	// The replay revoked the first exchange's family: sign in again for
	// the rest. Consent is remembered, but the host is a public client
	// with a loopback redirect, so it takes the one-click page (RFC 8252
	// section 8.6), on b as well.
	get := func() tokenReply {
		t.Helper()
		v2 := randomSecret() + randomSecret()
		sum := sha256.Sum256([]byte(v2))
		q.Set("code_challenge", base64.RawURLEncoding.EncodeToString(sum[:]))
		r, _ := http.NewRequest(http.MethodGet, public+"/authorize?"+q.Encode(), nil)
		p := fetch(t, br, r)
		if !strings.Contains(p.body, "Continue to this app?") || !strings.Contains(p.body, "Replica host") {
			t.Fatalf("remembered consent on b: no one-click page (HTTP %d %s):\n%.1500s", p.status, p.url, p.body)
		}
		target, vals, err := htmlform.Find(p.url, p.body, "/authorize/decision", url.Values{"decision": {"approve"}})
		if err != nil {
			t.Fatal(err)
		}
		creq, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
		creq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := br.Do(creq)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if loc == nil || loc.Query().Get("code") == "" {
			t.Fatalf("Continue on the one-click page on b: HTTP %d to %v", resp.StatusCode, loc)
		}
		return s.postToken(t, "b", url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")},
			"redirect_uri": {redirect}, "code_verifier": {v2}, "client_id": {client.ClientID}})
	}
	if a, _ := mcpCall(s.client, public, "b", tok.AccessToken, "list_connections", map[string]any{}, nil); a.Status != 401 {
		t.Fatalf("the replayed code's access token on b: HTTP %d", a.Status)
	}
	tok = get()
	if tok.Status != 200 {
		t.Fatalf("second sign-in: %+v", tok)
	}

	for _, replica := range []string{"a", "b"} {
		if a, err := mcpCall(s.client, public, replica, tok.AccessToken, "list_connections", map[string]any{}, nil); err != nil || a.Status != 200 || a.Result.IsError {
			t.Fatalf("a token issued by b, on %s: %v %s", replica, err, a.Raw)
		}
	}

	// Spent on a, spent on b.
	r1 := s.postToken(t, "a", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "client_id": {client.ClientID}})
	if r1.Status != 200 {
		t.Fatalf("refresh on a: %+v", r1)
	}
	for _, replica := range []string{"a", "b"} {
		if a, _ := mcpCall(s.client, public, replica, r1.AccessToken, "list_connections", map[string]any{}, nil); a.Status != 200 {
			t.Fatalf("the refreshed token on %s: HTTP %d", replica, a.Status)
		}
	}
	replay := s.postToken(t, "b", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "client_id": {client.ClientID}})
	ack := time.Now()
	if replay.Error != "invalid_grant" || !strings.Contains(replay.Desc, "already used") {
		t.Fatalf("the spent refresh token on b: %+v", replay)
	}
	// b ended the family itself: refused at once. a cached it: refused
	// within the bound (apps.Bound).
	if st := s.status(t, "b", r1.AccessToken); st != 401 {
		t.Fatalf("after the replay, the family's newest access token on b: HTTP %d", st)
	}
	s.refusedWithinBound(t, "a", r1.AccessToken, ack)

	// One refresh token presented on both replicas at once: exactly one
	// rotation wins; the other is a replay.
	tok = get()
	var wg sync.WaitGroup
	answers := make([]tokenReply, 2)
	for i, replica := range []string{"a", "b"} {
		wg.Go(func() {
			answers[i] = s.postToken(t, replica, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "client_id": {client.ClientID}})
		})
	}
	wg.Wait()
	if ok := (answers[0].Status == 200) != (answers[1].Status == 200); !ok {
		t.Fatalf("concurrent refreshes on a and b: %+v and %+v; want exactly one rotation", answers[0], answers[1])
	}

	// Removing the app on a is refused on b at once.
	tok = get()
	ba := s.browserOn("a")
	ba.Jar = br.Jar // the same browser, now reaching a
	creq, _ := http.NewRequest(http.MethodGet, public+"/connections", nil)
	page := fetch(t, ba, creq)
	page = submitForm(t, ba, page, "/connections/apps/", nil)
	if !strings.Contains(page.body, "Removed.") {
		t.Fatalf("removal on a: HTTP %d %.1000s", page.status, page.body)
	}
	if a, _ := mcpCall(s.client, public, "b", tok.AccessToken, "list_connections", map[string]any{}, nil); a.Status != 401 {
		t.Fatalf("the removed app's token on b: HTTP %d", a.Status)
	}
	for _, p := range []*serveProc{s.a, s.b} {
		if strings.Contains(p.logs.String(), tok.RefreshToken) || strings.Contains(p.logs.String(), code) {
			t.Errorf("replica %s logged a token or code", p.name)
		}
	}
}

package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/apps"
	"credbroker/internal/htmlform"
	"credbroker/internal/testskip"
)

// TestReplicasRemovalBound: two `broker serve` replicas in broker mode on
// one PostgreSQL database, each caching which token families are alive.
// Alice's host uses its token on replica b (so b caches its family), then
// she removes the app on her page on replica a. From the moment a
// acknowledges the removal, b refuses the token within apps.Bound (one
// second), and never accepts it after the acknowledgement plus the bound.
// Twenty rounds; the slowest is reported.
func TestReplicasRemovalBound(t *testing.T) {
	testskip.Short(t, "multi-process test")
	s := newReplicaStackMode(t, []string{"alice"}, "broker")
	public := s.lb.srv.URL
	redirect := "http://127.0.0.1:9/callback" // never contacted
	reg, _ := json.Marshal(map[string]any{"redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code"}, "client_name": "Bound host"})
	req, _ := http.NewRequest(http.MethodPost, public+"/register", strings.NewReader(string(reg)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var client struct {
		ClientID string `json:"client_id"`
	}
	json.NewDecoder(resp.Body).Decode(&client)
	resp.Body.Close()

	// Alice's browser: sign-in and consent on b, "My connections" on a.
	bb := s.browserOn("b")
	bb.CheckRedirect = func(r *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(r.URL.String(), redirect) {
			return http.ErrUseLastResponse
		}
		return nil
	}
	ba := s.browserOn("a")
	ba.Jar = bb.Jar
	signedIn := false
	token := func() string {
		t.Helper()
		verifier := randomSecret() + randomSecret()
		sum := sha256.Sum256([]byte(verifier))
		q := url.Values{"response_type": {"code"}, "client_id": {client.ClientID}, "redirect_uri": {redirect}, "state": {"s"},
			"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
		r, _ := http.NewRequest(http.MethodGet, public+"/authorize?"+q.Encode(), nil)
		p := fetch(t, bb, r)
		if !signedIn {
			p = submitForm(t, bb, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
			signedIn = true
		}
		target, vals, err := htmlform.Find(p.url, p.body, "/authorize/decision", url.Values{"decision": {"approve"}})
		if err != nil {
			t.Fatalf("%v (HTTP %d %s):\n%.1500s", err, p.status, p.url, p.body)
		}
		dreq, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
		dreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		dresp, err := bb.Do(dreq)
		if err != nil {
			t.Fatal(err)
		}
		dresp.Body.Close()
		loc, _ := url.Parse(dresp.Header.Get("Location"))
		if loc == nil || loc.Query().Get("code") == "" {
			t.Fatalf("consent on b: HTTP %d to %v", dresp.StatusCode, loc)
		}
		tok := s.postToken(t, "b", url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")},
			"redirect_uri": {redirect}, "code_verifier": {verifier}, "client_id": {client.ClientID}})
		if tok.Status != 200 {
			t.Fatalf("code exchange: %+v", tok)
		}
		return tok.AccessToken
	}

	var took []time.Duration
	for round := range 20 {
		tok := token()
		for range 3 { // b reads the family once, then answers from its cache
			if st := s.status(t, "b", tok); st != 200 {
				t.Fatalf("round %d: the token on b before the removal: HTTP %d", round, st)
			}
		}
		page := fetch(t, ba, mustRequest(t, public+"/connections"))
		page = submitForm(t, ba, page, "/connections/apps/", nil)
		ack := time.Now()
		if !strings.Contains(page.body, "Removed.") {
			t.Fatalf("round %d: removal on a: HTTP %d %.1000s", round, page.status, page.body)
		}
		refused := s.refusedWithinBound(t, "b", tok, ack)
		took = append(took, refused)
	}
	slices.Sort(took)
	t.Logf("removal on a to refusal on b, 20 rounds: median %v, slowest %v (bound %v)", took[len(took)/2], took[len(took)-1], apps.Bound)
}

func mustRequest(t *testing.T, u string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// status is the HTTP status of list_connections with bearer tok on replica.
func (s *replicaStack) status(t *testing.T, replica, tok string) int {
	t.Helper()
	a, err := mcpCall(s.client, s.lb.srv.URL, replica, tok, "list_connections", map[string]any{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a.Status
}

// refusedWithinBound calls replica with tok until it is refused, and on
// until apps.Bound after ack (when the change that ended tok's family was
// acknowledged): it fails when the token is accepted after it was refused
// once, or at all in a call made past the bound. A call is timed from
// when it was sent: the replica decided at some point after that, so a
// slow answer on a busy machine is not taken for a late decision. It
// returns how long after ack the first refusal came (when it was
// answered).
func (s *replicaStack) refusedWithinBound(t *testing.T, replica, tok string, ack time.Time) time.Duration {
	t.Helper()
	refused := time.Duration(-1)
	for {
		sent := time.Since(ack)
		st := s.status(t, replica, tok)
		since := time.Since(ack)
		switch {
		case st == 401 && refused < 0:
			refused = since
		case st == 200 && refused >= 0:
			t.Fatalf("%s accepted the token %v after the change, having refused it at %v", replica, since, refused)
		case st == 200 && sent > apps.Bound:
			t.Fatalf("%s still accepts the token in a call sent %v after the change was acknowledged (bound %v)", replica, sent, apps.Bound)
		case st != 200 && st != 401:
			t.Fatalf("%s: HTTP %d", replica, st)
		}
		if refused >= 0 && since > apps.Bound {
			return refused
		}
	}
}

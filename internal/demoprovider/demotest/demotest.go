// Package demotest drives the demo provider's authorization code flow the
// way a browser would (consent page, approve as an account, code exchange
// with PKCE), for tests that need real demo tokens.
package demotest

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"golang.org/x/oauth2"
)

// Client is the demo provider client a test authorizes as.
type Client struct {
	// AuthURL and TokenURL are the demo provider's endpoints.
	AuthURL, TokenURL string
	ClientID          string
	ClientSecret      string
	RedirectURL       string
}

var requestRE = regexp.MustCompile(`name="request" value="([^"]+)"`)

// CodeFlow approves the demo consent as accountID ("1001" alice-demo,
// "1002" bob-demo) for scopes and exchanges the code.
func (c Client) CodeFlow(tb testing.TB, accountID string, scopes []string) *oauth2.Token {
	tb.Helper()
	conf := oauth2.Config{ClientID: c.ClientID, ClientSecret: c.ClientSecret, RedirectURL: c.RedirectURL, Scopes: scopes,
		Endpoint: oauth2.Endpoint{AuthURL: c.AuthURL, TokenURL: c.TokenURL, AuthStyle: oauth2.AuthStyleInHeader}}
	verifier := oauth2.GenerateVerifier()
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Get(conf.AuthCodeURL("st", oauth2.S256ChallengeOption(verifier)))
	if err != nil {
		tb.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := requestRE.FindSubmatch(page)
	if m == nil {
		tb.Fatalf("demo consent page without request id: %s", page)
	}
	resp, err = hc.PostForm(c.AuthURL, url.Values{"request": {string(m[1])}, "account": {accountID}, "decision": {"approve"}})
	if err != nil {
		tb.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		tb.Fatalf("demo consent answered %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok, err := conf.Exchange(ctx, loc.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// Refresh spends refreshToken at the token endpoint (as another client of
// the same grant would) and returns the new tokens.
func (c Client) Refresh(tb testing.TB, refreshToken string) *oauth2.Token {
	tb.Helper()
	conf := oauth2.Config{ClientID: c.ClientID, ClientSecret: c.ClientSecret,
		Endpoint: oauth2.Endpoint{TokenURL: c.TokenURL, AuthStyle: oauth2.AuthStyleInHeader}}
	tok, err := conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: refreshToken}).Token()
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// APIStatus is the status the demo API answers to GET base+"/user" with
// accessToken.
func APIStatus(tb testing.TB, apiBase, accessToken string) int {
	tb.Helper()
	req, _ := http.NewRequest(http.MethodGet, apiBase+"/user", nil)
	req.Header.Set("Authorization", "Bearer "+accessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"time"

	"credbroker/internal/htmlform"
)

// host is an MCP host at the broker's authorization server, registered
// the way hosts register on first use (RFC 7591 dynamic registration): a
// public client with a loopback redirect URI, PKCE and refresh tokens.
type host struct {
	base     string
	clientID string
	redirect string
}

// hostRedirect is the host's loopback callback. Nothing listens there: the
// browser stops at the redirect and hands the code to the host.
const hostRedirect = "http://127.0.0.1:9/callback"

func registerHost(base string) (*host, error) {
	body, _ := json.Marshal(map[string]any{"redirect_uris": []string{hostRedirect}, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code", "refresh_token"}, "response_types": []string{"code"}, "client_name": "bench host"})
	resp, err := http.Post(base+"/register", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var reg struct {
		ClientID string `json:"client_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&reg); err != nil || resp.StatusCode != http.StatusCreated || reg.ClientID == "" {
		return nil, fmt.Errorf("register the host: HTTP %d (%v)", resp.StatusCode, err)
	}
	return &host{base: base, clientID: reg.ClientID, redirect: hostRedirect}, nil
}

// tokens gets an access token for resource for each user (whose password
// is the user name), workers people at a time.
func (h *host) tokens(users []string, resource string, workers int) (map[string]string, error) {
	out := make(map[string]string, len(users))
	var mu sync.Mutex
	var firstErr error
	next := make(chan string)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for u := range next {
				tok, err := h.token(u, u, resource)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", u, err)
				}
				out[u] = tok
				mu.Unlock()
			}
		})
	}
	for _, u := range users {
		next <- u
	}
	close(next)
	wg.Wait()
	return out, firstErr
}

// token is the authorization code flow for one person and resource, as a
// host runs it: the person's browser (a fresh cookie jar) opens
// /authorize, which sends it through the broker's sign-in at the IdP; the
// person signs in and allows the host on the consent page; the host
// redeems the code with its PKCE verifier at /token.
func (h *host) token(user, password, resource string) (string, error) {
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(r *http.Request, via []*http.Request) error {
		if strings.HasPrefix(r.URL.String(), h.redirect) {
			return http.ErrUseLastResponse
		}
		if len(via) > 20 {
			return errors.New("too many redirects")
		}
		return nil
	}}
	verifier := rand.Text() + rand.Text()
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {h.clientID}, "redirect_uri": {h.redirect}, "state": {"bench"},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}, "resource": {resource}}
	page, err := get(browser, h.base+"/authorize?"+q.Encode())
	if err != nil {
		return "", err
	}
	if page, err = submit(browser, page, "login", url.Values{"username": {user}, "password": {password}}); err != nil {
		return "", fmt.Errorf("sign-in: %w", err)
	}
	resp, err := post(browser, page, "/authorize/decision", url.Values{"decision": {"approve"}})
	if err != nil {
		return "", fmt.Errorf("consent: %w", err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Query().Get("code") == "" {
		return "", fmt.Errorf("consent: HTTP %d to %q, not the host's redirect with a code", resp.StatusCode, resp.Header.Get("Location"))
	}
	tresp, err := http.PostForm(h.base+"/token", url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")},
		"redirect_uri": {h.redirect}, "code_verifier": {verifier}, "client_id": {h.clientID}, "resource": {resource}})
	if err != nil {
		return "", err
	}
	defer tresp.Body.Close()
	var tok struct {
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
	}
	if err := json.NewDecoder(tresp.Body).Decode(&tok); err != nil || tresp.StatusCode != 200 || tok.AccessToken == "" || tok.RefreshToken == "" {
		return "", fmt.Errorf("token: HTTP %d (%v)", tresp.StatusCode, err)
	}
	return tok.AccessToken, nil
}

// page is a fetched HTML page.
type page struct {
	url  *url.URL
	body string
}

func get(c *http.Client, u string) (page, error) {
	resp, err := c.Get(u)
	if err != nil {
		return page{}, err
	}
	return read(resp)
}

func read(resp *http.Response) (page, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: HTTP %d", resp.Request.URL.Path, resp.StatusCode)
	}
	return page{url: resp.Request.URL, body: string(b)}, err
}

// post sends p's form whose action contains action with its hidden inputs
// plus extra, as a browser does, and returns the answer unread.
func post(c *http.Client, p page, action string, extra url.Values) (*http.Response, error) {
	target, vals, err := htmlform.Find(p.url, p.body, action, extra)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return c.Do(req)
}

func submit(c *http.Client, p page, action string, extra url.Values) (page, error) {
	resp, err := post(c, p, action, extra)
	if err != nil {
		return page{}, err
	}
	return read(resp)
}

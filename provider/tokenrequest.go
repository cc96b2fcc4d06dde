package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"credbroker/internal/untrusted"
)

// Token requests x/oauth2 has no call for (RFC 8693 token exchange, the
// RFC 7523 JWT bearer grant): a form posted to a token endpoint with the
// client's authentication, the answer read as a token or as the
// endpoint's RFC 6749 error.

// clientAuth is how a token request authenticates its client.
type clientAuth struct {
	id, secret string
	// method is client_secret_basic, client_secret_post or none.
	method string
}

// oauthError is an RFC 6749 section 5.2 error answer.
type oauthError struct {
	Code        string `json:"error"`
	Description string `json:"error_description"`
	status      int
}

// String renders the error for a person or a log: the code and its
// description, clipped and quoted (the server's words, untrusted).
func (e *oauthError) String() string {
	s := e.Code
	if s == "" {
		s = "HTTP " + strconv.Itoa(e.status)
	}
	if e.Description != "" {
		s += ": " + untrusted.Quote(untrusted.Clip(e.Description, 200))
	}
	return s
}

// maxTokenAnswer caps a token endpoint's answer.
const maxTokenAnswer = 1 << 20

// postToken posts form to a token endpoint (no redirect followed) and
// reads the answer: a token (with its other members as Extra; expires_in
// counted from now), or the endpoint's OAuth error, or err when there is
// no usable answer.
func postToken(ctx context.Context, client *http.Client, endpoint string, form url.Values, auth clientAuth, now time.Time) (*oauth2.Token, *oauthError, error) {
	if err := checkEndpoint(endpoint); err != nil {
		return nil, nil, err
	}
	switch auth.method {
	case "client_secret_post":
		form.Set("client_id", auth.id)
		form.Set("client_secret", auth.secret)
	case "none", "":
		form.Set("client_id", auth.id)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if auth.method == "client_secret_basic" {
		// RFC 6749 section 2.3.1: both form-encoded before Basic.
		req.SetBasicAuth(url.QueryEscape(auth.id), url.QueryEscape(auth.secret))
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, errors.New(describeRefreshErr(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenAnswer+1))
	if err != nil || len(body) > maxTokenAnswer {
		return nil, nil, fmt.Errorf("HTTP %d with an unreadable or oversized answer", resp.StatusCode)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" && resp.StatusCode/100 == 2 {
		return nil, nil, fmt.Errorf("HTTP %d with a %s answer, not JSON", resp.StatusCode, untrusted.Quote(untrusted.Clip(mt, 60)))
	}
	if resp.StatusCode/100 != 2 {
		oe := &oauthError{status: resp.StatusCode}
		if json.Unmarshal(body, oe) != nil || oe.Code == "" || resp.StatusCode >= 500 {
			return nil, nil, fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil, oe, nil
	}
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, nil, errors.New("the answer is not a JSON object")
	}
	tok := &oauth2.Token{}
	tok.AccessToken, _ = raw["access_token"].(string)
	tok.TokenType, _ = raw["token_type"].(string)
	tok.RefreshToken, _ = raw["refresh_token"].(string)
	if tok.AccessToken == "" {
		return nil, nil, errors.New("the answer has no access_token")
	}
	var secs int64
	switch v := raw["expires_in"].(type) {
	case float64:
		secs = int64(v)
	case string:
		secs, _ = strconv.ParseInt(v, 10, 64)
	}
	if secs > 0 && secs < 10*365*24*3600 {
		tok.Expiry = now.Add(time.Duration(secs) * time.Second)
	}
	return tok.WithExtra(raw), nil, nil
}

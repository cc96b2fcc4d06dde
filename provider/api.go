package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"credbroker/vault"
)

// RequestError is an API request the broker refuses to send: the message
// is safe to show to the caller and names the problem precisely.
type RequestError struct{ Msg string }

func (e *RequestError) Error() string { return e.Msg }

func reqErrorf(format string, args ...any) error {
	return &RequestError{Msg: fmt.Sprintf(format, args...)}
}

// apiMethods are the HTTP methods an API request may use.
var apiMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// apiMethods returns the HTTP methods an API request may use.
func APIMethods() []string { return slices.Clone(apiMethods) }

// allowedRequestHeaders may be set by the caller of an API request; every
// other header (Authorization above all) is refused.
var allowedRequestHeaders = []string{
	"Accept", "Accept-Language", "Content-Type", "If-Match", "If-None-Match",
	"If-Modified-Since", "If-Unmodified-Since", "X-GitHub-Api-Version",
}

// AllowedRequestHeaders returns the request headers a caller may set.
func AllowedRequestHeaders() []string { return slices.Clone(allowedRequestHeaders) }

// RequestPattern is one entry of a provider's API allow-list:
// "[METHOD[,METHOD…] ]PATH". PATH is relative to the API base; "*" matches
// one path segment; a PATH ending in "/" matches everything below it; any
// other PATH matches itself and everything below it ("/user" matches
// "/user" and "/user/repos" but not "/users").
type RequestPattern struct {
	Methods []string // empty: every method in apiMethods
	Path    string
}

// ParseRequestPattern parses one allow-list entry.
func ParseRequestPattern(s string) (RequestPattern, error) {
	var rp RequestPattern
	path := strings.TrimSpace(s)
	if m, rest, ok := strings.Cut(path, " "); ok {
		for meth := range strings.SplitSeq(m, ",") {
			meth = strings.ToUpper(strings.TrimSpace(meth))
			if !slices.Contains(apiMethods, meth) {
				return rp, fmt.Errorf("%q: method %q is not one of %s", s, meth, strings.Join(apiMethods, ", "))
			}
			rp.Methods = append(rp.Methods, meth)
		}
		path = strings.TrimSpace(rest)
	}
	if !strings.HasPrefix(path, "/") {
		return rp, fmt.Errorf("%q: the path must start with /", s)
	}
	if _, err := checkAPIPath(path); err != nil {
		return rp, fmt.Errorf("%q: %v", s, err)
	}
	rp.Path = path
	return rp, nil
}

// Match reports whether method and path (relative to the API base,
// already checked by checkAPIPath) are allowed by rp.
func (rp RequestPattern) Match(method, path string) bool {
	if len(rp.Methods) > 0 && !slices.Contains(rp.Methods, method) {
		return false
	}
	ps := strings.Split(strings.TrimPrefix(rp.Path, "/"), "/")
	xs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	prefix := strings.HasSuffix(rp.Path, "/")
	if prefix {
		ps = ps[:len(ps)-1]
	}
	if len(xs) < len(ps) || (prefix && len(xs) == len(ps)) {
		return false
	}
	for i, p := range ps {
		if p != "*" && p != xs[i] {
			return false
		}
	}
	return true
}

// requestAllowed applies p's allow-list (empty: everything under the base).
func (p *Provider) requestAllowed(method, path string) bool {
	if len(p.AllowedRequests) == 0 {
		return true
	}
	for _, rp := range p.AllowedRequests {
		if rp.Match(method, path) {
			return true
		}
	}
	return false
}

// checkAPIPath validates an untrusted API path relative to the API base and
// returns its segments' decoded form. It refuses anything that could leave
// the base: absolute or scheme-relative URLs, "." and ".." segments,
// encoded slashes, dots, backslashes or percent signs (double encoding),
// "@", backslashes, control characters, query or fragment markers.
func checkAPIPath(path string) (string, error) {
	switch {
	case path == "":
		return "", reqErrorf("path is required (relative to the API base, starting with /)")
	case len(path) > 2048:
		return "", reqErrorf("path is longer than 2048 bytes")
	case !strings.HasPrefix(path, "/"):
		return "", reqErrorf("path must start with / and be relative to the API base (absolute URLs are refused)")
	case strings.HasPrefix(path, "//"), strings.Contains(path, "//"):
		return "", reqErrorf("path must not contain empty segments (//)")
	case strings.ContainsAny(path, "\\"):
		return "", reqErrorf("path must not contain backslashes")
	case strings.Contains(path, "@"):
		return "", reqErrorf("path must not contain @")
	case strings.ContainsAny(path, "?#"):
		return "", reqErrorf("path must not contain ? or #: pass query parameters in query")
	}
	for _, r := range path {
		if r < 0x21 || r == 0x7f || r > 0x7e {
			return "", reqErrorf("path must be printable ASCII without spaces (percent-encode other characters)")
		}
	}
	low := strings.ToLower(path)
	for _, enc := range []string{"%2f", "%2e", "%5c", "%25", "%00", "%40", "%3f", "%23"} {
		if strings.Contains(low, enc) {
			return "", reqErrorf("path must not contain encoded slashes, dots, backslashes, @, ?, # or percent signs (%s)", enc)
		}
	}
	for seg := range strings.SplitSeq(path[1:], "/") {
		if seg == "." || seg == ".." {
			return "", reqErrorf("path must not contain . or .. segments")
		}
	}
	dec, err := url.PathUnescape(path)
	if err != nil {
		return "", reqErrorf("path has malformed percent-encoding")
	}
	return dec, nil
}

// ResolveAPIURL joins an untrusted path and query to the API base URL and
// checks that the result stays under the base (same scheme, host and path
// prefix).
func ResolveAPIURL(base, path string, query url.Values) (*url.URL, error) {
	b, err := url.Parse(base)
	if err != nil || b.Host == "" {
		return nil, errors.New("provider: provider has an invalid API base URL")
	}
	dec, err := checkAPIPath(path)
	if err != nil {
		return nil, err
	}
	basePath := strings.TrimSuffix(b.Path, "/")
	u := &url.URL{Scheme: b.Scheme, Host: b.Host, Path: basePath + dec, RawPath: strings.TrimSuffix(b.EscapedPath(), "/") + path}
	if u.EscapedPath() != u.RawPath {
		u.RawPath = "" // canonical encoding equals what was given
	}
	if len(query) > 0 {
		for k, vs := range query {
			if k == "" || len(k) > 256 {
				return nil, reqErrorf("query parameter names must be 1-256 bytes")
			}
			for _, v := range vs {
				if len(v) > 4096 {
					return nil, reqErrorf("query parameter %q is longer than 4096 bytes", k)
				}
			}
		}
		u.RawQuery = query.Encode()
		if len(u.RawQuery) > 8192 {
			return nil, reqErrorf("query is longer than 8192 bytes once encoded")
		}
	}
	if err := underBase(b, u); err != nil {
		return nil, err
	}
	return u, nil
}

// underBase checks that u is on b's scheme and host, under b's path.
func underBase(b, u *url.URL) error {
	basePath := strings.TrimSuffix(b.Path, "/")
	if u.Scheme != b.Scheme || !strings.EqualFold(u.Host, b.Host) || u.User != nil ||
		!(u.Path == basePath || strings.HasPrefix(u.Path, basePath+"/")) {
		return reqErrorf("the request would leave the provider's API base URL")
	}
	return nil
}

// APIRequest is a request to a provider's API, relative to its base URL.
type APIRequest struct {
	Method string
	Path   string
	Query  url.Values
	Header http.Header // only AllowedRequestHeaders
	Body   []byte
}

// APIResponse is the provider's answer. Body holds at most the response
// cap; Truncated says there was more.
type APIResponse struct {
	Status    int
	Header    http.Header // selected headers only (see responseHeader)
	Body      []byte
	Truncated bool
}

// responseHeader reports whether an upstream response header is passed on:
// content description, caching validators, pagination and rate limits.
func responseHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Content-Type", "Content-Language", "Etag", "Last-Modified", "Link", "Retry-After", "Location",
		"X-Github-Request-Id", "X-Oauth-Scopes", "X-Accepted-Oauth-Scopes":
		return true
	}
	l := strings.ToLower(name)
	return strings.HasPrefix(l, "x-ratelimit-") || strings.HasPrefix(l, "ratelimit")
}

// prepare validates req against p and returns the upstream URL and headers.
func (k *Client) prepare(p *Provider, req APIRequest) (*url.URL, http.Header, error) {
	if p.APIBaseURL == "" {
		return nil, nil, reqErrorf("provider %s has no API configured (api.base_url in providers.yaml)", p.Name)
	}
	if !slices.Contains(apiMethods, req.Method) {
		return nil, nil, reqErrorf("method %q is not allowed: use %s", req.Method, strings.Join(apiMethods, ", "))
	}
	if int64(len(req.Body)) > k.opts.MaxRequestBody {
		return nil, nil, reqErrorf("request body is %d bytes, more than the %d allowed", len(req.Body), k.opts.MaxRequestBody)
	}
	u, err := ResolveAPIURL(p.APIBaseURL, req.Path, req.Query)
	if err != nil {
		return nil, nil, err
	}
	if !p.requestAllowed(req.Method, req.Path) {
		return nil, nil, reqErrorf("%s %s is not in the broker's allow-list for %s", req.Method, req.Path, p.Name)
	}
	h := http.Header{}
	for name, vs := range req.Header {
		canon := http.CanonicalHeaderKey(name)
		if !slices.Contains(allowedRequestHeaders, canon) {
			return nil, nil, reqErrorf("request header %q is not allowed; allowed: %s", name, strings.Join(allowedRequestHeaders, ", "))
		}
		for _, v := range vs {
			if len(v) > 1024 || strings.ContainsAny(v, "\r\n\x00") {
				return nil, nil, reqErrorf("request header %q has an invalid value", name)
			}
			h.Add(canon, v)
		}
	}
	if h.Get("Accept") == "" {
		h.Set("Accept", "application/json")
	}
	if len(req.Body) > 0 && h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	return u, h, nil
}

// Do performs req against the API of connection id's provider with its
// access token (refreshed before expiry; refreshed once more and retried
// when the API answers 401 to an unexpired token). The connection's token
// set is opened once; a refresh reloads it under the refresh lock.
// Requests that could leave the API base, or that the provider's allow-list
// does not name, return a *RequestError before anything is sent (a refresh
// included). Redirects are followed only on the API host, within the base
// path, to a method and path the allow-list names; any other redirect is
// returned as is. Do does not record the use (the connections layer does).
func (k *Client) Do(ctx context.Context, id string, req APIRequest) (APIResponse, error) {
	conn, err := k.opts.Store.GetConnection(ctx, id)
	if err != nil {
		return APIResponse{}, fmt.Errorf("provider: connection %s: %w", id, err)
	}
	p, ok := k.opts.Providers.Lookup(conn.Provider)
	if !ok {
		return APIResponse{}, fmt.Errorf("%w: %s", ErrUnknownProvider, conn.Provider)
	}
	u, hdr, err := k.prepare(p, req)
	if err != nil {
		return APIResponse{}, err
	}
	if conn, err = k.usable(ctx, conn); err != nil {
		return APIResponse{}, err
	}
	resp, err := k.send(ctx, p, conn, req.Method, u, hdr, req.Body)
	if err != nil {
		return APIResponse{}, err
	}
	if resp.Status == http.StatusUnauthorized && (conn.Token.Expiry.IsZero() || k.opts.Now().Before(conn.Token.Expiry)) && conn.Token.RefreshToken != "" {
		// An unexpired token was refused: refresh once and retry once.
		fresh, err := k.ForceRefresh(ctx, id, conn.Token.AccessToken)
		if err != nil {
			return APIResponse{}, err
		}
		if fresh.Token.AccessToken != conn.Token.AccessToken {
			if resp, err = k.send(ctx, p, fresh, req.Method, u, hdr, req.Body); err != nil {
				return APIResponse{}, err
			}
		}
	}
	return resp, nil
}

// send performs one upstream request and reads the capped answer.
func (k *Client) send(ctx context.Context, p *Provider, conn vault.Connection, method string, u *url.URL, hdr http.Header, body []byte) (APIResponse, error) {
	base, _ := url.Parse(p.APIBaseURL)
	hreq, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(body))
	if err != nil {
		return APIResponse{}, reqErrorf("the request could not be built")
	}
	hreq.Header = hdr.Clone()
	tt := conn.Token.TokenType
	if tt == "" || strings.EqualFold(tt, "bearer") {
		tt = "Bearer"
	}
	hreq.Header.Set("Authorization", tt+" "+conn.Token.AccessToken.Reveal())
	cl := *k.opts.HTTPClient
	cl.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if len(via) >= 5 || !redirectAllowed(p, base, r) {
			// Never follow with the token to another host, outside the base
			// or to a method and path the allow-list does not name (a 307
			// or 308 replays the method and body): the caller gets the 3xx.
			return http.ErrUseLastResponse
		}
		return nil
	}
	start := time.Now()
	resp, err := cl.Do(hreq)
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	k.opts.Telemetry.ProviderCall(p.Name, status, time.Since(start))
	if err != nil {
		if ctx.Err() != nil {
			return APIResponse{}, ctx.Err()
		}
		return APIResponse{}, fmt.Errorf("%w: %s API: %s", ErrProviderUnavailable, p.Name, describeRefreshErr(err))
	}
	defer resp.Body.Close()
	// An API that echoes the request (a debugging endpoint, an error
	// message) must not hand the token back to the caller, in any of the
	// encodings an echo is likely to use. A token starting before the cap
	// is read whole so it is redacted whole, then the body is cut.
	forms := secretForms(conn.Token.AccessToken.Reveal())
	longest := 0
	for _, f := range forms {
		longest = max(longest, len(f))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, k.opts.MaxResponseBody+int64(longest)+1))
	if err != nil {
		return APIResponse{}, fmt.Errorf("%w: %s API: reading the answer failed", ErrProviderUnavailable, p.Name)
	}
	out := APIResponse{Status: resp.StatusCode, Header: http.Header{}}
	out.Body, out.Truncated = redactCapped(b, forms, k.opts.MaxResponseBody)
	for name, vs := range resp.Header {
		if responseHeader(name) {
			for _, v := range vs {
				for _, f := range forms {
					v = strings.ReplaceAll(v, string(f), redacted)
				}
				out.Header.Add(name, v)
			}
		}
	}
	return out, nil
}

// redirectAllowed reports whether the API client may follow a redirect to
// r: on the API host, under the base path, to a path that passes
// checkAPIPath and, with r's method, the provider's allow-list.
func redirectAllowed(p *Provider, base *url.URL, r *http.Request) bool {
	if underBase(base, r.URL) != nil {
		return false
	}
	rel, ok := strings.CutPrefix(r.URL.EscapedPath(), strings.TrimSuffix(base.EscapedPath(), "/"))
	if !ok || rel == "" {
		return false
	}
	if _, err := checkAPIPath(rel); err != nil {
		return false
	}
	return slices.Contains(apiMethods, r.Method) && p.requestAllowed(r.Method, rel)
}

// redacted replaces the access token in API answers.
const redacted = "REDACTED"

// secretForms returns the encodings of an access token an API might echo:
// as is, JSON-escaped (with and without HTML escaping, with "\/") and URL-
// encoded. Empty for an empty token.
func secretForms(secret string) [][]byte {
	if secret == "" {
		return nil
	}
	quoted := func(escapeHTML bool) string {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(escapeHTML)
		_ = enc.Encode(secret)
		return strings.TrimSuffix(strings.TrimSpace(buf.String()), `"`)[1:]
	}
	jsonHTML, jsonPlain := quoted(true), quoted(false)
	var forms [][]byte
	for _, f := range []string{secret, jsonHTML, jsonPlain, strings.ReplaceAll(jsonHTML, "/", `\/`),
		strings.ReplaceAll(jsonPlain, "/", `\/`), url.QueryEscape(secret), url.PathEscape(secret)} {
		if !slices.ContainsFunc(forms, func(g []byte) bool { return string(g) == f }) {
			forms = append(forms, []byte(f))
		}
	}
	return forms
}

// redactCapped replaces every form in b that starts before limit with
// redacted and cuts the rest at limit (of b's original positions, so text
// shifting left after a replacement cannot bring a partial token in), and
// the result at limit bytes. It reports whether anything was cut.
func redactCapped(b []byte, forms [][]byte, limit int64) ([]byte, bool) {
	out := make([]byte, 0, min(int64(len(b)), limit))
	// next[f] caches where form f next occurs at or after i (-1: nowhere),
	// so each form is searched for once per occurrence, not once per
	// replacement.
	next := make([]int, len(forms))
	for f := range forms {
		next[f] = -2
	}
	i := 0
	for int64(i) < limit && i < len(b) {
		at, form := -1, -1
		for f, fb := range forms {
			if next[f] == -2 || next[f] >= 0 && next[f] < i {
				next[f] = -1
				if j := bytes.Index(b[i:], fb); j >= 0 {
					next[f] = i + j
				}
			}
			if n := next[f]; n >= 0 && (at < 0 || n < at || n == at && len(fb) > len(forms[form])) {
				at, form = n, f
			}
		}
		if at < 0 || int64(at) >= limit {
			end := int(min(limit, int64(len(b))))
			out = append(out, b[i:end]...)
			i = end
			break
		}
		out = append(out, b[i:at]...)
		out = append(out, redacted...)
		i = at + len(forms[form])
	}
	if int64(len(out)) > limit {
		// A replacement just before the cap ran past it.
		return out[:limit], true
	}
	return out, i < len(b)
}

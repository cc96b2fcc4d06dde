// Package client is a small Go client for credbroker's sidecar API (see
// package sidecar): a co-located MCP server uses it to make sure the user
// has connected a provider and to call the provider's API through the
// broker, without any OAuth code or token of its own.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Client talks to one broker's sidecar listener.
type Client struct {
	base string
	hc   *http.Client
}

// New returns a client for baseURL ("http://127.0.0.1:8081", or
// "unix:///run/credbroker/sidecar.sock" for a Unix socket) authenticating
// with the sidecar secret. hc may be nil; the client works on a copy of it
// that never follows redirects (a provider's 3xx, relayed by /v1/proxy,
// comes back as a Response) and that sends the sidecar secret and the
// user's token only to the sidecar's own scheme and host.
func New(baseURL, secret string, hc *http.Client) (*Client, error) {
	if secret == "" {
		return nil, errors.New("sidecar client: the sidecar secret is required")
	}
	cc := http.Client{Timeout: 60 * time.Second}
	if hc != nil {
		cc = *hc
	}
	next := cc.Transport
	if sock, ok := strings.CutPrefix(baseURL, "unix://"); ok {
		if sock == "" {
			return nil, errors.New("sidecar client: unix:// needs a socket path")
		}
		next = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}
		baseURL = "http://sidecar"
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("sidecar client: %q is not an http(s) or unix:// URL", baseURL)
	}
	if next == nil {
		next = http.DefaultTransport
	}
	cc.Transport = &credTransport{scheme: u.Scheme, host: u.Host, secret: secret, next: next}
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{base: strings.TrimSuffix(baseURL, "/"), hc: &cc}, nil
}

// userTokenKey carries the end user's token of one call to credTransport.
type userTokenKey struct{}

// credTransport adds the sidecar secret and the user's token to requests
// for the sidecar's scheme and host, and strips them from any other.
type credTransport struct {
	scheme, host string
	secret       string
	next         http.RoundTripper
}

func (t *credTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Del(secretHeader)
	r.Header.Del("Authorization")
	if strings.EqualFold(r.URL.Scheme, t.scheme) && strings.EqualFold(r.URL.Host, t.host) {
		r.Header.Set(secretHeader, t.secret)
		if tok, ok := r.Context().Value(userTokenKey{}).(string); ok {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	return t.next.RoundTrip(r)
}

const secretHeader = "Broker-Sidecar-Secret"

// Error is an error answer of the sidecar API.
type Error struct {
	Status   int      `json:"-"`
	Code     string   `json:"error"`
	Message  string   `json:"message"`
	Accounts []string `json:"accounts,omitempty"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("sidecar: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Connection describes a connection (never a token).
type Connection struct {
	ID       string   `json:"id"`
	Provider string   `json:"provider"`
	Account  string   `json:"account"`
	Scopes   []string `json:"scopes"`
	Status   string   `json:"status"`
	// NotGranted are the scopes the connection's last connect request
	// asked for that the person did not grant; Note says so and how to ask
	// again. Both empty when everything was granted.
	NotGranted []string `json:"not_granted,omitempty"`
	Note       string   `json:"note,omitempty"`
}

// InputRequest is an MCP input request to copy into the caller's own
// InputRequiredResult.
type InputRequest struct {
	Method string            `json:"method"`
	Params *mcp.ElicitParams `json:"params"`
}

// RequireResult is the answer of Require. Status is connected,
// input_required, declined or cancelled.
type RequireResult struct {
	Status     string      `json:"status"`
	Connection *Connection `json:"connection,omitempty"`
	// InputKey is the key to place InputRequest under in the server's own
	// inputRequests; the host answers under the same key.
	InputKey     string        `json:"input_key,omitempty"`
	InputRequest *InputRequest `json:"input_request,omitempty"`
	RequestState string        `json:"request_state,omitempty"`
	// Message says, for declined and cancelled, what happened in words
	// fit for the person.
	Message string `json:"message,omitempty"`
}

// InputRequired returns the MCP tool result asking the user to connect:
// the input request under InputKey, and the state to echo on the retry.
func (r *RequireResult) InputRequired() *mcp.CallToolResult {
	if r.InputRequest == nil {
		return nil
	}
	return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{r.InputKey: r.InputRequest.Params}, RequestState: r.RequestState}
}

// RequireRequest is what Require asks.
type RequireRequest struct {
	Provider string
	Scopes   []string
	// RequestState is "" on a first call, and on a retry what the host
	// echoed (the previous answer's RequestState).
	RequestState string
	// InputResponses are the host's answers on a retry, passed on as they
	// came (the broker reads the one under its InputKey: accept, decline
	// or cancel).
	InputResponses mcp.InputResponseMap
	// ClientName is the host's self-asserted name, shown to the person as
	// not verified.
	ClientName string
}

// RequireFrom builds the RequireRequest of an MCP tool call: the host's
// requestState, inputResponses and name come from req.
func RequireFrom(req *mcp.CallToolRequest, provider string, scopes ...string) RequireRequest {
	out := RequireRequest{Provider: provider, Scopes: scopes}
	if req == nil || req.Params == nil {
		return out
	}
	out.RequestState, out.InputResponses = req.Params.RequestState, req.Params.InputResponses
	if info := req.ClientInfo(); info != nil {
		out.ClientName = info.Title
		if out.ClientName == "" {
			out.ClientName = info.Name
		}
	}
	return out
}

func (c *Client) do(ctx context.Context, userToken, method, path string, hdr http.Header, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(context.WithValue(ctx, userTokenKey{}, userToken), method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	return c.hc.Do(req)
}

func (c *Client) postJSON(ctx context.Context, userToken, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, userToken, http.MethodPost, path, http.Header{"Content-Type": {"application/json"}}, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("sidecar: %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("sidecar: %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return decodeError(resp.StatusCode, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("sidecar: %s: malformed answer", path)
	}
	return nil
}

func decodeError(status int, data []byte) error {
	e := &Error{Status: status}
	if json.Unmarshal(data, e) != nil || e.Code == "" {
		e.Code, e.Message = "http_error", http.StatusText(status)
	}
	return e
}

// Require makes sure the user behind userToken has connected r.Provider
// with r.Scopes: connected, input_required (return InputRequired() to the
// host), or, once the host answered, declined or cancelled.
func (c *Client) Require(ctx context.Context, userToken string, r RequireRequest) (*RequireResult, error) {
	body := map[string]any{"provider": r.Provider}
	if len(r.Scopes) > 0 {
		body["scopes"] = r.Scopes
	}
	if r.RequestState != "" {
		body["request_state"] = r.RequestState
		if len(r.InputResponses) > 0 {
			body["input_responses"] = r.InputResponses
		}
	}
	if r.ClientName != "" {
		body["client_name"] = r.ClientName
	}
	var out RequireResult
	if err := c.postJSON(ctx, userToken, "/v1/require", body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Response is a provider API answer relayed by the broker.
type Response struct {
	Status    int
	Header    http.Header
	Body      []byte
	Truncated bool
}

// Request describes a provider API call through the broker.
type Request struct {
	Method  string // default GET
	Path    string // relative to the provider's API base, starting with /
	Query   url.Values
	Header  http.Header // only the broker's allow-listed headers are passed on
	Body    []byte
	Account string // needed when several accounts are connected
	// APIHost names one of the provider's API hosts (Google serves its
	// APIs from several); empty: the provider's main API base.
	APIHost string
}

// Do calls provider's API as the user behind userToken. A non-nil error is
// either a transport failure or an *Error from the broker; the provider's
// own answers (any status) come back as a Response.
func (c *Client) Do(ctx context.Context, userToken, provider string, r Request) (*Response, error) {
	if r.Method == "" {
		r.Method = http.MethodGet
	}
	path := "/v1/proxy/" + url.PathEscape(provider) + r.Path
	if len(r.Query) > 0 {
		path += "?" + r.Query.Encode()
	}
	hdr := r.Header.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	if r.Account != "" {
		hdr.Set("Broker-Account", r.Account)
	}
	if r.APIHost != "" {
		hdr.Set("Broker-Api-Host", r.APIHost)
	}
	resp, err := c.do(ctx, userToken, r.Method, path, hdr, bytes.NewReader(r.Body))
	if err != nil {
		return nil, fmt.Errorf("sidecar: proxy: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("sidecar: proxy: %w", err)
	}
	if resp.Header.Get("Broker-Truncated") == "" && isBrokerError(resp) {
		return nil, decodeError(resp.StatusCode, data)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: data, Truncated: resp.Header.Get("Broker-Truncated") == "true"}, nil
}

// isBrokerError tells the broker's own refusals from relayed answers: the
// broker's carry its JSON error body and one of its status codes.
func isBrokerError(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusBadRequest, http.StatusNotFound, http.StatusConflict,
		http.StatusRequestEntityTooLarge, http.StatusBadGateway, http.StatusGatewayTimeout, http.StatusInternalServerError,
		http.StatusUnsupportedMediaType, http.StatusServiceUnavailable:
	default:
		return false
	}
	return resp.Header.Get("Broker-Error") == "true"
}

// Token is an exported access token (only for providers that opt in).
type Token struct {
	AccessToken string    `json:"access_token"`
	TokenType   string    `json:"token_type"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// Token returns the current access token of the user's provider
// connection, when the broker's configuration allows exporting it.
func (c *Client) Token(ctx context.Context, userToken, provider, account string) (*Token, error) {
	var out Token
	if err := c.postJSON(ctx, userToken, "/v1/token", map[string]string{"provider": provider, "account": account}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/htmlform"
)

// gatewayHost is an MCP host of one gateway endpoint (/mcp/u/{provider}),
// as TestGatewayConformanceClient drives it for each scenario: the go-sdk
// client speaking 2026-07-28 with url and form elicitation, sampling and
// roots declared, whose url elicitations a cookie-jar browser completes
// (the IdP's sign-in, the broker's consent, the upstream's authorization
// server), whose form elicitations it accepts with values the schema asks
// for, and whose sampling requests it answers with a fixed text. It keeps
// a transcript of what it did and saw, for a failing test to show.
type gatewayHost struct {
	endpoint string
	bearer   string // the host's access token for endpoint (hostToken)
	user     string

	browser *http.Client

	mu  sync.Mutex // guards log
	log strings.Builder
}

func newGatewayHost(endpoint, user string) *gatewayHost {
	jar, _ := cookiejar.New(nil)
	return &gatewayHost{endpoint: endpoint, user: user,
		browser: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
}

func (h *gatewayHost) logf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(&h.log, format+"\n", args...)
}

// Transcript is what the host did and saw.
func (h *gatewayHost) Transcript() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

// gatewayToolCall is a call a scenario asks for (MCP_CONFORMANCE_CONTEXT's
// toolCalls).
type gatewayToolCall struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

// run connects (when connect is set and the endpoint lists only its
// placeholder tool: that tool's url elicitation, the retry), then lists
// the upstream's tools and calls each (or the calls given), and reads
// every resource and prompt the endpoint declares. The first error that stops it is returned; calls
// that fail are noted and the host goes on, as a person would.
func (h *gatewayHost) run(ctx context.Context, connect bool, calls []gatewayToolCall) error {
	client := mcp.NewClient(&mcp.Implementation{Name: "credbroker-gateway-conformance-host", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{
			Form: &mcp.FormElicitationCapabilities{}, URL: &mcp.URLElicitationCapabilities{}},
			Sampling: &mcp.SamplingCapabilities{}, RootsV2: &mcp.RootCapabilities{}},
		ElicitationHandler: h.elicit,
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			h.logf("sampling request: %d messages", len(req.Params.Messages))
			return &mcp.CreateMessageResult{Model: "conformance-model", Role: "assistant", Content: &mcp.TextContent{Text: "conformance sample"}}, nil
		},
	})
	client.AddRoots(&mcp.Root{URI: "file:///conformance", Name: "conformance"})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.endpoint, DisableStandaloneSSE: true, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearerTransport{h.bearer, http.DefaultTransport}}}, nil)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", h.endpoint, err)
	}
	defer cs.Close()
	h.logf("connected to %s (protocol %s)", h.endpoint, cs.InitializeResult().ProtocolVersion)
	// While the endpoint lists only its placeholder, the person is not
	// connected (or must connect again): call it, which asks to connect,
	// and list again.
	var tools *mcp.ListToolsResult
	for round := 0; ; round++ {
		tools, err = cs.ListTools(ctx, nil)
		if err != nil {
			return fmt.Errorf("tools/list: %w", err)
		}
		h.logf("tools/list: %v", listedNames(tools.Tools))
		if len(tools.Tools) != 1 || tools.Tools[0].Name != placeholderName || !connect {
			break
		}
		if round == 3 {
			return fmt.Errorf("still not connected after %d rounds", round)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: placeholderName, Arguments: map[string]any{}})
		if err != nil {
			return fmt.Errorf("call %s: %w", placeholderName, err)
		}
		h.logf("call %s: isError=%v %s", placeholderName, res.IsError, short(resultText(res)))
		if res.IsError {
			return fmt.Errorf("%s answered with a tool error: %s", placeholderName, short(resultText(res)))
		}
	}
	if calls == nil {
		for _, t := range tools.Tools {
			calls = append(calls, gatewayToolCall{Name: t.Name, Arguments: exampleArguments(t.InputSchema)})
		}
	}
	for _, c := range calls {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.Name, Arguments: c.Arguments})
		if err != nil {
			h.logf("call %s: error: %v", c.Name, err)
			continue
		}
		h.logf("call %s: isError=%v %s", c.Name, res.IsError, short(resultText(res)))
	}
	caps := cs.InitializeResult().Capabilities
	if caps != nil && caps.Resources != nil {
		res, err := cs.ListResources(ctx, nil)
		if err != nil {
			h.logf("resources/list: error: %v", err)
		} else {
			for _, r := range res.Resources {
				_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: r.URI})
				h.logf("resources/read %s: error=%v", r.URI, err)
			}
		}
	}
	if caps != nil && caps.Prompts != nil {
		res, err := cs.ListPrompts(ctx, nil)
		if err != nil {
			h.logf("prompts/list: error: %v", err)
		} else {
			for _, p := range res.Prompts {
				args := map[string]string{}
				for _, a := range p.Arguments {
					if a.Required {
						args[a.Name] = "conformance"
					}
				}
				_, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: p.Name, Arguments: args})
				h.logf("prompts/get %s: error=%v", p.Name, err)
			}
		}
	}
	return nil
}

// elicit answers the elicitations the host is asked for: a url one by
// completing it in the browser, a form one by accepting it with
// exampleArguments of its schema.
func (h *gatewayHost) elicit(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	p := req.Params
	if p.Mode == "url" {
		h.logf("url elicitation: %s", p.Message)
		if err := h.browse(ctx, p.URL); err != nil {
			h.logf("browser: %v", err)
			return &mcp.ElicitResult{Action: "cancel"}, nil
		}
		return &mcp.ElicitResult{Action: "accept"}, nil
	}
	var schema any
	if b, err := json.Marshal(p.RequestedSchema); err == nil {
		_ = json.Unmarshal(b, &schema)
	}
	content := exampleArguments(schema)
	h.logf("form elicitation %q: accepted with %v", p.Message, content)
	return &mcp.ElicitResult{Action: "accept", Content: content}, nil
}

// browse completes a connect link as a person does: it signs in at the
// IdP when asked, approves the broker's consent page, and follows the
// redirects through the upstream's authorization server back to the
// broker, whose last page must say the account is connected.
func (h *gatewayHost) browse(ctx context.Context, link string) error {
	page, err := h.get(ctx, link)
	if err != nil {
		return err
	}
	for step := 0; step < 6; step++ {
		var extra url.Values
		var part string
		switch {
		case strings.Contains(page.body, "Connected: return to your app"):
			h.logf("browser: connected (%s)", page.url.Path)
			return nil
		case hasForm(page, "login"):
			part, extra = "login", url.Values{"username": {h.user}, "password": {h.user}}
		case hasForm(page, "/connect/"):
			part, extra = "/connect/", url.Values{"decision": {"approve"}}
		default:
			return fmt.Errorf("the browser stopped at %s (HTTP %d): %.600s", page.url.Redacted(), page.status, pageText(page.body))
		}
		target, vals, err := htmlform.Find(page.url, page.body, part, extra)
		if err != nil {
			return err
		}
		h.logf("browser: %s form on %s", part, page.url.Path)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if page, err = h.do(req); err != nil {
			return err
		}
	}
	return errors.New("the browser went round in circles")
}

// hostToken gets the host's access token for resource from the broker's
// own authorization server, as an MCP host does: dynamic registration,
// then the authorization code flow with PKCE in the person's browser (the
// IdP's sign-in and the broker's consent for the host), then the code
// exchange. The browser's redirect to the host's loopback callback is
// where it stops.
func (h *gatewayHost) hostToken(ctx context.Context, public, resource string) (string, error) {
	const redirect = "http://127.0.0.1:9/callback" // never contacted
	reg, _ := json.Marshal(map[string]any{"redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code", "refresh_token"}, "client_name": "Conformance host", "application_type": "native"})
	var client struct {
		ClientID string `json:"client_id"`
	}
	if err := postJSON(ctx, public+"/register", "application/json", reg, http.StatusCreated, &client); err != nil {
		return "", fmt.Errorf("register the host: %w", err)
	}
	verifier := randomSecret() + randomSecret()
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {client.ClientID}, "redirect_uri": {redirect}, "state": {"s"},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}, "resource": {resource}}
	br := *h.browser
	br.CheckRedirect = func(r *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(r.URL.String(), redirect) {
			return http.ErrUseLastResponse
		}
		return nil
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, public+"/authorize?"+q.Encode(), nil)
	resp, err := br.Do(req)
	for step := 0; err == nil && step < 4 && resp.StatusCode == http.StatusOK; step++ {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		page := hostPage{status: resp.StatusCode, url: resp.Request.URL, body: string(b)}
		part, extra := "/authorize/decision", url.Values{"decision": {"approve"}}
		if hasForm(page, "login") {
			part, extra = "login", url.Values{"username": {h.user}, "password": {h.user}}
		}
		target, vals, ferr := htmlform.Find(page.url, page.body, part, extra)
		if ferr != nil {
			return "", fmt.Errorf("authorizing the host: %v on %s: %.400s", ferr, page.url.Redacted(), pageText(page.body))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err = br.Do(req)
	}
	if err != nil {
		return "", fmt.Errorf("authorizing the host: %w", err)
	}
	resp.Body.Close()
	code := ""
	if loc, perr := url.Parse(resp.Header.Get("Location")); perr == nil && strings.HasPrefix(loc.String(), redirect) {
		code = loc.Query().Get("code")
	}
	if code == "" {
		return "", fmt.Errorf("authorizing the host ended with HTTP %d to %q, no code", resp.StatusCode, resp.Header.Get("Location"))
	}
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect},
		"code_verifier": {verifier}, "client_id": {client.ClientID}, "resource": {resource}}
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if err := postJSON(ctx, public+"/token", "application/x-www-form-urlencoded", []byte(form.Encode()), http.StatusOK, &tok); err != nil {
		return "", fmt.Errorf("the host's code exchange: %w", err)
	}
	h.logf("the host has a token from the broker for %s", resource)
	return tok.AccessToken, nil
}

// postJSON posts body and decodes a JSON answer of status want into out.
func postJSON(ctx context.Context, u, contentType string, body []byte, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != want {
		return fmt.Errorf("HTTP %d: %.300s", resp.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}

type hostPage struct {
	status int
	url    *url.URL
	body   string
}

func (h *gatewayHost) get(ctx context.Context, u string) (hostPage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return hostPage{}, err
	}
	return h.do(req)
}

func (h *gatewayHost) do(req *http.Request) (hostPage, error) {
	resp, err := h.browser.Do(req)
	if err != nil {
		return hostPage{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return hostPage{status: resp.StatusCode, url: resp.Request.URL, body: string(b)}, err
}

func hasForm(p hostPage, actionPart string) bool {
	_, _, err := htmlform.Find(p.url, p.body, actionPart, nil)
	return err == nil
}

// pageText is a page's text without its markup, for messages.
func pageText(body string) string {
	var b strings.Builder
	in := false
	for _, r := range body {
		switch {
		case r == '<':
			in = true
		case r == '>':
			in = false
			b.WriteByte(' ')
		case !in:
			b.WriteRune(r)
		}
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// exampleArguments makes a value for each property of an object schema
// (its default, its first enum value, or one of its type), as a person
// filling the tool's form would.
func exampleArguments(schema any) map[string]any {
	b, _ := json.Marshal(schema)
	var s struct {
		Properties map[string]map[string]any `json:"properties"`
	}
	_ = json.Unmarshal(b, &s)
	out := map[string]any{}
	for name, p := range s.Properties {
		if d, ok := p["default"]; ok {
			out[name] = d
			continue
		}
		if e, ok := p["enum"].([]any); ok && len(e) > 0 {
			out[name] = e[0]
			continue
		}
		switch p["type"] {
		case "number", "integer":
			out[name] = 1
		case "boolean":
			out[name] = true
		case "object":
			out[name] = map[string]any{}
		case "array":
			out[name] = []any{}
		case "null":
			out[name] = nil
		default:
			out[name] = "conformance"
		}
	}
	return out
}

func listedNames(tools []*mcp.Tool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Name)
	}
	slices.Sort(out)
	return out
}

// short is s cut to 300 bytes, for the transcript.
func short(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

package mcpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/connections"
	"credbroker/internal/requeststate"
	"credbroker/provider"
)

// accountChoice marks a requestState that carries a pending form
// elicitation (which account?) rather than a grant. It is never a valid
// grant id, so such a state can never resume a connect flow.
const accountChoice = "form:choose_account"

const chooseAccountKey = "choose_account"

type requestInput struct {
	Provider string                     `json:"provider"`
	Host     string                     `json:"host"`
	Method   string                     `json:"method"`
	Path     string                     `json:"path"`
	Query    map[string]json.RawMessage `json:"query"`
	Headers  map[string]string          `json:"headers"`
	Body     json.RawMessage            `json:"body"`
	Account  string                     `json:"account"`
}

func (in *requestInput) stringArgs() []stringArg {
	return []stringArg{{"provider", &in.Provider}, {"host", &in.Host}, {"method", &in.Method},
		{"path", &in.Path}, {"account", &in.Account}}
}

type requestOutput struct {
	Status       int               `json:"status"`
	Headers      map[string]string `json:"headers"`
	Body         string            `json:"body"`
	BodyEncoding string            `json:"body_encoding"` // text | base64
	Truncated    bool              `json:"truncated"`
	// Decoded names the content encoding the provider applied unasked and
	// the broker undid to check the answer for secrets.
	Decoded string `json:"decoded,omitempty"`
}

func providerRequestTool() *mcp.Tool {
	return &mcp.Tool{
		Name:  toolRequest,
		Title: "Call a provider's API",
		Description: "Call the API of a connected provider (for example GitHub's REST API) as the user: the broker adds the user's stored token, " +
			"which is never shown. path is relative to the provider's API base URL. If the account is not connected yet, the user is asked " +
			"to connect it first; give account when several accounts of the provider are connected. The answer carries the HTTP status, " +
			"selected headers (content type, pagination, rate limits) and the body (text, or base64 for binary; capped, with truncated=true when cut).",
		InputSchema: compactJSON(`{"type":"object","properties":{
"provider":{"type":"string","description":"Provider name, as listed by the broker's configuration."},
"method":{"type":"string","enum":["GET","POST","PUT","PATCH","DELETE"]},
"path":{"type":"string","description":"Path relative to the provider's API base URL, starting with /, e.g. /user/repos."},
"host":{"type":"string","description":"For a provider whose APIs live on several hosts (Google): the API host to call, e.g. gmail.googleapis.com; default: the provider's main API base URL."},
"query":{"type":"object","additionalProperties":{"anyOf":[{"type":"string"},{"type":"number"},{"type":"boolean"},{"type":"array","items":{"type":"string"}}]}},
"headers":{"type":"object","additionalProperties":{"type":"string"},"description":"Only ` + strings.Join(provider.AllowedRequestHeaders(), ", ") + `."},
"body":{"description":"Request body: a JSON value (sent as JSON) or a string (sent as is)."},
"account":{"type":"string","description":"Account login (or id), needed only when several accounts of the provider are connected."}},
"required":["provider","method","path"],"additionalProperties":false}`),
		OutputSchema: compactJSON(`{"type":"object","properties":{
"status":{"type":"integer"},"headers":{"type":"object","additionalProperties":{"type":"string"}},
"body":{"type":"string"},"body_encoding":{"type":"string","enum":["text","base64"]},"truncated":{"type":"boolean"},
"decoded":{"type":"string","description":"The content encoding (gzip, deflate) the provider applied unasked, which the broker undid to check the answer for secrets."}},
"required":["status","headers","body","body_encoding","truncated"],"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{Title: "Call a provider's API", ReadOnlyHint: false,
			DestructiveHint: boolPtr(true), IdempotentHint: false, OpenWorldHint: boolPtr(true)},
	}
}

// buildAPIRequest validates the arguments that do not depend on the
// provider's configuration.
func buildAPIRequest(in requestInput) (provider.APIRequest, error) {
	req := provider.APIRequest{Method: strings.ToUpper(in.Method), Path: in.Path, Host: in.Host}
	if !slices.Contains(provider.APIMethods(), req.Method) {
		return req, fmt.Errorf("method %s is not allowed: use %s", quote(in.Method), strings.Join(provider.APIMethods(), ", "))
	}
	if len(in.Query) > 0 {
		req.Query = url.Values{}
		for k, raw := range in.Query {
			var s string
			var list []string
			var n json.Number
			var b bool
			switch {
			case json.Unmarshal(raw, &s) == nil:
				req.Query.Add(k, s)
			case json.Unmarshal(raw, &list) == nil:
				req.Query[k] = append(req.Query[k], list...)
			case json.Unmarshal(raw, &n) == nil:
				req.Query.Add(k, n.String())
			case json.Unmarshal(raw, &b) == nil:
				req.Query.Add(k, fmt.Sprint(b))
			default:
				return req, fmt.Errorf("query parameter %s must be a string, number, boolean or list of strings", quote(k))
			}
		}
	}
	if len(in.Headers) > 0 {
		req.Header = http.Header{}
		for k, v := range in.Headers {
			req.Header.Set(k, v)
		}
	}
	if body := bytes.TrimSpace(in.Body); len(body) > 0 && string(body) != "null" {
		var s string
		if json.Unmarshal(body, &s) == nil {
			req.Body = []byte(s)
		} else {
			req.Body = body
		}
	}
	// Check path and query now, against a placeholder base, so a bad
	// request never makes anyone connect an account first.
	if _, err := provider.ResolveAPIURL("https://api.invalid", req.Path, req.Query); err != nil {
		return req, err
	}
	return req, nil
}

func (s *Server) providerRequest(ctx context.Context, c *callContext) outcome {
	var in requestInput
	if err := decodeArgs(c.args, &in); err != nil {
		return toolError("Invalid arguments: %v.", err)
	}
	p, _, err := s.opts.Connections.Resolve(in.Provider, nil)
	if err != nil {
		return s.failed(err, "", toolRequest)
	}
	req, err := buildAPIRequest(in)
	if err != nil {
		return toolError("Request refused: %v. Nothing was sent.", err)
	}
	var cont connections.Continuation
	if c.state != "" {
		ref, bad := s.continued(c, toolRequest)
		if bad != nil {
			return *bad
		}
		if ref == accountChoice {
			cont.Choosing = true
			cont.Answer, cont.Chosen, bad = c.choice(chooseAccountKey)
		} else {
			cont.Grant = ref
			cont.Answer, bad = c.answer("connect_" + p.Name)
		}
		if bad != nil {
			return *bad
		}
	}
	o, err := s.opts.Connections.Perform(ctx, c.request(p.Name, nil, in.Account), req, cont)
	if err != nil {
		return s.failed(err, p.Name, toolRequest)
	}
	switch o := o.(type) {
	case connections.Response:
		return response(o.Resp)
	case connections.NeedsUser:
		return s.askToConnect(c, toolRequest, o)
	case connections.Ambiguous:
		return s.askAccount(c, p, o.Accounts)
	case connections.Declined:
		return declined(o)
	case connections.Cancelled:
		return toolError("No request was sent. %s", o.Message(toolRequest))
	}
	return internalError()
}

// choice reads the person's answer to the account choice key from a
// retry: their action and the account they named.
func (c *callContext) choice(key string) (connections.Answer, string, *outcome) {
	a, bad := c.answer(key)
	if bad != nil || a != connections.Accept {
		return a, "", bad
	}
	chosen, _ := c.responses[key].(*mcp.ElicitResult).Content["account"].(string)
	return a, chosen, nil
}

// askAccount asks which account to use: a form elicitation (a single-select
// enum of the logins, nothing secret) when the client can show forms,
// otherwise a tool error listing the accounts.
func (s *Server) askAccount(c *callContext, p *provider.Provider, logins []string) outcome {
	if !c.modern || !c.formCapable {
		return toolError("Several %s accounts are connected; call again with account set to one of: %s.", p.DisplayName, strings.Join(logins, ", "))
	}
	digest, err := requeststate.Digest(c.args)
	if err != nil {
		return invalidParams("arguments are not valid JSON")
	}
	st := requeststate.Seal(s.opts.StateKeys, requeststate.State{Principal: c.principal, Operation: toolRequest,
		ArgDigest: digest, Ref: accountChoice, Expires: s.opts.Now().Add(s.opts.StateTTL)})
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{"account": map[string]any{
			"type": "string", "title": p.DisplayName + " account", "enum": logins,
		}},
		"required": []string{"account"},
	}
	return outcome{input: &inputRequired{
		key: chooseAccountKey,
		params: &mcp.ElicitParams{Mode: "form", RequestedSchema: schema,
			Message: fmt.Sprintf("Several %s accounts are connected. Which one should this request use?", p.DisplayName)},
		state: st,
	}}
}

// response renders the provider's answer.
func response(resp provider.APIResponse) outcome {
	out := requestOutput{Status: resp.Status, Headers: map[string]string{}, Truncated: resp.Truncated, Decoded: resp.Decoded}
	for k, vs := range resp.Header {
		out.Headers[strings.ToLower(k)] = strings.Join(vs, ", ")
	}
	out.Body, out.BodyEncoding = encodeBody(resp.Header.Get("Content-Type"), resp.Body)
	o := complete(out)
	o.isError = resp.Status >= 400
	return o
}

// encodeBody returns body as text when it is UTF-8 of a textual media type
// (or untyped), else base64.
func encodeBody(contentType string, body []byte) (string, string) {
	textual := contentType == ""
	if mt, _, err := mime.ParseMediaType(contentType); err == nil {
		textual = strings.HasPrefix(mt, "text/") || mt == "application/json" || strings.HasSuffix(mt, "+json") ||
			mt == "application/xml" || strings.HasSuffix(mt, "+xml") || mt == "application/x-www-form-urlencoded" ||
			mt == "application/javascript"
	}
	if textual && utf8.Valid(body) {
		return string(body), "text"
	}
	if textual && len(body) > 0 {
		// A truncated body may end inside a UTF-8 sequence.
		if cut := bytes.ToValidUTF8(body, nil); len(body)-len(cut) <= 3 && utf8.Valid(body[:len(cut)]) {
			return string(cut), "text"
		}
	}
	return base64.StdEncoding.EncodeToString(body), "base64"
}

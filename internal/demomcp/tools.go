package demomcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/demoprovider"
)

// newMCPHandler is the go-sdk server behind the bearer check: stateless,
// so both eras are served on the one endpoint.
func (s *Server) newMCPHandler() http.Handler {
	srv := mcp.NewServer(&mcp.Implementation{Name: "credbroker-demo-mcp", Title: "Demo MCP server", Version: "1.0.0"}, &mcp.ServerOptions{
		Logger:       s.log,
		Instructions: "A demonstration MCP server of credbroker's broker dev: echo, and a few notes per demo account.",
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Title: "Echo",
		Description: "Answers what it was sent: the arguments, the request's _meta and headers (never Authorization), and the caller's account.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.echo)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_notes", Title: "List notes",
		Description: "The demo account's notes (needs the notes:read scope).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.listNotes)
	mcp.AddTool(srv, &mcp.Tool{Name: "add_note", Title: "Add a note",
		Description: "Adds a note to the demo account (needs the notes:write scope); the last 20 are kept."}, s.addNote)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:    true,
		JSONResponse: true,
		Logger:       s.log,
		// Hosts reach it through names that resolve to loopback (tests,
		// the gateway's allowed hosts); every request needs a token anyway.
		DisableLocalhostProtection: true,
	})
	// The token was checked by serveMCP; this hands its account to the
	// tools (RequestExtra.TokenInfo). Its expiry was checked too, with the
	// provider's clock.
	verify := func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		c, ok := r.Context().Value(callKey{}).(call)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{Scopes: c.in.Scopes, UserID: c.in.Account.Login, Extra: map[string]any{extraCall: c}}, nil
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}

// EchoResult is what echo answers.
type EchoResult struct {
	Arguments map[string]any `json:"arguments"`
	Meta      map[string]any `json:"meta,omitempty"`
	// Headers are the request's headers but Authorization.
	Headers map[string][]string `json:"headers"`
	// Authorization says whether the request carried one ("withheld") or
	// not ("absent"); its value is never shown.
	Authorization string   `json:"authorization"`
	Account       string   `json:"account"`
	Scopes        []string `json:"scopes"`
}

// Notes is what list_notes and add_note answer.
type Notes struct {
	Account string   `json:"account"`
	Notes   []string `json:"notes"`
}

// NoteArgs are add_note's arguments.
type NoteArgs struct {
	Text string `json:"text" jsonschema:"the note, 1 to 500 characters"`
}

const extraCall = "credbroker/demomcp.call"

// caller is the token's introspection, which serveMCP put in the request.
// It notes that the tool runs and checks its scope again: serveMCP
// answers 403 before the go-sdk is reached, this holds whatever the
// go-sdk made of the body.
func caller(req *mcp.CallToolRequest) (demoprovider.Introspection, error) {
	var c call
	if req.Extra != nil && req.Extra.TokenInfo != nil {
		c, _ = req.Extra.TokenInfo.Extra[extraCall].(call)
	}
	if c.ran == nil {
		return demoprovider.Introspection{}, errors.New("no caller")
	}
	name := req.Params.Name
	c.ran.Store(&name)
	if need := toolScopes[name]; need != "" && !slices.Contains(c.in.Scopes, need) {
		return demoprovider.Introspection{}, fmt.Errorf("%s needs the %s scope", name, need)
	}
	return c.in, nil
}

func (s *Server) echo(_ context.Context, req *mcp.CallToolRequest, args map[string]any) (*mcp.CallToolResult, EchoResult, error) {
	in, err := caller(req)
	if err != nil {
		return nil, EchoResult{}, err
	}
	out := EchoResult{Arguments: args, Headers: map[string][]string{}, Authorization: "absent",
		Account: in.Account.Login, Scopes: slices.Clone(in.Scopes)}
	if out.Arguments == nil {
		out.Arguments = map[string]any{}
	}
	if out.Scopes == nil {
		out.Scopes = []string{}
	}
	if m := req.Params.Meta; len(m) > 0 {
		out.Meta = m
	}
	for k, v := range req.Extra.Header {
		if http.CanonicalHeaderKey(k) == "Authorization" {
			out.Authorization = "withheld"
			continue
		}
		out.Headers[k] = slices.Clone(v)
	}
	return nil, out, nil
}

func (s *Server) listNotes(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, Notes, error) {
	in, err := caller(req)
	if err != nil {
		return nil, Notes{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return nil, Notes{Account: in.Account.Login, Notes: append([]string{}, s.notes[in.Account.Login]...)}, nil
}

func (s *Server) addNote(_ context.Context, req *mcp.CallToolRequest, args NoteArgs) (*mcp.CallToolResult, Notes, error) {
	in, err := caller(req)
	if err != nil {
		return nil, Notes{}, err
	}
	if n := utf8.RuneCountInString(args.Text); n == 0 || n > maxNoteLen || !utf8.ValidString(args.Text) {
		return nil, Notes{}, fmt.Errorf("a note is 1 to %d characters of text", maxNoteLen)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	notes := append(s.notes[in.Account.Login], args.Text)
	if len(notes) > maxNotes {
		notes = slices.Delete(notes, 0, len(notes)-maxNotes)
	}
	s.notes[in.Account.Login] = notes
	return nil, Notes{Account: in.Account.Login, Notes: slices.Clone(notes)}, nil
}

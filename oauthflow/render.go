package oauthflow

import (
	"bytes"
	"credbroker/provider"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
)

// parsePages parses every page template at start-up, each with
// layout.html: the pages of this package and those a provider kind's
// browser step names (provider.RedirectStep.ConsentPage, provider.Form).
func parsePages(fsys fs.FS) (map[string]*template.Template, error) {
	files, err := fs.Glob(fsys, "*.html")
	if err != nil {
		return nil, fmt.Errorf("oauthflow: list pages: %w", err)
	}
	pages := make(map[string]*template.Template, len(files))
	for _, file := range files {
		n := strings.TrimSuffix(file, ".html")
		if n == "layout" {
			continue
		}
		t, err := template.New(n).ParseFS(fsys, "layout.html", file)
		if err != nil {
			return nil, fmt.Errorf("oauthflow: parse page %s: %w", n, err)
		}
		pages[n] = t
	}
	return pages, nil
}

// chrome is the part of every page drawn by the layout.
type chrome struct {
	Identity string // signed-in identity for display; empty when signed out
	CSRF     string
}

type scopeLine struct {
	Scope, Words string
	// New: a scope the person's connection does not hold yet (asking
	// for more access).
	New bool
}

type consentPage struct {
	Chrome   chrome
	Provider string
	Domain   string
	// ClientName is the asking client's self-asserted name (untrusted).
	ClientName string
	// Server is the configured name of the co-located server that asked
	// through the sidecar (trusted), "" for MCP clients; ServerUnnamed
	// when it used the unnamed secret.
	Server        string
	ServerUnnamed bool
	Identity      string
	Scopes        []scopeLine
	Action        string
	// Relay is the MCP server the broker relays calls to with the
	// account (type: mcp providers), "" otherwise.
	Relay string
}

type mismatchPage struct {
	Chrome    chrome
	Identity  string
	Reference string
}

type donePage struct {
	Chrome   chrome
	Provider string
	Account  string
	Scopes   []string
	// NoRefresh: stored without the refresh token the entry expects, so
	// access ends when the access token expires.
	NoRefresh bool
}

type deniedPage struct {
	Chrome   chrome
	Provider string
}

// errorPage is any failure the user must read: Heading, Message, what to do
// Next, and optionally the provider's own (untrusted, escaped) description.
type errorPage struct {
	Chrome    chrome
	Status    int
	Heading   string
	Message   string
	Detail    string
	Next      string
	Reference string
}

type connectionRow struct {
	ID, Provider, Account, Status, Created, LastUsed string
	Scopes                                           []string
	// RefreshExpires is when the refresh token expires ("" when the
	// provider did not say); NoRefresh as on donePage.
	RefreshExpires string
	NoRefresh      bool
	// Key: an API-key connection (Replace key instead of scopes).
	Key bool
}

type connectionsPage struct {
	Chrome chrome
	Notice string
	// NoticeLink (with NoticeLinkText) follows the notice: where to revoke
	// a deleted API key at its provider.
	NoticeLink, NoticeLinkText string
	Connections                []connectionRow
	Apps                       []appRow
	AppsShown                  bool
}

type signedOutPage struct{ Chrome chrome }

// setPageHeaders sets the security headers every page carries. formAction
// lists extra origins the page's forms may lead to (a redirect after a form
// submission is checked against form-action).
func setPageHeaders(h http.Header, formAction ...string) {
	fa := "'self'"
	for _, o := range formAction {
		fa += " " + o
	}
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action "+fa+"; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// render executes page into a buffer first, so a failed render is a clean 500.
func (f *Flow) render(w http.ResponseWriter, status int, page string, data any, formAction ...string) {
	var buf bytes.Buffer
	t, ok := f.pages[page]
	if !ok {
		f.log.Error("render page: no such template", "page", page)
		setPageHeaders(w.Header())
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	if err := t.ExecuteTemplate(&buf, "layout", data); err != nil {
		f.log.Error("render page", "page", page, "err", err)
		setPageHeaders(w.Header())
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	setPageHeaders(w.Header(), formAction...)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

func (f *Flow) renderMismatch(w http.ResponseWriter, p mismatchPage) {
	f.render(w, http.StatusForbidden, "mismatch", p)
}

func (f *Flow) renderDone(w http.ResponseWriter, p donePage) {
	f.render(w, http.StatusOK, "done", p)
}

func (f *Flow) renderDenied(w http.ResponseWriter, p deniedPage) {
	f.render(w, http.StatusOK, "denied", p)
}

func (f *Flow) renderError(w http.ResponseWriter, p errorPage) {
	if p.Status == 0 {
		p.Status = http.StatusBadRequest
	}
	f.render(w, p.Status, "error", p)
}

func (f *Flow) renderConnections(w http.ResponseWriter, p connectionsPage) {
	f.render(w, http.StatusOK, "connections", p)
}

func (f *Flow) renderSignedOut(w http.ResponseWriter, p signedOutPage) {
	f.render(w, http.StatusOK, "signedout", p)
}

// origin returns scheme://host of a URL, for CSP form-action.
func origin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// plainScope turns a scope into words when the provider entry gives none.
func plainScope(p *provider.Provider, s string) scopeLine {
	if w, ok := p.ScopeDescriptions[s]; ok && w != "" {
		return scopeLine{Scope: s, Words: w}
	}
	switch s {
	case "openid":
		return scopeLine{Scope: s, Words: "Confirm your identity"}
	case "email":
		return scopeLine{Scope: s, Words: "See your email address"}
	case "profile":
		return scopeLine{Scope: s, Words: "See your basic profile"}
	case "offline_access":
		return scopeLine{Scope: s, Words: "Keep access when you are not using the app"}
	}
	words := strings.NewReplacer(":", " ", "_", " ", ".", " ").Replace(s)
	return scopeLine{Scope: s, Words: "Permission “" + words + "”"}
}

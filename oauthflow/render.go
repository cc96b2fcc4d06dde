package oauthflow

import (
	"net/http"
	"strings"

	"credbroker/provider"
	"credbroker/vault"
	"credbroker/web"
)

// The pages are rendered by the browser kit (package web): every page
// template, each with layout.html, parsed at start-up, so the page a
// provider kind's browser step names (provider.RedirectStep.ConsentPage,
// provider.Form) is found by that name.

// requester is who asked for a connect request, as the consent and key
// entry pages name them.
type requester struct {
	// ClientName is the asking client's self-asserted name (untrusted),
	// web.UnnamedClient when nothing names the requester.
	ClientName string
	// Server is the configured name of the co-located server that asked
	// through the sidecar (trusted), "" for MCP clients; ServerUnnamed
	// when it used the unnamed secret.
	Server        string
	ServerUnnamed bool
	// Unnamed: nothing names the requester, as for a request the person
	// started with Connect on the connections page (a grant does not
	// record that) or one of an MCP client that gave no name.
	Unnamed bool
}

func requesterOf(g vault.Grant) requester {
	return requester{ClientName: web.ClientName(g.ClientName, g.Server), Server: g.Server, ServerUnnamed: g.Server == vault.UnnamedServer,
		Unnamed: g.ClientName == "" && g.Server == ""}
}

type consentPage struct {
	Chrome   web.Chrome
	Provider string
	Domain   string
	requester
	Identity string
	Scopes   []web.ScopeLine
	Action   string
	// Relay is the MCP server the broker relays calls to with the
	// account (type: mcp providers), "" otherwise.
	Relay string
	// Why says why the person is asked here when the broker tried to
	// connect without them first (connections.WhyAsked), "" otherwise.
	Why string
}

type mismatchPage struct {
	Chrome    web.Chrome
	Identity  string
	Reference string
}

type donePage struct {
	Chrome   web.Chrome
	Provider string
	Account  string
	Scopes   []string
	// NoRefresh: stored without the refresh token the entry expects, so
	// access ends when the access token expires.
	NoRefresh bool
}

type deniedPage struct {
	Chrome   web.Chrome
	Provider string
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
	Chrome web.Chrome
	Notice string
	// NoticeLink (with NoticeLinkText) follows the notice: where to revoke
	// a deleted API key at its provider.
	NoticeLink, NoticeLinkText string
	Connections                []connectionRow
	// Offers are the providers the person can connect here (Connect).
	Offers    []offerRow
	Apps      []appRow
	AppsShown bool
}

// offerRow is a provider the connections page offers to connect: its
// Connect button posts to /connections/{Name}/connect.
type offerRow struct {
	Name, Provider string
	// Reconnect: the person has a connection there that needs reconnecting.
	Reconnect bool
	// Key: connecting means entering an API key.
	Key bool
}

type signedOutPage struct{ Chrome web.Chrome }

// render renders page with data through the kit.
func (f *Flow) render(w http.ResponseWriter, status int, page string, data any, formAction ...string) {
	f.kit.Render(w, status, page, data, formAction...)
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

func (f *Flow) renderError(w http.ResponseWriter, p web.ErrorPage) {
	f.kit.RenderError(w, p)
}

func (f *Flow) renderConnections(w http.ResponseWriter, p connectionsPage) {
	f.render(w, http.StatusOK, "connections", p)
}

func (f *Flow) renderSignedOut(w http.ResponseWriter, p signedOutPage) {
	f.render(w, http.StatusOK, "signedout", p)
}

// plainScope turns a scope into words when the provider entry gives none.
func plainScope(p *provider.Provider, s string) web.ScopeLine {
	if w, ok := p.ScopeDescriptions[s]; ok && w != "" {
		return web.ScopeLine{Scope: s, Words: w}
	}
	if w, ok := web.ScopeWords(s); ok {
		return web.ScopeLine{Scope: s, Words: w}
	}
	words := strings.NewReplacer(":", " ", "_", " ", ".", " ").Replace(s)
	return web.ScopeLine{Scope: s, Words: "Permission “" + words + "”"}
}

package authserver

import (
	"errors"
	"net/http"

	"credbroker/internal/telemetry"
	"credbroker/vault"
	"credbroker/web"
)

// pages are the templates of package web this package renders.
var pages = []string{"app_consent", "error"}

// visitorOf is the signed-in person (ok) as the browser kit knows them;
// nil when nobody is signed in.
func visitorOf(p Person, ok bool) *web.Visitor {
	if !ok {
		return nil
	}
	return &web.Visitor{Issuer: p.Principal.Issuer, Subject: p.Principal.Subject, Display: p.Display, CSRF: p.CSRF}
}

func chromeOf(p Person) web.Chrome { return web.Chrome{Identity: p.Display, CSRF: p.CSRF} }

// scopeLines describes the extra scopes an app asks for: in the words
// every consent page uses (web.ScopeWords), else as the scope the
// administrator requires (Options.Scopes).
func scopeLines(scopes []string) []web.ScopeLine {
	var out []web.ScopeLine
	for _, sc := range scopes {
		w, ok := web.ScopeWords(sc)
		if !ok {
			w = "the permission this broker's administrator requires of apps"
		}
		out = append(out, web.ScopeLine{Scope: sc, Words: w})
	}
	return out
}

type consentPage struct {
	Chrome       web.Chrome
	ClientName   string
	Verified     string
	RedirectHost string
	// RedirectTarget is the redirect URI without its query, shown on the
	// one-click page (a loopback port is what tells two programs apart).
	RedirectTarget string
	Identity       string
	Scopes         []web.ScopeLine
	Request        string
	Action         string
	// Remembered selects the one-click confirmation of a remembered
	// consent instead of the full consent page.
	Remembered bool
	// Gateway is the gateway endpoint asked for (a remote MCP server the
	// broker relays to), "" for the broker's own MCP endpoint.
	Gateway string
}

func (s *Server) renderError(w http.ResponseWriter, p web.ErrorPage) {
	s.kit.RenderError(w, p)
}

// fail logs err with a reference and renders a generic error page.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, p Person, what string, err error) {
	if errors.Is(err, vault.ErrUnavailable) {
		s.opts.Telemetry.StoreUnavailable(telemetry.DoorPage)
		s.kit.Unavailable(w, r, chromeOf(p), what, "Go back to your app and sign in again in a few seconds.", err)
		return
	}
	s.kit.Fail(w, r, chromeOf(p), http.StatusInternalServerError, what, err)
}

package oauthflow

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"credbroker/connections"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/web"
)

// notices are the fixed messages the connections page shows after a
// redirect; a disconnect's notice is its revocation outcome.
var notices = map[string]string{
	string(provider.Revoked):      "Disconnected. The broker revoked access at the provider and deleted the stored tokens.",
	string(provider.NotSupported): "Disconnected. The stored tokens were deleted; this provider offers no way to revoke them, so you may also remove the app in the provider's settings.",
	string(provider.NotConfirmed): "Disconnected here, but the provider did not confirm the revocation. Remove the app's access in the provider's account settings to be sure.",
	string(provider.KeptShared):   "Disconnected. The stored tokens were deleted; access at the provider was not revoked because another connection uses the same provider account, and revoking would end its access too.",
	"not_found":                   "That connection does not exist (it may already be disconnected).",
	"app_removed":                 "Removed. The app's tokens are revoked: it can no longer use credbroker as you unless you allow it again.",
	"app_not_found":               "That app has no access (it may already be removed).",
	"already_connected":           "That provider is connected already; nothing new was started.",
}

// handleConnections is GET /connections: the signed-in user's connections.
func (f *Flow) handleConnections(w http.ResponseWriter, r *http.Request) {
	s := f.jar.session(r)
	if s == nil {
		f.startLogin(w, r, "/connections")
		return
	}
	conns, err := f.opts.Connections.List(r.Context(), s.principal())
	if err != nil {
		f.fail(w, r, s, http.StatusInternalServerError, "list connections", err)
		return
	}
	apps, err := f.appRows(r.Context(), s.principal())
	if err != nil {
		f.fail(w, r, s, http.StatusInternalServerError, "list apps", err)
		return
	}
	page := connectionsPage{Chrome: s.chrome(), Notice: notices[r.URL.Query().Get("notice")], Apps: apps, AppsShown: f.opts.Apps != nil}
	f.keyNotice(&page, r.URL.Query())
	for _, c := range conns {
		name := c.Provider
		p, known := f.providers.Lookup(c.Provider)
		if known {
			name = p.DisplayName
		}
		key := known && isForm(p)
		status := "Active"
		switch {
		case c.Status == vault.StatusNeedsReconnect && key:
			status = "Key rejected: replace it"
		case c.Status == vault.StatusNeedsReconnect:
			status = "Needs reconnecting"
		}
		lastUsed := "never"
		if !c.LastUsed.IsZero() {
			lastUsed = c.LastUsed.UTC().Format("2006-01-02 15:04 UTC")
		}
		row := connectionRow{
			ID: c.ID, Provider: name, Account: connections.AccountName(c), Scopes: c.Scopes, Status: status,
			Created: c.Created.UTC().Format("2006-01-02 15:04 UTC"), LastUsed: lastUsed, Key: key,
		}
		row.NoRefresh = c.Status != vault.StatusNeedsReconnect && connections.MissingRefreshToken(p, c)
		if !c.RefreshExpires.IsZero() {
			row.RefreshExpires = c.RefreshExpires.UTC().Format("2006-01-02 15:04 UTC")
		}
		page.Connections = append(page.Connections, row)
	}
	for _, p := range f.opts.Connections.Offered(conns) {
		o := offerRow{Name: p.Name, Provider: p.DisplayName, Key: isForm(p)}
		for _, c := range conns {
			o.Reconnect = o.Reconnect || c.Provider == p.Name
		}
		page.Offers = append(page.Offers, o)
	}
	f.renderConnections(w, page)
}

// handleConnect is POST /connections/{provider}/connect, the Connect
// button: a connect request of the signed-in person (connections.Connect,
// under the limits of every connect request), then its link, where the
// usual consent or key form, provider and callback follow. A refusal
// stores nothing.
func (f *Flow) handleConnect(w http.ResponseWriter, r *http.Request) {
	s, ok := f.postedForm(w, r, plainForm)
	if !ok {
		return
	}
	o, err := f.opts.Connections.Connect(r.Context(), s.principal(), r.PathValue("provider"))
	if err != nil {
		f.connectRefused(w, r, s, err)
		return
	}
	switch o := o.(type) {
	case connections.NeedsUser:
		http.Redirect(w, r, "/connect/"+o.Grant.ID, http.StatusSeeOther)
	case connections.Connected:
		f.redirectNotice(w, r, "already_connected")
	default:
		f.fail(w, r, s, http.StatusInternalServerError, "connect", fmt.Errorf("unexpected outcome %T", o))
	}
}

// connectRefused renders why the Connect button started nothing.
func (f *Flow) connectRefused(w http.ResponseWriter, r *http.Request, s *session, err error) {
	msg := connections.Describe(err, nil)
	if !strings.HasSuffix(msg, ".") {
		msg += "."
	}
	page := web.ErrorPage{Chrome: s.chrome(), Message: msg + " Nothing was connected.",
		Next: "Go back to My connections and choose again."}
	switch connections.Explain(err, nil).Class {
	case connections.NotFound:
		page.Status, page.Heading = http.StatusNotFound, "Unknown provider"
	case connections.BadRequest:
		page.Status, page.Heading = http.StatusBadRequest, "Nothing to connect"
	case connections.Refused:
		page.Status, page.Heading = http.StatusTooManyRequests, "Too many connect requests"
		page.Next = "Finish or let your open connect links expire, then try again."
	case connections.Unavailable:
		f.log.Warn("connect: provider unavailable", "provider", r.PathValue("provider"), "err", err)
		page.Status, page.Heading = http.StatusBadGateway, "Provider not reachable"
		page.Next = "Try again in a few minutes."
	default:
		f.fail(w, r, s, http.StatusInternalServerError, "connect", err)
		return
	}
	f.renderError(w, page)
}

// handleDisconnect is POST /connections/{id}/disconnect.
func (f *Flow) handleDisconnect(w http.ResponseWriter, r *http.Request) {
	s, ok := f.postedForm(w, r, plainForm)
	if !ok {
		return
	}
	d, err := f.opts.Connections.DisconnectID(r.Context(), connections.Request{Principal: s.principal(), Via: "browser"}, r.PathValue("id"))
	switch {
	case errors.Is(err, vault.ErrNotFound) && d.Provider == nil:
		// Absent and "not yours" look the same.
		f.redirectNotice(w, r, "not_found")
	case err != nil:
		f.fail(w, r, s, http.StatusInternalServerError, "disconnect", err)
	case isForm(d.Provider):
		// Nothing to revoke remotely: say so, with where to revoke it.
		f.redirectNotice(w, r, noticeKeyDeleted+"&provider="+url.QueryEscape(d.Provider.Name))
	default:
		f.redirectNotice(w, r, string(d.Revocation))
	}
}

func (f *Flow) redirectNotice(w http.ResponseWriter, r *http.Request, notice string) {
	http.Redirect(w, r, "/connections?notice="+notice, http.StatusSeeOther)
}

// handleLogout is POST /logout.
func (f *Flow) handleLogout(w http.ResponseWriter, r *http.Request) {
	s := f.jar.session(r)
	if s != nil && !f.kit.PostedForm(w, r, s.visitor(), plainForm) {
		return
	}
	f.jar.clear(w, "session")
	f.jar.clear(w, "flow")
	f.jar.markLoggedOut(w)
	if s != nil && f.keepIdP {
		// Signed out here: the broker no longer acts on the person's IdP
		// session (the next sign-in brings a new one).
		if err := f.opts.Connections.ForgetIdPSession(r.Context(), s.principal()); err != nil {
			f.log.Warn("sign-out: the IdP session was not forgotten", "err", err)
		}
	}
	f.renderSignedOut(w, signedOutPage{})
}

// isForm reports whether p connects through a form step (a key the person
// entered, which the broker cannot revoke).
func isForm(p *provider.Provider) bool {
	if p == nil {
		return false
	}
	_, ok := p.Kind.(provider.FormStep)
	return ok
}

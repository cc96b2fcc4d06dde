package oauthflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"credbroker/binding"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// notices are the fixed messages the connections page shows after a redirect.
var notices = map[string]string{
	"disconnected":  "Disconnected. The broker revoked access at the provider and deleted the stored tokens.",
	"deleted":       "Disconnected. The stored tokens were deleted; this provider offers no way to revoke them, so you may also remove the app in the provider's settings.",
	"revoke_failed": "Disconnected here, but the provider did not confirm the revocation. Remove the app's access in the provider's account settings to be sure.",
	"not_found":     "That connection does not exist (it may already be disconnected).",
}

// handleConnections is GET /connections: the signed-in user's connections.
func (f *Flow) handleConnections(w http.ResponseWriter, r *http.Request) {
	s := f.jar.session(r)
	if s == nil {
		f.startLogin(w, r, "/connections")
		return
	}
	conns, err := f.opts.Store.ListConnections(r.Context(), s.principal())
	if err != nil {
		f.fail(w, r, s, http.StatusInternalServerError, "list connections", err)
		return
	}
	page := connectionsPage{Chrome: s.chrome(), Notice: notices[r.URL.Query().Get("notice")]}
	for _, c := range conns {
		name := c.Provider
		if p, ok := f.opts.Providers.Lookup(c.Provider); ok {
			name = p.DisplayName
		}
		status := "Active"
		if c.Status == vault.StatusNeedsReconnect {
			status = "Needs reconnecting"
		}
		page.Connections = append(page.Connections, connectionRow{
			ID: c.ID, Provider: name, Account: c.AccountLogin, Scopes: c.Scopes, Status: status,
			Created: c.Created.UTC().Format("2006-01-02 15:04 UTC"),
		})
	}
	f.renderConnections(w, page)
}

// handleDisconnect is POST /connections/{id}/disconnect.
func (f *Flow) handleDisconnect(w http.ResponseWriter, r *http.Request) {
	s := f.jar.session(r)
	if s == nil {
		f.signedOutPost(w)
		return
	}
	if !f.checkForm(w, r, s) {
		return
	}
	c, err := f.opts.Store.GetConnection(r.Context(), r.PathValue("id"))
	if errors.Is(err, vault.ErrNotFound) || err == nil && !binding.SamePrincipal(c.Principal, s.principal()) {
		// Absent and "not yours" look the same.
		f.redirectNotice(w, r, "not_found")
		return
	}
	if err != nil {
		f.fail(w, r, s, http.StatusInternalServerError, "get connection", err)
		return
	}
	notice := "deleted"
	revoked, err := f.Revoke(r.Context(), c)
	revocation := "not_revoked"
	switch {
	case err != nil:
		f.log.Warn("revocation failed; deleting anyway", "provider", c.Provider, "connection", c.ID, "err", err)
		notice, revocation = "revoke_failed", "failed"
	case revoked:
		notice, revocation = "disconnected", "revoked"
	}
	if p, ok := f.opts.Providers.Lookup(c.Provider); ok && p.RevocationStyle != "" {
		f.audit(r.Context(), telemetry.Event{Kind: telemetry.EventRevoke, Principal: c.Principal, Provider: c.Provider,
			Account: c.AccountLogin, Connection: c.ID, Outcome: revocation, Err: err})
	}
	if err := f.opts.Store.DeleteConnection(r.Context(), c.ID); err != nil && !errors.Is(err, vault.ErrNotFound) {
		f.fail(w, r, s, http.StatusInternalServerError, "delete connection", err)
		return
	}
	f.log.Info("connection deleted", "provider", c.Provider, "connection", c.ID, "revoked", revoked)
	f.audit(r.Context(), telemetry.Event{Kind: telemetry.EventDisconnect, Principal: c.Principal, Provider: c.Provider,
		Account: c.AccountLogin, Connection: c.ID})
	f.redirectNotice(w, r, notice)
}

func (f *Flow) redirectNotice(w http.ResponseWriter, r *http.Request, notice string) {
	setPageHeaders(w.Header())
	http.Redirect(w, r, "/connections?notice="+notice, http.StatusSeeOther)
}

// handleLogout is POST /logout.
func (f *Flow) handleLogout(w http.ResponseWriter, r *http.Request) {
	s := f.jar.session(r)
	if s != nil && !f.checkForm(w, r, s) {
		return
	}
	f.jar.clear(w, "session")
	f.jar.clear(w, "flow")
	f.jar.markLoggedOut(w)
	f.renderSignedOut(w, signedOutPage{})
}

const revokeTimeout = 15 * time.Second

// Revoke asks the provider to revoke c's tokens: RFC 7009 (the refresh
// token when there is one, since that ends the whole grant) or GitHub's
// grant deletion. It returns (false, nil) when the provider has no
// revocation configured.
func (f *Flow) Revoke(ctx context.Context, c vault.Connection) (bool, error) {
	p, ok := f.opts.Providers.Lookup(c.Provider)
	if !ok || p.RevocationStyle == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	var req *http.Request
	var err error
	switch p.RevocationStyle {
	case RevokeRFC7009:
		form := url.Values{}
		if rt := c.Token.RefreshToken.Reveal(); rt != "" {
			form.Set("token", rt)
			form.Set("token_type_hint", "refresh_token")
		} else {
			form.Set("token", c.Token.AccessToken.Reveal())
			form.Set("token_type_hint", "access_token")
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, p.RevocationURL, strings.NewReader(form.Encode()))
		if err != nil {
			return false, fmt.Errorf("oauthflow: revoke %s: %w", p.Name, err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	case RevokeGitHubGrant:
		body, _ := json.Marshal(map[string]string{"access_token": c.Token.AccessToken.Reveal()})
		u := strings.ReplaceAll(p.RevocationURL, "{client_id}", url.PathEscape(p.ClientID))
		req, err = http.NewRequestWithContext(ctx, http.MethodDelete, u, bytes.NewReader(body))
		if err != nil {
			return false, fmt.Errorf("oauthflow: revoke %s: %w", p.Name, err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/vnd.github+json")
	default:
		return false, nil
	}
	req.SetBasicAuth(url.QueryEscape(p.ClientID), url.QueryEscape(p.ClientSecret.Reveal()))
	// Never redirected: a 307/308 would replay the token elsewhere.
	resp, err := noRedirectClient(f.client).Do(req)
	if err != nil {
		return false, fmt.Errorf("oauthflow: revoke %s: %w", p.Name, err)
	}
	defer resp.Body.Close()
	_, _ = readLimited(resp.Body, 64<<10)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return true, nil
	case resp.StatusCode == http.StatusNotFound && p.RevocationStyle == RevokeGitHubGrant:
		// GitHub answers 404 when the token or grant no longer exists.
		return true, nil
	}
	return false, fmt.Errorf("oauthflow: revoke %s: HTTP %d", p.Name, resp.StatusCode)
}

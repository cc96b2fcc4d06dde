package oauthflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/binding"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// callbackParams is the provider's answer at the redirect URI, as parsed
// from the untrusted query string.
type callbackParams struct {
	Code, State, Error, ErrorDescription string
}

// parseCallback validates the callback query: each parameter at most once,
// bounded length, and either a code or an error.
func parseCallback(rawQuery string) (callbackParams, error) {
	if len(rawQuery) > 8192 {
		return callbackParams{}, errors.New("query too long")
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return callbackParams{}, fmt.Errorf("malformed query: %w", err)
	}
	var p callbackParams
	for k, dst := range map[string]*string{"code": &p.Code, "state": &p.State, "error": &p.Error, "error_description": &p.ErrorDescription} {
		v := q[k]
		if len(v) > 1 {
			return callbackParams{}, fmt.Errorf("parameter %s repeated", k)
		}
		if len(v) == 1 {
			*dst = v[0]
		}
	}
	if len(p.Code) > 2048 || len(p.State) > 512 || len(p.Error) > 128 {
		return callbackParams{}, errors.New("parameter too long")
	}
	if p.State == "" {
		return callbackParams{}, errors.New("no state")
	}
	if p.Error == "" && p.Code == "" {
		return callbackParams{}, errors.New("neither code nor error")
	}
	for _, r := range p.Error {
		if r < 0x20 || r > 0x7e {
			return callbackParams{}, errors.New("error code has invalid characters")
		}
	}
	p.ErrorDescription = truncate(p.ErrorDescription, 300)
	return p, nil
}

// handleProviderCallback is GET /oauth/{provider}/callback.
func (f *Flow) handleProviderCallback(w http.ResponseWriter, r *http.Request) {
	pname := r.PathValue("provider")
	s := f.jar.session(r)
	fs, haveFlow := f.jar.flow(r)
	restart := "Go back to your app and ask it to connect again; it will give you a fresh link."
	if !haveFlow {
		f.securityEvent(r, "callback_without_flow", s, "provider", pname)
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "Connection attempt not recognised",
			Message: "This browser has no connection in progress that matches this answer from the provider (it may have expired, finished already, or been started in another browser). Nothing was connected.",
			Next:    restart})
		return
	}
	cp, err := parseCallback(r.URL.RawQuery)
	if err != nil || fs.Provider != pname || !equalToken(cp.State, fs.State) {
		f.securityEvent(r, "callback_state_mismatch", s, "provider", pname, "grant_ref", reference(fs.Grant))
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "Connection attempt not recognised",
			Message: "The answer from the provider does not match the connection this browser started. Nothing was connected.",
			Next:    "Open the link from your app again and approve once more."})
		return
	}
	// The state matched: this flow cookie is spent whatever happens next.
	f.jar.clear(w, "flow")
	if s == nil {
		f.renderError(w, errorPage{Status: http.StatusUnauthorized, Heading: "You are signed out",
			Message: "Your broker sign-in expired while you were at the provider, so the connection could not be checked and nothing was connected.",
			Next:    "Open the link from your app again; you will sign in and approve once more."})
		return
	}
	g, p, ok := f.loadGrant(w, r, s, fs.Grant, "callback")
	if !ok {
		return
	}
	if g.State != vault.GrantApproved || p.Name != pname {
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusConflict, Heading: "Connection not approved",
			Message: "This connection was not approved in this browser. Nothing was connected.", Next: "Open the link from your app again."})
		return
	}
	if cp.Error != "" {
		f.providerError(w, r, s, p, g, cp)
		return
	}
	conf, op, err := f.providerConfig(r.Context(), p)
	if err != nil {
		f.providerUnavailable(w, r, s, p, err)
		return
	}
	conf.Scopes = fs.Scopes
	ctx := f.clientCtx(r.Context())
	var opts []oauth2.AuthCodeOption
	if fs.Verifier != "" {
		opts = append(opts, oauth2.VerifierOption(fs.Verifier))
	}
	tok, err := conf.Exchange(f.tokenCtx(r.Context()), cp.Code, opts...)
	if err != nil {
		f.exchangeFailed(w, s, p, err)
		return
	}
	acct, err := f.findAccount(ctx, p, op, tok, fs.Nonce)
	if err != nil {
		f.log.Warn("provider account lookup failed", "provider", p.Name, "err", err)
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadGateway, Heading: "Could not confirm your " + p.DisplayName + " account",
			Message: p.DisplayName + " signed you in, but the broker could not confirm which account it was, so nothing was stored.",
			Next:    "Open the link from your app again. If it keeps happening, tell your administrator."})
		return
	}
	conn, err := f.storeConnection(r.Context(), s.principal(), p, acct, tok, fs.Scopes)
	if err != nil {
		f.fail(w, r, s, http.StatusInternalServerError, "store connection", err)
		return
	}
	if _, err := f.opts.Grants.Complete(r.Context(), g.ID, s.principal(), conn.ID); err != nil {
		if conn.Version == 1 {
			// Nothing else can reference a connection created a moment ago.
			_ = f.opts.Store.DeleteConnection(context.WithoutCancel(r.Context()), conn.ID)
		}
		if errors.Is(err, binding.ErrClosed) || errors.Is(err, binding.ErrExpired) {
			f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusGone, Heading: "This connect link can no longer be used",
				Message: "The link expired or was used while you were at " + p.DisplayName + ". Nothing new was stored.", Next: restart})
			return
		}
		f.fail(w, r, s, http.StatusInternalServerError, "complete grant", err)
		return
	}
	f.log.Info("connection stored", "provider", p.Name, "connection", conn.ID, "grant_ref", reference(g.ID), "updated", conn.Version > 1)
	f.audit(r.Context(), telemetry.Event{Kind: telemetry.EventConnect, Principal: s.principal(), Provider: p.Name,
		Account: conn.AccountLogin, Grant: g.ID, Connection: conn.ID})
	f.renderDone(w, donePage{Chrome: s.chrome(), Provider: p.DisplayName, Account: conn.AccountLogin, Scopes: conn.Scopes})
}

func (f *Flow) providerError(w http.ResponseWriter, r *http.Request, s *session, p *Provider, g vault.Grant, cp callbackParams) {
	f.log.Info("provider returned an error", "provider", p.Name, "error", cp.Error, "grant_ref", reference(g.ID))
	if cp.Error == "access_denied" {
		if _, err := f.opts.Grants.Deny(r.Context(), g.ID, s.principal()); err != nil {
			f.log.Warn("deny grant after access_denied", "err", err)
		}
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusForbidden, Heading: "Not connected: access was refused at " + p.DisplayName,
			Message: p.DisplayName + " reported that access was not granted. Nothing was connected and the app has been told.",
			Detail:  cp.ErrorDescription, Next: "If this was a mistake, ask your app to start the connection again."})
		return
	}
	f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadGateway, Heading: p.DisplayName + " reported an error",
		Message: p.DisplayName + " did not complete the connection (error " + strconv.Quote(cp.Error) + "). Nothing was connected.",
		Detail:  cp.ErrorDescription, Next: "Open the link from your app again. If it keeps happening, tell your administrator."})
}

func (f *Flow) exchangeFailed(w http.ResponseWriter, s *session, p *Provider, err error) {
	f.log.Warn("provider code exchange failed", "provider", p.Name, "err", describeTokenErr(err))
	var re *oauth2.RetrieveError
	if errors.As(err, &re) && (re.ErrorCode == "invalid_grant" || re.ErrorCode == "bad_verification_code") {
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "The authorization was already used or has expired",
			Message: p.DisplayName + " did not accept the authorization code. Nothing was connected.",
			Next:    "Open the link from your app again and approve once more."})
		return
	}
	f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadGateway, Heading: p.DisplayName + " did not answer properly",
		Message: "The broker could not finish the connection with " + p.DisplayName + ". Nothing was connected.",
		Next:    "Try again in a few minutes: go back to your app and ask it to connect again."})
}

// account is the provider account a token belongs to.
type account struct{ ID, Login string }

const maxAccountBody = 1 << 20

// findAccount learns which provider account was connected: the verified
// ID token for OIDC providers (nonce checked), or the account endpoint.
func (f *Flow) findAccount(ctx context.Context, p *Provider, op *oidc.Provider, tok *oauth2.Token, nonce string) (account, error) {
	if op != nil {
		raw, _ := tok.Extra("id_token").(string)
		if raw == "" {
			return account{}, errors.New("no id_token in the token response")
		}
		idt, err := op.Verifier(&oidc.Config{ClientID: p.ClientID, Now: f.now}).Verify(ctx, raw)
		if err != nil {
			return account{}, fmt.Errorf("id_token: %w", err)
		}
		if nonce != "" && !equalToken(idt.Nonce, nonce) {
			return account{}, errors.New("id_token nonce does not match")
		}
		var c struct {
			Email string `json:"email"`
			User  string `json:"preferred_username"`
			Name  string `json:"name"`
		}
		_ = idt.Claims(&c)
		a := account{ID: idt.Subject, Login: firstNonEmpty(c.Email, c.User, c.Name, idt.Subject)}
		if p.AccountURL == "" {
			return a, nil
		}
	}
	if p.AccountURL == "" {
		return account{}, errors.New("no account endpoint configured")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.AccountURL, nil)
	if err != nil {
		return account{}, err
	}
	req.Header.Set("Accept", "application/json")
	tok.SetAuthHeader(req)
	resp, err := f.client.Do(req)
	if err != nil {
		return account{}, fmt.Errorf("account endpoint: %w", err)
	}
	defer resp.Body.Close()
	body, err := readLimited(resp.Body, maxAccountBody)
	if err != nil {
		return account{}, fmt.Errorf("account endpoint: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return account{}, fmt.Errorf("account endpoint: HTTP %d", resp.StatusCode)
	}
	return parseAccount(body, p.AccountIDField, p.AccountLoginField)
}

// parseAccount extracts the id and login fields from an account document.
// Numbers and strings are accepted for either.
func parseAccount(body []byte, idField, loginField string) (account, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		return account{}, fmt.Errorf("account endpoint: not a JSON object")
	}
	field := func(name string) string {
		raw, ok := doc[name]
		if !ok {
			return ""
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
		var n json.Number
		if json.Unmarshal(raw, &n) == nil {
			return n.String()
		}
		return ""
	}
	a := account{ID: field(idField), Login: field(loginField)}
	if a.ID == "" || len(a.ID) > 256 || strings.ContainsAny(a.ID, "\x00\r\n") {
		return account{}, fmt.Errorf("account endpoint: field %q missing or invalid", idField)
	}
	a.Login = truncate(strings.ToValidUTF8(a.Login, ""), 256)
	if a.Login == "" {
		a.Login = a.ID
	}
	return a, nil
}

// storeConnection saves the tokens: an existing connection to the same
// provider account of the same principal is updated, never duplicated.
func (f *Flow) storeConnection(ctx context.Context, pr vault.Principal, p *Provider, a account, tok *oauth2.Token, scopes []string) (vault.Connection, error) {
	ts := vault.TokenSet{
		AccessToken: vault.Secret(tok.AccessToken), RefreshToken: vault.Secret(tok.RefreshToken),
		TokenType: tok.Type(), Expiry: tok.Expiry,
	}
	if raw, ok := tok.Extra("id_token").(string); ok {
		ts.IDToken = vault.Secret(raw)
	}
	if granted, ok := tok.Extra("scope").(string); ok && granted != "" {
		scopes = strings.FieldsFunc(granted, func(r rune) bool { return r == ' ' || r == ',' })
	}
	now := f.now()
	existing, err := f.opts.Store.ListConnections(ctx, pr)
	if err != nil {
		return vault.Connection{}, err
	}
	for _, c := range existing {
		if c.Provider != p.Name || c.AccountID != a.ID {
			continue
		}
		return f.opts.Store.UpdateConnection(ctx, c.ID, func(old vault.Connection) (vault.Connection, error) {
			keepRefresh := old.Token.RefreshToken
			old.Token = ts
			if old.Token.RefreshToken == "" {
				old.Token.RefreshToken = keepRefresh
			}
			old.AccountLogin, old.Scopes, old.Status, old.Updated = a.Login, scopes, vault.StatusActive, now
			return old, nil
		})
	}
	return f.opts.Store.CreateConnection(ctx, vault.Connection{
		ID: "conn_" + binding.NewID(), Principal: pr, Provider: p.Name, AccountID: a.ID, AccountLogin: a.Login,
		Scopes: scopes, Token: ts, Status: vault.StatusActive, Created: now, Updated: now,
	})
}

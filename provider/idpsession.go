package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// The person's session at the organisation's IdP: what the broker's own
// sign-in got when it asked for offline access (a refresh token, and the
// ID token), kept sealed in the store (vault.IdPSessionStore) so that the
// broker can present a fresh ID token of the person to the IdP later,
// when an enterprise entry asks for an ID-JAG (idjag.go). The ID token is
// used while it lives; after, the refresh token gets a new one, once at a
// time per person across replicas (the store's lock), the rotated refresh
// token stored (compare-and-swap) before the ID token is used. Neither
// token ever leaves this file but to the IdP's token endpoint.

// OrgIdP is the organisation's identity provider as the broker's client
// there: the broker signs people in at Issuer as ClientID (the --issuer
// and --client-id of the broker), and asks it for ID-JAGs as the same
// client.
type OrgIdP struct {
	Issuer       string
	ClientID     string
	ClientSecret vault.Secret
}

// idTokenMargin: a stored ID token expiring sooner is not presented to
// the IdP (it would expire on the way); a new one is fetched.
const idTokenMargin = time.Minute

// idpName keys the IdP's discovery among the providers' (no entry name
// has a NUL).
const idpName = "\x00idp"

// KeepIdPSession stores what the broker's sign-in of pr got from the
// IdP: tok is the code exchange's answer (with a refresh token when the
// IdP granted offline access) whose ID token the caller verified, expiring
// at idExpiry. A sign-in without a refresh token keeps the one the
// person's session held (IdPs may issue it at the first consent only).
// Without a session store (no enterprise entry) it does nothing.
func (k *Client) KeepIdPSession(ctx context.Context, pr vault.Principal, tok *oauth2.Token, idExpiry time.Time) error {
	st := k.opts.IdPSessions
	if st == nil || tok == nil {
		return nil
	}
	raw, _ := tok.Extra("id_token").(string)
	now := k.opts.Now()
	s := vault.IdPSession{Principal: pr, RefreshToken: vault.Secret(tok.RefreshToken), IDToken: vault.Secret(raw),
		IDTokenExpires: idExpiry, Created: now, Updated: now}
	if s.RefreshToken == "" {
		if old, err := st.GetIdPSession(ctx, pr); err == nil {
			s.RefreshToken = old.RefreshToken
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.opts.SaveTimeout)
	defer cancel()
	if _, err := st.PutIdPSession(sctx, s); err != nil {
		return fmt.Errorf("provider: keep the IdP session: %w", err)
	}
	k.log.Info("provider: IdP session kept", "iss", pr.Issuer, "sub", pr.Subject, "refresh_token", s.RefreshToken != "")
	return nil
}

// ForgetIdPSession removes pr's IdP session (sign-out, offboarding) and
// reports whether there was one.
func (k *Client) ForgetIdPSession(ctx context.Context, pr vault.Principal) (bool, error) {
	if k.opts.IdPSessions == nil {
		return false, nil
	}
	err := k.opts.IdPSessions.DeleteIdPSession(ctx, pr)
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("provider: forget the IdP session: %w", err)
	}
	return true, nil
}

// NeedsIdPSessions reports whether an entry of the catalogue connects by
// assertions (mcp.auth: enterprise), for which the broker keeps people's
// IdP sessions.
func (r *Registry) NeedsIdPSessions() bool {
	for _, name := range r.Names() {
		p, _ := r.Lookup(name)
		if a, ok := p.Kind.(AssertionStep); ok && a.assertionEnabled() {
			return true
		}
	}
	return false
}

// idToken returns a fresh ID token of pr for the IdP's token exchange:
// the stored one while it lives, else one the IdP issues for the stored
// refresh token. Failures are *AssertionRefusedError (no session, the
// session ended at the IdP) or unavailable ones.
func (k *Client) idToken(ctx context.Context, pr vault.Principal) (string, error) {
	st := k.opts.IdPSessions
	if st == nil || k.opts.IdP == nil {
		return "", refusal(telemetry.UpstreamIDJAGNoSession, "the broker keeps no sessions at the organisation's IdP (no --issuer client configured for it)")
	}
	s, err := st.GetIdPSession(ctx, pr)
	if done, tok, err := k.usableIDToken(s, err); done {
		return tok, err
	}
	// Once at a time per person, across replicas: a rotating refresh
	// token spent twice looks like theft to the IdP.
	sum := sha256.Sum256([]byte(pr.Issuer + "\x00" + pr.Subject))
	unlock, err := k.locker.LockConnection(ctx, "idp-session/"+hex.EncodeToString(sum[:16]))
	if err != nil {
		return "", fmt.Errorf("%w: lock the IdP session: %w", ErrProviderUnavailable, err)
	}
	defer unlock()
	s, err = st.GetIdPSession(ctx, pr)
	if done, tok, err := k.usableIDToken(s, err); done {
		return tok, err // refreshed by another caller meanwhile
	}
	return k.refreshIDToken(ctx, s)
}

// usableIDToken answers idToken from the stored session when it can
// (done): its ID token while it lives, or why there is none to refresh.
func (k *Client) usableIDToken(s vault.IdPSession, err error) (done bool, tok string, _ error) {
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return true, "", refusal(telemetry.UpstreamIDJAGNoSession, "the broker holds no session of yours at the organisation's IdP: sign in to the broker again")
	case errors.Is(err, vault.ErrDecrypt), errors.Is(err, vault.ErrUnknownKey), errors.Is(err, vault.ErrMalformed):
		// Sealed with a key the broker no longer holds: as if absent
		// (the next sign-in writes it again).
		return true, "", refusal(telemetry.UpstreamIDJAGNoSession, "the broker cannot read your session at the organisation's IdP: sign in to the broker again")
	case err != nil:
		return true, "", fmt.Errorf("provider: read the IdP session: %w", err)
	case s.IDToken != "" && k.opts.Now().Add(idTokenMargin).Before(s.IDTokenExpires):
		return true, s.IDToken.Reveal(), nil
	case s.RefreshToken == "":
		return true, "", refusal(telemetry.UpstreamIDJAGNoSession, "your sign-in at the organisation's IdP has expired and the broker holds no refresh token for it: sign in to the broker again")
	}
	return false, "", nil
}

// refreshIDToken spends s's refresh token at the IdP (never re-sent, as
// a provider refresh), verifies the new ID token (this IdP, this client,
// the same person) and stores the rotated refresh token before the ID
// token is used.
func (k *Client) refreshIDToken(ctx context.Context, s vault.IdPSession) (string, error) {
	op, err := k.discover(ctx, idpName, k.opts.IdP.Issuer)
	if err != nil {
		return "", fmt.Errorf("%w: the organisation's IdP: %v", ErrProviderUnavailable, err)
	}
	ep := op.Endpoint()
	ep.AuthStyle = oauth2.AuthStyleInHeader
	conf := oauth2.Config{ClientID: k.opts.IdP.ClientID, ClientSecret: k.opts.IdP.ClientSecret.Reveal(), Endpoint: ep,
		Scopes: []string{oidc.ScopeOpenID}}
	hctx := context.WithValue(ctx, oauth2.HTTPClient, NoRedirectClient(k.opts.HTTPClient))
	tok, err := conf.TokenSource(hctx, &oauth2.Token{RefreshToken: s.RefreshToken.Reveal()}).Token()
	var re *oauth2.RetrieveError
	switch {
	case errors.As(err, &re) && grantRefused(re.ErrorCode):
		// The session ended at the IdP (signed out there, revoked, the
		// person no longer vouched for): forget it, so later calls do not
		// ask again.
		if derr := k.opts.IdPSessions.DeleteIdPSession(context.WithoutCancel(ctx), s.Principal); derr != nil && !errors.Is(derr, vault.ErrNotFound) {
			k.log.Warn("provider: forgetting an ended IdP session failed", "err", derr)
		}
		return "", refusal(telemetry.UpstreamIDJAGSessionEnded, "your session at the organisation's IdP has ended (it refused the broker's refresh token): sign in to the broker again")
	case err != nil:
		return "", fmt.Errorf("%w: the organisation's IdP refresh: %s", ErrProviderUnavailable, describeRefreshErr(err))
	}
	raw, _ := tok.Extra("id_token").(string)
	now := k.opts.Now()
	var idExp time.Time
	var verr error
	if raw == "" {
		verr = errors.New("its refresh answer carries no ID token")
	} else if idt, err := op.Verifier(&oidc.Config{ClientID: k.opts.IdP.ClientID, Now: k.opts.Now}).Verify(ctx, raw); err != nil {
		verr = fmt.Errorf("its new ID token did not verify: %v", err)
	} else if idt.Issuer != s.Principal.Issuer || idt.Subject != s.Principal.Subject {
		verr = errors.New("its new ID token names another person")
	} else {
		idExp = idt.Expiry
	}
	spent := s.RefreshToken
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.opts.SaveTimeout)
	defer cancel()
	_, err = k.opts.IdPSessions.UpdateIdPSession(sctx, s.Principal, func(old vault.IdPSession) (vault.IdPSession, error) {
		if old.RefreshToken != spent {
			return old, errRotatedElsewhere
		}
		if tok.RefreshToken != "" {
			old.RefreshToken = vault.Secret(tok.RefreshToken)
		}
		if verr == nil {
			old.IDToken, old.IDTokenExpires = vault.Secret(raw), idExp
		}
		old.Updated = now
		return old, nil
	})
	switch {
	case errors.Is(err, errRotatedElsewhere):
		return "", fmt.Errorf("%w: the IdP session changed meanwhile; try again", ErrProviderUnavailable)
	case err != nil:
		k.log.Error("provider: saving the refreshed IdP session failed; its ID token is not used", "err", err)
		return "", fmt.Errorf("%w: save the IdP session: %w", ErrProviderUnavailable, err)
	case verr != nil:
		return "", fmt.Errorf("%w: the organisation's IdP: %v", ErrProviderUnavailable, verr)
	}
	return raw, nil
}

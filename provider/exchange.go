package provider

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/internal/untrusted"
	"credbroker/vault"
)

// Errors of Exchange, for the browser flow to explain.
var (
	// ErrCodeRejected: the provider refused the authorization code
	// (already used, expired, or not issued for this client).
	ErrCodeRejected = errors.New("provider: the authorization code was refused")
	// ErrAccountUnknown: the provider issued tokens, but which account
	// they belong to could not be established.
	ErrAccountUnknown = errors.New("provider: the connected account could not be established")
)

// Account is the provider account a token set belongs to.
type Account struct {
	// ID is the provider's stable account id (GitHub numeric id, OIDC sub).
	ID string
	// Login is the display login or email.
	Login string
}

// Exchanged is the result of a code exchange: who, what was granted, and
// the token set, which only the connections layer's store may receive.
type Exchanged struct {
	Account Account
	// Scopes are the scopes the provider says it granted (its "scope"
	// answer), or the requested ones when it does not say.
	Scopes []string
	Token  vault.TokenSet
}

// Exchange redeems an authorization code at p's token endpoint (PKCE
// verifier when set; never following a redirect) and establishes the
// connected account: the verified ID token (with nonce) for OIDC
// providers, or the account endpoint. requested are the scopes asked for.
func (k *Client) Exchange(ctx context.Context, p *Provider, redirectURL, code, verifier, nonce string, requested []string) (Exchanged, error) {
	conf, op, err := k.OAuthConfig(ctx, p, redirectURL)
	if err != nil {
		return Exchanged{}, fmt.Errorf("%w: %v", ErrProviderUnavailable, err)
	}
	conf.Scopes = requested
	var opts []oauth2.AuthCodeOption
	if verifier != "" {
		opts = append(opts, oauth2.VerifierOption(verifier))
	}
	tok, err := conf.Exchange(k.TokenContext(ctx), code, opts...)
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && (re.ErrorCode == "invalid_grant" || re.ErrorCode == "bad_verification_code") {
			return Exchanged{}, fmt.Errorf("%w: %s", ErrCodeRejected, DescribeTokenError(err))
		}
		return Exchanged{}, fmt.Errorf("%w: %s", ErrProviderUnavailable, DescribeTokenError(err))
	}
	acct, err := k.findAccount(k.HTTPContext(ctx), p, op, tok, nonce)
	if err != nil {
		return Exchanged{}, fmt.Errorf("%w: %v", ErrAccountUnknown, err)
	}
	out := Exchanged{Account: acct, Scopes: requested, Token: TokenSet(tok)}
	if granted, ok := tok.Extra("scope").(string); ok && granted != "" {
		out.Scopes = strings.FieldsFunc(granted, func(r rune) bool { return r == ' ' || r == ',' })
	}
	return out, nil
}

const maxAccountBody = 1 << 20

// findAccount learns which provider account was connected: the verified
// ID token for OIDC providers (nonce checked), or the account endpoint.
func (k *Client) findAccount(ctx context.Context, p *Provider, op *oidc.Provider, tok *oauth2.Token, nonce string) (Account, error) {
	if op != nil {
		raw, _ := tok.Extra("id_token").(string)
		if raw == "" {
			return Account{}, errors.New("no id_token in the token response")
		}
		idt, err := op.Verifier(&oidc.Config{ClientID: p.ClientID, Now: k.opts.Now}).Verify(ctx, raw)
		if err != nil {
			return Account{}, fmt.Errorf("id_token: %w", err)
		}
		if nonce != "" && !equalToken(idt.Nonce, nonce) {
			return Account{}, errors.New("id_token nonce does not match")
		}
		var c struct {
			Email string `json:"email"`
			User  string `json:"preferred_username"`
			Name  string `json:"name"`
		}
		_ = idt.Claims(&c)
		a := Account{ID: idt.Subject, Login: FirstNonEmpty(c.Email, c.User, c.Name, idt.Subject)}
		if p.AccountURL == "" {
			return a, nil
		}
	}
	if p.AccountURL == "" {
		return Account{}, errors.New("no account endpoint configured")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.AccountURL, nil)
	if err != nil {
		return Account{}, err
	}
	req.Header.Set("Accept", "application/json")
	tok.SetAuthHeader(req)
	resp, err := k.opts.HTTPClient.Do(req)
	if err != nil {
		return Account{}, fmt.Errorf("account endpoint: %s", describeRefreshErr(err))
	}
	defer resp.Body.Close()
	body, err := readLimited(resp.Body, maxAccountBody)
	if err != nil {
		return Account{}, fmt.Errorf("account endpoint: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return Account{}, fmt.Errorf("account endpoint: HTTP %d", resp.StatusCode)
	}
	return parseAccount(body, p.AccountIDField, p.AccountLoginField)
}

// parseAccount extracts the id and login fields from an account document.
// Numbers and strings are accepted for either.
func parseAccount(body []byte, idField, loginField string) (Account, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		return Account{}, fmt.Errorf("account endpoint: not a JSON object")
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
	a := Account{ID: field(idField), Login: field(loginField)}
	if a.ID == "" || len(a.ID) > 256 || strings.ContainsAny(a.ID, "\x00\r\n") {
		return Account{}, fmt.Errorf("account endpoint: field %q missing or invalid", idField)
	}
	a.Login = untrusted.Clip(strings.ToValidUTF8(a.Login, ""), 256)
	if a.Login == "" {
		a.Login = a.ID
	}
	return a, nil
}

// FirstNonEmpty returns the first non-empty string of ss.
func FirstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// equalToken compares two secrets in constant time; empty never matches.
func equalToken(a, b string) bool {
	return a != "" && b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// readLimited reads at most n bytes of r.
func readLimited(r io.Reader, n int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, n+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > n {
		return nil, fmt.Errorf("response larger than %d bytes", n)
	}
	return b, nil
}

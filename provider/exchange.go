package provider

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/internal/egress"
	"credbroker/internal/untrusted"
	"credbroker/vault"
)

// WrongDomainError: the connected account is not in the hosted domain
// the entry requires. It matches ErrWrongDomain.
type WrongDomainError struct {
	// Want is the entry's hosted_domain ("*": any Workspace domain); Got
	// the ID token's hd claim, clipped (untrusted).
	Want, Got string
}

func (e *WrongDomainError) Error() string {
	return fmt.Sprintf("%v: hd claim %q, want %q", ErrWrongDomain, e.Got, e.Want)
}

func (e *WrongDomainError) Unwrap() error { return ErrWrongDomain }

// grantedScopes returns the scope a token endpoint answered (nil when it
// said none: GitHub Apps answer "", which says nothing).
func grantedScopes(tok *oauth2.Token) []string {
	if s, ok := tok.Extra("scope").(string); ok {
		if granted := ParseScopeAnswer(s); len(granted) > 0 {
			return granted
		}
	}
	return nil
}

// refreshExpiry reads refresh_token_expires_in (a number, or a string in
// GitHub's form-encoded answers) relative to now; zero when absent or
// not a positive number of seconds.
func refreshExpiry(tok *oauth2.Token, now time.Time) time.Time {
	if tok.RefreshToken == "" {
		return time.Time{}
	}
	var secs int64
	// x/oauth2 gives a JSON number as float64, and a form-encoded value as
	// int64 (or float64, or the string when it is not a number).
	switch v := tok.Extra("refresh_token_expires_in").(type) {
	case int64:
		secs = v
	case float64:
		secs = int64(v)
	case json.Number:
		secs, _ = v.Int64()
	case string:
		secs, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	}
	if secs <= 0 || secs > 100*365*24*3600 {
		return time.Time{}
	}
	return now.Add(time.Duration(secs) * time.Second)
}

const maxAccountBody = 1 << 20

// idClaims are the claims of an ID token the broker reads.
type idClaims struct {
	Email string `json:"email"`
	User  string `json:"preferred_username"`
	Name  string `json:"name"`
	HD    string `json:"hd"`
}

// verifyIDToken verifies ID token raw with v, checks the nonce the
// authorization request sent (when it sent one) and names its account.
func verifyIDToken(ctx context.Context, v *oidc.IDTokenVerifier, raw, nonce string) (Account, idClaims, error) {
	idt, err := v.Verify(ctx, raw)
	if err != nil {
		return Account{}, idClaims{}, fmt.Errorf("id_token: %w", err)
	}
	if nonce != "" && !equalToken(idt.Nonce, nonce) {
		return Account{}, idClaims{}, errors.New("id_token nonce does not match")
	}
	var c idClaims
	_ = idt.Claims(&c)
	return Account{ID: idt.Subject, Login: FirstNonEmpty(c.Email, c.User, c.Name, idt.Subject)}, c, nil
}

// lookupAccount learns which provider account was connected: the
// verified ID token for OIDC providers (nonce checked), or the account
// endpoint.
func (o *OAuth) lookupAccount(ctx context.Context, k *Client, p *Provider, _ vault.Principal, tok *oauth2.Token, nonce string) (Account, error) {
	if o.OIDC {
		op, err := k.discover(ctx, p.Name, o.Issuer)
		if err != nil {
			return Account{}, err
		}
		raw, _ := tok.Extra("id_token").(string)
		if raw == "" {
			return Account{}, errors.New("no id_token in the token response")
		}
		a, c, err := verifyIDToken(ctx, op.Verifier(&oidc.Config{ClientID: o.ClientID, Now: k.opts.Now}), raw, nonce)
		if err != nil {
			return Account{}, err
		}
		if !domainOK(o.HostedDomain, c.HD) {
			// Google: hd= only steers the account chooser; the claim is
			// what proves the account's domain.
			return Account{}, &WrongDomainError{Want: o.HostedDomain, Got: untrusted.Clip(c.HD, 64)}
		}
		if o.AccountURL == "" {
			return a, nil
		}
	}
	if o.AccountURL == "" {
		return Account{}, errors.New("no account endpoint configured")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.AccountURL, nil)
	if err != nil {
		return Account{}, err
	}
	req.Header.Set("Accept", "application/json")
	tok.SetAuthHeader(req)
	resp, err := k.httpFor(p).Do(req)
	if err != nil {
		return Account{}, fmt.Errorf("account endpoint: %s", describeRefreshErr(err))
	}
	defer resp.Body.Close()
	body, err := egress.ReadAll(resp.Body, maxAccountBody)
	if err != nil {
		return Account{}, fmt.Errorf("account endpoint: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return Account{}, fmt.Errorf("account endpoint: HTTP %d", resp.StatusCode)
	}
	return parseAccount(body, o.AccountIDField, o.AccountLoginField)
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

// domainOK reports whether an ID token's hd claim satisfies hosted_domain
// want ("" accepts anything; "*" any non-empty domain).
func domainOK(want, hd string) bool {
	switch want {
	case "":
		return true
	case "*":
		return hd != ""
	}
	return strings.EqualFold(hd, want)
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

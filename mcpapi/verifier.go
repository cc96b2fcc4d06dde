package mcpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// NewTokenVerifier returns the broker's bearer-token verifier (JWTs of
// issuer, keys found by OIDC discovery) accepting tokens whose audience
// names any of audiences. Other front doors (the sidecar API) use it so the
// user's identity is always established by the broker itself.
func NewTokenVerifier(issuer string, audiences []string, client *http.Client, now func() time.Time) (TokenVerifier, error) {
	if issuer == "" || len(audiences) == 0 {
		return nil, errors.New("mcpapi: NewTokenVerifier needs an issuer and at least one audience")
	}
	for _, a := range audiences {
		if a == "" {
			return nil, errors.New("mcpapi: NewTokenVerifier: empty audience")
		}
	}
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	if now == nil {
		now = time.Now
	}
	first := &jwtVerifier{issuer: issuer, audience: audiences[0], client: client, now: now}
	return func(ctx context.Context, raw string) (TokenInfo, error) {
		info, err := first.verify(ctx, raw)
		if err == nil || len(audiences) == 1 || !errors.Is(err, ErrInvalidToken) {
			return info, err
		}
		v, gerr := first.get(ctx)
		if gerr != nil {
			return TokenInfo{}, gerr
		}
		for _, a := range audiences[1:] {
			other := &jwtVerifier{issuer: issuer, audience: a, client: client, now: now, verifier: v}
			if info, oerr := other.verify(ctx, raw); oerr == nil {
				return info, nil
			}
		}
		return TokenInfo{}, fmt.Errorf("%w (accepted audiences: %d)", err, len(audiences))
	}, nil
}

package provider

import "errors"

// Errors, matched with errors.Is. Each says what happened, never a token or
// the provider's answer.
var (
	// ErrNeedsReconnect: the provider refused the stored grant
	// (invalid_grant, GitHub's bad_refresh_token, or an expired token with
	// no refresh token); the
	// connection is marked vault.StatusNeedsReconnect and the user must
	// connect again.
	ErrNeedsReconnect = errors.New("provider: the connection must be reconnected")
	// ErrProviderUnavailable: the provider's token endpoint or API timed out
	// or answered 5xx (a token request that reached the provider is never
	// re-sent at once; one that never left is retried within the bound).
	// Stored tokens are untouched.
	ErrProviderUnavailable = errors.New("provider: the provider is unavailable")
	// ErrUnknownProvider: the connection names a provider that is no longer
	// configured.
	ErrUnknownProvider = errors.New("provider: provider not configured")
	// ErrCodeRejected: the provider refused the authorization code
	// (already used, expired, or not issued for this client).
	ErrCodeRejected = errors.New("provider: the authorization code was refused")
	// ErrRegistrationDropped: an upstream MCP server's authorization
	// server answered invalid_client for the broker's dynamic registration
	// (it no longer knows the client, RFC 6749 §5.2). The broker deleted
	// that registration, so the next connect registers anew; the tokens
	// issued to it went with it (a refresh that met it is also
	// ErrNeedsReconnect).
	ErrRegistrationDropped = errors.New("provider: the upstream authorization server no longer knows the broker's registration")
	// ErrAccountUnknown: the provider issued tokens, but which account
	// they belong to could not be established.
	ErrAccountUnknown = errors.New("provider: the connected account could not be established")
	// ErrWrongDomain: the account is not in the entry's hosted_domain (the
	// ID token's hd claim is absent or another domain); a
	// *WrongDomainError says which domain was required.
	ErrWrongDomain = errors.New("provider: the account is not in the required domain")
	// ErrUninspectableAnswer: the provider answered in a form the broker
	// cannot check for secrets (an unknown or undecodable content encoding),
	// so nothing of the answer is returned.
	ErrUninspectableAnswer = errors.New("provider: the answer cannot be checked for secrets")
	// ErrNotAToken: an API-key connection was asked for an OAuth token (token
	// export, a refresh). An API key is never handed out.
	ErrNotAToken = errors.New("provider: an API-key connection has no token to hand out")
	// ErrNothingToKeepAlive: the connection holds no refresh token.
	ErrNothingToKeepAlive = errors.New("provider: the connection has no refresh token to keep alive")
	// ErrNoStep: the provider's kind does not have the browser step asked for
	// (a code exchange for a form kind, a key for a redirect kind).
	ErrNoStep = errors.New("provider: the provider is not connected this way")
)

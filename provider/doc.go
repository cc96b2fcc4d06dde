// Package provider is everything credbroker says to the providers people
// connect (GitHub, Google, any OAuth 2.0 or OIDC service): the catalogue
// (providers.yaml: ParseProviders, strict, every problem with its line),
// OAuth configuration with OIDC discovery (one cache per Client), the code
// exchange and account lookup at the callback, the token source with
// single-flight refresh, API calls with their guards and redaction, and
// revocation.
//
// It hands no token to a front door: Exchange's result goes to the
// connections layer's store, Do and Revoke use tokens where they are
// needed. (The one exception is the opt-in sidecar token export, which the
// connections layer audits.)
//
// # Kinds
//
// An entry's type is a kind (kind.go): a type of this package that holds
// that kind's configuration and implements what it can, found by type
// assertion as dex finds what its connectors can do. Every kind has one
// browser step:
//
//	RedirectStep   the person connects at the provider (OAuth 2.0 code flow): *OAuth (oauth2, oidc)
//	FormStep       the person enters values on the broker's page: *APIKey (api_key)
//
// and optional capabilities: Refresher (refresh tokens), Revoker,
// TokenExporter (its access tokens may be handed to co-located servers),
// AccountLookup (who a code exchange connected). The Client's methods
// (AuthRequest, Exchange, ResponseIssuer, VerifyKey, Do, Token, Revoke,
// KeepAlive) ask the kind; callers outside this package ask the same
// questions ("redirect or form?", "can its tokens be exported?") and never
// which type an entry is.
//
// To add a kind:
//
//  1. Write one file: the kind's type with Type() and the methods of its
//     browser step and of each capability it has (the interfaces' methods
//     are unexported, so kinds live in this package); its providers.yaml
//     keys as a spec struct (entrySpec inline, and scopeSpec, apiSpec,
//     keep_alive as the kind needs: a key no kind takes is an unknown key,
//     one another kind takes is refused with that kind's name); and a
//     kindDef from defineKind, whose build function validates an entry
//     with entryCheck (every problem at its line) and returns its Provider.
//  2. Add the kindDef to kinds in catalog.go.
//  3. Add the page its browser step names (ConsentPage, or Form.Page) to
//     web/templates/, unless it reuses one. A form step's page is its
//     title, heading and words around the blocks of
//     web/templates/partials.html, which keyentry.html uses too:
//     formstep.error, formstep.facts (who asked, who is signed in),
//     formstep.instructions and formstep.form (the fields, the CSRF
//     token, approve and deny).
//  4. Document its type and keys in the header comment of the
//     repository's providers.yaml, which lists every field of every kind.
//
// Nothing outside this package, that template and that header changes:
// the connections layer and the front doors already ask for capabilities.
//
// # Refresh protocol (per connection)
//
// In-process single flight keyed by the connection id → the store's lock
// (a PostgreSQL advisory lock across replicas) → reload → already
// refreshed by someone else? use theirs → refresh at the token endpoint
// with a fixed client authentication style → save with compare-and-swap,
// applied only if the stored refresh token is still the one spent. The new
// access token is used only after the save succeeded, so a rotated refresh
// token is durable before the new access token is used. A refused refresh
// token (invalid_grant, GitHub's bad_refresh_token) marks the connection
// needs_reconnect. A token request is retried only when it provably never
// reached the provider (a dial or TLS failure before it was written) or the
// provider said it did not process it (429); after a 5xx, a timeout or a
// dropped connection the provider may already have spent a rotating refresh
// token, so nothing is re-posted: the refresh fails, the connection stays
// as it was, and its next use tries again.
//
// # API calls
//
// A path relative to an API base (the entry's base_url, or another of its
// api.hosts named by APIRequest.Host), refused before anything is sent when
// it could leave that base (absolute or scheme-relative URLs, dot segments,
// encoded separators, double encoding) or when that base's allow-list does
// not name it; only AllowedRequestHeaders pass; redirects are followed on
// the same host, under the same base, to allowed paths only; the answer is
// capped and the token is redacted from it in the encodings an echo is
// likely to use. A 401 the broker cannot cure (no refresh token, or a 401
// again right after a refresh) marks the connection needs_reconnect.
//
// # Scopes
//
// Providers answer granted scopes in their own words: NormalizeScopes maps
// the entry's scope_aliases (Google's long names) to the catalogue's names
// before anything is stored, and MissingScopes also counts what
// scope_implies says a granted scope includes (GitHub's repo covers
// public_repo).
//
// # API keys
//
// A `type: api_key` entry (apikey.go) is a service without OAuth for
// individuals. Its entry page's fields (secret or not, with a pattern and
// a length cap), how the credential is injected (a header template such
// as "Authorization: Bearer {api_key}", or basic authentication from
// templates) and the verify request (a path under the API base, and JSON
// pointers to the account's id and login) are validated like the rest of
// the catalogue. VerifyKey checks what a person entered (nothing is sent
// when a check fails), then sends the verify request and answers the
// account with the entered fields as the token set (vault.TokenSet.Fields)
// for the connections layer to seal. Do injects the stored fields, redacts
// every secret field and the composed header or basic-auth value from the
// answer in every encoding, and turns a 401 into needs_reconnect. There
// is no refresh, no revocation at the provider, and Token refuses to hand
// an API key out (ErrNotAToken).
package provider

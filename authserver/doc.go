// Package authserver is credbroker's OAuth 2.1 authorization server for
// its own MCP resource: the front door MCP hosts (Claude, ChatGPT, VS Code,
// Cursor, MCP Inspector) use to get a token for the broker, whatever the
// organisation's identity provider can or cannot do. The person signs in
// with the organisation's IdP exactly as on the connect pages (the broker's
// own OIDC sign-in and browser session, package oauthflow); the broker then
// issues its own tokens, audience-bound to its MCP endpoint.
//
// Routes mounted by (*Server).Register on a web.Site, pages on its browser
// side (the page headers on every answer, the cross-origin check on every
// POST, the form preamble web.Kit.PostedForm), the rest on its API side
// (no page headers, no cookies):
//
//	browser GET  /authorize                               authorization request: client, redirect URI, PKCE S256,
//	                                                      resource; sign-in; remembered consent or the consent page
//	browser POST /authorize/decision                      the consent form (CSRF, same-origin): approve or deny
//	API     GET  /.well-known/oauth-authorization-server  RFC 8414 metadata (issuer = the public URL)
//	API     GET  /.well-known/jwks.json                   the public keys of the access tokens
//	API     POST /token                                   authorization_code, refresh_token and (with --idjag) the
//	                                                      JWT bearer grant for ID-JAGs
//	API     POST /revoke                                  RFC 7009 revocation
//	API     POST /register                                RFC 7591 dynamic registration (off: 403 access_denied)
//
// # Clients
//
// A client_id that is an https URL is a Client ID Metadata Document
// (draft-ietf-oauth-client-id-metadata-document): the URL must have a path
// other than "/", no userinfo, fragment or dot segments; the document is
// fetched without following redirects, within 5 seconds and 5 KB, must be
// 200 JSON whose client_id equals the URL by simple string comparison, and
// must name the client and its redirect URIs; it may not carry a shared
// secret or private keys, so such clients are public (auth method none).
// Valid documents are cached per Cache-Control (default five minutes, at
// most a day; errors and invalid documents never), and a recently valid
// one stands in while the client's site is unreachable. The fetch is a
// server-side request forgery vector: its dialer is internal/egress's
// (egress.NewDialer), which checks every address the host resolves to, and
// the address it connects to, against egress's special-use ranges of
// RFC 6890 and successors (loopback, private, link-local, CGNAT,
// documentation, …) and refuses them unless Options.AllowPrivateMetadata
// is set; no proxy is used.
//
// Any other client_id is a client registered here (RFC 7591): registration
// is open unless turned off, capped in number (atomically, in the store),
// limited per remote address per minute, and a client that never redeems a
// code is removed after a day. A confidential client's secret is returned
// once and stored only as its SHA-256.
//
// Redirect URIs are https, http on a loopback host, or a native app's
// private-use scheme (RFC 8252 section 7.1; Cursor registers
// cursor://anysphere.cursor-mcp/oauth/callback); never http elsewhere, a
// fragment, or a scheme that acts inside the browser (javascript:, data:,
// …). An authorization request's redirect URI must equal a registered one,
// except that a loopback http one may use any port (RFC 8252 section 7.3).
//
// # Authorization
//
// GET /authorize checks, in this order: no repeated parameter, the client,
// the redirect URI; until then a failure is an error page and nothing is
// sent anywhere (no open redirect). After that every failure goes back to
// the redirect URI as an RFC 6749 error with state and iss:
// response_type code, PKCE with S256 (a missing challenge or the plain
// method is invalid_request), resource (RFC 8707: absent means the MCP
// endpoint, another value is invalid_target). The person signs in through
// the broker's session (Options.Person and Options.StartSignIn, which
// send the browser through the IdP and back to the same /authorize URL).
// Consent is remembered per person and client and asked again when the
// redirect URI (loopback: ignoring the port) or the scopes grow. A
// remembered consent issues a code with no page only where the client's
// identity is assured (RFC 8252 section 8.6): an https redirect, not on a
// loopback host, of a confidential client or of a metadata-document
// client on its document's own host. Public clients and every loopback or
// private-use redirect get a one-click page naming the app and the
// redirect target instead (prompt=none: interaction_required), since any
// program on the person's machine can listen there. The consent page
// shows the client's self-asserted name marked as such, the host it sends
// the person back to, whether a metadata document at a domain vouches for
// it or it registered itself, and in plain words what it gets. Its buttons
// are the connect consent page's contract: name="decision" value="approve"
// or "deny", inside a POST form with a hidden csrf field. Every answer to
// the client carries iss (RFC 9207).
//
// # Tokens
//
// An authorization code is 256 random bits, stored as its SHA-256 for one
// minute, bound to the client, the redirect URI, the PKCE challenge, the
// resource and the person, and redeemed atomically by exactly one caller.
// A code presented a second time revokes what its first redemption issued.
//
// Access tokens are JWTs (RFC 9068, typ at+jwt, ES256) that live one hour
// by default. iss is the broker; aud is the MCP resource URI; client_id,
// scope, iat, exp and jti are as usual; sid names the token family. The
// person is the organisation IdP's (iss, sub), never the broker's: sub is
// the IdP's subject, and sub_id is an RFC 9493 iss_sub subject identifier
// carrying the IdP's issuer with it. The verifier (Server.Verifier) turns
// a token into the principal (sub_id.iss, sub_id.sub) after checking that
// sub_id.iss is the configured IdP, so a person's connections are the same
// whether their token came from the IdP (--mcp-auth issuer) or from here.
//
// The signing keys are derived from the broker's key ring (one P-256 key
// per ring key, HKDF with a purpose of their own), so replicas sharing the
// ring sign and verify alike and nothing is stored. The primary key signs;
// every key in the ring verifies and is published in the JWKS; after a
// key rotation tokens signed with the old key stay valid until they expire
// as long as the old key stays in the ring (keep it an access token
// lifetime at least).
//
// Refresh tokens are opaque (cbrt1.<app>.<family>.<256 random bits>),
// stored as SHA-256, bound to the client and rotated on every use; the
// spent ones are remembered, and presenting one again revokes its whole
// family (the refresh token and every access token of that sign-in). A
// family ends after an absolute lifetime (30 days) and a refresh token
// after an idle one (7 days). Refresh tokens go to clients whose metadata
// lists the refresh_token grant. Check and rotation are one
// compare-and-swap in the store, so a token is spent once across replicas.
//
// Every use of an access token checks that its family still exists, so
// revoking (RFC 7009, either token of a family), a replay, and a person
// removing the app on "My connections" end its access at once on the
// replica that made the change and within one second on every other
// (package apps: the liveness cache and its bound). Signing out of the
// broker revokes nothing.
//
// Consent memory, token families and their lifetimes, rotation,
// revocation, liveness and removing an app are the apps core's (package
// apps); this package translates between the wire and it.
//
// # Enterprise-managed authorization (idjag.go)
//
// With Options.IDJAG's policy on, /token also takes
// grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer with an ID-JAG
// (draft-ietf-oauth-identity-assertion-authz-grant, as MCP's
// enterprise-managed-authorization extension profiles it): the IdP that
// signs people in (and any issuer trusted besides it) vouches for the person
// and the host, and no consent page is shown. The policy is off, any
// confidential client, or an allow-list. The assertion must be a JWS with an
// asymmetric algorithm (never none or HMAC), typ oauth-id-jag+jwt, signed
// by a key of its trusted issuer (JWKS from discovery), with aud the
// broker's issuer alone, resource (if any) the MCP endpoint, client_id the
// authenticated client, exp/iat/nbf within 30 s of now, at most 5 minutes
// between iat and exp, scopes the broker offers, and a jti never redeemed
// before on any replica (vault.AssertionLedger, the last check, so a refusal
// stores nothing). The answer is an access token without a refresh token,
// for a token family marked apps.ViaIDJAG ("let in by the
// organisation" on the Apps page); no consent is recorded. Every refusal is
// an RFC 6749 error, an idjag_refused audit event and a count in
// credbroker_idjag_grants_total; metadata advertises the grant type and the
// ID-JAG grant profile while the policy is on.
//
// # Storage
//
// Registered clients, codes and per-person app access records (consent and
// token families) go through vault.AuthStore (bbolt, memory, PostgreSQL;
// one conformance suite, vaulttest.RunAuth). Nothing secret is stored: a
// code, a refresh token or a client secret appears only as a hash.
//
// # Why this is not built on zitadel/oidc's op package
//
// The broker already uses github.com/zitadel/oidc/v3/pkg/op for its
// development IdP, and its building blocks were weighed first (v3.52.0).
// They fit an OpenID Provider that owns its users and its client list; this
// server federates its login and takes its clients from URLs. Concretely:
// op's code flow always issues an ID token (CreateTokenResponse calls
// CreateIDToken unconditionally) and issues refresh tokens only when the
// offline_access scope was requested (needsRefreshToken), which MCP hosts
// do not send; its authorization responses and error redirects carry no
// iss (CodeResponseType, AuthRequestError), which RFC 9207 and MCP want on
// every answer; it has no RFC 8707 resource, no dynamic registration and
// no metadata-document clients; single use of a code rests on a
// DeleteAuthRequest after the tokens are made rather than one atomic step;
// errors before the redirect URI is trusted are written as text/plain; and
// it logs through the process-wide slog default. Each could be patched
// around (a wrapper per endpoint, an injected scope), leaving two layers of
// validation on every endpoint. The wire here is small and fully specified,
// so it is written directly against the RFCs, with go-jose (already a
// dependency) for JWS and JWK and the standard library for the rest; the
// security-critical decisions (code binding, PKCE, rotation, replay,
// audience, SSRF) would have been this package's code either way.
package authserver

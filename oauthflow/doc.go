// Package oauthflow is the browser side of credbroker: the broker's own OIDC
// sign-in, session cookies, consent, the redirect to the provider's
// authorization code flow with PKCE, the callback with re-verification of
// the signed-in user, and the "my connections" page. The code exchange and
// account lookup are the provider package's (Client.Exchange); storing the
// result, listing and disconnecting are the connections layer's.
//
// Routes mounted by (*Flow).Register on the browser side of a web.Site
// (which serves the embedded CSS at GET /static/ itself):
//
//	GET  /connect/{grant}                 landing: sign in (OIDC code + PKCE S256 + nonce) if needed,
//	                                      compare the session's (iss, sub) with the grant's principal
//	                                      in constant time; mismatch page + security event, or consent
//	POST /connect/{grant}                 consent form (CSRF): decision=approve → the flow cookie
//	                                      (the consent: person and grant; nothing is written) and a
//	                                      redirect to the provider with fresh state, PKCE, nonce
//	                                      (OIDC); deny → denied
//	GET  /auth/callback                   the broker's own sign-in callback (state, PKCE, nonce)
//	GET  /oauth/{provider}/callback       provider callback: flow cookie state (constant time),
//	                                      re-verify principal, exchange code, find account, store
//	                                      the encrypted connection, approve and complete the grant
//	                                      (single use) in the same transaction
//	POST /connect/{grant}/key             API-key providers: the key entry form (CSRF), after the same
//	                                      landing (GET /connect/{grant} shows it instead of consent):
//	                                      re-check the person, pattern checks (nothing sent on a
//	                                      mismatch), the provider's verify request, store sealed,
//	                                      approve and complete the grant; deny declines
//	GET  /connections                     the signed-in user's connections, and a Connect button for
//	                                      every provider connections.Offered names
//	POST /connections/{provider}/connect  Connect (CSRF): connections.Connect starts a connect request
//	                                      of the signed-in person (the usual limits; nothing stored on
//	                                      refusal) and redirects to its link, GET /connect/{grant}
//	POST /connections/{id}/disconnect     connections.DisconnectID: revoke at the provider (when
//	                                      supported), then delete (CSRF); the page names the outcome
//	GET  /connections/{id}/key            "Replace key": the entry form for one API-key connection
//	POST /connections/{id}/key            verify the new key, store it in the same connection (same
//	                                      account only; CSRF)
//	POST /connections/apps/{id}/remove    Options.Apps.Remove: revoke every token an app (an OAuth
//	                                      client of the broker's authorization server) holds (CSRF)
//	POST /logout                          end the broker session (CSRF)
//
// The consent page's buttons are a stable contract for automation:
// <button type="submit" name="decision" value="approve"> and value="deny",
// inside a POST form that carries a hidden csrf field. The key entry page
// keeps the same buttons (approve submits the key) and names its inputs
// field.<name> (secret ones type=password, autocomplete=off, maxlength).
// No page shows an entered key, and none is logged.
//
// Other front doors' pages use the broker's session through two hooks that
// cmd/broker wires, so front doors never import each other and the cookie
// format stays this package's: (*Flow).SignedIn reports who is signed in
// and (*Flow).StartSignIn sends the browser through the sign-in and back
// to a broker path (the authorization server's /authorize).
//
// Cookies (securecookie: AES-256 + HMAC-SHA256 with keys derived from the
// broker's key ring, all ring keys accepted for rotation; HttpOnly,
// SameSite=Lax, Secure and __Host- prefixed outside DevMode):
//
//	session  (iss, sub, display name, CSRF token)          30 minutes
//	login    (state, PKCE verifier, nonce, return path)     10 minutes
//	flow     (person, grant, state, PKCE verifier, nonce,  10 minutes, capped at the grant's expiry
//	          scopes): the person's consent to the grant
//
// Every page is rendered from embedded templates into a buffer by the
// browser kit (package web: web.Kit), and every answer of a route here
// carries the site's page headers: a CSP that allows no script, nosniff,
// frame-ancestors 'none', X-Frame-Options DENY, Referrer-Policy
// no-referrer, a same-origin opener policy and Cache-Control no-store.
// Every POST passes the site's cross-origin check and then the kit's form
// preamble (signed in, bounded body, the session's CSRF token). No token
// value is ever rendered or logged; a failure at any step stores nothing.
// Grant ids appear in logs only as connections.Ref references.
package oauthflow

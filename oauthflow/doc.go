// Package oauthflow is the browser side of credbroker: the broker's own OIDC
// sign-in, session cookies, consent, the provider's authorization code flow
// with PKCE, the callback with re-verification of the signed-in user, token
// refresh and revocation, and the provider registry built from providers.yaml.
package oauthflow

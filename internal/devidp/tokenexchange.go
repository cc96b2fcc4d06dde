package devidp

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Token exchange for ID-JAGs (enterprise-managed authorization): RFC 8693
// at the token endpoint with requested_token_type
// urn:ietf:params:oauth:token-type:id-jag, as
// draft-ietf-oauth-identity-assertion-authz-grant and the MCP extension
// io.modelcontextprotocol/enterprise-managed-authorization describe it.
// zitadel's op handles every other grant; it does not know this token
// type, so the IdP answers these requests itself, in front of it.

const (
	grantTokenExchange = "urn:ietf:params:oauth:grant-type:token-exchange"
	tokenTypeIDJAG     = "urn:ietf:params:oauth:token-type:id-jag"
	tokenTypeIDToken   = "urn:ietf:params:oauth:token-type:id_token"
	// idjagTTL is how long an ID-JAG lives.
	idjagTTL = 5 * time.Minute
)

// IDJAGRule is one line of the IdP's token-exchange policy: User may use
// the IdP client Client to get ID-JAGs for the authorization server
// Audience (its issuer identifier). The first rule matching user, client
// and audience decides; with none, the exchange is refused.
type IDJAGRule struct {
	// User is a username, or "*" for every user.
	User string
	// Client is the IdP client id of the host asking.
	Client string
	// Audience is the issuer identifier of the resource authorization
	// server (the broker's public URL).
	Audience string
	// Resources the ID-JAG may name (empty: the request's resource is
	// refused, only its absence is accepted).
	Resources []string
	// Scopes are the most an ID-JAG of this rule grants (the request's
	// scope is narrowed to them; absent, all of them).
	Scopes []string
	// AudienceClientID is the client's id at the audience, the ID-JAG's
	// client_id (empty: Client; see the draft's client id mapping).
	AudienceClientID string
	// Deny makes the rule refuse: the policy saying no for this user.
	Deny bool
}

// SetIDJAGRules replaces the token-exchange policy (at run time, e.g. to
// show the IdP no longer vouching for someone).
func (p *IdP) SetIDJAGRules(rules []IDJAGRule) {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	p.store.idjagRules = slices.Clone(rules)
}

// exchangeError is an RFC 6749 section 5.2 error answer.
type exchangeError struct {
	status       int
	code, desc   string
	wwwAuthBasic bool
}

// withTokenExchange answers token-exchange requests at the token endpoint
// and hands every other request to next, body intact.
func (p *IdP) withTokenExchange(next http.Handler) http.Handler {
	tokenPath := p.path + "/oauth/token"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != tokenPath {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxFormBytes+1))
		if err != nil || len(body) > maxFormBytes {
			writeTokenError(w, exchangeError{status: http.StatusBadRequest, code: "invalid_request", desc: "the request body is too large or unreadable"})
			return
		}
		form, err := url.ParseQuery(string(body))
		if err != nil || form.Get("grant_type") != grantTokenExchange {
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			next.ServeHTTP(w, r)
			return
		}
		resp, e := p.exchange(r, form)
		if e != nil {
			p.log.Info("devidp: token exchange refused", "error", e.code, "reason", e.desc)
			writeTokenError(w, *e)
			return
		}
		writeTokenJSON(w, http.StatusOK, resp)
	})
}

type exchangeResponse struct {
	IssuedTokenType string `json:"issued_token_type"`
	AccessToken     string `json:"access_token"`
	TokenType       string `json:"token_type"`
	ExpiresIn       int64  `json:"expires_in"`
	Scope           string `json:"scope,omitempty"`
}

// exchange validates a token-exchange request and issues an ID-JAG.
func (p *IdP) exchange(r *http.Request, form url.Values) (exchangeResponse, *exchangeError) {
	bad := func(code, format string, args ...any) *exchangeError {
		return &exchangeError{status: http.StatusBadRequest, code: code, desc: fmt.Sprintf(format, args...)}
	}
	for k, v := range form {
		if len(v) > 1 {
			return exchangeResponse{}, bad("invalid_request", "parameter %q is repeated", k)
		}
	}
	// Client authentication is required (the MCP extension: omitting it
	// would let anyone holding an ID token get an ID-JAG).
	c, e := p.authenticateClient(r, form)
	if e != nil {
		return exchangeResponse{}, e
	}
	switch {
	case form.Get("requested_token_type") != tokenTypeIDJAG:
		return exchangeResponse{}, bad("invalid_request", "requested_token_type must be %s", tokenTypeIDJAG)
	case form.Get("subject_token_type") != tokenTypeIDToken:
		return exchangeResponse{}, bad("invalid_request", "subject_token_type must be %s (this IdP takes ID tokens)", tokenTypeIDToken)
	case form.Get("subject_token") == "":
		return exchangeResponse{}, bad("invalid_request", "subject_token is required: the ID token of the person")
	case form.Get("audience") == "":
		return exchangeResponse{}, bad("invalid_request", "audience is required: the issuer of the authorization server the ID-JAG is for")
	case form.Has("actor_token"):
		return exchangeResponse{}, bad("invalid_request", "actor_token is not supported")
	}
	user, e := p.checkIDToken(form.Get("subject_token"), c.ID)
	if e != nil {
		return exchangeResponse{}, e
	}
	audience, resource := form.Get("audience"), form.Get("resource")
	p.store.mu.Lock()
	rules := p.store.idjagRules
	p.store.mu.Unlock()
	i := slices.IndexFunc(rules, func(rule IDJAGRule) bool {
		return (rule.User == "*" || rule.User == user.Username) && rule.Client == c.ID && rule.Audience == audience
	})
	if i < 0 || rules[i].Deny {
		return exchangeResponse{}, bad("invalid_grant", "the organisation's policy does not let this app act for %s at %s", user.Username, audience)
	}
	rule := rules[i]
	if resource != "" && !slices.Contains(rule.Resources, resource) {
		return exchangeResponse{}, bad("invalid_target", "the policy does not cover this resource at %s", audience)
	}
	scopes := slices.Clone(rule.Scopes)
	if raw, ok := form["scope"]; ok {
		scopes = nil
		for _, sc := range strings.Fields(raw[0]) {
			if slices.Contains(rule.Scopes, sc) && !slices.Contains(scopes, sc) {
				scopes = append(scopes, sc)
			}
		}
	}
	clientID := rule.AudienceClientID
	if clientID == "" {
		clientID = c.ID
	}
	jti, err := randomString(16)
	if err != nil {
		return exchangeResponse{}, &exchangeError{status: http.StatusInternalServerError, code: "server_error", desc: "no randomness"}
	}
	now := p.store.now()
	claims := map[string]any{
		"iss": p.issuer, "sub": user.Subject, "aud": audience, "client_id": clientID, "jti": jti,
		"iat": now.Unix(), "exp": now.Add(idjagTTL).Unix(), "email": user.Email,
	}
	if resource != "" {
		claims["resource"] = resource
	}
	if len(scopes) > 0 {
		claims["scope"] = strings.Join(scopes, " ")
	}
	tok, err := p.Sign("oauth-id-jag+jwt", claims)
	if err != nil {
		return exchangeResponse{}, &exchangeError{status: http.StatusInternalServerError, code: "server_error", desc: "the ID-JAG could not be signed"}
	}
	p.log.Info("devidp: ID-JAG issued", "client_id", c.ID, "sub", user.Subject, "audience", audience)
	return exchangeResponse{IssuedTokenType: tokenTypeIDJAG, AccessToken: tok, TokenType: "N_A",
		ExpiresIn: int64(idjagTTL / time.Second), Scope: strings.Join(scopes, " ")}, nil
}

// authenticateClient checks client_secret_basic or client_secret_post;
// public clients cannot use token exchange.
func (p *IdP) authenticateClient(r *http.Request, form url.Values) (Client, *exchangeError) {
	id, secret, basic := r.BasicAuth()
	if basic {
		var err1, err2 error
		id, err1 = url.QueryUnescape(id)
		secret, err2 = url.QueryUnescape(secret)
		if err1 != nil || err2 != nil || form.Has("client_secret") {
			return Client{}, &exchangeError{status: http.StatusUnauthorized, code: "invalid_client", desc: "malformed client credentials", wwwAuthBasic: true}
		}
	} else {
		id, secret = form.Get("client_id"), form.Get("client_secret")
	}
	p.store.mu.Lock()
	c, ok := p.store.clients[id]
	p.store.mu.Unlock()
	switch {
	case id == "" || !ok:
		return Client{}, &exchangeError{status: http.StatusUnauthorized, code: "invalid_client", desc: "unknown client", wwwAuthBasic: basic}
	case c.Secret == "":
		return Client{}, &exchangeError{status: http.StatusUnauthorized, code: "invalid_client",
			desc: "token exchange needs client authentication; this client is public", wwwAuthBasic: basic}
	}
	a, b := sha256.Sum256([]byte(secret)), sha256.Sum256([]byte(c.Secret))
	if subtle.ConstantTimeCompare(a[:], b[:]) != 1 {
		return Client{}, &exchangeError{status: http.StatusUnauthorized, code: "invalid_client", desc: "wrong client secret", wwwAuthBasic: basic}
	}
	return c, nil
}

// checkIDToken verifies an ID token this IdP issued to clientID (the
// draft: its audience must be the authenticated client) and returns its
// user.
func (p *IdP) checkIDToken(raw, clientID string) (User, *exchangeError) {
	bad := &exchangeError{status: http.StatusBadRequest, code: "invalid_grant", desc: "subject_token is not a valid ID token of this IdP for this client"}
	if len(raw) > 16<<10 {
		return User{}, bad
	}
	jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		return User{}, bad
	}
	payload, err := jws.Verify(&p.store.key.PublicKey)
	if err != nil {
		return User{}, bad
	}
	var c struct {
		Issuer   string   `json:"iss"`
		Subject  string   `json:"sub"`
		Audience audience `json:"aud"`
		Expiry   int64    `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil || c.Issuer != p.issuer || c.Subject == "" {
		return User{}, bad
	}
	if !slices.Contains(c.Audience, clientID) {
		return User{}, &exchangeError{status: http.StatusBadRequest, code: "invalid_grant", desc: "the ID token was issued to another client"}
	}
	if !p.store.now().Before(time.Unix(c.Expiry, 0)) {
		return User{}, &exchangeError{status: http.StatusBadRequest, code: "invalid_grant", desc: "the ID token expired; sign in again"}
	}
	p.store.mu.Lock()
	u, ok := p.store.userBySubject(c.Subject)
	p.store.mu.Unlock()
	if !ok {
		return User{}, bad
	}
	return u, nil
}

// audience is an aud claim: a string or an array of strings.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

// Sign signs claims as a JWT of type typ with the IdP's key (RS256, the
// key id of its JWKS). The token exchange uses it; tests use it to make
// tokens the IdP would not issue (a wrong audience, an expired one).
func (p *IdP) Sign(typ string, claims any) (string, error) {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: p.store.key},
		(&jose.SignerOptions{}).WithType(jose.ContentType(typ)).WithHeader(jose.HeaderKey("kid"), p.store.keyID))
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}

func writeTokenJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	w.WriteHeader(status)
	w.Write(b)
}

func writeTokenError(w http.ResponseWriter, e exchangeError) {
	if e.wwwAuthBasic {
		w.Header().Set("WWW-Authenticate", `Basic realm="devidp"`)
	}
	writeTokenJSON(w, e.status, map[string]string{"error": e.code, "error_description": e.desc})
}

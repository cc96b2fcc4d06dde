package authserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"

	"credbroker/apps"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// Enterprise-managed authorization: the JWT bearer grant (RFC 7523) with
// an Identity Assertion JWT Authorization Grant (ID-JAG,
// draft-ietf-oauth-identity-assertion-authz-grant), as the MCP extension
// io.modelcontextprotocol/enterprise-managed-authorization profiles it.
// The host trades the person's ID token at the organisation's IdP for an
// ID-JAG naming this broker, then redeems it here: no consent page, the
// IdP's policy decides.

const (
	grantJWTBearer = "urn:ietf:params:oauth:grant-type:jwt-bearer"
	// profileIDJAG is the authorization_grant_profiles_supported value.
	profileIDJAG = "urn:ietf:params:oauth:grant-profile:id-jag"
	// idjagType is the JWS typ an ID-JAG must carry.
	idjagType = "oauth-id-jag+jwt"
	// maxAssertionLen bounds the assertion parameter.
	maxAssertionLen = 16 << 10
	// defaultIDJAGLifetime is the longest exp - iat accepted by default;
	// IdPs issue ID-JAGs for about five minutes.
	defaultIDJAGLifetime = 5 * time.Minute
	// idjagLeeway tolerates clock differences with the IdP.
	idjagLeeway = 30 * time.Second
)

// idjagAlgorithms is the signature allow-list: asymmetric algorithms only.
// none and the HMAC family are never accepted (an HMAC "signed" with the
// issuer's public key bytes is the classic confusion attack).
var idjagAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// Policy modes of the JWT bearer grant.
const (
	IDJAGOff   = "off"   // the grant is refused (unsupported_grant_type) and not advertised
	IDJAGAny   = "any"   // any confidential client that authenticates
	IDJAGAllow = "allow" // only the clients listed (ids or metadata-document URLs)
)

// IDJAGPolicy says which clients may redeem ID-JAGs.
type IDJAGPolicy struct {
	Mode string
	// Clients is the allow-list of Mode IDJAGAllow: client ids of
	// registered clients and metadata-document URLs, compared exactly.
	Clients []string
}

// ParseIDJAGPolicy reads the policy's flag form: "off", "any", or a
// comma-separated allow-list of client ids and metadata-document URLs.
func ParseIDJAGPolicy(s string) (IDJAGPolicy, error) {
	switch strings.TrimSpace(s) {
	case "", IDJAGOff:
		return IDJAGPolicy{Mode: IDJAGOff}, nil
	case IDJAGAny:
		return IDJAGPolicy{Mode: IDJAGAny}, nil
	}
	var p IDJAGPolicy
	p.Mode = IDJAGAllow
	for _, c := range strings.Split(s, ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if c == IDJAGOff || c == IDJAGAny {
			return IDJAGPolicy{}, fmt.Errorf("ID-JAG policy %q: %q cannot be part of an allow-list", s, c)
		}
		if len(c) > maxRedirectURILen {
			return IDJAGPolicy{}, fmt.Errorf("ID-JAG policy: client %.40q… is too long", c)
		}
		if strings.HasPrefix(c, "https://") {
			if err := checkClientIDURL(c); err != nil {
				return IDJAGPolicy{}, fmt.Errorf("ID-JAG policy: %q is not a valid metadata-document client_id: %v", c, err)
			}
		}
		if !slices.Contains(p.Clients, c) {
			p.Clients = append(p.Clients, c)
		}
	}
	if len(p.Clients) == 0 {
		return IDJAGPolicy{}, fmt.Errorf("ID-JAG policy %q names no client", s)
	}
	return p, nil
}

// String renders the policy in its flag form.
func (p IDJAGPolicy) String() string {
	if p.Mode == IDJAGAllow {
		return strings.Join(p.Clients, ",")
	}
	if p.Mode == "" {
		return IDJAGOff
	}
	return p.Mode
}

// IDJAGOptions configures the JWT bearer grant (Options.IDJAG).
type IDJAGOptions struct {
	// Policy says which clients may use the grant; the zero value is off.
	Policy IDJAGPolicy
	// TrustedIssuers are IdPs whose ID-JAGs are accepted besides
	// Options.IdPIssuer (always trusted); each one's keys come from its
	// OpenID Connect discovery document. Their people are principals of
	// their own (iss, sub).
	TrustedIssuers []string
	// Ledger remembers spent jti values across replicas (the store);
	// required unless the policy is off.
	Ledger vault.AssertionLedger
	// HTTPClient fetches the issuers' discovery documents and keys (nil:
	// a client with a 10 s timeout).
	HTTPClient *http.Client
	// MaxLifetime is the longest exp - iat accepted (default 5 minutes).
	MaxLifetime time.Duration
}

// idjagVerifier holds the trusted issuers and their keys.
type idjagVerifier struct {
	issuers map[string]*trustedIssuer
	client  *http.Client
}

// trustedIssuer is one IdP whose ID-JAGs are accepted. Its JWKS URL is
// found by OIDC discovery on first use and kept once that succeeds
// (go-oidc's remote key set then refetches the keys on an unknown kid),
// so the broker starts while an IdP is down.
type trustedIssuer struct {
	issuer string

	mu   sync.Mutex // guards keys
	keys oidc.KeySet
}

func newIDJAGVerifier(o IDJAGOptions, idp string) *idjagVerifier {
	v := &idjagVerifier{issuers: map[string]*trustedIssuer{}, client: o.HTTPClient}
	if v.client == nil {
		v.client = &http.Client{Timeout: 10 * time.Second}
	}
	for _, iss := range append([]string{idp}, o.TrustedIssuers...) {
		if iss != "" {
			v.issuers[iss] = &trustedIssuer{issuer: iss}
		}
	}
	return v
}

func (t *trustedIssuer) get(ctx context.Context, client *http.Client) (oidc.KeySet, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.keys != nil {
		return t.keys, nil
	}
	// The key set outlives this request: its context must not be cancelled
	// with it.
	kctx := oidc.ClientContext(context.WithoutCancel(ctx), client)
	dctx, cancel := context.WithTimeout(kctx, 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(dctx, t.issuer)
	if err != nil {
		return nil, fmt.Errorf("OIDC discovery for %s: %w", t.issuer, err)
	}
	var d struct {
		JWKS string `json:"jwks_uri"`
	}
	if err := p.Claims(&d); err != nil || d.JWKS == "" {
		return nil, fmt.Errorf("OIDC discovery for %s: no jwks_uri", t.issuer)
	}
	t.keys = oidc.NewRemoteKeySet(kctx, d.JWKS)
	return t.keys, nil
}

// idjagClaims are the claims of an ID-JAG the broker reads.
type idjagClaims struct {
	Issuer   string       `json:"iss"`
	Subject  string       `json:"sub"`
	Audience stringOrList `json:"aud"`
	ClientID string       `json:"client_id"`
	ID       string       `json:"jti"`
	Expiry   *numericDate `json:"exp"`
	IssuedAt *numericDate `json:"iat"`
	NotBef   *numericDate `json:"nbf"`
	Resource stringOrList `json:"resource"`
	Scope    *string      `json:"scope"`
}

// stringOrList is a claim that is one string or an array of strings;
// present records that the claim was there at all.
type stringOrList struct {
	values  []string
	present bool
}

func (s *stringOrList) UnmarshalJSON(b []byte) error {
	s.present = true
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		s.values = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("must be a string or an array of strings")
	}
	s.values = many
	return nil
}

// numericDate is a JWT NumericDate: seconds since the epoch, possibly
// fractional.
type numericDate struct{ t time.Time }

func (d *numericDate) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return errors.New("must be a number")
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e11 {
		return errors.New("is out of range")
	}
	sec, frac := math.Modf(f)
	d.t = time.Unix(int64(sec), int64(frac*1e9))
	return nil
}

// jagRefusal is why an ID-JAG was refused: the telemetry outcome (IDJAG*)
// and the error description for the client, which names no secret and no
// claim value the client did not send itself.
type jagRefusal struct {
	outcome string
	status  int
	code    string
	desc    string
	err     error // for the log only
}

func refuse(outcome, format string, args ...any) *jagRefusal {
	return &jagRefusal{outcome: outcome, status: http.StatusBadRequest, code: "invalid_grant", desc: fmt.Sprintf(format, args...)}
}

// acceptedJAG is a valid ID-JAG: the person, the client and what it grants.
type acceptedJAG struct {
	principal vault.Principal
	jti       string
	expiry    time.Time
	// scopes is the scope claim's (nil when absent), each offered by
	// the broker.
	scopes    []string
	hasScope  bool
	resources []string
	// resource is the one the token is issued for.
	resource string
}

// validateIDJAG checks raw as an ID-JAG for clientID at now: the checks of
// RFC 7521 section 5.2, RFC 7523 section 3 and the ID-JAG draft's
// processing rules, with the MCP profile's audience, resource and replay
// rules. It stores nothing; the caller spends the jti.
func (s *Server) validateIDJAG(ctx context.Context, raw, clientID string, now time.Time) (acceptedJAG, *jagRefusal) {
	if raw == "" {
		r := refuse(telemetry.IDJAGMalformed, "assertion is required: the ID-JAG")
		r.code = "invalid_request"
		return acceptedJAG{}, r
	}
	if len(raw) > maxAssertionLen {
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion is longer than %d bytes", maxAssertionLen)
	}
	if alg, ok := headerAlg(raw); ok && !slices.Contains(idjagAlgorithms, jose.SignatureAlgorithm(alg)) {
		return acceptedJAG{}, refuse(telemetry.IDJAGAlgorithm, "the assertion's signature algorithm %s is not accepted (asymmetric algorithms only; never none or HMAC)", untrustedName(alg))
	}
	jws, err := jose.ParseSignedCompact(raw, idjagAlgorithms)
	if err != nil {
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion is not a compact JWS")
	}
	if len(jws.Signatures) != 1 {
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion must carry exactly one signature")
	}
	if typ, _ := jws.Signatures[0].Protected.ExtraHeaders[jose.HeaderType].(string); !isIDJAGType(typ) {
		return acceptedJAG{}, refuse(telemetry.IDJAGType, "the assertion's typ must be %s", idjagType)
	}
	// Which issuer claims to have signed it decides the keys; nothing
	// else is read before the signature checks.
	var head struct {
		Issuer string `json:"iss"`
	}
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &head); err != nil || head.Issuer == "" {
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion's claims must be a JSON object with iss")
	}
	ti, ok := s.jag.issuers[head.Issuer]
	if !ok {
		return acceptedJAG{}, refuse(telemetry.IDJAGUntrustedIssuer, "the assertion's issuer is not trusted by this broker")
	}
	keys, err := ti.get(ctx, s.jag.client)
	if err != nil {
		return acceptedJAG{}, &jagRefusal{outcome: telemetry.IDJAGIssuerDown, status: http.StatusServiceUnavailable,
			code: "temporarily_unavailable", desc: "the assertion's issuer cannot be reached to check its signature; try again later", err: err}
	}
	// The algorithm is on the allow-list (parsed above with it), so the
	// key set only has to find the issuer's key that verifies.
	payload, err := keys.VerifySignature(ctx, raw)
	if err != nil {
		r := refuse(telemetry.IDJAGSignature, "the assertion's signature does not verify with the issuer's keys")
		r.err = err
		return acceptedJAG{}, r
	}
	c, err := parseJAGClaims(payload)
	if err != nil {
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion's claims are malformed: %s", err)
	}
	switch {
	case c.Issuer != head.Issuer:
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion's claims are malformed: iss")
	case c.Subject == "" || len(c.Subject) > 255:
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion must name its subject (sub, at most 255 bytes)")
	case c.ID == "" || len(c.ID) > 255:
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion must carry a jti of at most 255 bytes (single use is required)")
	case c.Expiry == nil || c.IssuedAt == nil:
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion must carry exp and iat")
	case c.ClientID == "":
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion must carry client_id")
	}
	// aud: exactly this broker's issuer identifier, alone.
	if len(c.Audience.values) != 1 || c.Audience.values[0] != s.opts.PublicURL {
		return acceptedJAG{}, refuse(telemetry.IDJAGAudience, "the assertion's aud must be this authorization server's issuer, %s, alone", s.opts.PublicURL)
	}
	if c.Resource.present {
		if len(c.Resource.values) == 0 {
			return acceptedJAG{}, refuse(telemetry.IDJAGResource, "the assertion's resource is empty")
		}
		for i, r := range c.Resource.values {
			canon, ok := s.resourceOf(r)
			if !ok {
				return acceptedJAG{}, refuse(telemetry.IDJAGResource, "the assertion's resource must be this broker's MCP endpoint, %s, or a gateway endpoint of it", s.opts.Resource)
			}
			c.Resource.values[i] = canon
		}
	}
	if c.ClientID != clientID {
		return acceptedJAG{}, refuse(telemetry.IDJAGClientMismatch, "the assertion was issued for another client than the one authenticated")
	}
	exp, iat := c.Expiry.t, c.IssuedAt.t
	switch {
	case !now.Before(exp.Add(idjagLeeway)):
		return acceptedJAG{}, refuse(telemetry.IDJAGExpired, "the assertion expired")
	case iat.After(now.Add(idjagLeeway)):
		return acceptedJAG{}, refuse(telemetry.IDJAGNotYetValid, "the assertion was issued in the future (iat)")
	case c.NotBef != nil && c.NotBef.t.After(now.Add(idjagLeeway)):
		return acceptedJAG{}, refuse(telemetry.IDJAGNotYetValid, "the assertion is not valid yet (nbf)")
	case exp.Sub(iat) > s.jagLifetime:
		return acceptedJAG{}, refuse(telemetry.IDJAGTooLongLived, "the assertion lives longer than the %s this broker accepts (exp - iat)", s.jagLifetime)
	case !exp.After(iat):
		return acceptedJAG{}, refuse(telemetry.IDJAGMalformed, "the assertion's exp is not after its iat")
	}
	a := acceptedJAG{principal: vault.Principal{Issuer: c.Issuer, Subject: c.Subject}, jti: c.ID, expiry: exp,
		resources: c.Resource.values}
	if c.Scope != nil {
		a.hasScope = true
		for _, sc := range strings.Fields(*c.Scope) {
			if !slices.Contains(s.scopes, sc) {
				return acceptedJAG{}, refuse(telemetry.IDJAGScope, "the assertion grants scope %s, which this broker does not offer", untrustedName(sc))
			}
			if !slices.Contains(a.scopes, sc) {
				a.scopes = append(a.scopes, sc)
			}
		}
	}
	return a, nil
}

// isIDJAGType accepts the typ header's value with or without the
// application/ prefix (RFC 7515 section 4.1.9), case-insensitively.
func isIDJAGType(typ string) bool {
	typ = strings.ToLower(typ)
	return typ == idjagType || typ == "application/"+idjagType
}

// headerAlg reads the alg of a compact JWS's protected header without
// trusting anything else, so an algorithm off the allow-list gets its own
// answer.
func headerAlg(raw string) (string, bool) {
	h, _, ok := strings.Cut(raw, ".")
	if !ok || len(h) > 4096 {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		return "", false
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(b, &hdr) != nil {
		return "", false
	}
	return hdr.Alg, true
}

// parseJAGClaims decodes the claims the broker reads, naming the claim
// that is malformed (never its value).
func parseJAGClaims(payload []byte) (idjagClaims, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil {
		return idjagClaims{}, errors.New("not a JSON object")
	}
	var c idjagClaims
	for name, dst := range map[string]any{
		"iss": &c.Issuer, "sub": &c.Subject, "aud": &c.Audience, "client_id": &c.ClientID, "jti": &c.ID,
		"exp": &c.Expiry, "iat": &c.IssuedAt, "nbf": &c.NotBef, "resource": &c.Resource, "scope": &c.Scope,
	} {
		v, ok := raw[name]
		if !ok {
			continue
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return idjagClaims{}, fmt.Errorf("%s has the wrong type or is out of range", name)
		}
	}
	return c, nil
}

// idjagAllowed applies the policy to an authenticated client: any
// confidential client under "any" (the draft wants the grant for
// confidential clients only), the listed clients (public ones included,
// the operator's explicit choice) under an allow-list.
func (s *Server) idjagAllowed(c *client) bool {
	p := s.opts.IDJAG.Policy
	switch p.Mode {
	case IDJAGAny:
		return c.AuthMethod != authNone
	case IDJAGAllow:
		return slices.Contains(p.Clients, c.ID)
	}
	return false
}

// jwtBearerGrant redeems an ID-JAG (RFC 7523 section 2.1). Every refusal
// is an RFC 6749 error, an audit event and a metric, and stores nothing.
func (s *Server) jwtBearerGrant(ctx context.Context, c *client, form url.Values) (tokenResponse, *oauthError) {
	resp, a, r := s.redeemIDJAG(ctx, c, form)
	if r != nil {
		s.opts.Telemetry.IDJAGGrant(r.outcome)
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventIDJAGRefused, Principal: a.principal, Client: c.ID,
			Via: "token", Outcome: r.outcome})
		return tokenResponse{}, &oauthError{Status: r.status, Code: r.code, Desc: r.desc, Err: r.err}
	}
	s.opts.Telemetry.IDJAGGrant(telemetry.IDJAGGranted)
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventIDJAGGranted, Principal: a.principal, Client: c.ID,
		Via: "token", Outcome: telemetry.IDJAGGranted})
	return resp, nil
}

func (s *Server) redeemIDJAG(ctx context.Context, c *client, form url.Values) (tokenResponse, acceptedJAG, *jagRefusal) {
	if s.opts.IDJAG.Policy.Mode == IDJAGOff || s.opts.IDJAG.Policy.Mode == "" {
		return tokenResponse{}, acceptedJAG{}, &jagRefusal{outcome: telemetry.IDJAGPolicyOff, status: http.StatusBadRequest,
			code: "unsupported_grant_type", desc: "the JWT bearer grant (ID-JAG) is turned off on this broker"}
	}
	if !s.idjagAllowed(c) {
		desc := "this client may not use the JWT bearer grant (ID-JAG) on this broker"
		if s.opts.IDJAG.Policy.Mode == IDJAGAny {
			desc = "the JWT bearer grant (ID-JAG) is for confidential clients: authenticate with a client secret"
		}
		return tokenResponse{}, acceptedJAG{}, &jagRefusal{outcome: telemetry.IDJAGClientNotAllowed, status: http.StatusBadRequest,
			code: "unauthorized_client", desc: desc}
	}
	now := s.now()
	a, r := s.validateIDJAG(ctx, form.Get("assertion"), c.ID, now)
	if r != nil {
		return tokenResponse{}, a, r
	}
	// The resource: the request's (within the assertion's, if it names
	// any), else the assertion's one, else the MCP endpoint.
	resource, e := s.requestedResource(form)
	switch {
	case e != nil:
		return tokenResponse{}, a, &jagRefusal{outcome: telemetry.IDJAGResource, status: e.Status, code: e.Code, desc: e.Desc}
	case resource != "" && len(a.resources) > 0 && !slices.Contains(a.resources, resource):
		return tokenResponse{}, a, &jagRefusal{outcome: telemetry.IDJAGResource, status: http.StatusBadRequest, code: "invalid_target",
			desc: "resource is not one the assertion was issued for"}
	case resource == "" && len(a.resources) == 1:
		resource = a.resources[0]
	case resource == "" && len(a.resources) > 1:
		return tokenResponse{}, a, &jagRefusal{outcome: telemetry.IDJAGResource, status: http.StatusBadRequest, code: "invalid_target",
			desc: "the assertion names several resources: say which one with the resource parameter"}
	case resource == "":
		resource = s.opts.Resource
	}
	a.resource = resource
	// Granted: the ID-JAG's scopes, narrowed to the request's scope when
	// one is sent (the MCP profile's intersection). Refresh tokens are not
	// issued for this grant, so offline_access means nothing here.
	scopes := a.scopes
	if raw, ok := form["scope"]; ok {
		var want []string
		for _, sc := range strings.Fields(raw[0]) {
			if slices.Contains(scopes, sc) && !slices.Contains(want, sc) {
				want = append(want, sc)
			}
		}
		scopes = want
	}
	scopes = slices.DeleteFunc(slices.Clone(scopes), func(sc string) bool { return sc == scopeOffline })

	// Single use across replicas: the last check, so a refusal above
	// stores nothing.
	err := s.opts.IDJAG.Ledger.SpendAssertion(ctx, vault.AssertionKey(a.principal.Issuer, a.jti), a.expiry.Add(idjagLeeway))
	switch {
	case errors.Is(err, vault.ErrAssertionSpent):
		s.log.Warn("security event", "event", "idjag_replayed", "client_id", c.ID)
		return tokenResponse{}, a, refuse(telemetry.IDJAGReplayed, "the assertion was used before (its jti is single use); ask the IdP for a new one")
	case err != nil:
		return tokenResponse{}, a, &jagRefusal{outcome: telemetry.IDJAGStoreFailed, status: http.StatusInternalServerError,
			code: "server_error", desc: "the assertion could not be recorded", err: err}
	}
	resp, e := s.issueForIDJAG(ctx, c, a, scopes)
	if e != nil {
		return tokenResponse{}, a, &jagRefusal{outcome: telemetry.IDJAGStoreFailed, status: e.Status, code: e.Code, desc: e.Desc, err: e.Err}
	}
	return resp, a, nil
}

// issueForIDJAG records a token family for the person and client, marked
// as granted by the organisation, and signs its access token. No refresh
// token: the draft says a JWT bearer grant should not return one, so a
// person the IdP stops vouching for gets nothing new once the access
// token expires.
func (s *Server) issueForIDJAG(ctx context.Context, c *client, a acceptedJAG, scopes []string) (tokenResponse, *oauthError) {
	now := s.now()
	fam := vault.TokenFamily{ID: randomID(16), Scopes: scopes, Resource: a.resource, Created: now,
		Expires: now.Add(s.policy.AccessTokenTTL), Via: apps.ViaIDJAG}
	// No consent is recorded: the organisation let the app in, and the
	// browser's /authorize still asks the person.
	app, err := s.apps.AddFamilyWithoutConsent(ctx, a.principal, c.ID, c.displayName(), fam)
	if err != nil {
		return tokenResponse{}, &oauthError{Status: http.StatusInternalServerError, Code: "server_error", Desc: "the tokens could not be recorded", Err: err}
	}
	resp, e := s.tokens(app, fam, scopes, "")
	if e != nil {
		return tokenResponse{}, e
	}
	if len(a.resources) > 0 {
		resp.Resource = a.resource
	}
	return resp, nil
}

// grantTypesText lists the grant types the token endpoint takes.
func (s *Server) grantTypesText() string {
	if s.opts.IDJAG.Policy.Mode == IDJAGOff {
		return "authorization_code or refresh_token"
	}
	return "authorization_code, refresh_token or " + grantJWTBearer
}

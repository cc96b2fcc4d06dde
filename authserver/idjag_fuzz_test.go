package authserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"

	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/web"
)

// FuzzJWTBearerGrant feeds arbitrary token request bodies, carrying
// arbitrary assertions, to the token endpoint (the form parser, client
// authentication and the JWT bearer grant's assertion validator) with a
// trusted issuer whose key the fuzzer's seeds are signed with. Whatever
// comes in: no panic, a JSON answer, an error from RFC 6749's set with
// nothing stored, and an access token only for an assertion that passes
// every check when read again independently, its jti accepted once.
func FuzzJWTBearerGrant(f *testing.F) {
	const iss = "https://idp.fuzz.example"
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		f.Fatal(err)
	}
	store := memstore.New(kr)
	now := time.Unix(1_900_000_000, 0)
	const public = "http://127.0.0.1:1"
	as, err := New(Options{
		PublicURL: public, IdPIssuer: iss, Store: store, Keys: kr, Scopes: []string{"broker"},
		Person:      func(*http.Request) (Person, bool) { return Person{}, false },
		StartSignIn: func(http.ResponseWriter, *http.Request, string) {},
		Now:         func() time.Time { return now },
		IDJAG:       IDJAGOptions{Policy: IDJAGPolicy{Mode: IDJAGAny}, Ledger: store.Assertions()},
		Clients:     []StaticClient{{ID: "fuzz-client", Secret: "fuzz-secret", RedirectURIs: []string{"http://127.0.0.1/cb"}}},
	})
	if err != nil {
		f.Fatal(err)
	}
	// The issuer's keys without discovery: the same go-oidc key set type
	// the broker uses, holding the one public key.
	as.jag.issuers[iss].keys = &oidc.StaticKeySet{PublicKeys: []crypto.PublicKey{&key.PublicKey}}
	site := web.NewSite()
	as.Register(site)

	sign := func(typ string, claims map[string]any) string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType(jose.ContentType(typ)))
		if err != nil {
			f.Fatal(err)
		}
		b, _ := json.Marshal(claims)
		jws, err := s.Sign(b)
		if err != nil {
			f.Fatal(err)
		}
		out, _ := jws.CompactSerialize()
		return out
	}
	valid := func(jti string) map[string]any {
		return map[string]any{"iss": iss, "sub": "alice", "aud": public, "client_id": "fuzz-client", "jti": jti,
			"iat": now.Unix(), "exp": now.Add(2 * time.Minute).Unix(), "resource": public + "/mcp", "scope": "broker"}
	}
	body := func(assertion string, extra string) string {
		return url.Values{"grant_type": {grantJWTBearer}, "assertion": {assertion}}.Encode() + extra
	}
	f.Add(body(sign(idjagType, valid("seed-1")), ""), true)
	f.Add(body(sign(idjagType, valid("seed-2")), "&scope=broker+offline_access"), true)
	f.Add(body(sign("JWT", valid("seed-3")), ""), true)
	c := valid("seed-4")
	c["aud"] = []any{public, "x"}
	f.Add(body(sign(idjagType, c), ""), true)
	c = valid("seed-5")
	c["exp"] = 1e300
	f.Add(body(sign(idjagType, c), ""), true)
	c = valid("seed-6")
	c["resource"] = []any{public + "/mcp", public + "/MCP"}
	f.Add(body(sign(idjagType, c), "&resource="+url.QueryEscape(public+"/mcp")), true)
	f.Add(body("eyJhbGciOiJub25lIn0.e30.", ""), true)
	f.Add(body(sign(idjagType, valid("seed-7")), "&assertion=again"), false)
	f.Add("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer", true)

	accepted := map[string]bool{}
	f.Fuzz(func(t *testing.T, form string, basic bool) {
		req := httptest.NewRequest(http.MethodPost, "/token", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if basic {
			req.SetBasicAuth("fuzz-client", "fuzz-secret")
		}
		rec := httptest.NewRecorder()
		site.ServeHTTP(rec, req)
		var answer struct {
			AccessToken  string `json:"access_token"`
			RefreshToken string `json:"refresh_token"`
			Error        string `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
			t.Fatalf("HTTP %d, not JSON: %q", rec.Code, rec.Body.String())
		}
		if rec.Code != http.StatusOK {
			switch answer.Error {
			case "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type",
				"invalid_scope", "invalid_target":
			default:
				t.Fatalf("HTTP %d error %q is not an RFC 6749 token error", rec.Code, answer.Error)
			}
			return
		}
		// Accepted: read the assertion again, independently of the code
		// under test, and check every rule.
		vals, err := url.ParseQuery(form)
		if err != nil || vals.Get("grant_type") != grantJWTBearer || answer.RefreshToken != "" {
			t.Fatalf("accepted %q (refresh token %q)", form, answer.RefreshToken)
		}
		raw := vals.Get("assertion")
		parts := strings.Split(raw, ".")
		if len(parts) != 3 {
			t.Fatalf("accepted a non-JWS %q", raw)
		}
		hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
		var hdr map[string]any
		if json.Unmarshal(hb, &hdr) != nil || hdr["alg"] != "ES256" || !isIDJAGType(hdr["typ"].(string)) {
			t.Fatalf("accepted header %s", hb)
		}
		jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{jose.ES256})
		if err != nil {
			t.Fatalf("accepted: %v", err)
		}
		payload, err := jws.Verify(&key.PublicKey)
		if err != nil {
			t.Fatalf("accepted an assertion whose signature does not verify: %v", err)
		}
		var cl map[string]any
		if err := json.Unmarshal(payload, &cl); err != nil {
			t.Fatal(err)
		}
		aud, _ := cl["aud"].(string)
		if al, ok := cl["aud"].([]any); ok && len(al) == 1 {
			aud, _ = al[0].(string)
		}
		exp, _ := cl["exp"].(float64)
		iat, _ := cl["iat"].(float64)
		jti, _ := cl["jti"].(string)
		switch {
		case cl["iss"] != iss || aud != public || cl["client_id"] != "fuzz-client" || cl["sub"] == "" || jti == "":
			t.Fatalf("accepted claims %s", payload)
		case exp-iat > defaultIDJAGLifetime.Seconds() || float64(now.Unix()) >= exp+idjagLeeway.Seconds() || iat > float64(now.Add(idjagLeeway).Unix()):
			t.Fatalf("accepted times %s", payload)
		case accepted[jti]:
			t.Fatalf("jti %q accepted twice", jti)
		}
		accepted[jti] = true
		info, err := as.verifySigned(t.Context(), answer.AccessToken, as.opts.Resource)
		if err != nil || info.Principal != (vault.Principal{Issuer: iss, Subject: cl["sub"].(string)}) || info.ClientID != "fuzz-client" {
			t.Fatalf("the access token: %+v, %v", info, err)
		}
	})
}

package authserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"credbroker/vault"
)

// signingPurpose derives the token signing keys from the broker's key ring.
const signingPurpose = "authserver/access-token-signing/es256"

// accessTokenType is the JWS typ of the broker's access tokens (RFC 9068).
const accessTokenType = "at+jwt"

// signingKey is one ES256 key derived from one key of the key ring.
type signingKey struct {
	kid    string
	priv   *ecdsa.PrivateKey
	signer jose.Signer
}

// keySet holds one signing key per key of the broker's key ring, in ring
// order: the primary signs, all verify. Every replica derives the same
// keys from the same ring, so nothing is stored and nothing needs to be
// shared besides the ring itself; a rotation (a new primary) signs new
// tokens with the new key while tokens signed with the old one stay valid
// for as long as the old key stays in the ring.
type keySet struct {
	keys []*signingKey
	byID map[string]*signingKey
	jwks []byte
}

func newKeySet(kr *vault.Keyring) (*keySet, error) {
	d := kr.Derive(signingPurpose)
	ks := &keySet{byID: map[string]*signingKey{}}
	var pub jose.JSONWebKeySet
	for _, seed := range d.AllBytes() {
		priv, err := ecKeyFromSeed(seed)
		if err != nil {
			return nil, err
		}
		jwk := jose.JSONWebKey{Key: &priv.PublicKey, Algorithm: string(jose.ES256), Use: "sig"}
		tp, err := jwk.Thumbprint(crypto.SHA256)
		if err != nil {
			return nil, fmt.Errorf("authserver: key thumbprint: %w", err)
		}
		kid := base64.RawURLEncoding.EncodeToString(tp)
		jwk.KeyID = kid
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: priv},
			(&jose.SignerOptions{}).WithType(accessTokenType).WithHeader("kid", kid))
		if err != nil {
			return nil, fmt.Errorf("authserver: signer: %w", err)
		}
		k := &signingKey{kid: kid, priv: priv, signer: signer}
		ks.keys = append(ks.keys, k)
		ks.byID[kid] = k
		pub.Keys = append(pub.Keys, jwk)
	}
	if len(ks.keys) == 0 {
		return nil, vault.ErrNoKeys
	}
	b, err := json.Marshal(pub)
	if err != nil {
		return nil, err
	}
	ks.jwks = b
	return ks, nil
}

// ecKeyFromSeed turns 32 derived bytes into a P-256 private key. A value
// outside [1, n-1] (probability about 2^-32) is hashed again until it fits.
func ecKeyFromSeed(seed []byte) (*ecdsa.PrivateKey, error) {
	b := seed
	for i := range 64 {
		if k, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), b); err == nil {
			return k, nil
		}
		sum := sha256.Sum256(append(b, byte(i)))
		b = sum[:]
	}
	return nil, errors.New("authserver: cannot derive a P-256 key")
}

// accessClaims are the claims of the broker's access tokens (RFC 9068's
// profile). The person is the organisation IdP's (iss, sub): sub is the
// IdP's subject and sub_id names the IdP's issuer with it (RFC 9493's
// iss_sub subject identifier), so the broker's own iss never becomes
// part of a principal.
type accessClaims struct {
	Issuer   string    `json:"iss"`
	Subject  string    `json:"sub"`
	SubID    subjectID `json:"sub_id"`
	Audience audience  `json:"aud"`
	ClientID string    `json:"client_id"`
	Scope    string    `json:"scope,omitempty"`
	IssuedAt int64     `json:"iat"`
	Expiry   int64     `json:"exp"`
	ID       string    `json:"jti"`
	Session  string    `json:"sid"`
}

// audience is the aud claim: one string or an array (RFC 7519 section
// 4.1.3); the broker writes an array.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
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

// subjectID is an RFC 9493 subject identifier in the iss_sub format.
type subjectID struct {
	Format  string `json:"format"`
	Issuer  string `json:"iss"`
	Subject string `json:"sub"`
}

func (ks *keySet) sign(c accessClaims) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	jws, err := ks.keys[0].signer.Sign(b)
	if err != nil {
		return "", fmt.Errorf("authserver: sign access token: %w", err)
	}
	return jws.CompactSerialize()
}

// errBadToken is every reason a string is not one of the broker's valid
// access tokens; the wrapped text says which, for logs.
var errBadToken = errors.New("not a valid access token of this broker")

// parse verifies the signature and type of a compact JWS and returns its
// claims. It checks nothing else (see Server.checkClaims).
func (ks *keySet) parse(raw string) (accessClaims, error) {
	if len(raw) > 8<<10 {
		return accessClaims{}, fmt.Errorf("%w: too long", errBadToken)
	}
	jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		return accessClaims{}, fmt.Errorf("%w: %v", errBadToken, err)
	}
	if len(jws.Signatures) != 1 {
		return accessClaims{}, fmt.Errorf("%w: want one signature", errBadToken)
	}
	h := jws.Signatures[0].Protected
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != accessTokenType {
		return accessClaims{}, fmt.Errorf("%w: typ %q", errBadToken, typ)
	}
	k, ok := ks.byID[h.KeyID]
	if !ok {
		return accessClaims{}, fmt.Errorf("%w: unknown key id", errBadToken)
	}
	payload, err := jws.Verify(&k.priv.PublicKey)
	if err != nil {
		return accessClaims{}, fmt.Errorf("%w: signature: %v", errBadToken, err)
	}
	var c accessClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		return accessClaims{}, fmt.Errorf("%w: claims: %v", errBadToken, err)
	}
	return c, nil
}

// expiry is the claims' exp as a time.
func (c accessClaims) expiry() time.Time { return time.Unix(c.Expiry, 0) }

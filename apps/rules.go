package apps

import (
	"crypto/subtle"
	"slices"
	"time"

	"credbroker/internal/loopback"
	"credbroker/vault"
)

const (
	// MaxFamilies bounds the token families one app holds for one person
	// (one per sign-in): the oldest goes first.
	MaxFamilies = 20
	// MaxSpent bounds the spent refresh token hashes a family remembers
	// for replay detection: the oldest goes first.
	MaxSpent = 64
)

// Policy is the token lifetimes every rule of this package applies. The
// zero value of a field means its default.
type Policy struct {
	// AccessTokenTTL is an access token's lifetime, and the whole life of
	// a family without a refresh token (default 1h).
	AccessTokenTTL time.Duration
	// FamilyTTL is the absolute life of a family with a refresh token: no
	// token of it is valid afterwards (default 30 days).
	FamilyTTL time.Duration
	// RefreshIdleTTL expires a refresh token unused this long (default 7
	// days).
	RefreshIdleTTL time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.AccessTokenTTL <= 0 {
		p.AccessTokenTTL = time.Hour
	}
	if p.FamilyTTL <= 0 {
		p.FamilyTTL = 30 * 24 * time.Hour
	}
	if p.RefreshIdleTTL <= 0 {
		p.RefreshIdleTTL = 7 * 24 * time.Hour
	}
	return p
}

// NewFamily is the family an authorization code's redemption starts: it
// lives FamilyTTL with a refresh token (refreshHash, the SecretKey of the
// first one) and AccessTokenTTL without.
func (p Policy) NewFamily(id string, scopes []string, resource, refreshHash string, now time.Time) vault.TokenFamily {
	f := vault.TokenFamily{ID: id, Scopes: scopes, Resource: resource, Created: now, Expires: now.Add(p.AccessTokenTTL)}
	if refreshHash != "" {
		f.Expires, f.RefreshHash, f.Refreshed = now.Add(p.FamilyTTL), refreshHash, now
	}
	return f
}

// Live reports whether f can still issue or back a token at now: before
// its absolute end and, with a refresh token, that token not idle too
// long.
func (p Policy) Live(f vault.TokenFamily, now time.Time) bool {
	if !now.Before(f.Expires) {
		return false
	}
	return f.RefreshHash == "" || now.Before(f.Refreshed.Add(p.RefreshIdleTTL))
}

// WithFamily returns a holding fam as well: families that can issue
// nothing any more are dropped, at most MaxFamilies are kept (the oldest
// go first) and LastUsed is now. a is not modified.
func (p Policy) WithFamily(a vault.AppAccess, fam vault.TokenFamily, now time.Time) vault.AppAccess {
	fs := make([]vault.TokenFamily, 0, len(a.Families)+1)
	for _, f := range a.Families {
		if p.Live(f, now) {
			fs = append(fs, f)
		}
	}
	fs = append(fs, fam)
	if len(fs) > MaxFamilies {
		fs = fs[len(fs)-MaxFamilies:]
	}
	a.Families, a.LastUsed = fs, now
	return a
}

// withoutFamily returns a without the family at index i (a is not
// modified).
func withoutFamily(a vault.AppAccess, i int) vault.AppAccess {
	a.Families = slices.Delete(slices.Clone(a.Families), i, i+1)
	return a
}

func familyIndex(a vault.AppAccess, id string) int {
	return slices.IndexFunc(a.Families, func(f vault.TokenFamily) bool { return f.ID == id })
}

// Refresh is a refresh token presented for rotation, as hashes only.
type Refresh struct {
	// FamilyID is the family the token names.
	FamilyID string
	// Presented is vault.SecretKey of the presented token; Next that of
	// the token that replaces it.
	Presented, Next string
	// ClientID is the client that presented it (authenticated).
	ClientID string
}

// Outcome is what a rotation came to.
type Outcome int

const (
	// Unknown: the family does not exist, or never issued the token.
	// Nothing changes.
	Unknown Outcome = iota
	// Rotated: the token is spent and Next replaces it.
	Rotated
	// Replayed: the token was spent before; the family ends.
	Replayed
	// WrongClient: another client presented it; the family ends.
	WrongClient
	// Expired: the family or its refresh token is past its life; the
	// family ends.
	Expired
)

var outcomeNames = [...]string{"unknown", "rotated", "replayed", "wrong_client", "expired"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "outcome?"
}

// Rotate is refresh-token rotation (RFC 6749 section 6, OAuth 2.1's
// replay rule) as a pure function of the app access record, the presented
// token and the time: it returns the new record and what happened. A
// token of the family's chain presented again (spent), by another client,
// or after the family's life ends the family; the current one is spent
// (remembered, at most MaxSpent) and replaced by r.Next. a is not
// modified; with Unknown the record is returned as it is.
func (p Policy) Rotate(a vault.AppAccess, r Refresh, now time.Time) (vault.AppAccess, Outcome) {
	i := familyIndex(a, r.FamilyID)
	if i < 0 {
		return a, Unknown
	}
	f := a.Families[i]
	current := f.RefreshHash != "" && subtle.ConstantTimeCompare([]byte(r.Presented), []byte(f.RefreshHash)) == 1
	spent := slices.Contains(f.Spent, r.Presented)
	switch {
	case !current && !spent:
		return a, Unknown
	case a.ClientID != r.ClientID:
		return withoutFamily(a, i), WrongClient
	case spent:
		return withoutFamily(a, i), Replayed
	case !p.Live(f, now):
		return withoutFamily(a, i), Expired
	}
	f.Spent = append(slices.Clone(f.Spent), f.RefreshHash)
	if len(f.Spent) > MaxSpent {
		f.Spent = f.Spent[len(f.Spent)-MaxSpent:]
	}
	f.RefreshHash, f.Refreshed = r.Next, now
	a.Families = slices.Clone(a.Families)
	a.Families[i], a.LastUsed = f, now
	return a, Rotated
}

// Revocation is a token presented for revocation (RFC 7009).
type Revocation struct {
	FamilyID string
	// Refresh: the token is a refresh token, and Presented its
	// vault.SecretKey; only a token the family really issued revokes it.
	// An access token is checked by its signature before.
	Refresh   bool
	Presented string
	// ClientID is the client that asked (authenticated).
	ClientID string
}

// RevokeOutcome is what a revocation came to.
type RevokeOutcome int

const (
	// NotRevoked: no such family, or a refresh token it never issued;
	// RFC 7009 answers 200 all the same.
	NotRevoked RevokeOutcome = iota
	// Revoked: the family ended.
	Revoked
	// Foreign: the token belongs to another client; nothing changes.
	Foreign
)

// Revoke is revocation as a pure function: revoking either token of a
// family ends the family.
func Revoke(a vault.AppAccess, r Revocation) (vault.AppAccess, RevokeOutcome) {
	i := familyIndex(a, r.FamilyID)
	if i < 0 {
		return a, NotRevoked
	}
	if f := a.Families[i]; r.Refresh && f.RefreshHash != r.Presented && !slices.Contains(f.Spent, r.Presented) {
		return a, NotRevoked
	}
	if a.ClientID != r.ClientID {
		return a, Foreign
	}
	return withoutFamily(a, i), Revoked
}

// Request is what an app asks a person to allow.
type Request struct {
	Principal vault.Principal
	ClientID  string
	// ClientName is the app's self-asserted name (untrusted text).
	ClientName  string
	RedirectURI string
	Scopes      []string
	// Resource is the broker endpoint asked for; Primary the broker's MCP
	// endpoint, which a record from before resources were recorded
	// covers. "" for both: the resource is not checked.
	Resource, Primary string
}

// consentedResources are the resources a's consent covers: those recorded,
// or primary for a record from before resources were recorded.
func consentedResources(a vault.AppAccess, primary string) []string {
	if len(a.Resources) == 0 && primary != "" {
		return []string{primary}
	}
	return a.Resources
}

// withResource is a's resources with r's added (an approval for one more
// resource keeps the consent to the others).
func withResource(a vault.AppAccess, r Request) []string {
	out := slices.Clone(consentedResources(a, r.Primary))
	if r.Resource != "" && !slices.Contains(out, r.Resource) {
		out = append(out, r.Resource)
	}
	return out
}

// Covers reports whether the consent a remembers covers r: the same
// redirect URI (a loopback one may differ in port, RFC 8252 section 7.3),
// the resource among those consented to (consent is per person, client and
// resource), and no scope it did not grant. A record without a consent (an
// app the organisation let in) covers nothing.
func Covers(a vault.AppAccess, r Request) bool {
	if a.RedirectURI == "" || (a.RedirectURI != r.RedirectURI && !loopback.SameRedirect(a.RedirectURI, r.RedirectURI)) {
		return false
	}
	if r.Resource != "" && !slices.Contains(consentedResources(a, r.Primary), r.Resource) {
		return false
	}
	for _, sc := range r.Scopes {
		if !slices.Contains(a.Scopes, sc) {
			return false
		}
	}
	return true
}

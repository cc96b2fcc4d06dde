package oauthflow

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"time"

	"github.com/gorilla/securecookie"

	"credbroker/vault"
	"credbroker/web"
)

// Cookie lifetimes. All three are short: the session only has to last while
// a person connects or manages accounts.
const (
	sessionTTL = 30 * time.Minute
	loginTTL   = 10 * time.Minute
	flowTTL    = 10 * time.Minute
)

// session is the broker sign-in, stored in the session cookie.
type session struct {
	Issuer  string    `json:"iss"`
	Subject string    `json:"sub"`
	Display string    `json:"disp"` // email or name, shown on pages only
	CSRF    string    `json:"csrf"`
	Expires time.Time `json:"exp"`
}

func (s *session) principal() vault.Principal {
	return vault.Principal{Issuer: s.Issuer, Subject: s.Subject}
}

// visitor is the session as the browser kit knows it; nil when nobody is
// signed in.
func (s *session) visitor() *web.Visitor {
	if s == nil {
		return nil
	}
	return &web.Visitor{Issuer: s.Issuer, Subject: s.Subject, Display: s.Display, CSRF: s.CSRF}
}

func (s *session) chrome() web.Chrome { return s.visitor().Chrome() }

// loginState is the broker's own OIDC login in progress.
type loginState struct {
	State    string    `json:"state"`
	Verifier string    `json:"verifier"`
	Nonce    string    `json:"nonce"`
	ReturnTo string    `json:"return_to"`
	Expires  time.Time `json:"exp"`
}

// flowState is one provider authorization in progress: the consent of the
// person (Iss, Sub) to one grant, carried from the consent form to the
// callback, which records it with the connection.
type flowState struct {
	Iss      string    `json:"iss"`
	Sub      string    `json:"sub"`
	State    string    `json:"state"`
	Verifier string    `json:"verifier,omitempty"`
	Nonce    string    `json:"nonce,omitempty"`
	Grant    string    `json:"grant"`
	Provider string    `json:"provider"`
	Scopes   []string  `json:"scopes,omitempty"`
	Expires  time.Time `json:"exp"`
}

// cookieJar encodes and decodes the broker's cookies with securecookie
// (AES-256 + HMAC-SHA256), trying every configured key for rotation.
type cookieJar struct {
	codecs []securecookie.Codec
	dev    bool
	now    func() time.Time
}

func newCookieJar(kr *vault.Keyring, dev bool, now func() time.Time) *cookieJar {
	hash := kr.Derive("cookie-hash").AllBytes()
	block := kr.Derive("cookie-block").AllBytes()
	pairs := make([][]byte, 0, 2*len(hash))
	for i := range hash {
		pairs = append(pairs, hash[i], block[i])
	}
	codecs := securecookie.CodecsFromPairs(pairs...)
	for _, c := range codecs {
		if sc, ok := c.(*securecookie.SecureCookie); ok {
			sc.SetSerializer(securecookie.JSONEncoder{})
			sc.MaxAge(int(sessionTTL / time.Second))
		}
	}
	return &cookieJar{codecs: codecs, dev: dev, now: now}
}

// name returns the cookie name: __Host- prefixed outside dev mode (which
// requires Secure, Path=/ and no Domain, all of which we set).
func (j *cookieJar) name(base string) string {
	if j.dev {
		return "cb_" + base
	}
	return "__Host-cb_" + base
}

func (j *cookieJar) set(w http.ResponseWriter, base string, v any, ttl time.Duration) error {
	name := j.name(base)
	enc, err := securecookie.EncodeMulti(name, v, j.codecs...)
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: enc, Path: "/", MaxAge: int(ttl / time.Second),
		HttpOnly: true, Secure: !j.dev, SameSite: http.SameSiteLaxMode,
	})
	return nil
}

func (j *cookieJar) clear(w http.ResponseWriter, base string) {
	http.SetCookie(w, &http.Cookie{
		Name: j.name(base), Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: !j.dev, SameSite: http.SameSiteLaxMode,
	})
}

// get decodes cookie base into v; false when absent or invalid.
func (j *cookieJar) get(r *http.Request, base string, v any) bool {
	c, err := r.Cookie(j.name(base))
	if err != nil || c.Value == "" {
		return false
	}
	return securecookie.DecodeMulti(j.name(base), c.Value, v, j.codecs...) == nil
}

// session returns the signed-in session, or nil.
func (j *cookieJar) session(r *http.Request) *session {
	var s session
	if !j.get(r, "session", &s) || s.Issuer == "" || s.Subject == "" || !j.now().Before(s.Expires) {
		return nil
	}
	return &s
}

func (j *cookieJar) flow(r *http.Request) (*flowState, bool) {
	var fs flowState
	if !j.get(r, "flow", &fs) || !j.now().Before(fs.Expires) {
		return nil, false
	}
	return &fs, true
}

func (j *cookieJar) login(r *http.Request) (*loginState, bool) {
	var ls loginState
	if !j.get(r, "login", &ls) || !j.now().Before(ls.Expires) {
		return nil, false
	}
	return &ls, true
}

// randomToken returns 256 random bits, base64url.
func randomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("oauthflow: crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

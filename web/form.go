package web

import (
	"crypto/subtle"
	"net/http"
)

// Visitor is who is signed in to the broker in a browser, as a door knows
// them from the broker's session; a nil *Visitor is nobody.
type Visitor struct {
	Issuer, Subject string
	// Display is an email or a name, for pages.
	Display string
	// CSRF is the session's anti-forgery token, which every form echoes.
	CSRF string
}

// Chrome is what the layout shows of v.
func (v *Visitor) Chrome() Chrome {
	if v == nil {
		return Chrome{}
	}
	return Chrome{Identity: v.Display, CSRF: v.CSRF}
}

// Form is one kind of form post of a door: how large its body may be and
// what its refusals say. The kit gives the refusals' headings and status.
type Form struct {
	// Limit bounds the body, in bytes.
	Limit int64
	// SignedOut is the page when nobody is signed in (401); Refused when
	// the post did not come from the door's page (403): no or another
	// CSRF token, or a body that cannot be read. Each says what was left
	// alone (Message) and what to do Next.
	SignedOut, Refused ErrorPage
}

// PostedForm is the preamble of every form post on a page: someone is
// signed in (v), the body is read (at most f.Limit bytes) and its csrf
// field equals v's token (constant time). Otherwise it renders the
// refusal (a forged or stale post is also a security event) and answers
// false; nothing else has happened.
func (k *Kit) PostedForm(w http.ResponseWriter, r *http.Request, v *Visitor, f Form) bool {
	if v == nil {
		p := f.SignedOut
		p.Status, p.Heading = http.StatusUnauthorized, "You are signed out"
		k.RenderError(w, p)
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, f.Limit)
	if err := r.ParseForm(); err != nil || !EqualToken(r.PostFormValue("csrf"), v.CSRF) {
		k.SecurityEvent(r, "csrf_rejected", v, "path", k.opts.RedactPath(r.URL.Path))
		p := f.Refused
		p.Chrome, p.Status, p.Heading = v.Chrome(), http.StatusForbidden, "Form expired"
		k.RenderError(w, p)
		return false
	}
	return true
}

// SecurityEvent logs an attempt the door refused, naming the client's
// address and the acting visitor (when signed in), never the owner of
// what was attempted.
func (k *Kit) SecurityEvent(r *http.Request, event string, v *Visitor, attrs ...any) {
	args := []any{"event", event, "remote", k.opts.ClientAddr(r)}
	if v != nil {
		args = append(args, "actor_iss", v.Issuer, "actor_sub", v.Subject)
	}
	k.log.Warn("security event", append(args, attrs...)...)
}

// EqualToken compares two secret tokens (CSRF tokens, OAuth state,
// nonces) in constant time; an empty one never matches.
func EqualToken(a, b string) bool {
	return a != "" && b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

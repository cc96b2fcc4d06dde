package oauthflow

import (
	"net/http"
	"time"
)

// loggedOutTTL bounds how long after POST /logout the next broker sign-in
// forces the IdP's login form (prompt=login).
const loggedOutTTL = sessionTTL // securecookie refuses older cookies anyway

type loggedOutMark struct {
	Expires time.Time `json:"exp"`
}

// markLoggedOut remembers in this browser that its person signed out.
func (j *cookieJar) markLoggedOut(w http.ResponseWriter) {
	_ = j.set(w, "logged_out", loggedOutMark{Expires: j.now().Add(loggedOutTTL)}, loggedOutTTL)
}

// loggedOut reports whether this browser signed out and has not signed in since.
func (j *cookieJar) loggedOut(r *http.Request) bool {
	var m loggedOutMark
	return j.get(r, "logged_out", &m) && j.now().Before(m.Expires)
}

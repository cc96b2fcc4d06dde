package provider

import (
	"testing"
	"time"
)

// TestRegistrationStatesForgotten: the per-issuer registration states
// (single flight, backoff) keep an issuer only while a registration there
// is under way or within registrationBackoff of a failed one; the others
// are forgotten as new issuers arrive, so servers naming ever new issuers
// cannot grow the map, and no backoff is lost.
func TestRegistrationStatesForgotten(t *testing.T) {
	now := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	k := &Client{opts: Options{Now: func() time.Time { return now }}, registrations: map[string]*registrationState{}}

	failed, doneFailed := k.registration("https://as.example/failed")
	failed.failed = now
	doneFailed()
	held, doneHeld := k.registration("https://as.example/held")
	for i := range 1000 {
		_, done := k.registration("https://as.example/" + string(rune('a'+i%26)) + time.Duration(i).String())
		done()
	}
	if n := len(k.registrations); n > 3 {
		t.Fatalf("%d registration states kept after 1,000 issuers came and went", n)
	}
	// A second caller at the held issuer, still there at the end.
	if st, _ := k.registration("https://as.example/held"); st != held {
		t.Error("the state of an issuer in use was forgotten: a second registration could start beside the first")
	}
	if st, done := k.registration("https://as.example/failed"); st != failed || !st.failed.Equal(now) {
		t.Error("the state of an issuer that failed a moment ago was forgotten: its backoff is lost")
	} else {
		done()
	}
	doneHeld()

	now = now.Add(registrationBackoff)
	k.registration("https://as.example/new")
	if _, ok := k.registrations["https://as.example/failed"]; ok {
		t.Error("an issuer kept past its backoff with nobody using it")
	}
	if _, ok := k.registrations["https://as.example/held"]; !ok {
		t.Error("an issuer its second caller still holds was forgotten")
	}
}

package apps

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"credbroker/vault"
)

var (
	t0    = time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)
	alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	rules = Policy{AccessTokenTTL: time.Hour, FamilyTTL: 30 * 24 * time.Hour, RefreshIdleTTL: 7 * 24 * time.Hour}
)

// record is an app of client "c1" holding one family f1 whose current
// refresh token hash is "h3", having spent "h1" and "h2", and another
// family f2.
func record() vault.AppAccess {
	return vault.AppAccess{ID: "a1", Principal: alice, ClientID: "c1", Version: 4, Families: []vault.TokenFamily{
		{ID: "f1", Scopes: []string{"mcp"}, Created: t0, Expires: t0.Add(30 * 24 * time.Hour), RefreshHash: "h3", Refreshed: t0, Spent: []string{"h1", "h2"}},
		{ID: "f2", Created: t0, Expires: t0.Add(30 * 24 * time.Hour), RefreshHash: "g1", Refreshed: t0},
	}}
}

// TestRotate is the table of refresh-token rotation: the pure function
// alone, (record, presented token, now) → (new record, outcome).
func TestRotate(t *testing.T) {
	later := t0.Add(time.Hour)
	rotated := record()
	rotated.Families = []vault.TokenFamily{
		{ID: "f1", Scopes: []string{"mcp"}, Created: t0, Expires: t0.Add(30 * 24 * time.Hour), RefreshHash: "h4", Refreshed: later, Spent: []string{"h1", "h2", "h3"}},
		rotated.Families[1],
	}
	rotated.LastUsed = later
	ended := record()
	ended.Families = ended.Families[1:]
	full := record() // a family that spent MaxSpent tokens already
	for i := range MaxSpent {
		full.Families[0].Spent = append(full.Families[0].Spent, fmt.Sprintf("s%d", i))
	}
	full.Families[0].Spent = full.Families[0].Spent[len(full.Families[0].Spent)-MaxSpent:]

	tests := []struct {
		name  string
		in    vault.AppAccess
		r     Refresh
		now   time.Time
		want  Outcome
		after vault.AppAccess
	}{
		{"current token rotates", record(), Refresh{FamilyID: "f1", Presented: "h3", Next: "h4", ClientID: "c1"}, later, Rotated, rotated},
		{"spent token is a replay: the family ends", record(), Refresh{FamilyID: "f1", Presented: "h1", Next: "h4", ClientID: "c1"}, later, Replayed, ended},
		{"latest spent token is a replay too", record(), Refresh{FamilyID: "f1", Presented: "h2", Next: "h4", ClientID: "c1"}, later, Replayed, ended},
		{"another client's token ends the family", record(), Refresh{FamilyID: "f1", Presented: "h3", Next: "h4", ClientID: "c2"}, later, WrongClient, ended},
		{"another client replaying ends it as wrong client", record(), Refresh{FamilyID: "f1", Presented: "h1", Next: "h4", ClientID: "c2"}, later, WrongClient, ended},
		{"idle refresh token expired", record(), Refresh{FamilyID: "f1", Presented: "h3", Next: "h4", ClientID: "c1"}, t0.Add(7 * 24 * time.Hour), Expired, ended},
		{"family past its absolute end", record(), Refresh{FamilyID: "f1", Presented: "h3", Next: "h4", ClientID: "c1"}, t0.Add(31 * 24 * time.Hour), Expired, ended},
		{"a token the family never issued changes nothing", record(), Refresh{FamilyID: "f1", Presented: "zz", Next: "h4", ClientID: "c1"}, later, Unknown, record()},
		{"another family's token changes nothing", record(), Refresh{FamilyID: "f1", Presented: "g1", Next: "h4", ClientID: "c1"}, later, Unknown, record()},
		{"an unknown family changes nothing", record(), Refresh{FamilyID: "f9", Presented: "h3", Next: "h4", ClientID: "c1"}, later, Unknown, record()},
		{"an empty presented hash is never current", func() vault.AppAccess {
			a := record()
			a.Families[1].RefreshHash = "" // an ID-JAG family: no refresh token
			return a
		}(), Refresh{FamilyID: "f2", Presented: "", Next: "h4", ClientID: "c1"}, later, Unknown, func() vault.AppAccess {
			a := record()
			a.Families[1].RefreshHash = ""
			return a
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.in.Clone()
			got, out := rules.Rotate(tt.in, tt.r, tt.now)
			if out != tt.want {
				t.Fatalf("outcome %v, want %v", out, tt.want)
			}
			if !reflect.DeepEqual(got, tt.after) {
				t.Fatalf("record after:\n%+v\nwant\n%+v", got, tt.after)
			}
			if !reflect.DeepEqual(tt.in, before) {
				t.Fatalf("Rotate modified its input:\n%+v\nwas\n%+v", tt.in, before)
			}
		})
	}

	// The spent list is bounded: rotating a family that spent MaxSpent
	// tokens keeps MaxSpent, dropping the oldest.
	got, out := rules.Rotate(full, Refresh{FamilyID: "f1", Presented: "h3", Next: "h4", ClientID: "c1"}, later)
	spent := got.Families[0].Spent
	if out != Rotated || len(spent) != MaxSpent || spent[len(spent)-1] != "h3" || spent[0] != full.Families[0].Spent[1] {
		t.Fatalf("rotating a full family: %v, %d spent (first %q, last %q)", out, len(spent), spent[0], spent[len(spent)-1])
	}
	// A long chain of rotations never holds more than MaxSpent.
	a, cur := record(), "h3"
	for i := range 3 * MaxSpent {
		next := fmt.Sprintf("n%d", i)
		if a, out = rules.Rotate(a, Refresh{FamilyID: "f1", Presented: cur, Next: next, ClientID: "c1"}, later); out != Rotated {
			t.Fatalf("rotation %d: %v", i, out)
		}
		cur = next
	}
	if n := len(a.Families[0].Spent); n != MaxSpent {
		t.Fatalf("after %d rotations the family remembers %d spent tokens, want %d", 3*MaxSpent, n, MaxSpent)
	}
}

// TestRevoke: either token of a family revokes it, only for its own client.
func TestRevoke(t *testing.T) {
	ended := record()
	ended.Families = ended.Families[1:]
	for _, tt := range []struct {
		name string
		r    Revocation
		want RevokeOutcome
	}{
		{"access token", Revocation{FamilyID: "f1", ClientID: "c1"}, Revoked},
		{"current refresh token", Revocation{FamilyID: "f1", Refresh: true, Presented: "h3", ClientID: "c1"}, Revoked},
		{"spent refresh token", Revocation{FamilyID: "f1", Refresh: true, Presented: "h1", ClientID: "c1"}, Revoked},
		{"refresh token the family never issued", Revocation{FamilyID: "f1", Refresh: true, Presented: "zz", ClientID: "c1"}, NotRevoked},
		{"unknown family", Revocation{FamilyID: "f9", ClientID: "c1"}, NotRevoked},
		{"another client's token", Revocation{FamilyID: "f1", ClientID: "c2"}, Foreign},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, out := Revoke(record(), tt.r)
			want := record()
			if tt.want == Revoked {
				want = ended
			}
			if out != tt.want || !reflect.DeepEqual(got, want) {
				t.Fatalf("got %v %+v, want %v %+v", out, got, tt.want, want)
			}
		})
	}
}

// TestWithFamily: adding a family drops dead ones and keeps at most
// MaxFamilies, the newest.
func TestWithFamily(t *testing.T) {
	a := record()
	a.Families[1].Expires = t0 // dead at t0
	for i := range MaxFamilies + 5 {
		a = rules.WithFamily(a, vault.TokenFamily{ID: fmt.Sprintf("n%d", i), Expires: t0.Add(time.Hour)}, t0)
	}
	if len(a.Families) != MaxFamilies || a.Families[MaxFamilies-1].ID != fmt.Sprintf("n%d", MaxFamilies+4) || !a.LastUsed.Equal(t0) {
		t.Fatalf("%d families, last %s", len(a.Families), a.Families[len(a.Families)-1].ID)
	}
	for _, f := range a.Families {
		if f.ID == "f2" {
			t.Fatal("the dead family was kept")
		}
	}
}

// TestCovers: a remembered consent covers the same redirect (loopback:
// any port) and no new scope; a record without consent covers nothing.
func TestCovers(t *testing.T) {
	a := vault.AppAccess{RedirectURI: "http://127.0.0.1:4000/cb", Scopes: []string{"mcp", "offline_access"}}
	for _, tt := range []struct {
		redirect string
		scopes   []string
		want     bool
	}{
		{"http://127.0.0.1:4000/cb", []string{"mcp"}, true},
		{"http://127.0.0.1:5999/cb", nil, true},
		{"http://127.0.0.1:4000/other", nil, false},
		{"http://localhost:4000/cb", nil, false},
		{"http://127.0.0.1:4000/cb", []string{"mcp", "admin"}, false},
	} {
		if got := Covers(a, Request{RedirectURI: tt.redirect, Scopes: tt.scopes}); got != tt.want {
			t.Errorf("Covers(%s %v) = %v, want %v", tt.redirect, tt.scopes, got, tt.want)
		}
	}
	if Covers(vault.AppAccess{}, Request{RedirectURI: ""}) {
		t.Error("a record without consent covers a request")
	}
}

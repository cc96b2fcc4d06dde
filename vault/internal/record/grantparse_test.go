package record

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"credbroker/internal/plainjson/plainjsontest"
	"credbroker/vault"
)

// checkGrantRecord fails when decodeGrantRecord accepts b and
// json.Unmarshal either rejects it or decodes something else. It reports
// whether the fast path took b.
func checkGrantRecord(t testing.TB, b []byte) bool {
	t.Helper()
	var fast grantRecord
	if !decodeGrantRecord(b, &fast) {
		return false
	}
	var want grantRecord
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("decodeGrantRecord accepted what encoding/json rejects (%v): %q", err, b)
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("decoded differently from %q:\nfast %#v\njson %#v", b, fast, want)
	}
	return true
}

func TestDecodeGrantRecordMatchesJSON(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 4, 5, 123456789, time.UTC)
	for _, g := range []vault.Grant{
		{ID: "g1", Principal: vault.Principal{Issuer: "https://idp", Subject: "alice"}, Provider: "github", Scopes: []string{"repo", "read:org"},
			ClientName: "Agent ✓", Server: "demorepos", Created: now, Expires: now.Add(10 * time.Minute), State: vault.GrantPending, Version: 1},
		{ID: "g2", Principal: vault.Principal{Issuer: "i", Subject: "s"}, Provider: "demo", Created: now.In(time.FixedZone("x", 3600)),
			State: vault.GrantCompleted, ConnectionID: "c1", Rounds: 3, Attempts: 2, Version: 123456789012},
		{ID: "g5", Why: "idp_refused", Version: 2},
		{ID: "g3"},
		{ID: "g4", ClientName: "<script>&", Scopes: []string{}},
	} {
		rec, err := EncodeGrant(g)
		if err != nil {
			t.Fatal(err)
		}
		if !checkGrantRecord(t, rec) && !strings.Contains(string(rec), `\u003c`) {
			t.Errorf("fast path refused a record EncodeGrant wrote: %s", rec)
		}
	}
	for _, tc := range []struct {
		rec  string
		fast bool
	}{
		{`{}`, true},
		{`{"v":1,"id":"g","scopes":[]}`, true},
		{`{"v":1,"id":"g","rounds":0,"version":999999999999999999}`, true},
		{`{"v":1,"id":"g","version":18446744073709551615}`, false},
		{`{"v":1,"id":"g","rounds":-1}`, false},
		{`{"v":1,"id":"g","rounds":01}`, false},
		{`{"v":1,"id":"g","rounds":1.0}`, false},
		{`{"v":1,"id":"g","rounds":1e2}`, false},
		{`{"v":1,"id":"g","id":"h"}`, false},
		{`{"v":1,"ID":"g"}`, false},
		{`{"v":1,"id":"g","extra":1}`, false},
		{`{"v":1,"id":"\u0067"}`, false},
		{"{\"v\":1,\"id\":\"\xff\"}", false},
		{`{"v":1,"id":null}`, false},
		{`{"v":1,"scopes":null}`, false},
		{`{"v":1,"scopes":["a",1]}`, false},
		{`{"v":1,"created":"2026-12-02T13:04:05Z"}`, true},
		{`{"v":1,"created":"2026-12-02T13:04:05+01:00"}`, true},
		{`{"v":1,"created":"2026-12-02 13:04:05Z"}`, false},
		{`{"v":1,"created":"0001-01-01T00:00:00Z"}`, true},
		{`{"v":1,"created":5}`, false},
		{`{ "v":1}`, false},
		{`{"v":1}x`, false},
		{`{"v":1,}`, false},
		{`[]`, false},
		{``, false},
	} {
		if got := checkGrantRecord(t, []byte(tc.rec)); got != tc.fast {
			t.Errorf("fast path %v, want %v: %s", got, tc.fast, tc.rec)
		}
	}

	rng := rand.New(rand.NewPCG(16, 18))
	var fast int
	const n = 20000
	for i := range n {
		b := randomGrantRecord(rng)
		if i%2 == 1 {
			b = mutateRecord(rng, b)
		}
		if checkGrantRecord(t, b) {
			fast++
		}
	}
	if fast < n/10 {
		t.Errorf("fast path took %d of %d random records: the corpus no longer exercises it", fast, n)
	}
	t.Logf("fast path: %d of %d", fast, n)
}

// randomGrantRecord is a record of EncodeGrant's shape with random values,
// occasionally dropped, repeated, re-cased or mistyped members.
func randomGrantRecord(rng *rand.Rand) []byte {
	strs := []string{`""`, `"a"`, `"Agent ✓"`, `"\u00e9"`, `"\n"`, "\"\xff\"", `"<&>"`, `null`, `5`}
	str := func() string {
		if rng.IntN(20) != 0 {
			return strs[rng.IntN(3)]
		}
		return strs[rng.IntN(len(strs))]
	}
	ints := []string{"0", "1", "42", "999999999999999999", "1000000000000000000", "-1", "01", "1.5", "2e3", `"1"`, "null"}
	num := func() string {
		if rng.IntN(20) != 0 {
			return ints[rng.IntN(4)]
		}
		return ints[rng.IntN(len(ints))]
	}
	times := []string{`"2026-12-02T13:04:05Z"`, `"2026-12-02T13:04:05.123456789+01:00"`, `"0001-01-01T00:00:00Z"`,
		`"2026-13-02T13:04:05Z"`, `"2026-12-02T13:04:05"`, `""`, `null`}
	tm := func() string {
		if rng.IntN(20) != 0 {
			return times[rng.IntN(3)]
		}
		return times[rng.IntN(len(times))]
	}
	scopes := func() string {
		var parts []string
		for range rng.IntN(4) {
			parts = append(parts, str())
		}
		if rng.IntN(30) == 0 {
			return "null"
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	members := []struct {
		k string
		v func() string
	}{
		{"v", num}, {"id", str}, {"iss", str}, {"sub", str}, {"provider", str}, {"scopes", scopes}, {"client_name", str},
		{"server", str}, {"created", tm}, {"expires", tm}, {"state", str}, {"connection_id", str}, {"rounds", num},
		{"attempts", num}, {"version", num},
	}
	var parts []string
	for _, m := range members {
		if rng.IntN(4) == 0 {
			continue
		}
		k := m.k
		if rng.IntN(30) == 0 {
			k = strings.ToUpper(k)
		}
		parts = append(parts, `"`+k+`":`+m.v())
		if rng.IntN(40) == 0 {
			parts = append(parts, `"`+k+`":`+m.v())
		}
	}
	if rng.IntN(20) == 0 {
		parts = append(parts, `"other":1`)
	}
	return []byte("{" + strings.Join(parts, ",") + "}")
}

// mutateRecord is plainjsontest.Mutate with the characters this parser decides on.
func mutateRecord(rng *rand.Rand, b []byte) []byte {
	return plainjsontest.Mutate(rng, b, "{}[]\",:\\ nx0-.eEZT\x00\xff")
}

// FuzzDecodeGrantRecord: whenever the fast path accepts a record,
// encoding/json accepts it too and decodes the same grantRecord.
func FuzzDecodeGrantRecord(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		f.Add(randomGrantRecord(rng))
	}
	f.Add([]byte(`{"v":1,"id":"g1","iss":"i","sub":"s","provider":"github","scopes":["repo"],"created":"2026-12-02T13:04:05.1Z","expires":"2026-12-02T13:14:05.1Z","state":"pending","version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkGrantRecord(t, b)
	})
}

func BenchmarkDecodeGrant(b *testing.B) {
	now := time.Now()
	rec, err := EncodeGrant(vault.Grant{ID: "g1", Principal: vault.Principal{Issuer: "https://idp.example", Subject: "alice"}, Provider: "github",
		Scopes: []string{"repo"}, ClientName: "Agent", Created: now, Expires: now.Add(10 * time.Minute), State: vault.GrantPending, Version: 2})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeGrant(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r grantRecord
			if err := json.Unmarshal(rec, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// checkEncodeGrantRecord fails when encodeGrantRecord writes anything but
// what json.Marshal writes. It reports whether the fast path took r.
func checkEncodeGrantRecord(t testing.TB, r grantRecord) bool {
	t.Helper()
	got, ok := encodeGrantRecord(&r)
	if !ok {
		return false
	}
	want, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("encodeGrantRecord wrote %s for a record json.Marshal refuses (%v): %#v", got, err, r)
	}
	if string(got) != string(want) {
		t.Fatalf("encodeGrantRecord differs:\nfast %s\njson %s", got, want)
	}
	return true
}

func TestEncodeGrantRecordMatchesJSON(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 4, 5, 123456789, time.UTC)
	for _, tc := range []struct {
		r    grantRecord
		fast bool
	}{
		{grantRecord{V: 1, ID: "g1", Issuer: "https://idp", Subject: "alice", Provider: "github", Scopes: []string{"repo", "read:org"},
			ClientName: "Agent ✓", Server: "demorepos", Created: now, Expires: now.Add(time.Minute), State: vault.GrantPending, Version: 1}, true},
		{grantRecord{V: 1, ID: "g2", Created: now.In(time.FixedZone("x", -5*3600-1800)), State: vault.GrantCompleted, ConnectionID: "c",
			Rounds: -3, Attempts: 7, Version: 1<<64 - 1}, true},
		{grantRecord{V: 1, ID: "g3", Why: "no_idp_session"}, true},
		{grantRecord{Why: "<"}, false},
		{grantRecord{}, true},
		{grantRecord{Scopes: []string{}}, true},
		{grantRecord{Created: now.Truncate(time.Second)}, true},
		{grantRecord{Created: now.In(time.FixedZone("s", 3601))}, true},
		{grantRecord{Created: now.In(time.FixedZone("big", 25*3600))}, false},
		{grantRecord{Created: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, false},
		{grantRecord{Expires: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}, false},
		{grantRecord{ID: "<"}, false},
		{grantRecord{ClientName: "a&b"}, false},
		{grantRecord{Server: `"`}, false},
		{grantRecord{Scopes: []string{`\`}}, false},
		{grantRecord{ConnectionID: "\n"}, false},
		{grantRecord{State: "\u2028"}, false},
		{grantRecord{Issuer: "\xff"}, false},
		{grantRecord{Subject: "\x7f"}, true},
	} {
		if got := checkEncodeGrantRecord(t, tc.r); got != tc.fast {
			t.Errorf("fast path %v, want %v: %#v", got, tc.fast, tc.r)
		}
	}
	rng := rand.New(rand.NewPCG(16, 19))
	var fast int
	const n = 20000
	for range n {
		if checkEncodeGrantRecord(t, randomGrantValue(rng)) {
			fast++
		}
	}
	if fast < n/4 {
		t.Errorf("fast path took %d of %d random records: the corpus no longer exercises it", fast, n)
	}
	t.Logf("fast path: %d of %d", fast, n)
}

func randomGrantValue(rng *rand.Rand) grantRecord {
	strs := []string{"", "a", "github", "Agent ✓", "é", "<", "&", ">", `"`, `\`, "\n", "\x00", "\x7f", "\u2028", "\u2029", "\xff", "a\xe2\x80"}
	str := func() string {
		if rng.IntN(8) != 0 {
			return strs[rng.IntN(5)]
		}
		return strs[rng.IntN(len(strs))]
	}
	zones := []*time.Location{time.UTC, time.FixedZone("a", 3600), time.FixedZone("b", -9000), time.FixedZone("c", 59),
		time.FixedZone("d", 24*3600), time.FixedZone("e", -24*3600-60)}
	tm := func() time.Time {
		if rng.IntN(10) == 0 {
			return time.Time{}
		}
		year := 2026
		if rng.IntN(20) == 0 {
			year = []int{-1, 0, 9999, 10000, 1}[rng.IntN(5)]
		}
		t := time.Date(year, time.Month(1+rng.IntN(12)), 1+rng.IntN(28), rng.IntN(24), rng.IntN(60), rng.IntN(60),
			[]int{0, 1, 1000, 123456789, 500000000}[rng.IntN(5)], time.UTC)
		z := zones[0]
		if rng.IntN(4) == 0 {
			z = zones[rng.IntN(len(zones))]
		}
		return t.In(z)
	}
	num := func() int { return []int{0, 0, 0, 1, 7, -1, 1 << 40, -(1 << 62)}[rng.IntN(8)] }
	var scopes []string
	switch rng.IntN(4) {
	case 0:
	case 1:
		scopes = []string{}
	default:
		for range 1 + rng.IntN(3) {
			scopes = append(scopes, str())
		}
	}
	return grantRecord{V: num(), ID: str(), Issuer: str(), Subject: str(), Provider: str(), Scopes: scopes, ClientName: str(),
		Server: str(), Created: tm(), Expires: tm(), State: vault.GrantState(str()), ConnectionID: str(), Rounds: num(),
		Attempts: num(), Why: str(), Version: rng.Uint64() >> rng.IntN(64)}
}

// FuzzEncodeGrantRecord: whenever the fast encoder writes a record, it is
// json.Marshal's bytes.
func FuzzEncodeGrantRecord(f *testing.F) {
	f.Add("g1", "https://idp", "alice", "github", "repo", "Agent ✓", "", int64(1796000000), int64(123), 0, int64(0), uint64(1))
	f.Add("<", "&", "\u2028", "\xff", "\n", "", "x", int64(-62135596801), int64(0), 3600, int64(-1), uint64(1<<63))
	f.Fuzz(func(t *testing.T, id, iss, sub, prov, scope, client, conn string, sec, nsec int64, zone int, rounds int64, version uint64) {
		tm := time.Unix(sec, nsec).In(time.FixedZone("z", zone%(48*3600)))
		r := grantRecord{V: 1, ID: id, Issuer: iss, Subject: sub, Provider: prov, ClientName: client, Server: client + "s",
			Created: tm, Expires: tm.Add(10 * time.Minute), State: vault.GrantState(scope), ConnectionID: conn, Rounds: int(rounds),
			Attempts: int(rounds >> 3), Why: conn + client, Version: version}
		if scope != "" {
			r.Scopes = []string{scope, id}
		}
		checkEncodeGrantRecord(t, r)
	})
}

func BenchmarkEncodeGrant(b *testing.B) {
	now := time.Now()
	g := vault.Grant{ID: "g1", Principal: vault.Principal{Issuer: "https://idp.example", Subject: "alice"}, Provider: "github",
		Scopes: []string{"repo"}, ClientName: "Agent", Created: now, Expires: now.Add(10 * time.Minute), State: vault.GrantPending, Version: 2}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeGrant(g); err != nil {
			b.Fatal(err)
		}
	}
}

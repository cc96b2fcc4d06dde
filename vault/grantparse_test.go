package vault

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
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
	for _, g := range []Grant{
		{ID: "g1", Principal: Principal{Issuer: "https://idp", Subject: "alice"}, Provider: "github", Scopes: []string{"repo", "read:org"},
			ClientName: "Agent ✓", Server: "demorepos", Created: now, Expires: now.Add(10 * time.Minute), State: GrantPending, Version: 1},
		{ID: "g2", Principal: Principal{Issuer: "i", Subject: "s"}, Provider: "demo", Created: now.In(time.FixedZone("x", 3600)),
			State: GrantCompleted, ConnectionID: "c1", Rounds: 3, Attempts: 2, Version: 123456789012},
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

func mutateRecord(rng *rand.Rand, b []byte) []byte {
	b = append([]byte(nil), b...)
	for range 1 + rng.IntN(3) {
		if len(b) == 0 {
			break
		}
		i := rng.IntN(len(b))
		switch rng.IntN(4) {
		case 0:
			const alphabet = "{}[]\",:\\ nx0-.eEZT\x00\xff"
			b[i] = alphabet[rng.IntN(len(alphabet))]
		case 1:
			b = append(b[:i], b[i+1:]...)
		case 2:
			b = append(b[:i], append([]byte{b[rng.IntN(len(b))]}, b[i:]...)...)
		default:
			b = b[:i]
		}
	}
	return b
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
	rec, err := EncodeGrant(Grant{ID: "g1", Principal: Principal{Issuer: "https://idp.example", Subject: "alice"}, Provider: "github",
		Scopes: []string{"repo"}, ClientName: "Agent", Created: now, Expires: now.Add(10 * time.Minute), State: GrantPending, Version: 2})
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

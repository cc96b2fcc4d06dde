package requeststate

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"credbroker/vault"
)

func checkEncodeWire(t testing.TB, w wire) bool {
	t.Helper()
	got, ok := encodeWire(&w)
	if !ok {
		return false
	}
	want, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encodeWire differs:\n got %s\nwant %s", got, want)
	}
	return true
}

func checkDecodeWire(t testing.TB, b []byte) bool {
	t.Helper()
	var got wire
	if !decodeWire(b, &got) {
		return false
	}
	var want wire
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("decodeWire accepted what encoding/json rejects (%v): %q", err, b)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded differently from %q:\nfast %#v\njson %#v", b, got, want)
	}
	return true
}

func TestWireCodecMatchesJSON(t *testing.T) {
	d, _ := Digest([]byte(`{"provider":"github"}`))
	for _, tc := range []struct {
		w    wire
		fast bool
	}{
		{wire{V: 1, Issuer: "https://idp.test", Subject: "alice", Tool: "connect_account", ArgDigest: d, GrantID: "g_1", Expires: 1796000000}, true},
		{wire{V: 1, Issuer: "é✓", ArgDigest: []byte{}, Expires: -5}, true},
		{wire{}, true},
		{wire{Subject: "a<b"}, false},
		{wire{Tool: "a\"b"}, false},
		{wire{GrantID: "\xff"}, false},
		{wire{Issuer: "\u2028"}, false},
	} {
		if got := checkEncodeWire(t, tc.w); got != tc.fast {
			t.Errorf("encode fast path %v, want %v: %+v", got, tc.fast, tc.w)
		}
		if b, err := json.Marshal(tc.w); err == nil && tc.fast && tc.w.Expires >= 0 && tc.w.ArgDigest != nil && !checkDecodeWire(t, b) {
			t.Errorf("decode fast path refused %s", b)
		}
	}
	for _, tc := range []struct {
		pt   string
		fast bool
	}{
		{`{}`, true},
		{`{"v":1,"args":""}`, true},
		{`{"v":1,"args":"AQID"}`, true},
		{`{"v":1,"args":"AQI="}`, true},
		{`{"v":1,"args":"AQI"}`, false},
		{`{"v":1,"args":"AQ\nID"}`, false},
		{`{"v":1,"args":null}`, false},
		{`{"v":1,"exp":-1}`, false},
		{`{"v":1,"exp":1.5}`, false},
		{`{"v":01}`, false},
		{`{"v":1,"v":1}`, false},
		{`{"V":1}`, false},
		{`{"v":1,"x":1}`, false},
		{`{"v":1,"iss":"\u0061"}`, false},
		{`{ "v":1}`, false},
		{`{"v":1}x`, false},
	} {
		if got := checkDecodeWire(t, []byte(tc.pt)); got != tc.fast {
			t.Errorf("decode fast path %v, want %v: %s", got, tc.fast, tc.pt)
		}
	}
	rng := rand.New(rand.NewPCG(16, 20))
	var enc, dec int
	const n = 20000
	for i := range n {
		w := randomWire(rng)
		if checkEncodeWire(t, w) {
			enc++
		}
		b, _ := json.Marshal(w)
		if i%2 == 1 {
			b = mutate(rng, b)
		}
		if checkDecodeWire(t, b) {
			dec++
		}
	}
	if enc < n/4 || dec < n/10 {
		t.Errorf("fast paths took %d encodes and %d decodes of %d: the corpus no longer exercises them", enc, dec, n)
	}
	t.Logf("fast: %d encodes, %d decodes of %d", enc, dec, n)
}

func randomWire(rng *rand.Rand) wire {
	strs := []string{"", "alice", "https://idp.test", "connect_account", "é", "<", "&", `"`, `\`, "\n", "\xff", "\u2028"}
	str := func() string {
		if rng.IntN(6) != 0 {
			return strs[rng.IntN(5)]
		}
		return strs[rng.IntN(len(strs))]
	}
	var args []byte
	if rng.IntN(8) != 0 {
		args = make([]byte, rng.IntN(40))
		for i := range args {
			args[i] = byte(rng.IntN(256))
		}
	}
	return wire{V: []int{1, 1, 1, 0, 2, -1}[rng.IntN(6)], Issuer: str(), Subject: str(), Tool: str(), ArgDigest: args, GrantID: str(),
		Expires: []int64{1796000000, 0, -1, 1 << 62, 999999999999999999}[rng.IntN(5)]}
}

func FuzzEncodeWire(f *testing.F) {
	f.Add(1, "https://idp.test", "alice", "connect_account", []byte{1, 2, 3}, "g_1", int64(1796000000))
	f.Add(-1, "<", "\u2028", "\xff", []byte{}, "\"", int64(-1))
	f.Fuzz(func(t *testing.T, v int, iss, sub, tool string, args []byte, grant string, exp int64) {
		checkEncodeWire(t, wire{V: v, Issuer: iss, Subject: sub, Tool: tool, ArgDigest: args, GrantID: grant, Expires: exp})
	})
}

func FuzzDecodeWire(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 10 {
		b, _ := json.Marshal(randomWire(rng))
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"iss":"i","sub":"s","tool":"t","args":"AQID","grant":"g","exp":` + strings.Repeat("9", 18) + `}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodeWire(t, b)
	})
}

func BenchmarkSealOpen(b *testing.B) {
	keys := testKeys(b)
	alice := vaultPrincipal()
	d, _ := Digest([]byte(`{"provider":"github"}`))
	st := State{Principal: alice, Operation: "connect_account", ArgDigest: d, Ref: "g_0123456789", Expires: epoch.Add(10 * 60e9)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Open(keys, Seal(keys, st), alice, "connect_account", d, epoch); err != nil {
			b.Fatal(err)
		}
	}
}

func vaultPrincipal() vault.Principal {
	return vault.Principal{Issuer: "https://idp.test", Subject: "alice"}
}

package mcpapi

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// argInputs are fresh zero values of every tool input fastStringArgs serves.
func argInputs() []stringArgser {
	return []stringArgser{&connectInput{}, &disconnectInput{}, &requestInput{}}
}

// checkFastStringArgs decodes raw into each tool input with decodeArgs and
// with encoding/json alone, and fails when they differ in value or in
// accepting raw. It reports whether the fast path took raw for any input.
func checkFastStringArgs(t testing.TB, raw []byte) (fast bool) {
	t.Helper()
	for _, in := range argInputs() {
		ref := reflect.New(reflect.TypeOf(in).Elem()).Interface()
		refErr := decodeArgsJSON(raw, ref)
		probe := reflect.New(reflect.TypeOf(in).Elem()).Interface().(stringArgser)
		took := fastStringArgs(raw, probe.stringArgs())
		if !took && !reflect.ValueOf(probe).Elem().IsZero() {
			t.Fatalf("%T: the fast path refused %q but changed the input: %+v", in, raw, probe)
		}
		if took {
			fast = true
			if refErr != nil {
				t.Fatalf("%T: the fast path accepted what encoding/json rejects (%v): %q", in, refErr, raw)
			}
			if !reflect.DeepEqual(probe, ref) {
				t.Fatalf("%T differs for %q:\nfast %+v\njson %+v", in, raw, probe, ref)
			}
		}
		// decodeArgs as it was before the fast path: its shortcut for no
		// arguments, then encoding/json.
		before := reflect.New(reflect.TypeOf(in).Elem()).Interface()
		var beforeErr error
		if trimmed := bytes.TrimSpace(raw); len(trimmed) > 0 && string(trimmed) != "null" && string(trimmed) != "{}" {
			beforeErr = decodeArgsJSON(trimmed, before)
		}
		got := reflect.New(reflect.TypeOf(in).Elem()).Interface()
		err := decodeArgs(raw, got)
		if (err == nil) != (beforeErr == nil) || err == nil && !reflect.DeepEqual(got, before) || err != nil && err.Error() != beforeErr.Error() {
			t.Fatalf("%T: decodeArgs(%q) = %+v, %v; before the fast path %+v, %v", in, raw, got, err, before, beforeErr)
		}
	}
	return fast
}

func TestFastStringArgsMatchesEncodingJSON(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		fast bool // the fast path must take it for some input (the common shapes)
	}{
		{`{"provider":"github"}`, true},
		{` { "provider" : "github" , "account" : "octocat" } `, true},
		{`{"provider":"github","method":"GET","path":"/user/repos","host":"api.github.com","account":"ø"}`, true},
		{`{"provider":""}`, true},
		// encoding/json decides:
		{`{"provider":"github","scopes":["repo"]}`, false},
		{`{"provider":"git\u0068ub"}`, false},
		{`{"provider":"a\nb"}`, false},
		{`{"Provider":"github"}`, false},
		{`{"provider":"a","provider":"b"}`, false},
		{`{"provider":null}`, false},
		{`{"provider":1}`, false},
		{`{"provider":"github","extra":"x"}`, false},
		{`{"provider":"github","query":{"a":"b"}}`, false},
		{`{"provider":"github","body":"x"}`, false},
		{`{"provider":"github"}}`, false},
		{`{"provider":"github"} {}`, false},
		{`{"provider":"github",}`, false},
		{`{"provider":"` + "\xff" + `"}`, false},
		{`["github"]`, false},
		{`"github"`, false},
		{`{`, false},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			if got := checkFastStringArgs(t, []byte(tc.raw)); got != tc.fast {
				t.Errorf("fast path took it: %v, want %v", got, tc.fast)
			}
		})
	}
}

// TestFastStringArgsRandom runs the differential check over argument
// objects built from the inputs' own names and over mutations of them.
func TestFastStringArgsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	fast := 0
	for range 20000 {
		raw := randomArgs(rng)
		for range rng.IntN(3) {
			raw = mutate(rng, raw)
		}
		if checkFastStringArgs(t, raw) {
			fast++
		}
	}
	if fast < 2000 {
		t.Fatalf("the fast path took only %d of 20000 inputs", fast)
	}
}

func randomArgs(rng *rand.Rand) []byte {
	names := []string{"provider", "account", "method", "path", "host", "scopes", "query", "Provider", "x"}
	values := []string{`"github"`, `"octocat"`, `"GET"`, `"/user"`, `""`, `"é✓"`, `["repo"]`, `{"a":"b"}`, `null`, `1`, `"a\"b"`}
	var parts []string
	for range rng.IntN(5) {
		n := names[rng.IntN(5)]
		if rng.IntN(4) == 0 {
			n = names[rng.IntN(len(names))]
		}
		v := values[rng.IntN(6)]
		if rng.IntN(4) == 0 {
			v = values[rng.IntN(len(values))]
		}
		sp := []string{"", " ", "\n\t"}[rng.IntN(3)]
		parts = append(parts, sp+`"`+n+`"`+sp+":"+sp+v+sp)
	}
	return []byte("{" + strings.Join(parts, ",") + "}")
}

// FuzzFastStringArgs: whenever the fast path takes a tool's arguments,
// encoding/json accepts them too and decodes the same input, and decodeArgs
// answers as encoding/json does.
func FuzzFastStringArgs(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 20 {
		f.Add(randomArgs(rng))
	}
	f.Add([]byte(`{"provider":"github","method":"GET","path":"/user"}`))
	f.Add([]byte(`{"provider":"a","provider":"b"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkFastStringArgs(t, raw)
	})
}

// BenchmarkDecodeArgs: a provider_request's usual arguments through
// decodeArgs (the fast path) and through encoding/json alone.
func BenchmarkDecodeArgs(b *testing.B) {
	raw := []byte(`{"provider":"github","method":"GET","path":"/user/repos"}`)
	for _, bc := range []struct {
		name   string
		decode func([]byte, any) error
	}{{"fast", func(r []byte, v any) error { return decodeArgs(r, v) }}, {"json", func(r []byte, v any) error { return decodeArgsJSON(r, v) }}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var in requestInput
				if err := bc.decode(raw, &in); err != nil || in.Path != "/user/repos" {
					b.Fatal(in, err)
				}
			}
		})
	}
}

package sidecar

import (
	"encoding/json"
	"testing"

	"credbroker/connections"
)

// FuzzAnswer feeds the host's inputResponses, as a co-located server
// passes them on, to the reading of the broker's answer: it never panics,
// and either reads one of the three answers (or none) or explains why not.
func FuzzAnswer(f *testing.F) {
	for _, s := range []string{`{"connect_demo":{"action":"accept"}}`, `{"connect_demo":{"action":"decline","content":{}}}`,
		`{"connect_demo":"cancel"}`, `{"other":{"role":"assistant"}}`, `{"connect_demo":{"action":"x","_meta":{}}}`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var responses map[string]json.RawMessage
		if json.Unmarshal(b, &responses) != nil {
			return
		}
		a, bad := answer(responses, "connect_demo")
		switch {
		case bad != "" && a != "":
			t.Fatalf("both an answer %q and a refusal %q", a, bad)
		case bad == "":
			if _, ok := responses["connect_demo"]; !ok && a != connections.NoAnswer {
				t.Fatalf("answer %q without an entry", a)
			}
			if a != connections.NoAnswer {
				if _, ok := connections.ParseAnswer(string(a)); !ok {
					t.Fatalf("read an answer %q that is none of the three", a)
				}
			}
		}
	})
}

package strictjson

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

type inner struct {
	Extra string `json:"extra"`
}

type target struct {
	inner
	Provider string   `json:"provider"`
	Scopes   []string `json:"scopes,omitempty"`
	Plain    int
	Hidden   string `json:"-"`
	private  string
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		field    string // *UnknownFieldError's field
		typeErr  bool
		notOne   bool
		trailing bool
	}{
		{name: "good", in: `{"provider":"github","scopes":["a"],"extra":"x","Plain":1}`},
		{name: "case folded like encoding/json", in: `{"PROVIDER":"github","plain":2}`},
		{name: "unknown", in: `{"provider":"github","colour":"red"}`, field: "colour"},
		{name: "hidden is unknown", in: `{"Hidden":"x"}`, field: "Hidden"},
		{name: "private is unknown", in: `{"private":"x"}`, field: "private"},
		{name: "wrong type", in: `{"provider":1}`, typeErr: true},
		{name: "not an object", in: `[1]`, typeErr: true},
		{name: "two objects", in: `{} {}`, trailing: true},
		{name: "broken", in: `{"provider":`, notOne: true},
		{name: "unknown before broken", in: `{"x":1,"provider":`, notOne: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v target
			err := Decode([]byte(tc.in), &v)
			var ue *UnknownFieldError
			var te *json.UnmarshalTypeError
			switch {
			case tc.field != "":
				if !errors.As(err, &ue) || ue.Field != tc.field {
					t.Fatalf("err = %v, want unknown field %q", err, tc.field)
				}
			case tc.typeErr:
				if !errors.As(err, &te) {
					t.Fatalf("err = %v, want a type error", err)
				}
			case tc.trailing:
				if !errors.Is(err, ErrTrailing) {
					t.Fatalf("err = %v, want ErrTrailing", err)
				}
			case tc.notOne:
				if !errors.Is(err, ErrNotOneObject) {
					t.Fatalf("err = %v, want ErrNotOneObject", err)
				}
			case err != nil:
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// FuzzDecode: whatever the input, Decode answers as encoding/json would
// (nil exactly when a strict decode succeeds), and an unknown field it
// names is a member the struct has no field for.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"provider":"x"}`, `{"colour":1}`, `{}`, `[]`, `{"PROVIDER":"y","scopes":null}`, `{"a":{"b":1}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v target
		err := Decode(b, &v)
		var want target
		werr := json.Unmarshal(b, &want)
		if err == nil && werr != nil {
			t.Fatalf("Decode accepted what encoding/json refuses: %q", b)
		}
		var ue *UnknownFieldError
		if errors.As(err, &ue) && known(fieldNames(reflect.TypeFor[target]()), ue.Field) {
			t.Fatalf("unknown field %q is a known field", ue.Field)
		}
	})
}

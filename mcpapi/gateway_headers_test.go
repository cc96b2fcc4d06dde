package mcpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// routeSchema marks a top-level string, a nested integer and a boolean
// with x-mcp-header.
const routeSchema = `{"type":"object","properties":{
	"region":{"type":"string","x-mcp-header":"Region"},
	"opts":{"type":"object","properties":{"shard":{"type":"integer","x-mcp-header":"Shard"}}},
	"dry":{"type":"boolean","x-mcp-header":"Dry"},
	"note":{"type":"string"}}}`

// TestCheckParamHeaders: every x-mcp-header binding, nested ones too, is
// compared with the call's arguments (integers by value, anything else
// by text after Base64 decoding); the headers for the upstream are
// written from the arguments.
func TestCheckParamHeaders(t *testing.T) {
	bindings := toolParamBindings(json.RawMessage(routeSchema))
	if len(bindings) != 3 {
		t.Fatalf("bindings %+v, want region, opts.shard and dry", bindings)
	}
	for _, c := range []struct {
		name, args string
		headers    map[string]string
		problem    string
		want       map[string]string
	}{
		{name: "none present", args: `{"note":"x"}`, want: map[string]string{}},
		{name: "all", args: `{"region":"eu","opts":{"shard":7},"dry":true}`,
			headers: map[string]string{"Mcp-Param-Region": "eu", "Mcp-Param-Shard": "7", "Mcp-Param-Dry": "true"},
			want:    map[string]string{"Mcp-Param-Region": "eu", "Mcp-Param-Shard": "7", "Mcp-Param-Dry": "true"}},
		{name: "an integer as 7.0", args: `{"opts":{"shard":7}}`, headers: map[string]string{"Mcp-Param-Shard": "7.0"},
			want: map[string]string{"Mcp-Param-Shard": "7"}},
		{name: "header names are case-insensitive", args: `{"region":"eu"}`, headers: map[string]string{"mcp-param-region": "eu"},
			want: map[string]string{"Mcp-Param-Region": "eu"}},
		{name: "a value that needs Base64", args: `{"region":" Zürich "}`, headers: map[string]string{"Mcp-Param-Region": "=?base64?IFrDvHJpY2gg?="},
			want: map[string]string{"Mcp-Param-Region": "=?base64?IFrDvHJpY2gg?="}},
		{name: "a value of the Base64 form itself", args: `{"region":"=?base64?eA==?="}`,
			headers: map[string]string{"Mcp-Param-Region": "=?base64?PT9iYXNlNjQ/ZUE9PT89?="},
			want:    map[string]string{"Mcp-Param-Region": "=?base64?PT9iYXNlNjQ/ZUE9PT89?="}},
		{name: "an empty string", args: `{"region":""}`, headers: map[string]string{"Mcp-Param-Region": ""},
			want: map[string]string{"Mcp-Param-Region": ""}},
		{name: "an empty string without its header", args: `{"region":""}`, problem: "missing Mcp-Param-Region header"},
		{name: "a nested header missing", args: `{"opts":{"shard":7}}`, problem: "missing Mcp-Param-Shard header for the argument \"opts.shard\""},
		{name: "an integer that differs", args: `{"opts":{"shard":7}}`, headers: map[string]string{"Mcp-Param-Shard": "8"}, problem: "does not match"},
		{name: "an integer header that is not a number", args: `{"opts":{"shard":7}}`, headers: map[string]string{"Mcp-Param-Shard": "seven"}, problem: "does not match"},
		{name: "a boolean in capitals", args: `{"dry":false}`, headers: map[string]string{"Mcp-Param-Dry": "False"}, problem: "does not match"},
		{name: "a header for an object", args: `{"region":{"a":1}}`, headers: map[string]string{"Mcp-Param-Region": "x"}, problem: "not a string, an integer or a boolean"},
		{name: "a header for a fraction", args: `{"opts":{"shard":1.5}}`, headers: map[string]string{"Mcp-Param-Shard": "1.5"}, problem: "not a string, an integer or a boolean"},
		{name: "arguments that are not an object", args: `[1]`, headers: map[string]string{"Mcp-Param-Region": "x"}, problem: "unexpected Mcp-Param-Region header"},
	} {
		h := http.Header{}
		for k, v := range c.headers {
			h.Set(k, v)
		}
		want, problem := checkParamHeaders(h, json.RawMessage(c.args), bindings)
		if c.name == "all" {
			twice := h.Clone()
			twice.Add("Mcp-Param-Region", "eu")
			if _, p := checkParamHeaders(twice, json.RawMessage(c.args), bindings); !strings.Contains(p, "given more than once") {
				t.Errorf("a header given twice: problem %q", p)
			}
		}
		switch {
		case c.problem != "" && !strings.Contains(problem, c.problem):
			t.Errorf("%s: problem %q, want %q", c.name, problem, c.problem)
		case c.problem == "" && problem != "":
			t.Errorf("%s: problem %q, want none", c.name, problem)
		case c.problem == "" && !equalMaps(want, c.want):
			t.Errorf("%s: upstream headers %v, want %v", c.name, want, c.want)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// FuzzCheckParamHeaders: any header and arguments give an answer without
// panicking; headers accepted are written for the upstream so that they
// are accepted again, and are printable ASCII.
func FuzzCheckParamHeaders(f *testing.F) {
	f.Add("eu", `{"region":"eu"}`)
	f.Add("=?base64?SGVsbG8=?=", `{"region":"Hello"}`)
	f.Add("7", `{"opts":{"shard":7}}`)
	f.Add("", `{"region":null}`)
	f.Add("=?base64?!!?=", `{"region":"x","opts":{"shard":9007199254740993}}`)
	bindings := toolParamBindings(json.RawMessage(routeSchema))
	f.Fuzz(func(t *testing.T, header, args string) {
		h := http.Header{}
		h.Set("Mcp-Param-Region", header)
		h.Set("Mcp-Param-Shard", header)
		want, problem := checkParamHeaders(h, json.RawMessage(args), bindings)
		if problem != "" {
			return
		}
		again := http.Header{}
		for k, v := range want {
			for i := 0; i < len(v); i++ {
				if v[i] < 0x20 || v[i] > 0x7e {
					t.Fatalf("header %s: %q is not printable ASCII", k, v)
				}
			}
			again.Set(k, v)
		}
		if _, p := checkParamHeaders(again, json.RawMessage(args), bindings); p != "" {
			t.Fatalf("the headers written for the upstream %v are refused: %s", want, p)
		}
	})
}

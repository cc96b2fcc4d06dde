package mcpapi

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// Custom headers of a relayed tool call (SEP-2243). An upstream tool may
// mark input properties with x-mcp-header: a 2026-07-28 host then sends
// each such argument again as the header Mcp-Param-{name}, so that what
// stands between host and server (a load balancer, a firewall) can route
// on it without reading the body. The gateway is that server for the
// host: it refuses (400, -32020) a call whose headers do not say what its
// body says, so nothing in front of it can be told one thing while the
// upstream is asked another; and it writes the upstream request's headers
// from the body itself. The bindings come from the upstream's tools/list
// (the first page, as the gateway caches it).

// paramBinding is an input property marked x-mcp-header: its path in the
// arguments and the header's name (after Mcp-Param-).
type paramBinding struct {
	path   []string
	header string
}

// schemaNode is what paramBindings reads of an input schema.
type schemaNode struct {
	XMCPHeader json.RawMessage       `json:"x-mcp-header"`
	Properties map[string]schemaNode `json:"properties"`
}

// toolParamBindings returns the x-mcp-header bindings of a tool's input
// schema, at any depth (nil when there are none or the schema is not an
// object schema).
func toolParamBindings(schema any) []paramBinding {
	b, err := json.Marshal(schema)
	if err != nil {
		return nil
	}
	var root schemaNode
	if json.Unmarshal(b, &root) != nil {
		return nil
	}
	var out []paramBinding
	var walk func(props map[string]schemaNode, prefix []string)
	walk = func(props map[string]schemaNode, prefix []string) {
		for name, p := range props {
			path := append(append([]string(nil), prefix...), name)
			var header string
			if json.Unmarshal(p.XMCPHeader, &header) == nil && header != "" {
				out = append(out, paramBinding{path: path, header: header})
			}
			walk(p.Properties, path)
		}
	}
	walk(root.Properties, nil)
	return out
}

const paramHeaderPrefix = "Mcp-Param-"

// checkParamHeaders compares a call's Mcp-Param headers with its
// arguments, binding by binding: a header for an argument that is absent
// or null, no header for one that is present (an empty header is present:
// an empty string's), a header given twice, one that is not valid Base64
// in its =?base64?…?= form, or one whose value differs from the
// argument's are problems (the first is returned, "" when there is none).
// want are the headers the upstream request carries, written from the
// arguments.
func checkParamHeaders(h http.Header, args json.RawMessage, bindings []paramBinding) (want map[string]string, problem string) {
	if len(bindings) == 0 {
		return nil, ""
	}
	var obj map[string]json.RawMessage
	_ = json.Unmarshal(args, &obj)
	want = map[string]string{}
	for _, b := range bindings {
		name := paramHeaderPrefix + b.header
		values := h.Values(name)
		sent, got := len(values) > 0, ""
		if sent {
			got = values[0]
		}
		if len(values) > 1 {
			return nil, name + " header given more than once"
		}
		arg, present := argumentAt(obj, b.path)
		if !present || string(arg) == "null" {
			if sent {
				return nil, "unexpected " + name + " header: the argument " + quote(strings.Join(b.path, ".")) + " is absent or null"
			}
			continue
		}
		value, ok := headerPrimitive(arg)
		if !ok {
			if sent {
				return nil, name + " header for the argument " + quote(strings.Join(b.path, ".")) + ", which is not a string, an integer or a boolean"
			}
			continue
		}
		if !sent {
			return nil, "missing " + name + " header for the argument " + quote(strings.Join(b.path, "."))
		}
		decoded, ok := decodeHeaderValue(got)
		if !ok {
			return nil, name + " header is not valid Base64"
		}
		if !headerValueEqual(decoded, arg, value) {
			return nil, name + " header does not match the argument " + quote(strings.Join(b.path, "."))
		}
		want[name] = encodeParamHeader(value)
	}
	return want, ""
}

// argumentAt follows path into the arguments.
func argumentAt(obj map[string]json.RawMessage, path []string) (json.RawMessage, bool) {
	var cur json.RawMessage
	for i, part := range path {
		if i > 0 {
			obj = nil
			if json.Unmarshal(cur, &obj) != nil {
				return nil, false
			}
		}
		v, ok := obj[part]
		if !ok {
			return nil, false
		}
		cur = v
	}
	return cur, cur != nil
}

// maxSafeInteger bounds the integers a header carries (those a float64
// holds exactly, as in JavaScript).
const maxSafeInteger = 1<<53 - 1

// headerPrimitive is an argument as a header states it: a string as it
// is, a boolean as true or false, an integer in decimal; false for any
// other value (a fraction, an object).
func headerPrimitive(raw json.RawMessage) (string, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	switch x := v.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > maxSafeInteger {
			return "", false
		}
		return strconv.FormatInt(int64(x), 10), true
	}
	return "", false
}

// headerValueEqual: an integer argument matches a header naming the same
// number (1, 1.0); anything else matches the exact text.
func headerValueEqual(header string, arg json.RawMessage, value string) bool {
	var n float64
	if json.Unmarshal(arg, &n) == nil {
		h, err := strconv.ParseFloat(header, 64)
		return err == nil && h == n
	}
	return header == value
}

// encodeParamHeader writes a value as a header carries it: as it is when
// it is printable ASCII without leading or trailing blanks and not itself
// of the =?base64?…?= form, else Base64 in that form.
func encodeParamHeader(v string) string {
	plain := !(strings.HasPrefix(v, "=?base64?") && strings.HasSuffix(v, "?=")) &&
		strings.TrimLeft(v, " \t") == v && strings.TrimRight(v, " \t") == v
	for i := 0; plain && i < len(v); i++ {
		plain = v[i] >= 0x20 && v[i] <= 0x7e
	}
	if plain {
		return v
	}
	return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(v)) + "?="
}

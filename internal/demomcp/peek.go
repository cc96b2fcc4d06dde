package demomcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// peek reads a request body's JSON-RPC method and, for tools/call, the
// tool's name, to decide the scope before the go-sdk runs anything. The
// go-sdk reads JSON case-sensitively (encoding/json would not), so a body
// is refused when it could be read two ways: not one JSON object, or the
// members that decide (method, params, params.name) repeated or spelled
// in another case ("Name", "NAME", "nams" with a long s…).
func peek(body []byte) (method, tool string, err error) {
	top, err := members(body, "method", "params")
	if err != nil {
		return "", "", err
	}
	if raw, ok := top["method"]; ok && json.Unmarshal(raw, &method) != nil {
		return "", "", nil // not a string: the go-sdk refuses it
	}
	if method != "tools/call" {
		return method, "", nil
	}
	raw, ok := top["params"]
	if !ok || !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
		return method, "", nil // no params object: the go-sdk refuses it
	}
	params, err := members(raw, "name")
	if err != nil {
		return "", "", err
	}
	if raw, ok := params["name"]; ok && json.Unmarshal(raw, &tool) != nil {
		return method, "", nil
	}
	return method, tool, nil
}

var (
	errNotOneObject = errors.New("the body must be one JSON object")
	errAmbiguous    = errors.New("a member is repeated or spelled in another case")
)

// members reads the JSON object b and returns the values of the members
// named in keys, refusing b when it is not exactly one object or when a
// member name equal to a key under Unicode case folding is repeated or
// not the key itself.
func members(b []byte, keys ...string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errNotOneObject
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, errNotOneObject
		}
		name, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errNotOneObject
		}
		for _, k := range keys {
			if !strings.EqualFold(name, k) {
				continue
			}
			if _, seen := out[k]; seen || name != k {
				return nil, errAmbiguous
			}
			out[k] = v
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, errNotOneObject
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errNotOneObject
	}
	return out, nil
}

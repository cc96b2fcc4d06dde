package mcpapi

import (
	"bytes"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/plainjson"
)

// fastParse decodes the JSON-RPC envelope and the params this endpoint reads
// (modernParams) in one pass over body, without reflection. It handles the
// common shape only: known keys spelled exactly, each at most once; strings
// without escapes and in valid UTF-8; no nulls where a value is decoded;
// inputResponses only as elicitation results holding just an action (what a
// retry after a connect link sends). Anything else returns ok=false and the caller decodes with
// encoding/json, so behaviour never differs: when ok is true, msg and p are
// exactly what json.Unmarshal(body, &msg) and then json.Unmarshal(msg.Params,
// &p) give (TestFastParseMatchesEncodingJSON, FuzzFastParse). Unknown keys
// are skipped (after validating their value) unless they case-fold to a known
// key, which encoding/json would match.
//
// Raw values (id, params, arguments, capabilities) alias body.
func fastParse(body []byte, msg *rpcMessage, p *modernParams) bool {
	d := fastDecoder{b: body}
	d.ws()
	if !d.object(func(key []byte) bool {
		switch string(key) {
		case "jsonrpc":
			return d.once(0) && d.str(&msg.JSONRPC)
		case "id":
			return d.once(1) && d.notNull() && d.raw((*[]byte)(&msg.ID))
		case "method":
			return d.once(2) && d.str(&msg.Method)
		case "params":
			return d.once(3) && d.notNull() && d.raw((*[]byte)(&msg.Params))
		}
		return d.unknown(key, "jsonrpc", "id", "method", "params")
	}) {
		return false
	}
	d.ws()
	if d.i != len(d.b) {
		return false
	}
	if len(msg.Params) == 0 {
		return true
	}
	return fastParams(msg.Params, p)
}

func fastParams(params []byte, p *modernParams) bool {
	d := fastDecoder{b: params}
	ok := d.object(func(key []byte) bool {
		switch string(key) {
		case "_meta":
			return d.once(0) && d.meta(&p.Meta)
		case "cursor":
			var s string
			if !d.once(1) || !d.str(&s) {
				return false
			}
			p.Cursor = &s
			return true
		case "name":
			return d.once(2) && d.str(&p.Name)
		case "arguments":
			return d.once(3) && d.notNull() && d.raw((*[]byte)(&p.Arguments))
		case "requestState":
			return d.once(4) && d.str(&p.RequestState)
		case "inputResponses":
			return d.once(5) && d.inputResponses(&p.InputResponses)
		case "uri":
			return d.once(6) && d.str(&p.URI)
		}
		return d.unknown(key, "_meta", "cursor", "name", "arguments", "requestState", "inputResponses", "uri")
	})
	return ok && d.i == len(d.b)
}

func (d *fastDecoder) meta(m *reqMeta) bool {
	_, ok := d.nested(func(sub *fastDecoder, key []byte) bool {
		switch string(key) {
		case mcp.MetaKeyProtocolVersion:
			var s string
			if !sub.once(0) || !sub.str(&s) {
				return false
			}
			m.Version = &s
			return true
		case mcp.MetaKeyClientCapabilities:
			return sub.once(1) && sub.notNull() && sub.raw((*[]byte)(&m.Capabilities))
		case mcp.MetaKeyClientInfo:
			return sub.once(2) && sub.impl(&m.ClientInfo)
		case "traceparent":
			return sub.once(3) && sub.str(&m.TraceParent)
		case "tracestate":
			return sub.once(4) && sub.str(&m.TraceState)
		case "progressToken":
			return sub.once(5) && sub.notNull() && sub.raw((*[]byte)(&m.ProgressToken))
		}
		return sub.unknown(key, mcp.MetaKeyProtocolVersion, mcp.MetaKeyClientCapabilities, mcp.MetaKeyClientInfo, "traceparent", "tracestate", "progressToken")
	})
	return ok
}

// inputResponses decodes {"key":{"action":"..."}, ...}: each response an
// object with the one member action, a plain string. The SDK's
// InputResponseMap.UnmarshalJSON makes that an *mcp.ElicitResult with only
// Action set (the probe finds action, not role or roots). Any other member,
// an empty response, or a repeated key falls back.
func (d *fastDecoder) inputResponses(out *mcp.InputResponseMap) bool {
	m := mcp.InputResponseMap{}
	_, ok := d.nested(func(sub *fastDecoder, key []byte) bool {
		if _, dup := m[string(key)]; dup {
			return false
		}
		r := &mcp.ElicitResult{}
		seen, ok := sub.nested(func(in *fastDecoder, k []byte) bool {
			return string(k) == "action" && in.once(0) && in.str(&r.Action)
		})
		if !ok || seen == 0 {
			return false
		}
		m[string(key)] = r
		return true
	})
	if ok {
		*out = m
	}
	return ok
}

func (d *fastDecoder) impl(out **mcp.Implementation) bool {
	var impl mcp.Implementation
	_, ok := d.nested(func(sub *fastDecoder, key []byte) bool {
		switch string(key) {
		case "name":
			return sub.once(0) && sub.str(&impl.Name)
		case "title":
			return sub.once(1) && sub.str(&impl.Title)
		case "description":
			return sub.once(2) && sub.str(&impl.Description)
		case "version":
			return sub.once(3) && sub.str(&impl.Version)
		case "websiteUrl":
			return sub.once(4) && sub.str(&impl.WebsiteURL)
		}
		return sub.unknown(key, "name", "title", "description", "version", "websiteUrl", "icons")
	})
	if ok {
		*out = &impl
	}
	return ok
}

// nested decodes the object at d.i on a decoder of its own (the once bits
// of its members apart from d's), calling field with it and each key;
// d moves past the object. seen are the bits its members set.
func (d *fastDecoder) nested(field func(sub *fastDecoder, key []byte) bool) (seen uint32, ok bool) {
	sub := fastDecoder{b: d.b, i: d.i}
	ok = sub.object(func(key []byte) bool { return field(&sub, key) })
	d.i = sub.i
	return sub.seen, ok
}

// fastDecoder walks one JSON text. seen records the known keys of the
// object being decoded (duplicates fall back: encoding/json merges them).
type fastDecoder struct {
	b    []byte
	i    int
	seen uint32
}

func (d *fastDecoder) ws() { d.i = plainjson.Space(d.b, d.i) }

func (d *fastDecoder) once(bit uint) bool {
	if d.seen&(1<<bit) != 0 {
		return false
	}
	d.seen |= 1 << bit
	return true
}

// object decodes {"key": value, ...}, calling field with each key (escape
// free) positioned at its value, which field must consume.
func (d *fastDecoder) object(field func(key []byte) bool) bool {
	d.seen = 0
	return d.list('{', '}', func() bool {
		key, ok := d.plainString()
		if !ok {
			return false
		}
		d.ws()
		if d.i >= len(d.b) || d.b[d.i] != ':' {
			return false
		}
		d.i++
		d.ws()
		return field(key)
	})
}

// list decodes open, elements separated by commas, close: elem is called
// positioned at each element, which it must consume.
func (d *fastDecoder) list(open, close byte, elem func() bool) bool {
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != open {
		return false
	}
	d.i++
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == close {
		d.i++
		return true
	}
	for {
		d.ws()
		if !elem() {
			return false
		}
		if done, ok := d.next(close); !ok || done {
			return ok
		}
	}
}

// unknown skips the value of a key that is none of known; a key that
// case-folds to a known one is left to encoding/json.
func (d *fastDecoder) unknown(key []byte, known ...string) bool {
	for _, k := range known {
		if bytes.EqualFold(key, []byte(k)) {
			return false
		}
	}
	return d.skip()
}

// plainString reads a string without escapes, in valid UTF-8 (what
// encoding/json would give verbatim).
func (d *fastDecoder) plainString() ([]byte, bool) {
	start, end, ok := plainjson.String(d.b, d.i)
	if !ok {
		return nil, false
	}
	d.i = end + 1
	return d.b[start:end], true
}

func (d *fastDecoder) str(out *string) bool {
	s, ok := d.plainString()
	if ok {
		*out = plainjson.Intern(s, interned)
	}
	return ok
}

// interned are the values most requests carry (the JSON-RPC version,
// methods, tool names, protocol versions), kept as strings without a copy
// (plainjson.Intern).
var interned = []string{"2.0", "tools/call", "tools/list", "server/discover", toolConnect, toolList, toolRequest, toolDisconnect, versionModern, versionLegacy}

func (d *fastDecoder) notNull() bool {
	return d.i < len(d.b) && d.b[d.i] != 'n'
}

// raw validates one value and stores its bytes.
func (d *fastDecoder) raw(out *[]byte) bool {
	start := d.i
	if !d.skip() {
		return false
	}
	*out = d.b[start:d.i:d.i]
	return true
}

// skip validates and passes over one JSON value (plainjson.ValueEnd).
func (d *fastDecoder) skip() bool {
	end, ok := plainjson.ValueEnd(d.b, d.i)
	if ok {
		d.i = end
	}
	return ok
}

func (d *fastDecoder) literal(lit string) bool {
	if !bytes.HasPrefix(d.b[d.i:], []byte(lit)) {
		return false
	}
	d.i += len(lit)
	return true
}

// capsInfo is what the handler reads from _meta clientCapabilities.
type capsInfo struct {
	ok                      bool // an object encoding/json decodes
	urlCapable, formCapable bool
}

func capsFrom(raw []byte) capsInfo {
	var cc mcp.ClientCapabilities
	if err := json.Unmarshal(raw, &cc); err != nil {
		return capsInfo{}
	}
	return capsInfo{
		ok:         true,
		urlCapable: cc.Elicitation != nil && cc.Elicitation.URL != nil,
		// An empty elicitation object declares form mode only.
		formCapable: cc.Elicitation != nil && (cc.Elicitation.Form != nil || cc.Elicitation.URL == nil),
	}
}

// bytesMemo remembers a decode of the few small JSON values clients send
// again and again, such as their capability objects (keyed by their exact
// bytes: the decode must be a pure function of them, and what it returns
// is shared, so read only). Bounded: once full, learning a new value
// evicts an arbitrary one (map iteration order is random), so a burst of
// unusual values cannot freeze out the common ones for the life of the
// process.
type bytesMemo[V any] struct {
	mu sync.RWMutex
	m  map[string]V
}

const (
	memoEntries  = 64
	memoMaxBytes = 512
)

func (c *bytesMemo[V]) get(raw []byte, decode func([]byte) V) V {
	if len(raw) > memoMaxBytes {
		return decode(raw)
	}
	c.mu.RLock()
	v, ok := c.m[string(raw)]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = decode(raw)
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string]V)
	}
	if _, ok := c.m[string(raw)]; !ok && len(c.m) >= memoEntries {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[string(raw)] = v
	c.mu.Unlock()
	return v
}

// next consumes what follows a member or an element: close (done) or a
// comma; anything else is not ok.
func (d *fastDecoder) next(close byte) (done, ok bool) {
	d.ws()
	if d.i >= len(d.b) {
		return false, false
	}
	switch d.b[d.i] {
	case close:
		d.i++
		return true, true
	case ',':
		d.i++
		return false, true
	}
	return false, false
}

// stringArg is a string argument of a tool's input: its JSON name and
// where its value goes.
type stringArg struct {
	name string
	dst  *string
}

// stringArgser is a tool input whose common calls carry string arguments
// only (stringArgs lists them), which fastStringArgs can decode.
type stringArgser interface{ stringArgs() []stringArg }

// fastStringArgs decodes raw, a tool's arguments, into fields without
// reflection when raw is an object whose keys are all among fields, spelled
// exactly, each at most once, with strings holding no escape, control byte
// or invalid UTF-8, and nothing but whitespace around it. Anything else
// (another key, a known one spelled otherwise, a non-string argument,
// null, an escape) returns false with fields untouched, and the caller
// decodes with encoding/json. So when it returns true, the fields hold
// exactly what strict encoding/json decoding into a zero value gives
// (TestFastStringArgsMatchesEncodingJSON, FuzzFastStringArgs).
func fastStringArgs(raw []byte, fields []stringArg) bool {
	if len(fields) > 8 {
		return false
	}
	var vals [8][]byte
	var seen uint
	d := fastDecoder{b: raw}
	ok := d.object(func(key []byte) bool {
		for i, f := range fields {
			if string(key) == f.name {
				if seen&(1<<i) != 0 {
					return false
				}
				seen |= 1 << i
				v, ok := d.plainString()
				vals[i] = v
				return ok
			}
		}
		return false
	})
	if d.ws(); !ok || d.i != len(d.b) {
		return false
	}
	for i, f := range fields {
		if seen&(1<<i) != 0 {
			*f.dst = string(vals[i])
		}
	}
	return true
}

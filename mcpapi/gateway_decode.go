package mcpapi

import (
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/provider/mcpup"
)

// relayedToolResult is the result of a relayed tools/call as the gateway
// relays it: the go-sdk's, or the one the pool's own exchange handed over
// undecoded (mcpup.ToolResult.Raw), decoded here.
func relayedToolResult(tr mcpup.ToolResult, modern bool) (*mcp.CallToolResult, error) {
	if tr.Raw == nil {
		return tr.Decoded, nil
	}
	if modern {
		if r, ok := fastToolResult(tr.Raw); ok {
			return r, nil
		}
	}
	return decodeToolResult(tr.Raw)
}

// decodeToolResult is what the go-sdk's client does with a result it
// read; a panic of its decoder (go-sdk v1.8.0's InputRequestMap panics on
// a null entry, "inputRequests":{"k":null}) is an error like any other
// undecodable answer.
func decodeToolResult(raw []byte) (res *mcp.CallToolResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("mcpapi: the upstream's tools/call result could not be decoded (%v)", p)
		}
	}()
	var r mcp.CallToolResult
	if err := r.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("mcpapi: the upstream's tools/call result: %w", err)
	}
	return &r, nil
}

// fastToolResult decodes the usual tool result of an upstream, text
// contents only,
//
//	{"content":[{"type":"text","text":"…"}, …],"isError":false,
//	 "_meta":{"io.modelcontextprotocol/serverInfo":…},"resultType":"complete"}
//
// without reflection or the go-sdk's decoder (a fresh 32 KiB buffer per
// value): content required, the other members optional, every key spelled
// exactly and present once, strings without escapes in valid UTF-8,
// _meta holding nothing but the upstream's serverInfo, which the gateway
// replaces with its own and so does not keep. Anything else is not ok and
// is decoded by the go-sdk. For a 2026-07-28 host the gateway relays what
// it relays for the go-sdk's decoding of the same bytes
// (TestFastToolResult, FuzzFastToolResult).
func fastToolResult(raw []byte) (*mcp.CallToolResult, bool) {
	res := &mcp.CallToolResult{}
	d := fastDecoder{b: raw}
	ok := d.object(func(key []byte) bool {
		switch string(key) {
		case "content":
			return d.once(0) && d.textContents(&res.Content)
		case "isError":
			return d.once(1) && d.boolean(&res.IsError)
		case "_meta":
			return d.once(2) && d.serverInfoOnly()
		case "resultType":
			var s string
			return d.once(3) && d.str(&s) && s == "complete"
		}
		return false
	})
	if d.ws(); !ok || d.seen&1 == 0 || d.i != len(d.b) {
		return nil, false
	}
	return res, true
}

// textContents decodes [{"type":"text","text":"…"}, …] (each member once,
// no other).
func (d *fastDecoder) textContents(out *[]mcp.Content) bool {
	contents := []mcp.Content{}
	ok := d.list('[', ']', func() bool {
		var typ, text string
		seen, ok := d.nested(func(sub *fastDecoder, key []byte) bool {
			switch string(key) {
			case "type":
				return sub.once(0) && sub.str(&typ) && typ == "text"
			case "text":
				return sub.once(1) && sub.str(&text)
			}
			return false
		})
		contents = append(contents, &mcp.TextContent{Text: text})
		return ok && seen == 3
	})
	if ok {
		*out = contents
	}
	return ok
}

// boolean decodes true or false.
func (d *fastDecoder) boolean(out *bool) bool {
	switch {
	case d.literal("true"):
		*out = true
	case d.literal("false"):
		*out = false
	default:
		return false
	}
	return true
}

// serverInfoOnly passes over a _meta object that is empty or holds only
// the upstream's serverInfo (any value).
func (d *fastDecoder) serverInfoOnly() bool {
	_, ok := d.nested(func(sub *fastDecoder, key []byte) bool {
		return string(key) == mcp.MetaKeyServerInfo && sub.once(0) && sub.skip()
	})
	return ok
}

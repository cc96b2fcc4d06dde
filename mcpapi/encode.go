package mcpapi

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// encodeToolResult encodes a complete tool result of the shape the tools
// build (one plain text content, structured content as compact JSON) with
// resultType and serverInfo, byte for byte as the SDK's MarshalJSON plus
// withResultType would, without reflection or re-compacting the structured
// content (the profile's largest item on the connect_account hot path).
// ok is false for any other shape; the caller then uses the SDK encoder.
func (s *Server) encodeToolResult(res *mcp.CallToolResult) (b []byte, ok bool) {
	if res == nil || len(res.Content) != 1 || res.Meta != nil || res.InputRequests != nil || res.RequestState != "" {
		return nil, false
	}
	tc, isText := res.Content[0].(*mcp.TextContent)
	if !isText || tc.Meta != nil || tc.Annotations != nil {
		return nil, false
	}
	var raw json.RawMessage
	switch sc := res.StructuredContent.(type) {
	case nil:
	case json.RawMessage:
		// complete() built it with json.Marshal: valid, compact, HTML-escaped.
		raw = sc
	default:
		return nil, false
	}
	text, err := json.Marshal(tc.Text)
	if err != nil {
		return nil, false
	}
	b = make([]byte, 0, 128+len(s.implJSON)+len(text)+len(raw))
	b = append(b, `{"resultType":"complete","_meta":{"`+mcp.MetaKeyServerInfo+`":`...)
	b = append(b, s.implJSON...)
	b = append(b, `},"content":[{"type":"text","text":`...)
	b = append(b, text...)
	b = append(b, "}]"...)
	if len(raw) > 0 {
		b = append(b, `,"structuredContent":`...)
		b = append(b, raw...)
	}
	if res.IsError {
		b = append(b, `,"isError":true`...)
	}
	return append(b, '}'), true
}

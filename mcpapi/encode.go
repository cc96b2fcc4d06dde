package mcpapi

import (
	"encoding/json"
	"unicode/utf8"

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

// encodeInputRequired encodes an input_required result with one URL
// elicitation, byte for byte as json.Marshal of inputRequiredResult (with
// the SDK's InputRequestMap.MarshalJSON) would, without reflection or the
// SDK's intermediate map. ok is false for params with _meta or a requested
// schema, or without a mode; the caller then uses json.Marshal.
func (s *Server) encodeInputRequired(in *inputRequired) (b []byte, ok bool) {
	p := in.params
	if p == nil || p.Meta != nil || p.RequestedSchema != nil || p.Mode == "" {
		return nil, false
	}
	b = make([]byte, 0, 256+len(s.implJSON)+len(in.key)+len(p.Message)+len(p.URL)+len(p.ElicitationID)+len(in.state))
	b = append(b, `{"resultType":"input_required","_meta":{"`+mcp.MetaKeyServerInfo+`":`...)
	b = append(b, s.implJSON...)
	b = append(b, `},"inputRequests":{`...)
	b = appendJSONString(b, in.key)
	b = append(b, `:{"method":"elicitation/create","params":{"mode":`...)
	b = appendJSONString(b, p.Mode)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, p.Message)
	if p.URL != "" {
		b = append(b, `,"url":`...)
		b = appendJSONString(b, p.URL)
	}
	if p.ElicitationID != "" {
		b = append(b, `,"elicitationId":`...)
		b = appendJSONString(b, p.ElicitationID)
	}
	b = append(b, "}}}"...)
	if in.state != "" {
		b = append(b, `,"requestState":`...)
		b = appendJSONString(b, in.state)
	}
	return append(b, '}'), true
}

// appendJSONString appends s as encoding/json writes a string (HTML
// escaped): verbatim when nothing in it needs escaping, else through
// json.Marshal.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return appendMarshalledString(b, s)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return appendMarshalledString(b, s)
		}
		i += size
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendMarshalledString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

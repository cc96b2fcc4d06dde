package mcpapi

import (
	"encoding/json"
	"slices"
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
	return appendComplete(make([]byte, 0, s.completeSize(len(tc.Text), raw)), s.implJSON, tc.Text, raw, res.IsError), true
}

// completeSize is about what appendComplete appends for a text of textLen
// bytes and raw.
func (s *Server) completeSize(textLen int, raw []byte) int {
	return 128 + len(s.implJSON) + 2*textLen + len(raw)
}

// appendComplete appends a complete tool result with resultType and
// serverInfo (implJSON), one text content (text) and the structured
// content raw (compact JSON as json.Marshal writes it; none when empty),
// as encodeToolResult describes. text may be the bytes of raw itself (a
// result built by complete()), read without a string copy.
func appendComplete[T ~string | ~[]byte](b, implJSON []byte, text T, raw []byte, isError bool) []byte {
	b = append(b, `{"resultType":"complete","_meta":{"`+mcp.MetaKeyServerInfo+`":`...)
	b = append(b, implJSON...)
	b = append(b, `},"content":[{"type":"text","text":`...)
	b = appendJSONString(b, text)
	b = append(b, "}]"...)
	if len(raw) > 0 {
		b = append(b, `,"structuredContent":`...)
		b = append(b, raw...)
	}
	if isError {
		b = append(b, `,"isError":true`...)
	}
	return append(b, '}')
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

// appendJSONString appends s quoted and escaped as encoding/json writes a
// string with HTML escaping (its default): \" and \\, the short escapes
// \b \f \n \r \t, \u00XX (lower-case hex) for other controls and < > &,
// \ufffd for each invalid UTF-8 byte, \u2028 and \u2029; everything else
// verbatim (TestAppendJSONString, FuzzAppendJSONString). s is a string or
// the bytes of one.
func appendJSONString[T ~string | ~[]byte](b []byte, s T) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if jsonVerbatim[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		// At most one rune's bytes: converting them from []byte copies
		// them on the stack.
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonVerbatim marks the ASCII bytes appendJSONString copies as they are:
// one lookup a byte on its hot loop instead of six comparisons.
var jsonVerbatim = func() (t [utf8.RuneSelf]bool) {
	for c := range t {
		t[c] = c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendJSONStrings appends ss as a JSON array of strings.
func appendJSONStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// encodeConnectOutput appends json.Marshal(o) to b, byte for byte, without
// reflection; ok is false when a time cannot be encoded (Marshal would
// fail too) (TestEncodeConnectOutput, FuzzEncodeConnectOutput).
func encodeConnectOutput(b []byte, o *connectOutput) (_ []byte, ok bool) {
	n := 64 + len(o.Message)
	if v := o.Connection; v != nil { // room for it all: one allocation
		n += 256 + len(v.ID) + len(v.Provider) + len(v.Account) + len(v.Note)
		for _, list := range [][]string{v.Scopes, v.NotGranted} {
			for _, s := range list {
				n += len(s) + 3
			}
		}
	}
	b = slices.Grow(b, n)
	b = append(b, `{"status":`...)
	b = appendJSONString(b, o.Status)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, o.Message)
	if v := o.Connection; v != nil {
		b = append(b, `,"connection":{"id":`...)
		b = appendJSONString(b, v.ID)
		b = append(b, `,"provider":`...)
		b = appendJSONString(b, v.Provider)
		b = append(b, `,"account":`...)
		b = appendJSONString(b, v.Account)
		b = append(b, `,"scopes":`...)
		if v.Scopes == nil {
			b = append(b, "null"...)
		} else {
			b = appendJSONStrings(b, v.Scopes)
		}
		b = append(b, `,"status":`...)
		b = appendJSONString(b, v.Status)
		var err error
		b = append(b, `,"created":"`...)
		if b, err = v.Created.AppendText(b); err != nil {
			return nil, false
		}
		b = append(b, '"')
		if v.LastUsed != nil {
			b = append(b, `,"lastUsed":"`...)
			if b, err = v.LastUsed.AppendText(b); err != nil {
				return nil, false
			}
			b = append(b, '"')
		}
		if len(v.NotGranted) > 0 {
			b = append(b, `,"notGranted":`...)
			b = appendJSONStrings(b, v.NotGranted)
		}
		if v.Note != "" {
			b = append(b, `,"note":`...)
			b = appendJSONString(b, v.Note)
		}
		b = append(b, '}')
	}
	return append(b, '}'), true
}

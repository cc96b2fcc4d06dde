package requeststate

import (
	"encoding/base64"
	"strconv"

	"credbroker/internal/plainjson"
)

// encodeWire appends w as json.Marshal writes it, byte for byte, when its
// strings need no escaping (a principal, a tool name and a grant id
// normally do not); ok is false otherwise and Seal uses json.Marshal
// (TestWireCodecMatchesJSON, FuzzEncodeWire).
func encodeWire(w *wire) (b []byte, ok bool) {
	b = make([]byte, 0, 96+len(w.Issuer)+len(w.Subject)+len(w.Tool)+len(w.GrantID)+base64.StdEncoding.EncodedLen(len(w.ArgDigest)))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(w.V), 10)
	for _, f := range [...]struct{ key, s string }{{`,"iss":`, w.Issuer}, {`,"sub":`, w.Subject}, {`,"tool":`, w.Tool}} {
		if b, ok = plainjson.AppendString(append(b, f.key...), f.s); !ok {
			return nil, false
		}
	}
	b = append(b, `,"args":`...)
	if w.ArgDigest == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, w.ArgDigest)
		b = append(b, '"')
	}
	if b, ok = plainjson.AppendString(append(b, `,"grant":`...), w.GrantID); !ok {
		return nil, false
	}
	b = append(b, `,"exp":`...)
	b = strconv.AppendInt(b, w.Expires, 10)
	return append(b, '}'), true
}

// decodeWire decodes the plaintext Seal writes without reflection: compact,
// the keys exactly as encodeWire writes them, each once, strings without
// escapes in valid UTF-8, args base64 as encoding/json reads []byte,
// v and exp non-negative integers of at most 18 digits. On anything else
// ok is false and Open uses json.Unmarshal, so what opens is unchanged
// (TestWireCodecMatchesJSON, FuzzDecodeWire).
func decodeWire(b []byte, w *wire) bool {
	d := wireScan{plainjson.Reader{B: b}}
	var seen uint8
	return d.Object(func(start, end int) bool {
		var bit uint8
		var ok bool
		switch string(b[start:end]) {
		case "v":
			bit = 1 << 0
			var n int64
			n, ok = d.Int()
			w.V = int(n)
		case "iss":
			bit, ok = 1<<1, d.string(&w.Issuer)
		case "sub":
			bit, ok = 1<<2, d.string(&w.Subject)
		case "tool":
			bit, ok = 1<<3, d.string(&w.Tool)
		case "args":
			bit, ok = 1<<4, d.bytes(&w.ArgDigest)
		case "grant":
			bit, ok = 1<<5, d.string(&w.GrantID)
		case "exp":
			bit = 1 << 6
			w.Expires, ok = d.Int()
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
}

// wireScan reads the values of the plaintext's members.
type wireScan struct{ plainjson.Reader }

func (d *wireScan) string(out *string) bool {
	start, end, ok := d.String()
	if ok {
		*out = string(d.B[start:end])
	}
	return ok
}

// bytes decodes a base64 string as encoding/json decodes into []byte.
func (d *wireScan) bytes(out *[]byte) bool {
	start, end, ok := d.String()
	if !ok {
		return false
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(end-start))
	n, err := base64.StdEncoding.Decode(b, d.B[start:end])
	if err != nil {
		return false
	}
	*out = b[:n]
	return true
}

package record

import (
	"strconv"
	"time"

	"credbroker/internal/plainjson"
)

// decodeGrantRecord decodes a grant record of the shape EncodeGrant writes
// (json.Marshal of grantRecord: compact, known keys spelled exactly, each
// once) without reflection. It accepts: strings without escapes in valid
// UTF-8, times as time.Time.UnmarshalJSON reads them, non-negative
// integers of at most 18 digits, scopes as an array of such strings. On
// anything else (whitespace, null, unknown or re-cased keys, escapes,
// signs, fractions, trailing data) ok is false and DecodeGrant uses
// encoding/json, so the result never differs from json.Unmarshal into
// grantRecord (TestDecodeGrantRecordMatchesJSON, FuzzDecodeGrantRecord).
//
// The strings decoded share one copy of the record (a grant holds seven or
// more of them).
func decodeGrantRecord(b []byte, r *grantRecord) bool {
	d := grantScan{Reader: plainjson.Reader{B: b}, s: string(b)}
	var seen uint32
	return d.Object(func(start, end int) bool {
		bit, field := grantField(d.s[start:end])
		if field == nil || seen&bit != 0 {
			return false
		}
		seen |= bit
		return field(&d, r)
	})
}

type grantFieldFunc func(d *grantScan, r *grantRecord) bool

func grantField(key string) (uint32, grantFieldFunc) {
	switch key {
	case "v":
		return 1 << 0, func(d *grantScan, r *grantRecord) bool { return d.int(&r.V) }
	case "id":
		return 1 << 1, func(d *grantScan, r *grantRecord) bool { return d.string(&r.ID) }
	case "iss":
		return 1 << 2, func(d *grantScan, r *grantRecord) bool { return d.string(&r.Issuer) }
	case "sub":
		return 1 << 3, func(d *grantScan, r *grantRecord) bool { return d.string(&r.Subject) }
	case "provider":
		return 1 << 4, func(d *grantScan, r *grantRecord) bool { return d.string(&r.Provider) }
	case "scopes":
		return 1 << 5, func(d *grantScan, r *grantRecord) bool { return d.strings(&r.Scopes) }
	case "client_name":
		return 1 << 6, func(d *grantScan, r *grantRecord) bool { return d.string(&r.ClientName) }
	case "server":
		return 1 << 7, func(d *grantScan, r *grantRecord) bool { return d.string(&r.Server) }
	case "created":
		return 1 << 8, func(d *grantScan, r *grantRecord) bool { return d.time(&r.Created) }
	case "expires":
		return 1 << 9, func(d *grantScan, r *grantRecord) bool { return d.time(&r.Expires) }
	case "state":
		return 1 << 10, func(d *grantScan, r *grantRecord) bool { return d.string((*string)(&r.State)) }
	case "connection_id":
		return 1 << 11, func(d *grantScan, r *grantRecord) bool { return d.string(&r.ConnectionID) }
	case "rounds":
		return 1 << 12, func(d *grantScan, r *grantRecord) bool { return d.int(&r.Rounds) }
	case "attempts":
		return 1 << 13, func(d *grantScan, r *grantRecord) bool { return d.int(&r.Attempts) }
	case "why":
		return 1 << 15, func(d *grantScan, r *grantRecord) bool { return d.string(&r.Why) }
	case "version":
		return 1 << 14, func(d *grantScan, r *grantRecord) bool {
			var n int
			ok := d.int(&n)
			r.Version = uint64(n)
			return ok
		}
	}
	return 0, nil
}

type grantScan struct {
	plainjson.Reader
	s string // B as a string, which decoded strings slice
}

func (d *grantScan) string(out *string) bool {
	start, end, ok := d.String()
	if ok {
		*out = d.s[start:end]
	}
	return ok
}

func (d *grantScan) strings(out *[]string) bool {
	if !d.Byte('[') {
		return false
	}
	list := []string{}
	if !d.Byte(']') {
		for {
			var s string
			if !d.string(&s) {
				return false
			}
			list = append(list, s)
			if d.Byte(']') {
				break
			}
			if !d.Byte(',') {
				return false
			}
		}
	}
	*out = list
	return true
}

// time decodes the quoted value as encoding/json does: with
// time.Time.UnmarshalJSON on the literal.
func (d *grantScan) time(out *time.Time) bool {
	start := d.I
	if _, _, ok := d.String(); !ok {
		return false
	}
	var t time.Time
	if t.UnmarshalJSON(d.B[start:d.I]) != nil {
		return false
	}
	*out = t
	return true
}

// int reads 0 or [1-9][0-9]{0,17}: no sign, fraction, exponent or
// overflow to consider.
func (d *grantScan) int(out *int) bool {
	n, ok := d.Int()
	if ok {
		*out = int(n)
	}
	return ok
}

// encodeGrantRecord appends r as json.Marshal writes it, byte for byte,
// without reflection: the fields in declaration order, omitempty ones left
// out when empty, times as time.Time.MarshalJSON writes them. It handles
// strings that Marshal copies verbatim (no quote, backslash, control, <, >,
// &, U+2028 or U+2029; EncodeGrant has already refused invalid UTF-8);
// for anything else, or a time MarshalJSON refuses, ok is false and
// EncodeGrant uses json.Marshal (TestEncodeGrantRecordMatchesJSON,
// FuzzEncodeGrantRecord).
func encodeGrantRecord(r *grantRecord) (b []byte, ok bool) {
	b = make([]byte, 0, 256)
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	if b, ok = appendField(b, `,"id":`, r.ID); !ok {
		return nil, false
	}
	if b, ok = appendField(b, `,"iss":`, r.Issuer); !ok {
		return nil, false
	}
	if b, ok = appendField(b, `,"sub":`, r.Subject); !ok {
		return nil, false
	}
	if b, ok = appendField(b, `,"provider":`, r.Provider); !ok {
		return nil, false
	}
	if len(r.Scopes) > 0 {
		b = append(b, `,"scopes":[`...)
		for i, s := range r.Scopes {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = plainjson.AppendString(b, s); !ok {
				return nil, false
			}
		}
		b = append(b, ']')
	}
	if r.ClientName != "" {
		if b, ok = appendField(b, `,"client_name":`, r.ClientName); !ok {
			return nil, false
		}
	}
	if r.Server != "" {
		if b, ok = appendField(b, `,"server":`, r.Server); !ok {
			return nil, false
		}
	}
	var err error
	b = append(b, `,"created":"`...)
	if b, err = r.Created.AppendText(b); err != nil {
		return nil, false
	}
	b = append(b, `","expires":"`...)
	if b, err = r.Expires.AppendText(b); err != nil {
		return nil, false
	}
	b = append(b, '"')
	if b, ok = appendField(b, `,"state":`, string(r.State)); !ok {
		return nil, false
	}
	if r.ConnectionID != "" {
		if b, ok = appendField(b, `,"connection_id":`, r.ConnectionID); !ok {
			return nil, false
		}
	}
	if r.Rounds != 0 {
		b = append(b, `,"rounds":`...)
		b = strconv.AppendInt(b, int64(r.Rounds), 10)
	}
	if r.Attempts != 0 {
		b = append(b, `,"attempts":`...)
		b = strconv.AppendInt(b, int64(r.Attempts), 10)
	}
	if r.Why != "" {
		if b, ok = appendField(b, `,"why":`, r.Why); !ok {
			return nil, false
		}
	}
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, r.Version, 10)
	return append(b, '}'), true
}

func appendField(b []byte, key, s string) ([]byte, bool) {
	return plainjson.AppendString(append(b, key...), s)
}

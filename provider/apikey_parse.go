package provider

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// keyFieldNameRE is what an API-key field's name looks like.
var keyFieldNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// maxTemplateLen bounds an injection template as written.
const maxTemplateLen = 512

// Template is an injection template: literal text with {field} references
// ("Bearer {api_key}"). "{{" and "}}" stand for literal braces; any other
// brace, a control character or a non-ASCII literal is an error, so a
// template can never split a header.
type Template struct {
	parts []templatePart
}

type templatePart struct {
	lit   string
	field string // set: a reference to this field
}

// ParseTemplate parses an injection template.
func ParseTemplate(s string) (Template, error) {
	if len(s) > maxTemplateLen {
		return Template{}, fmt.Errorf("longer than %d bytes", maxTemplateLen)
	}
	var t Template
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, templatePart{lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{' && i+1 < len(s) && s[i+1] == '{':
			lit.WriteByte('{')
			i++
		case c == '}' && i+1 < len(s) && s[i+1] == '}':
			lit.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return Template{}, fmt.Errorf("unclosed { at byte %d (write {{ for a literal brace)", i)
			}
			name := s[i+1 : i+1+end]
			if !keyFieldNameRE.MatchString(name) {
				return Template{}, fmt.Errorf("%q at byte %d is not a field reference (want {name}: a lowercase letter, then lowercase letters, digits or _)",
					"{"+name+"}", i)
			}
			flush()
			t.parts = append(t.parts, templatePart{field: name})
			i += end + 1
		case c == '}':
			return Template{}, fmt.Errorf("stray } at byte %d (write }} for a literal brace)", i)
		case c == '\t' || c >= 0x20 && c < 0x7f:
			lit.WriteByte(c)
		default:
			return Template{}, fmt.Errorf("byte %d is a control or non-ASCII character", i)
		}
	}
	flush()
	return t, nil
}

// Fields returns the field names t refers to, in order, each once.
func (t Template) Fields() []string {
	var out []string
	for _, p := range t.parts {
		if p.field != "" && !slices.Contains(out, p.field) {
			out = append(out, p.field)
		}
	}
	return out
}

// Empty reports whether t renders to nothing whatever the values.
func (t Template) Empty() bool { return len(t.parts) == 0 }

// Render fills t with values; ok is false when a referenced field has no
// value.
func (t Template) Render(values func(string) (string, bool)) (string, bool) {
	var b strings.Builder
	for _, p := range t.parts {
		if p.field == "" {
			b.WriteString(p.lit)
			continue
		}
		v, ok := values(p.field)
		if !ok {
			return "", false
		}
		b.WriteString(v)
	}
	return b.String(), true
}

// String is the template as it would be written.
func (t Template) String() string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.field != "" {
			b.WriteString("{" + p.field + "}")
			continue
		}
		b.WriteString(strings.NewReplacer("{", "{{", "}", "}}").Replace(p.lit))
	}
	return b.String()
}

// maxPointerLen bounds a JSON pointer as written.
const maxPointerLen = 256

// Pointer is an RFC 6901 JSON pointer ("/id", "/user/email", "/0/name"):
// its reference tokens, unescaped.
type Pointer struct {
	tokens []string
	set    bool
}

// ParsePointer parses an RFC 6901 JSON pointer: "" is the whole document;
// otherwise it starts with "/", and "~" is only "~0" (a ~) or "~1" (a /).
func ParsePointer(s string) (Pointer, error) {
	if len(s) > maxPointerLen {
		return Pointer{}, fmt.Errorf("longer than %d bytes", maxPointerLen)
	}
	if s == "" {
		return Pointer{set: true}, nil
	}
	if s[0] != '/' {
		return Pointer{}, errors.New(`a JSON pointer starts with "/" (e.g. /id or /user/email)`)
	}
	p := Pointer{set: true}
	for tok := range strings.SplitSeq(s[1:], "/") {
		var b strings.Builder
		for i := 0; i < len(tok); i++ {
			if tok[i] != '~' {
				b.WriteByte(tok[i])
				continue
			}
			if i+1 == len(tok) || (tok[i+1] != '0' && tok[i+1] != '1') {
				return Pointer{}, errors.New(`"~" must be followed by 0 (for ~) or 1 (for /)`)
			}
			if tok[i+1] == '0' {
				b.WriteByte('~')
			} else {
				b.WriteByte('/')
			}
			i++
		}
		p.tokens = append(p.tokens, b.String())
	}
	return p, nil
}

// IsZero reports whether p was never set (no pointer configured).
func (p Pointer) IsZero() bool { return !p.set }

// String is p as written.
func (p Pointer) String() string {
	var b strings.Builder
	for _, t := range p.tokens {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// Lookup returns the value p names in doc (decoded with json.Decoder's
// UseNumber: maps, slices, strings, json.Number, bools, nil).
func (p Pointer) Lookup(doc any) (any, bool) {
	cur := doc
	for _, t := range p.tokens {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[t]
			if !ok {
				return nil, false
			}
			cur = next
		case []any:
			// RFC 6901: decimal, no leading zeros; "-" names no element.
			if t == "" || len(t) > 1 && t[0] == '0' || strings.TrimLeft(t, "0123456789") != "" {
				return nil, false
			}
			i, err := strconv.Atoi(t)
			if err != nil || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// LookupString returns the string or number p names in doc as text.
func (p Pointer) LookupString(doc any) (string, bool) {
	v, ok := p.Lookup(doc)
	if !ok {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	}
	return "", false
}

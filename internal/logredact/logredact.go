// Package logredact provides a slog.Handler that removes secrets before a
// record reaches the output while keeping every message readable: it masks
// values, never words.
//
//   - Attributes whose key names a secret (token, code, secret, password,
//     cookie, authorization, verifier, ...) print "REDACTED".
//   - Values implementing slog.LogValuer (vault.Secret) resolve to
//     "REDACTED" on their own.
//   - Inside messages, string values and error texts, three shapes of
//     secret are masked: the credential after an authorization scheme
//     ("Bearer eyJ…", "token gho_…", but not "bearer token rejected"), the
//     value of a secret-named key=value or "key": "value" pair
//     (access_token=…, "client_secret": "…"), and strings shaped like
//     tokens on their own (JWTs, well-known provider token prefixes such
//     as gho_ or ya29.). Messages and error texts also lose long
//     random-looking strings (32 characters or more of mixed case and
//     digits), which no sentence contains.
package logredact

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
)

const redacted = "REDACTED"

// sensitive key fragments, matched case-insensitively against attribute keys
// split on '_', '-' and '.'.
var sensitiveWords = map[string]bool{
	"token": true, "tokens": true, "secret": true, "password": true, "passwd": true,
	"cookie": true, "authorization": true, "code": true, "verifier": true,
	"assertion": true, "credential": true, "credentials": true, "key": true, "keys": true,
	"requeststate": true, "state": true, "nonce": true,
}

// allowed keys that contain a sensitive word but are not secrets.
var allowedKeys = map[string]bool{
	"status_code": true, "code_challenge_method": true, "token_type": true,
	"key_id": true, "grant_state": true, "error_code": true, "http_status_code": true,
}

// SensitiveKey reports whether an attribute key names secret material.
func SensitiveKey(k string) bool {
	// Keys are short ASCII words: lower-case them on the stack and look
	// their words up without building a slice of them. strings.ToLower
	// folds non-ASCII letters onto ASCII ones (K, the Kelvin sign, is
	// "k"), so other keys take the general path.
	var buf [64]byte
	if len(k) > len(buf) || !isASCII(k) {
		return sensitiveKeyFolded(k)
	}
	lk := buf[:len(k)]
	for i := range len(k) {
		c := k[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lk[i] = c
	}
	if allowedKeys[string(lk)] {
		return false
	}
	for start := 0; start < len(lk); {
		end := start
		for end < len(lk) && lk[end] != '_' && lk[end] != '-' && lk[end] != '.' {
			end++
		}
		if sensitiveWords[string(lk[start:end])] {
			return true
		}
		start = end + 1
	}
	return false
}

// sensitiveKeyFolded is SensitiveKey for any key, with Unicode case
// folding.
func sensitiveKeyFolded(k string) bool {
	lk := strings.ToLower(k)
	if allowedKeys[lk] {
		return false
	}
	for _, w := range strings.FieldsFunc(lk, func(r rune) bool { return r == '_' || r == '-' || r == '.' }) {
		if sensitiveWords[w] {
			return true
		}
	}
	return false
}

var (
	// schemeRE finds an authorization scheme and the word after it; the
	// word is masked only when it is shaped like a credential.
	schemeRE = regexp.MustCompile(`(?i)\b(bearer|basic|token|dpop)(\s+)([A-Za-z0-9\-._~+/=]+)`)
	// secretPairRE finds key=value pairs (query strings, form bodies, free
	// text) whose key names a secret; the value is masked whatever it is.
	secretPairRE = regexp.MustCompile(`(?i)(^|[^A-Za-z0-9_])((?:access_token|refresh_token|id_token|token|client_secret|secret|password|code|code_verifier|state|nonce|api_key|apikey|assertion|requeststate|request_state)=)([^&\s"',;]*)`)
	// secretJSONRE finds the same keys as JSON members.
	secretJSONRE = regexp.MustCompile(`(?i)("(?:access_token|refresh_token|id_token|client_secret|password|code_verifier|api_key|apikey|assertion|requestState|request_state)"\s*:\s*")((?:[^"\\]|\\.)*)(")`)
	// tokenShapeRE finds strings that are tokens on their own: JWTs and
	// the documented prefixes of GitHub, Google, Slack and GitLab tokens.
	tokenShapeRE = regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*|\b(?:gh[opsur]_|github_pat_|glpat-|xox[abprs]-)[A-Za-z0-9_-]{8,}|\bya29\.[A-Za-z0-9_.-]{8,}|\b1//[A-Za-z0-9_-]{8,}`)
	// opaqueRE finds long runs of base64url characters; opaque reports
	// whether one looks random (mixed case and digits).
	opaqueRE = regexp.MustCompile(`[A-Za-z0-9_\-+/]{32,}=*`)
)

// credentialShaped reports whether w, found after an authorization scheme,
// is a credential rather than a word: credentials carry digits or
// punctuation, or are long.
func credentialShaped(w string) bool {
	if len(w) >= 20 {
		return true
	}
	return len(w) >= 8 && strings.ContainsAny(w, "0123456789-._~+/=")
}

func opaque(s string) bool {
	var upper, lower, digit bool
	for _, r := range s {
		switch {
		case r >= 'A' && r <= 'Z':
			upper = true
		case r >= 'a' && r <= 'z':
			lower = true
		case r >= '0' && r <= '9':
			digit = true
		}
	}
	return upper && lower && digit
}

// Scrub masks the credentials embedded in s (a string attribute value):
// the credential after an authorization scheme, the value of a secret
// key=value or JSON member, and token-shaped strings. The words around
// them stay as they are.
//
// Most strings hold none of these, so each pattern runs only when s holds
// something every match of it must hold (see the may* functions); a
// string with nothing to mask comes back as it is, without allocating.
func Scrub(s string) string {
	if !strings.ContainsAny(s, " =:.-_/") {
		return s
	}
	// The (?i) patterns fold non-ASCII letters onto ASCII ones (the
	// Kelvin sign matches k, the long s matches s), which the byte scans
	// for their ASCII words would miss: non-ASCII text gets them all.
	// Replacing keeps ASCII text ASCII, so this holds for every step.
	wide := !isASCII(s)
	if wide || mayHoldScheme(s) {
		s = schemeRE.ReplaceAllStringFunc(s, func(m string) string {
			sub := schemeRE.FindStringSubmatch(m)
			if !credentialShaped(sub[3]) || sub[3] == redacted {
				return m
			}
			return sub[1] + sub[2] + redacted
		})
	}
	if strings.IndexByte(s, '=') >= 0 && (wide || mayHoldSecretPair(s)) {
		s = secretPairRE.ReplaceAllStringFunc(s, func(m string) string {
			sub := secretPairRE.FindStringSubmatch(m)
			if sub[3] == "" {
				return m
			}
			return sub[1] + sub[2] + redacted
		})
	}
	if strings.IndexByte(s, '"') >= 0 && strings.IndexByte(s, ':') >= 0 {
		s = secretJSONRE.ReplaceAllString(s, "${1}"+redacted+"${3}")
	}
	if mayHoldTokenShape(s) {
		s = tokenShapeRE.ReplaceAllString(s, redacted)
	}
	return s
}

// ScrubText is Scrub for free text (log messages, error texts), which also
// loses long random-looking strings.
func ScrubText(s string) string {
	s = Scrub(s)
	if !mayHoldOpaque(s) {
		return s
	}
	return opaqueRE.ReplaceAllStringFunc(s, func(m string) string {
		if opaque(m) {
			return redacted
		}
		return m
	})
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// hasPrefixFold reports whether s starts with lower (lower-case ASCII),
// ignoring ASCII case.
func hasPrefixFold(s, lower string) bool {
	if len(s) < len(lower) {
		return false
	}
	for i := range len(lower) {
		if s[i]|0x20 != lower[i] {
			return false
		}
	}
	return true
}

// hasSuffixFold reports whether s ends with lower (lower-case ASCII),
// ignoring ASCII case.
func hasSuffixFold(s, lower string) bool {
	return len(s) >= len(lower) && hasPrefixFold(s[len(s)-len(lower):], lower)
}

// mayHoldScheme reports whether ASCII text s holds, in any case, one of
// schemeRE's schemes followed by white space, which every match does.
func mayHoldScheme(s string) bool {
	for i := range len(s) {
		var w string
		switch s[i] | 0x20 {
		case 'b':
			if hasPrefixFold(s[i:], "bearer") {
				w = "bearer"
			} else if hasPrefixFold(s[i:], "basic") {
				w = "basic"
			}
		case 't':
			if hasPrefixFold(s[i:], "token") {
				w = "token"
			}
		case 'd':
			if hasPrefixFold(s[i:], "dpop") {
				w = "dpop"
			}
		}
		if w != "" && i+len(w) < len(s) && isSpace(s[i+len(w)]) {
			return true
		}
	}
	return false
}

// isSpace covers \s (and \v besides: a wider scan is still a safe one).
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// secretPairEnds are the endings of secretPairRE's keys, one of which,
// in any case, comes right before the '=' of every match.
var secretPairEnds = []string{"token", "secret", "password", "code", "verifier", "state", "nonce", "key", "assertion"}

// mayHoldSecretPair reports whether ASCII text s has an '=' right after
// one of secretPairEnds.
func mayHoldSecretPair(s string) bool {
	for i := 0; ; {
		j := strings.IndexByte(s[i:], '=')
		if j < 0 {
			return false
		}
		i += j
		for _, end := range secretPairEnds {
			if hasSuffixFold(s[:i], end) {
				return true
			}
		}
		i++
	}
}

// mayHoldTokenShape reports whether s holds one of the literal starts of
// tokenShapeRE's alternatives (which is case-sensitive): "eyJ",
// "gh[opsur]_", "github_pat_", "glpat-", "xox", "ya29." or "1//".
func mayHoldTokenShape(s string) bool {
	for i := range len(s) {
		rest := s[i:]
		switch s[i] {
		case 'e':
			if strings.HasPrefix(rest, "eyJ") {
				return true
			}
		case 'g':
			if len(rest) >= 4 && rest[1] == 'h' && strings.IndexByte("opsur", rest[2]) >= 0 && rest[3] == '_' ||
				strings.HasPrefix(rest, "github_pat_") || strings.HasPrefix(rest, "glpat-") {
				return true
			}
		case 'x':
			if strings.HasPrefix(rest, "xox") {
				return true
			}
		case 'y':
			if strings.HasPrefix(rest, "ya29.") {
				return true
			}
		case '1':
			if strings.HasPrefix(rest, "1//") {
				return true
			}
		}
	}
	return false
}

// mayHoldOpaque reports whether opaqueRE's replacement can change s. Its
// matches are exactly the maximal runs of [A-Za-z0-9_\-+/] 32 or more
// long (with the '=' after them), and only those opaque calls random,
// holding an upper-case letter, a lower-case letter and a digit, are
// replaced: this looks for such a run.
func mayHoldOpaque(s string) bool {
	n := 0
	var upper, lower, digit bool
	for i := range len(s) {
		switch c := s[i]; {
		case 'A' <= c && c <= 'Z':
			upper = true
		case 'a' <= c && c <= 'z':
			lower = true
		case '0' <= c && c <= '9':
			digit = true
		case c == '_' || c == '-' || c == '+' || c == '/':
		default:
			if n >= 32 && upper && lower && digit {
				return true
			}
			n, upper, lower, digit = 0, false, false, false
			continue
		}
		n++
	}
	return n >= 32 && upper && lower && digit
}

// Handler wraps another slog.Handler and redacts secrets.
type Handler struct{ next slog.Handler }

// New returns a redacting handler in front of next.
func New(next slog.Handler) *Handler { return &Handler{next: next} }

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	msg := ScrubText(r.Message)
	if msg == r.Message {
		clean := true
		r.Attrs(func(a slog.Attr) bool {
			clean = unchanged(a)
			return clean
		})
		if clean {
			// Nothing to mask: rebuilding the record would give the same
			// one.
			return h.next.Handle(ctx, r)
		}
	}
	nr := slog.NewRecord(r.Time, r.Level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(redactAttr(a))
		return true
	})
	return h.next.Handle(ctx, nr)
}

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = redactAttr(a)
	}
	return &Handler{next: h.next.WithAttrs(out)}
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler { return &Handler{next: h.next.WithGroup(name)} }

// unchanged reports whether redactAttr(a) is a itself: nothing in it to
// mask, no LogValuer to resolve, no error to turn into its text.
func unchanged(a slog.Attr) bool {
	if SensitiveKey(a.Key) {
		return false
	}
	switch a.Value.Kind() {
	case slog.KindString:
		s := a.Value.String()
		return Scrub(s) == s
	case slog.KindGroup:
		// redactAttr rebuilds the group with slog.Group, which drops
		// empty groups; a group Value (made by slog.GroupValue) holds none.
		for _, ga := range a.Value.Group() {
			if !unchanged(ga) {
				return false
			}
		}
		return true
	case slog.KindLogValuer:
		return false
	case slog.KindAny:
		_, isErr := a.Value.Any().(error)
		return !isErr
	}
	return true
}

func redactAttr(a slog.Attr) slog.Attr {
	a.Value = a.Value.Resolve()
	if SensitiveKey(a.Key) {
		return slog.String(a.Key, redacted)
	}
	switch a.Value.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Scrub(a.Value.String()))
	case slog.KindGroup:
		g := a.Value.Group()
		out := make([]any, len(g))
		for i, ga := range g {
			out[i] = redactAttr(ga)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			return slog.String(a.Key, ScrubText(err.Error()))
		}
	}
	return a
}

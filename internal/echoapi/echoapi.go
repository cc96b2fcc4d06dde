// Package echoapi is a hostile provider API for tests: it reflects the
// Authorization header (or, without one, the X-Api-Key header) the broker sent in the encodings a careless or
// malicious API might use (base64 of the header or of the token alone,
// hex, buried inside a longer base64 text, compressed without being
// asked), so tests can show that no form of the token comes back out of
// provider_request or the sidecar proxy.
package echoapi

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// Forms are the echo forms served at /echo/{form}.
var Forms = []string{
	"raw", "base64-header", "base64-token", "base64url-token", "base64url-nopad-token", "base64-nopad-token",
	"hex", "hex-upper", "embedded-0", "embedded-1", "embedded-2", "embedded-url-1",
	"gzip", "deflate", "raw-deflate",
}

// Refused are forms the broker must refuse rather than pass on.
var Refused = []string{"br"}

// Start serves the echo API on loopback until the test ends; its base URL
// is the server's URL.
func Start(tb testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(serve))
	tb.Cleanup(srv.Close)
	return srv
}

// Handler serves the echo API's routes (/echo/{form}), for tests that
// mount it under a path of their own (with http.StripPrefix).
func Handler() http.Handler { return http.HandlerFunc(serve) }

func serve(w http.ResponseWriter, r *http.Request) {
	form, ok := strings.CutPrefix(r.URL.Path, "/echo/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	// The credential the broker injected: the Authorization header
	// (bearer or basic), or else an API key header.
	header := r.Header.Get("Authorization")
	if header == "" {
		header = r.Header.Get("X-Api-Key")
	}
	var body []byte
	encoding := ""
	if text, ok := Echoes(header)[form]; ok {
		body = []byte(text)
	}
	switch form {
	case "gzip", "deflate", "raw-deflate", "br":
		plain := []byte(`{"you_sent":"` + header + `"}`)
		var buf bytes.Buffer
		switch form {
		case "gzip":
			zw := gzip.NewWriter(&buf)
			zw.Write(plain)
			zw.Close()
			encoding = "gzip"
		case "deflate":
			zw := zlib.NewWriter(&buf)
			zw.Write(plain)
			zw.Close()
			encoding = "deflate"
		case "raw-deflate":
			zw, _ := flate.NewWriter(&buf, flate.BestSpeed)
			zw.Write(plain)
			zw.Close()
			encoding = "deflate"
		case "br":
			// Not real brotli: the broker must refuse the encoding by name.
			buf.Write(plain)
			encoding = "br"
		}
		body = buf.Bytes()
	default:
		if body == nil {
			http.NotFound(w, r)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if encoding != "" {
		w.Header().Set("Content-Encoding", encoding)
	}
	w.Write(body)
}

// Echoes are the answers the uncompressed forms give for a credential
// header (Authorization or X-Api-Key), by form name: JSON documents
// reflecting it (or its token, the part after the scheme) as is, base64
// (both alphabets, padded or not), hex (both cases), or buried in a longer
// text that is base64-encoded whole, at each offset mod 3. An upstream
// MCP server in a test reflects them in its answers the same way.
func Echoes(header string) map[string]string {
	_, token, found := strings.Cut(header, " ")
	if !found {
		token = header
	}
	b64 := base64.StdEncoding.EncodeToString
	out := map[string]string{
		"raw":                   `{"you_sent":"` + header + `"}`,
		"base64-header":         `{"auth":"` + b64([]byte(header)) + `"}`,
		"base64-token":          `{"t":"` + b64([]byte(token)) + `"}`,
		"base64url-token":       `{"t":"` + base64.URLEncoding.EncodeToString([]byte(token)) + `"}`,
		"base64url-nopad-token": `{"t":"` + base64.RawURLEncoding.EncodeToString([]byte(token)) + `"}`,
		"base64-nopad-token":    `{"t":"` + base64.RawStdEncoding.EncodeToString([]byte(token)) + `"}`,
		"hex":                   `{"t":"` + hex.EncodeToString([]byte(token)) + `"}`,
		"hex-upper":             `{"t":"` + strings.ToUpper(hex.EncodeToString([]byte(token))) + `"}`,
		"embedded-url-1":        `{"blob":"` + base64.RawURLEncoding.EncodeToString([]byte("x"+token+"yz")) + `"}`,
	}
	// The token inside a larger JSON document, base64-encoded whole, at
	// three offsets mod 3.
	for n := range 3 {
		pad := strings.Repeat("x", n)
		out["embedded-"+strconv.Itoa(n)] = `{"blob":"` + b64([]byte(`{"p":"`+pad+`","authorization":"`+header+`","n":42}`)) + `"}`
	}
	return out
}

// Leaks returns the forms of token found in text (every encoding Forms
// produce, and base64 fragments of it at any offset), so a test can say
// which one leaked.
func Leaks(text, token string) []string {
	var found []string
	check := func(name, f string) {
		if len(f) >= 8 && strings.Contains(text, f) {
			found = append(found, name)
		}
	}
	check("raw", token)
	check("hex", hex.EncodeToString([]byte(token)))
	check("hex-upper", strings.ToUpper(hex.EncodeToString([]byte(token))))
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for lead := range 3 {
			skip := (3 - lead) % 3
			whole := (len(token) - skip) / 3 * 3
			if whole > 0 {
				check("base64 fragment", enc.EncodeToString([]byte(token)[skip:skip+whole]))
			}
		}
	}
	return found
}

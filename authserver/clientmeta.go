package authserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"credbroker/internal/loopback"
	"credbroker/internal/untrusted"
)

// Client metadata (RFC 7591 section 2) as the broker reads it, from a
// registration request or a Client ID Metadata Document. Both parsers take
// untrusted bytes and are fuzzed.

// Limits on what a client may declare.
const (
	maxRedirectURIs   = 10
	maxRedirectURILen = 2000
	maxClientNameLen  = 200
	maxClientURILen   = 2000
)

// Grant types and auth methods the broker supports.
const (
	grantCode    = "authorization_code"
	grantRefresh = "refresh_token"

	authNone        = "none"
	authSecretBasic = "client_secret_basic"
	authSecretPost  = "client_secret_post"
)

// Metadata is the client metadata the broker keeps, validated.
type Metadata struct {
	RedirectURIs    []string
	GrantTypes      []string
	AuthMethod      string
	Name            string
	URI             string
	ApplicationType string
}

// MetadataError is a refusal of client metadata: Code is the RFC 7591
// error code (invalid_redirect_uri or invalid_client_metadata) and
// Description says which rule was broken, without echoing the input.
type MetadataError struct {
	Code        string
	Description string
}

func (e *MetadataError) Error() string { return e.Code + ": " + e.Description }

func badMetadata(format string, args ...any) error {
	return &MetadataError{Code: "invalid_client_metadata", Description: fmt.Sprintf(format, args...)}
}

func badRedirect(format string, args ...any) error {
	return &MetadataError{Code: "invalid_redirect_uri", Description: fmt.Sprintf(format, args...)}
}

// rawMetadata is the wire form. Fields are json.RawMessage where a wrong
// type must be reported rather than silently dropped.
type rawMetadata struct {
	ClientID                json.RawMessage `json:"client_id"`
	RedirectURIs            json.RawMessage `json:"redirect_uris"`
	GrantTypes              json.RawMessage `json:"grant_types"`
	ResponseTypes           json.RawMessage `json:"response_types"`
	TokenEndpointAuthMethod json.RawMessage `json:"token_endpoint_auth_method"`
	ClientName              json.RawMessage `json:"client_name"`
	ClientURI               json.RawMessage `json:"client_uri"`
	ApplicationType         json.RawMessage `json:"application_type"`
	ClientSecret            json.RawMessage `json:"client_secret"`
	ClientSecretExpiresAt   json.RawMessage `json:"client_secret_expires_at"`
	JWKS                    json.RawMessage `json:"jwks"`
}

// decodeObject decodes one JSON object (and nothing after it) into r.
func decodeObject(body []byte, r *rawMetadata) error {
	if !utf8.Valid(body) {
		return badMetadata("the document is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return badMetadata("the document is not a JSON object")
	}
	dec = json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(r); err != nil {
		return badMetadata("the document is not valid JSON client metadata (%s)", jsonProblem(err))
	}
	if dec.More() {
		return badMetadata("the document has data after its JSON object")
	}
	if _, err := dec.Token(); err == nil {
		return badMetadata("the document has data after its JSON object")
	}
	return nil
}

// jsonProblem names what went wrong without quoting the input.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return "field " + untrusted.Quote(untrusted.Clip(te.Field, 60)) + " has the wrong type"
	}
	return "malformed JSON"
}

func optString(raw json.RawMessage, field string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", badMetadata("%s must be a string", field)
	}
	return s, nil
}

func optStrings(raw json.RawMessage, field string, max int) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, badMetadata("%s must be an array of strings", field)
	}
	if len(ss) > max {
		return nil, badMetadata("%s has more than %d entries", field, max)
	}
	return ss, nil
}

// parseCommon validates what registration requests and metadata documents
// share. cimd selects the document's rules (no shared secrets).
func parseCommon(r *rawMetadata, cimd bool) (Metadata, error) {
	var m Metadata
	var err error
	if m.RedirectURIs, err = optStrings(r.RedirectURIs, "redirect_uris", maxRedirectURIs); err != nil {
		return Metadata{}, &MetadataError{Code: "invalid_redirect_uri", Description: err.(*MetadataError).Description}
	}
	if len(m.RedirectURIs) == 0 {
		return Metadata{}, badRedirect("redirect_uris is required: the broker issues authorization codes only to registered redirect URIs")
	}
	for i, u := range m.RedirectURIs {
		if err := checkRedirectURI(u); err != nil {
			return Metadata{}, badRedirect("redirect_uris[%d]: %s", i, err)
		}
	}
	if m.GrantTypes, err = optStrings(r.GrantTypes, "grant_types", 8); err != nil {
		return Metadata{}, err
	}
	if len(m.GrantTypes) == 0 {
		m.GrantTypes = []string{grantCode} // RFC 7591's default
	}
	for _, g := range m.GrantTypes {
		if g != grantCode && g != grantRefresh && g != grantJWTBearer {
			return Metadata{}, badMetadata("grant_types: only authorization_code, refresh_token and " + grantJWTBearer + " are supported")
		}
	}
	if !slices.Contains(m.GrantTypes, grantCode) {
		return Metadata{}, badMetadata("grant_types must include authorization_code")
	}
	slices.Sort(m.GrantTypes)
	m.GrantTypes = slices.Compact(m.GrantTypes)
	rts, err := optStrings(r.ResponseTypes, "response_types", 8)
	if err != nil {
		return Metadata{}, err
	}
	for _, rt := range rts {
		if rt != "code" {
			return Metadata{}, badMetadata("response_types: only code is supported")
		}
	}
	if m.AuthMethod, err = optString(r.TokenEndpointAuthMethod, "token_endpoint_auth_method"); err != nil {
		return Metadata{}, err
	}
	switch {
	case cimd && (m.AuthMethod == "" || m.AuthMethod == authNone):
		m.AuthMethod = authNone
	case cimd && m.AuthMethod == "private_key_jwt":
		return Metadata{}, badMetadata("token_endpoint_auth_method private_key_jwt is not supported by this broker; use none (a public client with PKCE)")
	case cimd:
		return Metadata{}, badMetadata("token_endpoint_auth_method must be none: a metadata document cannot establish a shared secret")
	case m.AuthMethod == "":
		m.AuthMethod = authSecretBasic // RFC 7591's default
	case m.AuthMethod != authNone && m.AuthMethod != authSecretBasic && m.AuthMethod != authSecretPost:
		return Metadata{}, badMetadata("token_endpoint_auth_method must be none, client_secret_basic or client_secret_post")
	}
	if m.Name, err = optString(r.ClientName, "client_name"); err != nil {
		return Metadata{}, err
	}
	if utf8.RuneCountInString(m.Name) > maxClientNameLen {
		return Metadata{}, badMetadata("client_name is longer than %d characters", maxClientNameLen)
	}
	m.Name = strings.TrimSpace(m.Name)
	uri, err := optString(r.ClientURI, "client_uri")
	if err != nil {
		return Metadata{}, err
	}
	if uri != "" {
		u, perr := url.Parse(uri)
		if perr != nil || u.Scheme != "https" || u.Host == "" || len(uri) > maxClientURILen {
			return Metadata{}, badMetadata("client_uri must be an https URL")
		}
		m.URI = uri
	}
	if m.ApplicationType, err = optString(r.ApplicationType, "application_type"); err != nil {
		return Metadata{}, err
	}
	switch m.ApplicationType {
	case "":
		m.ApplicationType = "web"
	case "web", "native":
	default:
		return Metadata{}, badMetadata("application_type must be web or native")
	}
	return m, nil
}

// ParseRegistration parses and validates an RFC 7591 registration request
// body. Unknown metadata is ignored, as RFC 7591 asks; a client secret
// cannot be chosen by the client.
func ParseRegistration(body []byte) (Metadata, error) {
	var r rawMetadata
	if err := decodeObject(body, &r); err != nil {
		return Metadata{}, err
	}
	if len(r.ClientID) > 0 || len(r.ClientSecret) > 0 {
		return Metadata{}, badMetadata("client_id and client_secret are assigned by the broker, not requested")
	}
	return parseCommon(&r, false)
}

// ParseClientIDMetadataDocument parses and validates the Client ID
// Metadata Document fetched from clientID (draft-ietf-oauth-client-id-
// metadata-document): its client_id must equal the URL it was fetched from
// by simple string comparison, it must name the client and list its
// redirect URIs, and it must not carry a shared secret or private keys.
func ParseClientIDMetadataDocument(clientID string, body []byte) (Metadata, error) {
	var r rawMetadata
	if err := decodeObject(body, &r); err != nil {
		return Metadata{}, err
	}
	id, err := optString(r.ClientID, "client_id")
	if err != nil {
		return Metadata{}, err
	}
	if id == "" {
		return Metadata{}, badMetadata("the document has no client_id")
	}
	if id != clientID {
		return Metadata{}, badMetadata("the document's client_id differs from the URL it was fetched from")
	}
	if len(r.ClientSecret) > 0 || len(r.ClientSecretExpiresAt) > 0 {
		return Metadata{}, badMetadata("the document carries client_secret; a metadata document cannot hold a shared secret")
	}
	if hasPrivateKey(r.JWKS) {
		return Metadata{}, badMetadata("the document's jwks holds private key material")
	}
	m, err := parseCommon(&r, true)
	if err != nil {
		return Metadata{}, err
	}
	if m.Name == "" {
		return Metadata{}, badMetadata("the document has no client_name")
	}
	return m, nil
}

// hasPrivateKey reports whether a jwks member holds private key parameters.
func hasPrivateKey(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	var set struct {
		Keys []map[string]json.RawMessage `json:"keys"`
	}
	if json.Unmarshal(raw, &set) != nil {
		return true // not a key set: refuse rather than guess
	}
	for _, k := range set.Keys {
		for _, p := range []string{"d", "p", "q", "dp", "dq", "qi", "k"} {
			if _, ok := k[p]; ok {
				return true
			}
		}
	}
	return false
}

// checkClientIDURL applies the Client Identifier URL rules: https, a host,
// a path other than "/", no userinfo, no fragment, no dot segments. A
// query is allowed (the draft discourages it but does not forbid it).
func checkClientIDURL(raw string) error {
	if len(raw) > maxRedirectURILen {
		return errors.New("the client_id URL is too long")
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return errors.New("the client_id is not a URL")
	case u.Scheme != "https":
		return errors.New("a client_id URL must use https")
	case u.Host == "" || u.Opaque != "":
		return errors.New("the client_id URL has no host")
	case u.User != nil:
		return errors.New("the client_id URL must not contain user information")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return errors.New("the client_id URL must not contain a fragment")
	case u.Path == "" || u.Path == "/":
		return errors.New("the client_id URL must have a path")
	}
	for seg := range strings.SplitSeq(u.EscapedPath(), "/") {
		if s, _ := url.PathUnescape(seg); s == "." || s == ".." {
			return errors.New("the client_id URL must not contain . or .. path segments")
		}
	}
	return nil
}

// isClientIDURL reports whether a client_id names a metadata document
// (the broker's own registered ids never start with https://).
func isClientIDURL(clientID string) bool { return strings.HasPrefix(clientID, "https://") }

// blockedSchemes are never acceptable redirect schemes, even for native
// apps: they run code in or reach into the browser instead of handing the
// code to an app.
var blockedSchemes = map[string]bool{
	"javascript": true, "data": true, "vbscript": true, "file": true, "about": true, "blob": true,
	"filesystem": true, "ftp": true, "ws": true, "wss": true, "mailto": true, "tel": true, "sms": true,
	"intent": true, "view-source": true, "chrome": true, "chrome-extension": true, "moz-extension": true,
}

// checkRedirectURI accepts an absolute redirect URI without a fragment
// that is https, http on a loopback host (RFC 8252 section 7.3), or a
// private-use scheme of a native app (RFC 8252 section 7.1, as Cursor's
// cursor://…). Plain http elsewhere and schemes that act inside the
// browser are refused.
func checkRedirectURI(raw string) error {
	if len(raw) > maxRedirectURILen {
		return errors.New("the redirect URI is too long")
	}
	if strings.ContainsAny(raw, "#\x00\r\n\t ") {
		return errors.New("a redirect URI must not contain a fragment, spaces or control characters")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return errors.New("a redirect URI must be an absolute URI")
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != u.Scheme {
		return errors.New("a redirect URI's scheme must be lower case")
	}
	switch {
	case scheme == "https":
		if u.Host == "" || u.User != nil {
			return errors.New("an https redirect URI needs a host and no user information")
		}
	case scheme == "http":
		if u.Host == "" || u.User != nil || !loopback.Host(u.Hostname()) {
			return errors.New("plain http redirect URIs are allowed only on a loopback host (127.0.0.1, [::1] or localhost)")
		}
	case blockedSchemes[scheme]:
		return errors.New("this redirect URI scheme is not allowed")
	default:
		// A private-use scheme: it must at least name something after the
		// scheme (cursor://host/path or com.example.app:/path).
		if u.Host == "" && u.Opaque == "" && u.Path == "" {
			return errors.New("a private-use redirect URI needs a path")
		}
	}
	return nil
}

// redirectAllowed reports whether requested is one of registered: equal by
// simple string comparison, or, for an http loopback URI, equal in all but
// the port (RFC 8252 section 7.3: native apps pick a free port at run
// time).
func redirectAllowed(registered []string, requested string) bool {
	if slices.Contains(registered, requested) {
		return true
	}
	for _, r := range registered {
		if loopback.SameRedirect(r, requested) {
			return true
		}
	}
	return false
}

// redirectHost is what the consent page shows of a redirect URI: its host
// (with scheme for private-use schemes), or "this computer" for loopback.
func redirectHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "?"
	}
	switch {
	case u.Scheme == "http" && loopback.Host(u.Hostname()):
		return u.Hostname() + " (this computer)"
	case u.Scheme == "https":
		return u.Hostname()
	case u.Host != "":
		return u.Scheme + "://" + u.Host
	}
	return u.Scheme + ":"
}

package provider

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"credbroker/internal/egress"
	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/provider/redact"
	"credbroker/vault"
)

// KeyRefusedError: the provider answered the verify request with an error
// status, so the entered credential was not stored. It names the status
// only: never the credential.
type KeyRefusedError struct {
	Provider string // display name
	Status   int
}

func (e *KeyRefusedError) Error() string {
	return fmt.Sprintf("the key was refused by %s (%d)", e.Provider, e.Status)
}

// KeyFormatError: entered values failed the entry's checks before anything
// was sent anywhere. Problems name fields by label and never hold a value.
type KeyFormatError struct {
	Problems []KeyFieldProblem
}

// KeyFieldProblem is one field's problem, in words.
type KeyFieldProblem struct {
	Field   string // the field's name
	Label   string
	Problem string // "is required", "did not match the expected format", …
}

func (e *KeyFormatError) Error() string {
	var parts []string
	for _, p := range e.Problems {
		parts = append(parts, p.Label+": "+p.Problem)
	}
	return strings.Join(parts, "; ")
}

// CheckValues checks what a person entered (field name → value, as
// posted) against the entry's fields: every field present, surrounding
// white space removed, within its length, no control characters, secrets
// at least MinSecretLen long, and each pattern matched. It returns the
// values to store, or a *KeyFormatError. Nothing is sent anywhere.
func (a *APIKey) CheckValues(raw map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(a.Fields))
	var probs []KeyFieldProblem
	bad := func(f KeyField, problem string) {
		probs = append(probs, KeyFieldProblem{Field: f.Name, Label: f.Label, Problem: problem})
	}
	for _, f := range a.Fields {
		v := strings.TrimSpace(raw[f.Name])
		switch {
		case v == "":
			bad(f, "is required")
		case len(v) > f.MaxLength:
			bad(f, fmt.Sprintf("is longer than %d characters", f.MaxLength))
		case !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl):
			bad(f, "contains characters that cannot be part of it")
		case f.Secret && len(v) < MinSecretLen:
			bad(f, fmt.Sprintf("is shorter than %d characters, too short to be a key", MinSecretLen))
		case f.re != nil && !f.re.MatchString(v):
			bad(f, "did not match the expected format")
		default:
			out[f.Name] = v
		}
	}
	if len(probs) > 0 {
		return nil, &KeyFormatError{Problems: probs}
	}
	return out, nil
}

// keyCredential renders an API-key connection's credential from its
// sealed fields; an error means the stored fields do not fit the entry
// (changed since) and the connection must be entered again.
func keyCredential(a *APIKey, fields map[string]vault.Secret) (credential, error) {
	get := func(name string) (string, bool) {
		v, ok := fields[name]
		return v.Reveal(), ok && v != ""
	}
	var secrets []string
	for _, f := range a.Fields {
		v, ok := get(f.Name)
		if !ok {
			return credential{}, fmt.Errorf("the stored credential has no %s", f.Name)
		}
		if f.Secret {
			secrets = append(secrets, v)
		}
	}
	var set func(h http.Header)
	if a.Header != "" {
		value, ok := a.HeaderValue.Render(get)
		if !ok {
			return credential{}, errors.New("the stored credential does not fill the header template")
		}
		// The whole header value is as secret as the key inside it.
		secrets = append(secrets, value)
		set = func(h http.Header) { h.Set(a.Header, value) }
	} else {
		user, ok1 := a.BasicUser.Render(get)
		pass, ok2 := a.BasicPass.Render(get)
		if !ok1 || !ok2 {
			return credential{}, errors.New("the stored credential does not fill the basic templates")
		}
		// "user:pass" gives the basic-auth value in every encoding
		// redact.Forms makes (its base64 is what the header carries), and
		// the header's value is a secret of its own (echoed re-encoded).
		encoded := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
		secrets = append(secrets, pass, user+":"+pass, encoded)
		set = func(h http.Header) { h.Set("Authorization", "Basic "+encoded) }
	}
	return credential{set: set, forms: redact.Forms(secrets...)}, nil
}

// do performs an API request with an API-key connection: the
// credential injected as the entry says, the answer redacted of every
// secret field in every encoding. A 401 marks the connection
// needs_reconnect (the key was revoked or expired at the provider) and
// returns ErrNeedsReconnect: the person must enter a new key.
func (a *APIKey) do(ctx context.Context, k *Client, p *Provider, call apiCall) (APIResponse, error) {
	conn := call.conn
	if conn.Status == vault.StatusNeedsReconnect {
		return APIResponse{}, ErrNeedsReconnect
	}
	cred, err := keyCredential(a, conn.Token.Fields)
	if err != nil {
		return APIResponse{}, k.markKeyRejected(ctx, conn, err.Error())
	}
	resp, err := k.send(ctx, p, call.base, cred, call.method, call.u, call.hdr, call.body)
	if err != nil {
		return APIResponse{}, err
	}
	if resp.Status == http.StatusUnauthorized {
		return APIResponse{}, k.markKeyRejected(ctx, conn, fmt.Sprintf("the provider answered %d to the stored key", resp.Status))
	}
	return resp, nil
}

var errKeyReplaced = errors.New("provider: the key was replaced meanwhile")

// markKeyRejected marks an API-key connection needs_reconnect, unless its
// key was replaced meanwhile (then the new key is left alone), records the
// audit event and returns ErrNeedsReconnect.
func (k *Client) markKeyRejected(ctx context.Context, cur vault.Connection, why string) error {
	now := k.opts.Now()
	_, err := k.save(ctx, cur.ID, func(old vault.Connection) (vault.Connection, error) {
		if !maps.Equal(old.Token.Fields, cur.Token.Fields) {
			return old, errKeyReplaced
		}
		old.Status, old.Updated = vault.StatusNeedsReconnect, now
		return old, nil
	})
	switch {
	case errors.Is(err, errKeyReplaced):
		return ErrNeedsReconnect
	case errors.Is(err, vault.ErrNotFound):
		return fmt.Errorf("provider: connection %s: %w", cur.ID, err)
	case err != nil:
		return fmt.Errorf("provider: mark %s needs_reconnect: %w", cur.ID, err)
	}
	if k.opts.Telemetry == nil {
		k.log.Warn("audit: connection needs reconnecting", "event", telemetry.EventNeedsReconnect, "reason", why,
			"provider", cur.Provider, "connection", cur.ID, "iss", cur.Principal.Issuer, "sub", cur.Principal.Subject)
		return ErrNeedsReconnect
	}
	k.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventNeedsReconnect, Principal: cur.Principal,
		Provider: cur.Provider, Account: cur.AccountLogin, Connection: cur.ID, Via: "background", Outcome: why})
	return ErrNeedsReconnect
}

// verify is VerifyKey for an api_key entry: the values' checks, then the
// verify request.
func (a *APIKey) verify(ctx context.Context, k *Client, p *Provider, raw map[string]string) (Exchanged, error) {
	values, err := a.CheckValues(raw)
	if err != nil {
		return Exchanged{}, err
	}
	fields := make(map[string]vault.Secret, len(values))
	for name, v := range values {
		fields[name] = vault.Secret(v)
	}
	cred, err := keyCredential(a, fields)
	if err != nil {
		return Exchanged{}, err
	}
	u, err := ResolveAPIURL(p.APIBaseURL, a.VerifyPath, nil)
	if err != nil {
		return Exchanged{}, fmt.Errorf("provider: %s verify path: %w", p.Name, err)
	}
	var body []byte
	if a.VerifyMethod == http.MethodPost {
		body = []byte("{}")
	}
	req, err := newRequestTo(ctx, a.VerifyMethod, u, body)
	if err != nil {
		return Exchanged{}, fmt.Errorf("provider: %s verify request: %w", p.Name, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	cred.set(req.Header)
	resp, err := k.call(ctx, p, NoRedirectClient(k.opts.HTTPClient), req, "verify request")
	if err != nil {
		return Exchanged{}, err
	}
	defer resp.Body.Close()
	answer, err := egress.ReadAll(resp.Body, maxAccountBody)
	switch {
	case resp.StatusCode >= 500:
		return Exchanged{}, fmt.Errorf("%w: %s verify request: HTTP %d", ErrProviderUnavailable, p.Name, resp.StatusCode)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return Exchanged{}, &KeyRefusedError{Provider: p.DisplayName, Status: resp.StatusCode}
	case err != nil:
		return Exchanged{}, fmt.Errorf("%w: verify answer: %v", ErrAccountUnknown, err)
	}
	acct, err := keyAccount(a, answer, cred.forms)
	if err != nil {
		return Exchanged{}, fmt.Errorf("%w: %v", ErrAccountUnknown, err)
	}
	return Exchanged{Account: acct, Token: vault.TokenSet{Fields: fields}}, nil
}

// keyAccount reads the account id and login from a verify answer. A value
// that holds the credential (an API that echoes it) is refused rather than
// stored as a name people see.
func keyAccount(a *APIKey, answer []byte, forms [][]byte) (Account, error) {
	dec := json.NewDecoder(bytes.NewReader(answer))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return Account{}, errors.New("the verify answer is not JSON")
	}
	id, ok := a.AccountID.LookupString(doc)
	if !ok || id == "" || len(id) > 256 || strings.ContainsAny(id, "\x00\r\n") {
		return Account{}, fmt.Errorf("no account id at %s in the verify answer", a.AccountID)
	}
	login, _ := a.AccountName.LookupString(doc)
	login = untrusted.Clip(strings.ToValidUTF8(login, ""), 256)
	if login == "" {
		login = id
	}
	for _, f := range forms {
		if len(f) >= MinSecretLen && (strings.Contains(id, string(f)) || strings.Contains(login, string(f))) {
			return Account{}, errors.New("the verify answer names the account with the credential itself")
		}
	}
	return Account{ID: id, Login: login}, nil
}

// isKeyConnection reports whether c holds an API key rather than OAuth
// tokens.
func isKeyConnection(c vault.Connection) bool {
	return len(c.Token.Fields) > 0
}

// SecretFields returns the names of p's secret fields, in order.
func (a *APIKey) SecretFields() []string {
	var out []string
	for _, f := range a.Fields {
		if f.Secret {
			out = append(out, f.Name)
		}
	}
	return slices.Clip(out)
}

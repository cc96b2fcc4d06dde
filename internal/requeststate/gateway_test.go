package requeststate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

// gatewayCall is a continuation of a tools/call through /mcp/u/linear.
func gatewayCall(t testing.TB) Gateway {
	d, err := Digest(json.RawMessage(`{"team":"core","title":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	return Gateway{Principal: vault.Principal{Issuer: "https://idp.test", Subject: "alice"}, Provider: "linear",
		Method: "tools/call", Name: "create_issue", ArgDigest: d, Expires: epoch.Add(10 * time.Minute)}
}

// TestGatewaySealOpen: both kinds of gateway continuation (the broker's
// connect request, the upstream's own state) open for the call they were
// issued for, with everything they carry.
func TestGatewaySealOpen(t *testing.T) {
	keys := testKeys(t)
	for name, mod := range map[string]func(*Gateway){
		"grant":    func(g *Gateway) { g.Grant = "grant-1" },
		"upstream": func(g *Gateway) { g.Conn, g.Upstream = "conn-1", "upstream-state-\"<&>\x00\u2028é" },
		"neither":  func(g *Gateway) { g.Conn = "conn-1" },
	} {
		t.Run(name, func(t *testing.T) {
			st := gatewayCall(t)
			mod(&st)
			sealed, err := SealGateway(keys, st)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(sealed, "linear") || strings.Contains(sealed, "upstream-state") {
				t.Fatal("the sealed state shows its contents")
			}
			want := gatewayCall(t)
			got, err := OpenGateway(keys, sealed, want, epoch)
			if err != nil {
				t.Fatalf("OpenGateway: %v", err)
			}
			if got.Principal != st.Principal || got.Provider != st.Provider || got.Method != st.Method || got.Name != st.Name ||
				!bytes.Equal(got.ArgDigest, st.ArgDigest) || got.Conn != st.Conn || got.Grant != st.Grant || got.Upstream != st.Upstream ||
				!got.Expires.Equal(st.Expires) {
				t.Fatalf("opened %+v, sealed %+v", got, st)
			}
		})
	}
}

// TestGatewayRefusals: every way a gateway continuation can be wrong is
// the one ErrInvalid.
func TestGatewayRefusals(t *testing.T) {
	keys := testKeys(t)
	st := gatewayCall(t)
	st.Conn, st.Upstream = "conn-1", "upstream-state"
	sealed, err := SealGateway(keys, st)
	if err != nil {
		t.Fatal(err)
	}
	want := gatewayCall(t)
	if _, err := OpenGateway(keys, sealed, want, epoch); err != nil {
		t.Fatalf("the control state does not open: %v", err)
	}
	ct, _ := base64.RawURLEncoding.DecodeString(sealed)
	flipped := func(i int) string {
		b := bytes.Clone(ct)
		b[i] ^= 1
		return base64.RawURLEncoding.EncodeToString(b)
	}
	otherDigest, _ := Digest(json.RawMessage(`{"team":"core","title":"y"}`))
	otherKeys, _ := vault.ParseKeys(vault.GenerateKey())
	plain := Seal(keys, State{Principal: st.Principal, Operation: "create_issue", ArgDigest: st.ArgDigest, Ref: "g", Expires: st.Expires})
	// The same plaintext sealed for another purpose (a plain requestState's
	// AAD) is no gateway state.
	pt, _ := json.Marshal(gatewayWire{V: 1, Issuer: st.Principal.Issuer, Subject: st.Principal.Subject, Provider: st.Provider,
		Method: st.Method, Name: st.Name, ArgDigest: st.ArgDigest, Expires: st.Expires.Unix()})
	otherAAD := base64.RawURLEncoding.EncodeToString(keys.Seal(pt, []byte(aad)))
	for name, c := range map[string]struct {
		sealed string
		mod    func(*Gateway)
		now    time.Time
	}{
		"tampered first byte":  {sealed: flipped(0)},
		"tampered middle":      {sealed: flipped(len(ct) / 2)},
		"tampered tag":         {sealed: flipped(len(ct) - 1)},
		"truncated":            {sealed: sealed[:len(sealed)-3]},
		"not base64":           {sealed: sealed[:10] + "!" + sealed[11:]},
		"padded base64":        {sealed: base64.URLEncoding.EncodeToString(ct)},
		"empty":                {sealed: ""},
		"oversized":            {sealed: sealed + strings.Repeat("A", maxGatewaySealed)},
		"expired at the limit": {sealed: sealed, now: st.Expires},
		"expired":              {sealed: sealed, now: st.Expires.Add(time.Hour)},
		"another person":       {sealed: sealed, mod: func(g *Gateway) { g.Principal.Subject = "bob" }},
		"another issuer":       {sealed: sealed, mod: func(g *Gateway) { g.Principal.Issuer = "https://other-idp.test" }},
		"another provider":     {sealed: sealed, mod: func(g *Gateway) { g.Provider = "notion" }},
		"another method":       {sealed: sealed, mod: func(g *Gateway) { g.Method = "prompts/get" }},
		"another name":         {sealed: sealed, mod: func(g *Gateway) { g.Name = "delete_issue" }},
		"other arguments":      {sealed: sealed, mod: func(g *Gateway) { g.ArgDigest = otherDigest }},
		"no arguments digest":  {sealed: sealed, mod: func(g *Gateway) { g.ArgDigest = nil }},
		"another key":          {sealed: sealed},
		"a plain requestState": {sealed: plain},
		"another purpose":      {sealed: otherAAD},
	} {
		t.Run(name, func(t *testing.T) {
			w := gatewayCall(t)
			if c.mod != nil {
				c.mod(&w)
			}
			now := epoch
			if !c.now.IsZero() {
				now = c.now
			}
			k := keys
			if name == "another key" {
				k = otherKeys
			}
			got, err := OpenGateway(k, c.sealed, w, now)
			if err != ErrInvalid {
				t.Fatalf("OpenGateway = %+v, %v; want ErrInvalid", got, err)
			}
		})
	}
	// The connection the upstream state was issued on comes back as sealed:
	// the gateway refuses it for a replaced connection (mcpapi compares it
	// with the connection the retry runs on).
	if got, _ := OpenGateway(keys, sealed, want, epoch); got.Conn != "conn-1" {
		t.Fatalf("Conn = %q, want conn-1", got.Conn)
	}
}

// TestGatewaySizes: an upstream requestState of up to MaxUpstreamState
// bytes, whatever its characters, seals into at most 24 KiB and opens
// back byte for byte; a larger one is refused at sealing, and so is
// anything else that would seal into a state too large to open.
func TestGatewaySizes(t *testing.T) {
	keys := testKeys(t)
	long := func(unit string) string {
		return strings.Repeat(unit, MaxUpstreamState/len(unit)) + strings.Repeat("a", MaxUpstreamState%len(unit))
	}
	st := gatewayCall(t)
	// The longest names a call carries: an issuer URL, a subject, a tool
	// name of 128 characters, a connection id.
	st.Principal = vault.Principal{Issuer: "https://login.example.com/" + strings.Repeat("t", 100) + "/v2.0", Subject: strings.Repeat("s", 64)}
	st.Name, st.Provider, st.Conn = strings.Repeat("n", 128), strings.Repeat("p", 32), strings.Repeat("c", 32)
	want := st
	for name, up := range map[string]string{
		"base64url":      long("AZaz09-_"),
		"quotes":         long(`"`),
		"backslashes":    long(`\`),
		"html":           long("<&>"),
		"control":        long("\x01"),
		"nul":            long("\x00"),
		"line separator": long("\u2028"),
		"two-byte":       long("é"),
		"four-byte":      long("😀"),
		"not utf-8":      long("\xff"),
	} {
		t.Run(name, func(t *testing.T) {
			if len(up) != MaxUpstreamState {
				t.Fatalf("test input is %d bytes", len(up))
			}
			s := st
			s.Upstream = up
			sealed, err := SealGateway(keys, s)
			if err != nil {
				t.Fatalf("SealGateway(%d bytes): %v", len(up), err)
			}
			if len(sealed) > 24<<10 {
				t.Fatalf("sealed state is %d bytes, over 24 KiB", len(sealed))
			}
			got, err := OpenGateway(keys, sealed, want, epoch)
			if err != nil {
				t.Fatalf("OpenGateway: %v", err)
			}
			if got.Upstream != up {
				t.Fatal("the upstream state did not come back byte for byte")
			}
			s.Upstream = up + "a"
			if _, err := SealGateway(keys, s); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("SealGateway(%d bytes) = %v, want ErrTooLarge", len(s.Upstream), err)
			}
		})
	}
	// A resource URI the host chose can be long too: what cannot be opened
	// is not handed out.
	s := gatewayCall(t)
	s.Method, s.Name, s.Grant = "resources/read", "https://example.com/"+strings.Repeat("r", 30<<10), "grant-1"
	if sealed, err := SealGateway(keys, s); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("SealGateway with a 30 KiB name = %d bytes, %v; want ErrTooLarge", len(sealed), err)
	}
}

// FuzzOpenGateway opens arbitrary strings: only a state sealed for this
// call opens, every failure is ErrInvalid, and nothing panics.
func FuzzOpenGateway(f *testing.F) {
	keys := testKeys(f)
	want := gatewayCall(f)
	for _, mod := range []func(*Gateway){
		func(g *Gateway) { g.Grant = "grant-1" },
		func(g *Gateway) { g.Conn, g.Upstream = "conn-1", "upstream-state" },
		func(g *Gateway) { g.Provider = "notion" },
	} {
		st := want
		mod(&st)
		sealed, err := SealGateway(keys, st)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(sealed)
		f.Add(sealed[:len(sealed)/2])
	}
	f.Add(Seal(keys, State{Principal: want.Principal, Operation: want.Name, ArgDigest: want.ArgDigest, Ref: "g", Expires: want.Expires}))
	f.Add(base64.RawURLEncoding.EncodeToString(keys.Seal([]byte(`{"v":1}`), []byte(gatewayAAD))))
	f.Add(base64.RawURLEncoding.EncodeToString(keys.Seal([]byte("{\"v\":2}\x00"), []byte(gatewayAAD))))
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := OpenGateway(keys, s, want, epoch)
		if err != nil {
			if err != ErrInvalid {
				t.Fatalf("error %v is not the uniform error", err)
			}
			return
		}
		if got.Principal != want.Principal || got.Provider != want.Provider || got.Method != want.Method || got.Name != want.Name ||
			!bytes.Equal(got.ArgDigest, want.ArgDigest) || !epoch.Before(got.Expires) {
			t.Fatalf("opened a state not bound to this call: %+v", got)
		}
	})
}

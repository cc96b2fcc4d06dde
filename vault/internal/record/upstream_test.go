package record_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// otherKeyring holds one key of another id than fuzzKeyring's.
func otherKeyring(t testing.TB) *vault.Keyring {
	t.Helper()
	kr, err := vault.NewKeyring([]string{"ot"}, [][]byte{bytes.Repeat([]byte{2}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// sameUpstreamClient compares registrations, times by instant.
func sameUpstreamClient(a, b vault.UpstreamClient) bool {
	ac, bc := a.Created, b.Created
	a.Created, b.Created = time.Time{}, time.Time{}
	return a == b && ac.Equal(bc)
}

func upstreamClient() vault.UpstreamClient {
	return vault.UpstreamClient{Key: "https://as.example https://broker.example/oauth/linear/callback", ClientID: "dcr-1",
		ClientSecret: "dcr-secret-value-1", AuthMethod: "client_secret_basic", Created: time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)}
}

// TestUpstreamClientSealed: a registration's client secret is sealed in
// the stored record (neither it nor its base64 is in the bytes), opens
// with the key ring, names the key that sealed it, and fails to open when
// the envelope is moved to another registration or client id, tampered
// with, or read with a key ring that lacks its key. A public client has no
// envelope at all.
func TestUpstreamClientSealed(t *testing.T) {
	kr := fuzzKeyring(t)
	c := upstreamClient()
	rec, err := record.EncodeUpstreamClient(kr, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range []string{c.ClientSecret.Reveal(), base64.StdEncoding.EncodeToString([]byte(c.ClientSecret.Reveal()))} {
		if bytes.Contains(rec, []byte(form)) {
			t.Fatalf("the stored record holds the client secret in the clear: %s", rec)
		}
	}
	got, err := record.DecodeUpstreamClient(kr, rec)
	c.SealedWith = kr.Primary()
	if err != nil || !sameUpstreamClient(got, c) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, c)
	}
	if key, sealed, err := record.UpstreamClientMeta(rec); err != nil || key != c.Key || sealed != kr.Primary() {
		t.Fatalf("meta: %q %q %v", key, sealed, err)
	}

	// Moved: the same envelope under another key or client id.
	for field, value := range map[string]string{"key": "https://other.example https://broker.example/cb", "client_id": "dcr-2"} {
		var m map[string]any
		if err := json.Unmarshal(rec, &m); err != nil {
			t.Fatal(err)
		}
		m[field] = value
		moved, _ := json.Marshal(m)
		if _, err := record.DecodeUpstreamClient(kr, moved); !errors.Is(err, vault.ErrDecrypt) {
			t.Errorf("the secret moved to another %s: %v, want ErrDecrypt", field, err)
		}
	}
	// Tampered: every byte of the envelope.
	var r struct {
		Secret []byte `json:"secret"`
	}
	if err := json.Unmarshal(rec, &r); err != nil {
		t.Fatal(err)
	}
	for i := range r.Secret {
		bad := bytes.Clone(r.Secret)
		bad[i] ^= 0x40
		tampered := bytes.Replace(rec, []byte(base64.StdEncoding.EncodeToString(r.Secret)), []byte(base64.StdEncoding.EncodeToString(bad)), 1)
		if _, err := record.DecodeUpstreamClient(kr, tampered); err == nil {
			t.Fatalf("byte %d of the envelope changed, and the secret still opened", i)
		}
	}
	// Another key ring.
	if _, err := record.DecodeUpstreamClient(otherKeyring(t), rec); !errors.Is(err, vault.ErrUnknownKey) {
		t.Errorf("opened with a key ring lacking its key: %v, want ErrUnknownKey", err)
	}

	public := upstreamClient()
	public.ClientSecret, public.AuthMethod = "", "none"
	prec, err := record.EncodeUpstreamClient(kr, public)
	if err != nil || bytes.Contains(prec, []byte(`"secret"`)) {
		t.Fatalf("public client: %s %v", prec, err)
	}
	if got, err := record.DecodeUpstreamClient(otherKeyring(t), prec); err != nil || !sameUpstreamClient(got, public) {
		t.Fatalf("public client decoded %+v, %v", got, err)
	}
}

// TestUpstreamClientReseal: a secret sealed with an older key is sealed
// again with the primary; one on the primary, or none, is left alone.
func TestUpstreamClientReseal(t *testing.T) {
	kr := fuzzKeyring(t)
	rec, err := record.EncodeUpstreamClient(kr, upstreamClient())
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := kr.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	nrec, changed, err := record.ResealUpstreamClient(rotated, rec)
	if err != nil || !changed {
		t.Fatalf("reseal: %v %v", changed, err)
	}
	got, err := record.DecodeUpstreamClient(rotated, nrec)
	if err != nil || got.SealedWith != rotated.Primary() || got.ClientSecret != upstreamClient().ClientSecret {
		t.Fatalf("after the reseal: %+v %v", got, err)
	}
	if _, changed, err := record.ResealUpstreamClient(rotated, nrec); changed || err != nil {
		t.Fatalf("second reseal: %v %v", changed, err)
	}
}

// TestUpstreamClientRefusals: what cannot be stored is refused with a
// precise error, and a stored record that is not one does not decode.
func TestUpstreamClientRefusals(t *testing.T) {
	kr := fuzzKeyring(t)
	for name, tt := range map[string]struct {
		edit func(*vault.UpstreamClient)
		want string
	}{
		"no key":       {func(c *vault.UpstreamClient) { c.Key = "" }, "without key"},
		"long key":     {func(c *vault.UpstreamClient) { c.Key = strings.Repeat("k", record.MaxUpstreamClientKey+1) }, "more than 2048"},
		"NUL in key":   {func(c *vault.UpstreamClient) { c.Key = "a\x00b" }, "without NUL"},
		"no client id": {func(c *vault.UpstreamClient) { c.ClientID = "" }, "without client id"},
		"bad secret":   {func(c *vault.UpstreamClient) { c.ClientSecret = "\xff" }, "not valid UTF-8"},
	} {
		c := upstreamClient()
		tt.edit(&c)
		if _, err := record.EncodeUpstreamClient(kr, c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tt.want)
		}
	}
	for _, b := range []string{`{"v":2,"key":"k","client_id":"c"}`, `{"v":1,"client_id":"c"}`, `{"v":1,"key":"k"}`, `[]`} {
		if _, err := record.DecodeUpstreamClient(kr, []byte(b)); err == nil {
			t.Errorf("%s decoded", b)
		}
	}
}

// FuzzDecodeUpstreamClient: a stored registration (an import reads one
// from another store) decodes or fails with an error, and one that
// decodes encodes and decodes again to itself.
func FuzzDecodeUpstreamClient(f *testing.F) {
	kr := fuzzKeyring(f)
	rec, err := record.EncodeUpstreamClient(kr, upstreamClient())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"v":1,"key":"k","client_id":"c","secret":"AQJmeg=="}`))
	f.Add([]byte(`{"v":1,"key":"k","client_id":"c"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := record.DecodeUpstreamClient(kr, b)
		_, _, metaErr := record.UpstreamClientMeta(b)
		if metaErr != nil && err == nil {
			t.Fatalf("decoded, but the metadata read failed: %v", metaErr)
		}
		if err != nil {
			return
		}
		again, err := record.EncodeUpstreamClient(kr, c)
		if err != nil {
			t.Fatalf("a registration that decoded does not encode: %v", err)
		}
		back, err := record.DecodeUpstreamClient(kr, again)
		if err != nil || !sameUpstreamClient(back, c) {
			t.Fatalf("round trip: %+v, %v; want %+v", back, err, c)
		}
	})
}

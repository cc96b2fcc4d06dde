package vault

import "log/slog"

// Secret holds token material. Printing, logging or JSON-encoding it yields
// "REDACTED"; Reveal is the one way to get the value, so every use is greppable.
type Secret string

const redacted = "REDACTED"

// Reveal returns the secret value.
func (s Secret) Reveal() string { return string(s) }

// String implements fmt.Stringer (used by %v, %s, %q and %x).
func (s Secret) String() string { return redacted }

// GoString implements fmt.GoStringer (used by %#v).
func (s Secret) GoString() string { return redacted }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON implements json.Marshaler so a Secret never reaches a client by accident.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText implements encoding.TextMarshaler.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

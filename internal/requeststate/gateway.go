package requeststate

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"time"

	"credbroker/vault"
)

// The gateway's continuation (/mcp/u/{provider}): what a retry of a call
// the gateway answered with input_required continues. It is bound to the
// person, the provider, the method, the name (tool, prompt or resource)
// and a digest of the arguments, and to the connection the call ran on; it
// carries either the broker's own connect request (Grant) or the
// upstream's requestState (Upstream), sealed so the host learns nothing of
// it. Every failure to open one is ErrInvalid.
//
// The sealed plaintext is a JSON header, a NUL byte (which encoding/json
// never writes), and the upstream's state as it is: carried in a JSON
// string it could grow sixfold (a control character becomes \u0001), and
// an upstream state of MaxUpstreamState bytes, whatever its characters,
// must seal into a state that opens.

const (
	gatewayAAD = "credbroker/gatewayState/v1"
	// gatewayVersion is the plaintext's layout: 2 is header, NUL, upstream
	// state.
	gatewayVersion = 2
	// MaxUpstreamState bounds the upstream's requestState the broker wraps.
	MaxUpstreamState = 16 << 10
	// maxGatewaySealed bounds a sealed state: SealGateway makes none
	// larger, OpenGateway opens none larger.
	maxGatewaySealed = 24 << 10
)

// ErrTooLarge: the upstream's requestState is larger than MaxUpstreamState,
// or the state would seal into more than 24 KiB.
var ErrTooLarge = errors.New("requeststate: the gateway state is too large")

// Gateway is a gateway continuation.
type Gateway struct {
	Principal vault.Principal
	// Provider, Method and Name say which call it continues; ArgDigest is
	// Digest of its arguments.
	Provider, Method, Name string
	ArgDigest              []byte
	// Conn is the connection the call ran on ("" before one existed).
	Conn string
	// Grant is the broker's connect request the call waits for; Upstream
	// the upstream's own requestState (one of the two, or neither: retry
	// later).
	Grant, Upstream string
	Expires         time.Time
}

type gatewayWire struct {
	V         int    `json:"v"`
	Issuer    string `json:"iss"`
	Subject   string `json:"sub"`
	Provider  string `json:"p"`
	Method    string `json:"m"`
	Name      string `json:"n"`
	ArgDigest []byte `json:"a"`
	Conn      string `json:"c,omitempty"`
	Grant     string `json:"g,omitempty"`
	Expires   int64  `json:"e"`
}

// SealGateway seals st with keys (the ring derived for request states).
func SealGateway(keys *vault.Keyring, st Gateway) (string, error) {
	if len(st.Upstream) > MaxUpstreamState {
		return "", ErrTooLarge
	}
	pt, err := json.Marshal(gatewayWire{V: gatewayVersion, Issuer: st.Principal.Issuer, Subject: st.Principal.Subject,
		Provider: st.Provider, Method: st.Method, Name: st.Name, ArgDigest: st.ArgDigest, Conn: st.Conn,
		Grant: st.Grant, Expires: st.Expires.Unix()})
	if err != nil {
		return "", err
	}
	pt = append(append(pt, 0), st.Upstream...)
	sealed := seal(keys, pt, gatewayAAD)
	if len(sealed) > maxGatewaySealed {
		// Long names (a resource URI) with a long upstream state: a state
		// OpenGateway would refuse is not handed out.
		return "", ErrTooLarge
	}
	return sealed, nil
}

// OpenGateway authenticates sealed and checks that it continues want (its
// Principal, Provider, Method, Name and ArgDigest) and has not expired at
// now. Nothing is parsed before authentication succeeds.
func OpenGateway(keys *vault.Keyring, sealed string, want Gateway, now time.Time) (Gateway, error) {
	pt, ok := unseal(keys, sealed, maxGatewaySealed, gatewayAAD)
	if !ok {
		return Gateway{}, ErrInvalid
	}
	header, upstream, ok := bytes.Cut(pt, []byte{0})
	var w gatewayWire
	if !ok || json.Unmarshal(header, &w) != nil || w.V != gatewayVersion {
		return Gateway{}, ErrInvalid
	}
	same := eq(w.Issuer, want.Principal.Issuer) & eq(w.Subject, want.Principal.Subject) & eq(w.Provider, want.Provider) &
		eq(w.Method, want.Method) & eq(w.Name, want.Name) & subtle.ConstantTimeCompare(w.ArgDigest, want.ArgDigest)
	exp := time.Unix(w.Expires, 0)
	if same != 1 || !now.Before(exp) {
		return Gateway{}, ErrInvalid
	}
	return Gateway{Principal: want.Principal, Provider: w.Provider, Method: w.Method, Name: w.Name, ArgDigest: w.ArgDigest,
		Conn: w.Conn, Grant: w.Grant, Upstream: string(upstream), Expires: exp}, nil
}

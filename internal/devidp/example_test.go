package devidp_test

import (
	"fmt"
	"net/http"
	"time"

	"credbroker/internal/devidp"
)

// The IdP is mounted under its issuer's path on the broker's own mux, as
// `broker dev` does.
func Example() {
	idp, err := devidp.New(devidp.Options{
		Issuer:  "http://127.0.0.1:8080/dev/idp",
		Users:   devidp.DefaultUsers(),
		Clients: []devidp.Client{{ID: "broker", Secret: "dev-secret", RedirectURIs: []string{"http://127.0.0.1:8080/oauth/login/callback"}}},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dev/idp/", idp.Handler())

	// A bearer token for the broker's MCP endpoint.
	_, exp, err := idp.MintAccessToken("alice", "http://127.0.0.1:8080/mcp", []string{"mcp"}, 10*time.Minute)
	fmt.Println(idp.Issuer(), err, time.Until(exp) > 9*time.Minute)
	// Output: http://127.0.0.1:8080/dev/idp <nil> true
}

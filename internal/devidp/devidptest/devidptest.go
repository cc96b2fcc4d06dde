// Package devidptest starts a devidp OpenID Provider on a loopback httptest
// server for tests in other packages.
package devidptest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"credbroker/internal/devidp"
)

// Start runs an IdP on 127.0.0.1 with issuer = server URL + "/idp" and
// stops it when the test ends. Nil users means devidp.DefaultUsers().
// Clients whose redirect URIs are known only later can be added with
// (*devidp.IdP).AddClient.
func Start(tb testing.TB, users []devidp.User, clients []devidp.Client) *devidp.IdP {
	tb.Helper()
	if users == nil {
		users = devidp.DefaultUsers()
	}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux) // binds 127.0.0.1
	tb.Cleanup(srv.Close)
	idp, err := devidp.New(devidp.Options{Issuer: srv.URL + "/idp", Users: users, Clients: clients})
	if err != nil {
		tb.Fatalf("devidptest: %v", err)
	}
	mux.Handle("/idp/", idp.Handler())
	return idp
}

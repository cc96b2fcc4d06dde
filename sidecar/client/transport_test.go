package client

import (
	"context"
	"net/http"
	"testing"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestCredTransportOnlyToSidecarHost(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		creds     bool
	}{
		{"sidecar", "http://127.0.0.1:8081/v1/require", true},
		{"other port", "http://127.0.0.1:9999/v1/require", false},
		{"other host", "http://localhost:8081/v1/require", false},
		{"other scheme", "https://127.0.0.1:8081/v1/require", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got http.Header
			tr := &credTransport{scheme: "http", host: "127.0.0.1:8081", secret: "s3cret-s3cret-s3cret",
				next: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					got = r.Header
					return &http.Response{StatusCode: 204, Body: http.NoBody, Request: r}, nil
				})}
			ctx := context.WithValue(context.Background(), userTokenKey{}, "user-token")
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tc.url, nil)
			// Headers set by hand are replaced, never passed on as they are.
			req.Header.Set(secretHeader, "forged")
			req.Header.Set("Authorization", "Bearer forged")
			if _, err := tr.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
			if tc.creds && (got.Get(secretHeader) != "s3cret-s3cret-s3cret" || got.Get("Authorization") != "Bearer user-token") {
				t.Errorf("sidecar request headers %v; want both credentials", got)
			}
			if !tc.creds && (got.Get(secretHeader) != "" || got.Get("Authorization") != "") {
				t.Errorf("request to %s carries credentials: %v", tc.url, got)
			}
			if req.Header.Get(secretHeader) != "forged" {
				t.Error("RoundTrip modified the caller's request")
			}
		})
	}
}

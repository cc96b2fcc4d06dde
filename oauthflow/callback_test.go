package oauthflow

import (
	"strings"
	"testing"
)

func TestParseCallback(t *testing.T) {
	tests := []struct {
		name, query string
		want        callbackParams
		wantErr     string
	}{
		{name: "code", query: "code=abc&state=xyz", want: callbackParams{Code: "abc", State: "xyz"}},
		{name: "error", query: "error=access_denied&error_description=%3Cb%3Eno%3C%2Fb%3E&state=s",
			want: callbackParams{Error: "access_denied", ErrorDescription: "<b>no</b>", State: "s"}},
		{name: "no state", query: "code=abc", wantErr: "no state"},
		{name: "neither", query: "state=s", wantErr: "neither code nor error"},
		{name: "repeated state", query: "code=a&state=s&state=t", wantErr: "repeated"},
		{name: "malformed", query: "code=%zz&state=s", wantErr: "malformed"},
		{name: "control chars in error", query: "error=a%0Ab&state=s", wantErr: "invalid characters"},
		{name: "too long", query: "state=s&code=" + strings.Repeat("a", 9000), wantErr: "too long"},
		{name: "iss", query: "code=abc&state=xyz&iss=https%3A%2F%2Faccounts.google.com",
			want: callbackParams{Code: "abc", State: "xyz", Iss: "https://accounts.google.com"}},
		{name: "repeated iss", query: "code=a&state=s&iss=https://a&iss=https://b", wantErr: "repeated"},
		{name: "iss too long", query: "code=a&state=s&iss=" + strings.Repeat("i", 600), wantErr: "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCallback(tc.query)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseCallback = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseCallback(f *testing.F) {
	f.Add("code=abc&state=xyz")
	f.Add("error=access_denied&error_description=%3Cscript%3E&state=s")
	f.Add("state=s&state=s&code=c")
	f.Fuzz(func(t *testing.T, q string) {
		p, err := parseCallback(q)
		if err != nil {
			if p != (callbackParams{}) {
				t.Fatalf("error %v with non-empty result %+v", err, p)
			}
			return
		}
		if p.State == "" || p.Code == "" && p.Error == "" {
			t.Fatalf("accepted %q without state or outcome: %+v", q, p)
		}
		if len(p.Code) > 2048 || len(p.State) > 512 || len([]rune(p.ErrorDescription)) > 301 {
			t.Fatalf("accepted oversized parameters: %+v", p)
		}
	})
}

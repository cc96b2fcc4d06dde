package sidecartest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// recordingTB collects what a Contract reports instead of failing.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestContractCatchesMismatches feeds the checker exchanges that break the
// document in one way each (and some that keep it): it must report
// exactly the broken ones.
func TestContractCatchesMismatches(t *testing.T) {
	const conn = `{"id":"conn_1","provider":"demo","account":"alice-demo","scopes":["repos"],"status":"active"}`
	jsonErr := func(status int, body string) (int, http.Header, string) {
		return status, http.Header{"Content-Type": {"application/json"}, "Broker-Error": {"true"}, "Cache-Control": {"no-store"}}, body
	}
	ok := func(body string) (int, http.Header, string) {
		return 200, http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}}, body
	}
	type exchange struct {
		name, method, path, reqBody string
		status                      int
		header                      http.Header
		body                        string
		broken                      bool
	}
	ex := func(name, method, path, reqBody string, broken bool, resp func() (int, http.Header, string)) exchange {
		st, h, b := resp()
		return exchange{name, method, path, reqBody, st, h, b, broken}
	}
	cases := []exchange{
		ex("connected", "POST", "/v1/require", `{"provider":"demo"}`, false, func() (int, http.Header, string) {
			return ok(`{"status":"connected","connection":` + conn + `}`)
		}),
		ex("input required", "POST", "/v1/require", `{"provider":"demo","scopes":["repos"],"client_name":"x"}`, false, func() (int, http.Header, string) {
			return ok(`{"status":"input_required","input_key":"connect_demo","input_request":{"method":"elicitation/create","params":{"mode":"url","message":"m","url":"https://b.example/connect/x"}},"request_state":"s"}`)
		}),
		ex("declined", "POST", "/v1/require", `{"provider":"demo","request_state":"s","input_responses":{"connect_demo":{"action":"decline"},"other":{"role":"assistant"}}}`, false, func() (int, http.Header, string) {
			return ok(`{"status":"declined","message":"no"}`)
		}),
		ex("error", "POST", "/v1/require", `{"provider":"demo","user":"bob"}`, false, func() (int, http.Header, string) {
			return jsonErr(400, `{"error":"invalid_request","message":"unknown field \"user\""}`)
		}),
		ex("relayed provider answer", "GET", "/v1/proxy/demo/repos/x/y", ``, false, func() (int, http.Header, string) {
			return 404, http.Header{"Content-Type": {"text/html"}}, `<h1>Not Found</h1>`
		}),
		ex("proxy refusal", "GET", "/v1/proxy/demo/user", ``, false, func() (int, http.Header, string) {
			return jsonErr(409, `{"error":"account_required","message":"name one","accounts":["a","b"]}`)
		}),
		ex("token", "POST", "/v1/token", `{"provider":"demo"}`, false, func() (int, http.Header, string) {
			return ok(`{"access_token":"t","token_type":"Bearer","expires_at":"2026-07-28T12:00:00Z"}`)
		}),

		ex("undeclared error code", "POST", "/v1/require", `{"provider":"demo"}`, true, func() (int, http.Header, string) {
			return jsonErr(409, `{"error":"busy","message":"x"}`)
		}),
		ex("undeclared status", "POST", "/v1/require", `{"provider":"demo"}`, true, func() (int, http.Header, string) {
			return jsonErr(418, `{"error":"internal","message":"x"}`)
		}),
		ex("missing member", "POST", "/v1/require", `{"provider":"demo"}`, true, func() (int, http.Header, string) {
			return ok(`{"status":"connected"}`)
		}),
		ex("unknown status value", "POST", "/v1/require", `{"provider":"demo"}`, true, func() (int, http.Header, string) {
			return ok(`{"status":"maybe","message":"x"}`)
		}),
		ex("extra member", "POST", "/v1/token", `{"provider":"demo"}`, true, func() (int, http.Header, string) {
			return ok(`{"access_token":"t","token_type":"Bearer","refresh_token":"r"}`)
		}),
		ex("error without Broker-Error", "POST", "/v1/token", `{"provider":"demo"}`, true, func() (int, http.Header, string) {
			return 403, http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}}, `{"error":"token_export_disabled","message":"x"}`
		}),
		ex("cacheable answer", "POST", "/v1/require", `{"provider":"demo"}`, true, func() (int, http.Header, string) {
			return 200, http.Header{"Content-Type": {"application/json"}}, `{"status":"declined","message":"no"}`
		}),
		ex("proxy refusal that is not an Error", "GET", "/v1/proxy/demo/user", ``, true, func() (int, http.Header, string) {
			return jsonErr(409, `{"problem":"x"}`)
		}),
		ex("accepted request the document does not describe", "POST", "/v1/require", `{"provider":"demo","user":"bob"}`, true, func() (int, http.Header, string) {
			return ok(`{"status":"connected","connection":` + conn + `}`)
		}),
		ex("unknown route", "POST", "/v1/disconnect", `{}`, true, func() (int, http.Header, string) {
			return ok(`{}`)
		}),
		ex("unknown method", "GET", "/v1/require", ``, true, func() (int, http.Header, string) {
			return ok(`{}`)
		}),
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingTB{TB: t}
			c := NewContract(t)
			c.tb = rec
			r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.reqBody))
			if tc.reqBody != "" {
				r.Header.Set("Content-Type", "application/json")
			}
			c.Check(r, []byte(tc.reqBody), tc.status, tc.header, []byte(tc.body))
			if broken := len(rec.errs) > 0; broken != tc.broken {
				t.Fatalf("reported %v, want broken=%v", rec.errs, tc.broken)
			}
		})
	}
}

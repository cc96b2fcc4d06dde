package htmlform

import (
	"net/url"
	"testing"
)

func TestFind(t *testing.T) {
	page, _ := url.Parse("http://127.0.0.1:8080/connect/abc")
	body := `<form method="get" action="/search"><input type="hidden" name="q" value="x"></form>
<form class="actions" method="post" action="/connect/abc?x=1&amp;y=2">
  <input type="hidden" name="csrf" value="t&amp;k">
  <input type="text" name="note" value="not sent unless given">
  <button type="submit" name="decision" value="approve">Approve</button>
</form>
<FORM ACTION="/logout" METHOD="POST"><INPUT TYPE="hidden" NAME="csrf" VALUE="z"></FORM>`
	tests := []struct {
		part      string
		extra     url.Values
		wantURL   string
		wantQuery string
		wantErr   bool
	}{
		{"/connect/", url.Values{"decision": {"approve"}}, "http://127.0.0.1:8080/connect/abc?x=1&y=2", "csrf=t%26k&decision=approve", false},
		{"/logout", nil, "http://127.0.0.1:8080/logout", "csrf=z", false},
		{"/logout", url.Values{"csrf": {"override"}}, "http://127.0.0.1:8080/logout", "csrf=override", false},
		{"/search", nil, "", "", true}, // a GET form is not submitted
		{"/nowhere", nil, "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.part, func(t *testing.T) {
			u, vals, err := Find(page, body, tt.part, tt.extra)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("found %v %v, want an error", u, vals)
				}
				return
			}
			if err != nil || u.String() != tt.wantURL || vals.Encode() != tt.wantQuery {
				t.Fatalf("got %v %q %v, want %s %s", u, vals.Encode(), err, tt.wantURL, tt.wantQuery)
			}
		})
	}
}

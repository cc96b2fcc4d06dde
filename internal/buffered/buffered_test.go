package buffered

import (
	"net/http"
	"testing"
)

func TestResponse(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		wantStatus int
		wantBody   string
	}{
		{"nothing written", func(http.ResponseWriter, *http.Request) {}, 0, ""},
		{"body without status is 200", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hi")) }, http.StatusOK, "hi"},
		{"first status wins", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusTeapot)
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("a"))
			w.Write([]byte("b"))
		}, http.StatusTeapot, "ab"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewResponse()
			r.Header().Set("X-Before", "1")
			tt.handler(r, nil)
			if r.Status != tt.wantStatus || r.Body.String() != tt.wantBody {
				t.Errorf("status %d body %q, want %d %q", r.Status, r.Body.String(), tt.wantStatus, tt.wantBody)
			}
			if r.Header().Get("X-Before") != "1" {
				t.Error("a header set before the handler ran was lost")
			}
		})
	}
}

var _ http.ResponseWriter = (*Response)(nil)

package main

import (
	"bytes"
	"net/http"
	"testing"

	"credbroker/internal/testskip"
)

// BenchmarkLoadHandler is the load run's connected tools/call without the
// network: each server's handler (the default path's whole site, the
// issuer mode's mux, the JSON floor) called in-process with a reused
// request and writer, on a bolt broker built as the load run builds it.
// What the broker's handler costs over the floor's is the difference of
// their ns/op, or of their process CPU per call (cpu-ns/op), which a
// busy machine disturbs less.
func BenchmarkLoadHandler(b *testing.B) {
	testskip.Short(b, "builds a broker and signs people in")
	quiet(b)
	st, err := newStack(config{only: "load"}, storeBolt, b.TempDir(), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.close()
	body := callBody(1, "github", "")
	for _, name := range []string{modeBroker, modeIssuer, floorName} {
		b.Run(name, func(b *testing.B) {
			h := st.handler[name]
			req := st.newRequest(st.endpoint(modeBroker), st.aliceAuth[name], body)
			rd := bytes.NewReader(body)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				rd.Reset(body)
				r := *req // the handlers only read its headers: shared
				r.Body = readCloser{rd}
				clear(w.h)
				w.code = 0
				h.ServeHTTP(w, &r)
				if w.code != http.StatusOK {
					b.Fatalf("status %d", w.code)
				}
			}
			// The process's CPU (GC included) per call: on a shared
			// machine steadier than ns/op, which counts others' turns.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// discardWriter is a reusable ResponseWriter that discards the body.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(p), nil
}

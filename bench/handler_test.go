package main

import (
	"bytes"
	"net/http"
	"testing"

	"credbroker/internal/testskip"
)

// eachLoadServer builds a bolt broker as the load run builds it and runs a
// sub-benchmark for each server of the load run (the default path's whole
// site, the issuer mode's mux, the JSON floor): call, which prepare makes
// for the server, serves it one connected tools/call. Besides ns/op it
// reports the process's CPU per call (cpu-ns/op, GC included), which a
// busy machine disturbs less: ns/op counts others' turns.
func eachLoadServer(b *testing.B, prepare func(b *testing.B, st *stack, name string, body []byte) (call func())) {
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
			call := prepare(b, st, name, body)
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				call()
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkLoadHandler is the load run's connected tools/call without the
// network: each server's handler called in-process with a reused request
// and writer. What the broker's handler costs over the floor's is the
// difference of their ns/op, or of their cpu-ns/op.
func BenchmarkLoadHandler(b *testing.B) {
	eachLoadServer(b, func(b *testing.B, st *stack, name string, body []byte) func() {
		h := st.handler[name]
		req := st.newRequest(st.endpoint(modeBroker), st.aliceAuth[name], body)
		rd := bytes.NewReader(body)
		w := &discardWriter{h: http.Header{}}
		return func() {
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
	})
}

// BenchmarkLoadHTTP is the load run's c=1 row as a benchmark: one
// keep-alive client sending the connected tools/call over loopback to each
// server, as the load run's clients do. Next to BenchmarkLoadHandler it
// tells what a call costs beyond the handler: the request's and the
// answer's bytes on the wire (the floor's request carries no
// Authorization header), net/http's work on both sides, the collector's
// share of what each allocates.
func BenchmarkLoadHTTP(b *testing.B) {
	eachLoadServer(b, func(b *testing.B, st *stack, name string, body []byte) func() {
		url := map[string]string{modeBroker: st.endpoint(modeBroker), modeIssuer: st.endpoint(modeIssuer), floorName: st.baseline + "/mcp"}[name]
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		b.Cleanup(client.CloseIdleConnections)
		return func() {
			if !roundTrip(client, st.newRequest(url, st.aliceAuth[name], body)) {
				b.Fatal("the call failed")
			}
		}
	})
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

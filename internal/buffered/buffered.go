// Package buffered holds an HTTP answer in memory: a handler served
// in-process writes to a Response, and its caller reads the status,
// headers and body afterwards (to rewrite the answer before it goes out,
// or to check it). Unlike httptest.ResponseRecorder it copies nothing at
// WriteHeader and has no test-only behaviour.
package buffered

import (
	"bytes"
	"net/http"
)

// Response is an http.ResponseWriter that keeps what a handler wrote.
// The first status written wins; a body written without one is 200.
// It is not safe for concurrent use.
type Response struct {
	header http.Header
	// Status is the status the handler wrote, 0 when it wrote nothing.
	Status int
	// Body is what the handler wrote.
	Body bytes.Buffer
}

// NewResponse returns an empty Response.
func NewResponse() *Response { return &Response{header: make(http.Header)} }

// Header returns the answer's headers, which a caller may set before the
// handler runs.
func (r *Response) Header() http.Header { return r.header }

// WriteHeader keeps the first status written.
func (r *Response) WriteHeader(status int) {
	if r.Status == 0 {
		r.Status = status
	}
}

// Write appends to Body, taking 200 as the status if none was written.
func (r *Response) Write(p []byte) (int, error) {
	if r.Status == 0 {
		r.Status = http.StatusOK
	}
	return r.Body.Write(p)
}

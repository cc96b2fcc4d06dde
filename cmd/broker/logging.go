package main

import (
	"io"
	"log/slog"

	"credbroker/internal/logredact"
)

// newLogger returns the process logger: text or JSON, behind the redacting
// handler so no token, code or secret reaches the output.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(logredact.New(h))
}

package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/buildinfo"
	"credbroker/internal/tracing"
)

// startTracing builds the tracer provider the OTEL_* environment asks for
// (nil: tracing off, nothing started). stop flushes the spans still
// buffered and stops the exporter; serve and dev call it on graceful
// shutdown, after the listener stopped.
func startTracing(ctx context.Context, log *slog.Logger) (tp trace.TracerProvider, stop func(), err error) {
	tp, shutdown, err := tracing.Setup(ctx, os.Getenv, buildinfo.Get().Version)
	if err != nil {
		return nil, func() {}, err
	}
	if tp == nil {
		return nil, func() {}, nil
	}
	cfg, _ := tracing.ConfigFromEnv(os.Getenv)
	endpoint := tracing.CleanURL(cfg.Endpoint)
	if endpoint == "" {
		endpoint = "the OTLP default (http://localhost:4318/v1/traces)"
	}
	log.Info("tracing on: spans go to OTLP/HTTP", "endpoint", endpoint)
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flushing traces at shutdown failed", "err", err)
		}
	}, nil
}

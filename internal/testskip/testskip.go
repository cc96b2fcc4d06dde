// Package testskip is the one way a credbroker test may skip.
//
// A test that cannot run because something it needs is missing on this
// machine (Chromium, PostgreSQL's server binaries, the MCP conformance suite,
// FUSE) calls Missing. That fails the test, naming what is missing and how
// to get it, unless the person running the tests opted in to a partial run
// with CREDBROKER_ALLOW_SKIP=1; then the test skips with a message in a fixed
// form, and `make test` lists every such skip at the end of the run
// (internal/testreport reads `go test -json`).
//
// Slow tests that `go test -short` may leave out call Short: -short is itself
// an explicit request to skip.
//
// No test calls testing.T's Skip methods directly; a test in this package
// checks the repository for that.
//
// It is test support: it imports testing and is only used from _test files
// and from other test-support packages.
package testskip

import (
	"fmt"
	"os"
	"testing"
)

// EnvAllow is the environment variable that turns Missing's failure into a
// skip: CREDBROKER_ALLOW_SKIP=1.
const EnvAllow = "CREDBROKER_ALLOW_SKIP"

// Prefix starts every skip message this package writes, so a report can
// tell a policy skip from anything else a skipped test logged.
const Prefix = "testskip: "

// Allowed reports whether skipping is allowed in this run
// (CREDBROKER_ALLOW_SKIP=1).
func Allowed() bool { return os.Getenv(EnvAllow) == "1" }

// Missing stops tb because what (a short name: "chromium", "postgresql",
// "conformance suite", "fuse") is not available; how says why and what
// installs it. It fails tb, unless CREDBROKER_ALLOW_SKIP=1, where it skips.
// Either way the message names what is missing.
func Missing(tb testing.TB, what, how string) {
	tb.Helper()
	msg := fmt.Sprintf("%smissing %s: %s", Prefix, what, how)
	if !Allowed() {
		tb.Fatalf("%s\n(set %s=1 to skip tests whose tools are missing; the run then lists every skip at the end)", msg, EnvAllow)
		return
	}
	tb.Skip(msg)
}

// Short skips tb when the tests run with -short, saying what was left out.
// It does nothing otherwise.
func Short(tb testing.TB, what string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip(Prefix + "-short: " + what)
	}
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"credbroker/internal/buildinfo"
)

// runVersion prints the build information: `broker version` for people,
// `broker version --json` for scripts (the same object /healthz carries).
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("version: unexpected argument %q", fs.Arg(0))}
	}
	bi := buildinfo.Get()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(bi)
	}
	modified := ""
	if bi.Modified {
		modified = " (with uncommitted changes)"
	}
	_, err := fmt.Fprintf(stdout, "credbroker %s\ncommit  %s%s\ndate    %s\ngo      %s\n", bi.Version, bi.Commit, modified, bi.Date, bi.GoVersion)
	return err
}

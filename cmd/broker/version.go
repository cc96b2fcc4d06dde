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
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parseFlags(fs, args, stderr, 0); err != nil {
		return err
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

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// usageError is a command-line mistake: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

const usage = `usage: broker <command> [flags]

commands:
  serve          run the broker (needs keys, an IdP and providers.yaml)
  dev            run the development stack on 127.0.0.1 (make run)
  keys generate  print a new random key line for BROKER_KEYS or --keys-file
  keys rotate    add a new primary key to --keys-file and re-encrypt every record
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{"no command given"}
	}
	switch args[0] {
	case "serve":
		return runServe(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usageError{fmt.Sprintf("unknown command %q", args[0])}
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	return errors.New("serve is not wired yet: the MCP endpoint and browser flow land in later changes")
}

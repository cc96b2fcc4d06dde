// Command testreport reads `go test -json` on stdin and writes what a
// person needs: each package's result line, the full output of every
// failed test and build, and at the end a summary that lists every skipped
// test with its reason. It exits non-zero when a test or build failed, when
// no test ran, or when a test skipped without CREDBROKER_ALLOW_SKIP=1 (see
// internal/testskip): a green run means everything ran.
//
//	go test -json ./... | go run ./internal/testreport
//
// `make test` runs the unit tests this way (with bash's pipefail, so go
// test's own failure counts too).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"credbroker/internal/testskip"
)

func main() {
	if !report(os.Stdin, os.Stdout, testskip.Allowed()) {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string // start, run, pause, cont, pass, fail, skip, output, bench, build-output, build-fail
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string // build-output and build-fail
}

// skip is one skipped test and why.
type skip struct{ pkg, test, reason string }

// report reads events from in, writes the report to out and says whether
// the run passed. allowSkip is CREDBROKER_ALLOW_SKIP=1.
func report(in io.Reader, out io.Writer, allowSkip bool) bool {
	var (
		output  = map[string][]string{} // package+" "+test -> its output lines so far
		top     = map[string][]string{} // package+" "+top-level test -> its and its subtests' lines
		skipped []skip
		passed  int
		failed  int
		builds  int // failed builds
		pkgFail int // failed packages
	)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line) // not an event (a tool's own output): pass it on
			continue
		}
		key := e.Package + " " + e.Test
		topKey := e.Package + " " + strings.SplitN(e.Test, "/", 2)[0]
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
		case "build-fail":
			builds++
		case "output":
			if e.Test == "" {
				fmt.Fprint(out, e.Output) // the package's own lines: ok, FAIL, panics
				continue
			}
			if strings.HasPrefix(e.Output, "=== ") {
				continue // RUN, PAUSE, CONT, NAME
			}
			output[key] = append(output[key], e.Output)
			top[topKey] = append(top[topKey], e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				if e.Action == "fail" {
					pkgFail++
					failed += unfinished(out, e.Package, top)
				}
				continue
			}
			switch e.Action {
			case "pass":
				passed++
			case "fail":
				failed++
				if !strings.Contains(e.Test, "/") { // subtests print with their parent
					fmt.Fprint(out, strings.Join(top[topKey], ""))
				}
			case "skip":
				skipped = append(skipped, skip{e.Package, e.Test, skipReason(output[key])})
			}
			delete(output, key)
			if !strings.Contains(e.Test, "/") {
				delete(top, topKey)
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testreport: reading go test -json: %v\n", err)
		return false
	}

	ok := true
	fmt.Fprintf(out, "\n== %d passed, %d failed, %d skipped", passed, failed, len(skipped))
	if builds > 0 {
		fmt.Fprintf(out, ", %d builds failed", builds)
	}
	fmt.Fprintln(out)
	if failed > 0 || builds > 0 || pkgFail > 0 {
		ok = false
	}
	if passed+failed+len(skipped) == 0 {
		fmt.Fprintln(out, "== no test ran")
		ok = false
	}
	if len(skipped) > 0 {
		slices.SortFunc(skipped, func(a, b skip) int { return strings.Compare(a.pkg+" "+a.test, b.pkg+" "+b.test) })
		fmt.Fprintf(out, "== skipped tests (%d):\n", len(skipped))
		for _, s := range skipped {
			fmt.Fprintf(out, "   %s %s: %s\n", s.pkg, s.test, s.reason)
		}
		if !allowSkip {
			fmt.Fprintf(out, "== tests may skip only with %s=1 (a partial run); install what is missing (.ci/deps says how)\n", testskip.EnvAllow)
			ok = false
		}
	}
	if ok {
		fmt.Fprintln(out, "== PASS")
	} else {
		fmt.Fprintln(out, "== FAIL")
	}
	return ok
}

// unfinished writes the output of every top-level test of pkg that was
// still running when the package failed (a -timeout panic, a crash in
// another goroutine), which test2json files under that test without a
// result of its own, and says how many there were. Without it a timed-out
// package reads "FAIL pkg" with no word of which test hung.
func unfinished(out io.Writer, pkg string, top map[string][]string) int {
	var names []string
	for k := range top {
		if name, ok := strings.CutPrefix(k, pkg+" "); ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(out, "--- DID NOT FINISH: %s (still running when %s failed)\n", name, pkg)
		fmt.Fprint(out, strings.Join(top[pkg+" "+name], ""))
		delete(top, pkg+" "+name)
	}
	return len(names)
}

// skipReason picks the reason out of a skipped test's output: testskip's
// message (with its continuation lines) when there is one, else the last
// line before "--- SKIP".
func skipReason(lines []string) string {
	var last string
	var msg []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "--- SKIP"):
			continue
		case msg != nil:
			msg = append(msg, l)
		default:
			if _, m, ok := strings.Cut(l, testskip.Prefix); ok {
				msg = []string{m}
				continue
			}
			last = l
		}
	}
	switch {
	case msg != nil:
		return strings.Join(msg, " ")
	case last != "":
		return last
	default:
		return "(no reason given)"
	}
}

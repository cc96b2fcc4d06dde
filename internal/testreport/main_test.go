package main

import (
	"os"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		allowSkip  bool
		wantOK     bool
		want       []string
		wantNot    []string
	}{
		{"failures and a build error fail the run", "mixed.jsonl", true, false,
			[]string{"b/b_test.go:3:28: undefined: undefined", "a_test.go:5: boom", "--- FAIL: TestFail/sub", "FAIL\tjt\t",
				"== 1 passed, 2 failed, 1 skipped, 1 builds failed", "jt TestSkip: missing chromium: install it", "== FAIL"},
			[]string{"hello", "=== RUN"}},
		{"a skip fails the run by default", "skip-only.jsonl", false, false,
			[]string{"== 1 passed, 0 failed, 1 skipped", "jt TestSkip: missing chromium: install it", "CREDBROKER_ALLOW_SKIP=1", "== FAIL"},
			[]string{"hello"}},
		{"a skip is listed and allowed with CREDBROKER_ALLOW_SKIP=1", "skip-only.jsonl", true, true,
			[]string{"jt TestSkip: missing chromium: install it", "== PASS"},
			[]string{"may skip only"}},
		{"a timed-out package names the test that was running, with its panic", "timeout.jsonl", true, false,
			[]string{"--- DID NOT FINISH: TestHangs (still running when tohang failed)", "waiting for the upstream",
				"panic: test timed out after 2s", "tohang/h_test.go:12", "== 1 passed, 1 failed, 0 skipped", "== FAIL"},
			[]string{"DID NOT FINISH: TestQuick"}},
		{"no events at all fail", "", true, false, []string{"no test ran", "== FAIL"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ""
			if tc.file != "" {
				b, err := os.ReadFile("testdata/" + tc.file)
				if err != nil {
					t.Fatal(err)
				}
				in = string(b)
			}
			var out strings.Builder
			if ok := report(strings.NewReader(in), &out, tc.allowSkip); ok != tc.wantOK {
				t.Errorf("report = %v, want %v", ok, tc.wantOK)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out.String(), w) {
					t.Errorf("report has %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func TestSkipReason(t *testing.T) {
	for _, tc := range []struct {
		lines []string
		want  string
	}{
		{[]string{"    x_test.go:4: before\n", "    x_test.go:9: testskip: -short: end-to-end test\n", "--- SKIP: TestX (0.00s)\n"}, "-short: end-to-end test"},
		{[]string{"    x_test.go:4: some other reason\n", "--- SKIP: TestX (0.00s)\n"}, "x_test.go:4: some other reason"},
		{[]string{"--- SKIP: TestX (0.00s)\n"}, "(no reason given)"},
		{[]string{"    x_test.go:9: testskip: missing postgresql: initdb failed\n", "        exit status 1\n", "--- SKIP: TestX (0.00s)\n"},
			"missing postgresql: initdb failed exit status 1"},
	} {
		if got := skipReason(tc.lines); got != tc.want {
			t.Errorf("skipReason(%q) = %q, want %q", tc.lines, got, tc.want)
		}
	}
}

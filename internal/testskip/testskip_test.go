package testskip_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"credbroker/internal/testskip"
)

// recorder is a testing.TB that records Fatalf and Skip instead of
// stopping the test (the embedded *testing.T supplies everything else).
type recorder struct {
	*testing.T
	fatal, skip string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recorder) Skip(args ...any)                  { r.skip = fmt.Sprint(args...) }

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		env                string
		wantFail, wantSkip bool
	}{
		{"", true, false},
		{"0", true, false},
		{"yes", true, false},
		{"1", false, true},
	} {
		t.Run("CREDBROKER_ALLOW_SKIP="+tc.env, func(t *testing.T) {
			t.Setenv(testskip.EnvAllow, tc.env)
			r := &recorder{T: t}
			testskip.Missing(r, "chromium", "apt-get install -y chromium")
			if got := r.fatal != ""; got != tc.wantFail {
				t.Errorf("failed = %v, want %v (%q)", got, tc.wantFail, r.fatal)
			}
			if got := r.skip != ""; got != tc.wantSkip {
				t.Errorf("skipped = %v, want %v (%q)", got, tc.wantSkip, r.skip)
			}
			for _, msg := range []string{r.fatal, r.skip} {
				if msg != "" && !strings.Contains(msg, "testskip: missing chromium: apt-get install -y chromium") {
					t.Errorf("message %q does not name what is missing and how to get it", msg)
				}
			}
			if tc.wantFail && !strings.Contains(r.fatal, "CREDBROKER_ALLOW_SKIP=1") {
				t.Errorf("failure %q does not say how to allow the skip", r.fatal)
			}
		})
	}
}

// TestNoOtherSkips keeps the policy whole: outside this package no Go file
// in the repository skips a test by itself or reads testing.Short.
func TestNoOtherSkips(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	forbidden := regexp.MustCompile(`\.(Skip|Skipf|SkipNow)\(|testing\.Short\(\)`)
	self := filepath.Join(root, "internal", "testskip")
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case path == self, name == "node_modules", name == "testdata", strings.HasPrefix(name, ".") && path != root:
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for i, line := range strings.Split(string(b), "\n") {
			if forbidden.MatchString(line) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d skips outside internal/testskip: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d Go files checked under %s", checked, root)
	}
}

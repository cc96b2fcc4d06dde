package web

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// The pages are served with a CSP that forbids inline script and style:
// the templates must not need either.
func TestTemplatesHaveNoInlineScriptOrStyle(t *testing.T) {
	inline := regexp.MustCompile(`(?i)<script|<style|\sstyle=|\son[a-z]+=|javascript:`)
	names, err := fs.Glob(Templates, "*.html")
	if err != nil || len(names) < 7 {
		t.Fatalf("templates = %v, %v", names, err)
	}
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			b, err := fs.ReadFile(Templates, n)
			if err != nil {
				t.Fatal(err)
			}
			if m := inline.FindString(string(b)); m != "" {
				t.Errorf("%s contains inline %q", n, m)
			}
			if n != "layout.html" && !strings.Contains(string(b), `{{define "content"}}`) {
				t.Errorf("%s does not define the content block", n)
			}
		})
	}
	if _, err := fs.Stat(Static, "style.css"); err != nil {
		t.Errorf("static/style.css: %v", err)
	}
}

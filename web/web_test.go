package web

import (
	"html/template"
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
			switch {
			case n == "layout.html":
			case n == "partials.html":
				// Blocks pages share; the page's own blocks are its own.
				if strings.Contains(string(b), `{{define "content"}}`) || strings.Contains(string(b), `{{define "title"}}`) {
					t.Errorf("%s defines a page's own block", n)
				}
			case !strings.Contains(string(b), `{{define "content"}}`):
				t.Errorf("%s does not define the content block", n)
			}
		})
	}
	if _, err := fs.Stat(Static, "style.css"); err != nil {
		t.Errorf("static/style.css: %v", err)
	}
}

// TestFormStepPartials: a new form kind's page is its own words around
// partials.html's blocks, parsed as the kit parses a page (with
// layout.html and partials.html): the refusal, who asked and who is
// signed in, the instructions and the form with its CSRF token, each
// field and approve and deny, all escaped.
func TestFormStepPartials(t *testing.T) {
	toy, err := template.New("toy").ParseFS(Templates, "layout.html", "partials.html")
	if err != nil {
		t.Fatal(err)
	}
	toy, err = toy.Parse(`{{define "title"}}Connect {{.Provider}}{{end}}
{{define "content"}}<h1>Connect {{.Provider}} with a toy token</h1>
{{template "formstep.error" .}}{{template "formstep.facts" .}}
<h2>Where to get the token</h2>
{{template "formstep.instructions" .}}
{{template "formstep.form" .}}{{end}}`)
	if err != nil {
		t.Fatal(err)
	}
	type field struct {
		Name, Label string
		Secret      bool
		MaxLength   int
	}
	data := map[string]any{"Chrome": Chrome{Identity: "alice@example.com", CSRF: "csrf-token-1"}, "Provider": "Toy",
		"Error": "The token <b> was refused.", "Replace": false, "Server": "", "ServerUnnamed": false, "Unnamed": false,
		"ClientName": "Host <i>", "Identity": "alice@example.com", "Instructions": "Make a token.",
		"InstructionsURL": "https://toy.example/tokens", "Action": "/connect/g1/key",
		"Fields": []field{{"token", "Toy token", true, 100}, {"team", "Team", false, 40}}}
	var b strings.Builder
	if err := toy.ExecuteTemplate(&b, "layout", data); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{
		`<title>Connect Toy · credbroker</title>`,
		`<p class="detail" role="alert" id="key-error">The token &lt;b&gt; was refused.</p>`,
		`<dt>Requested by</dt>`, `<span class="client">Host &lt;i&gt;</span>`, `<dd>alice@example.com</dd>`,
		`<p class="instructions">Make a token.</p>`, `href="https://toy.example/tokens"`,
		`<form method="post" action="/connect/g1/key"`, `<input type="hidden" name="csrf" value="csrf-token-1">`,
		`<input type="password" name="field.token" autocomplete="off" maxlength="100"`,
		`<input type="text" name="field.team" autocomplete="off" maxlength="40"`,
		`<button type="submit" name="decision" value="approve" class="primary">Connect</button>`,
		`<button type="submit" name="decision" value="deny" class="secondary" formnovalidate>Deny</button>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the toy page lacks %s:\n%s", want, page)
		}
	}
}

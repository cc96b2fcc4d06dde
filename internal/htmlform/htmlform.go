// Package htmlform reads POST forms out of HTML pages the way a browser
// submits them, for tests that drive credbroker's pages (and the IdP's and
// providers') with a plain HTTP client instead of a browser. It understands
// the simple, script-free markup those pages use; it is not an HTML parser.
package htmlform

import (
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
)

var (
	formRE   = regexp.MustCompile(`(?is)<form\b([^>]*)>(.*?)</form>`)
	actionRE = regexp.MustCompile(`(?i)\baction="([^"]*)"`)
	methodRE = regexp.MustCompile(`(?i)\bmethod="([^"]*)"`)
	inputRE  = regexp.MustCompile(`(?i)<input\b[^>]*>`)
	attrRE   = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// Find locates the first POST form in body whose action contains
// actionPart and returns the absolute URL it posts to (resolved against
// page) and the values a browser would send: its hidden inputs, overridden
// and extended by extra.
func Find(page *url.URL, body, actionPart string, extra url.Values) (*url.URL, url.Values, error) {
	for _, m := range formRE.FindAllStringSubmatch(body, -1) {
		attrs, inner := m[1], m[2]
		if mm := methodRE.FindStringSubmatch(attrs); mm == nil || !strings.EqualFold(mm[1], "post") {
			continue
		}
		am := actionRE.FindStringSubmatch(attrs)
		if am == nil {
			continue
		}
		action := html.UnescapeString(am[1])
		if !strings.Contains(action, actionPart) {
			continue
		}
		vals := url.Values{}
		for _, in := range inputRE.FindAllString(inner, -1) {
			a := map[string]string{}
			for _, kv := range attrRE.FindAllStringSubmatch(in, -1) {
				a[strings.ToLower(kv[1])] = html.UnescapeString(kv[2])
			}
			if strings.EqualFold(a["type"], "hidden") && a["name"] != "" {
				vals.Set(a["name"], a["value"])
			}
		}
		for k, v := range extra {
			vals[k] = v
		}
		target, err := page.Parse(action)
		if err != nil {
			return nil, nil, fmt.Errorf("htmlform: form action %q: %w", action, err)
		}
		return target, vals, nil
	}
	return nil, nil, fmt.Errorf("htmlform: no POST form with an action containing %q", actionPart)
}

package provider

import "testing"

// TestRegistryAt: a place in the catalogue named as its problems name
// them: the key's line in block and flow style, the deepest key there is
// when the path goes further, the file alone for an entry it lacks.
func TestRegistryAt(t *testing.T) {
	doc := `providers:
  linear:
    type: mcp
    mcp:
      url: https://mcp.linear.app/mcp
      registration: cimd
  wiki:
    type: mcp
    mcp: {url: https://wiki.example.com/mcp,
      registration: dcr}
`
	reg, err := ParseProviders("p.yaml", []byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		path []string
		want string
	}{
		{"linear", []string{"mcp", "registration"}, "p.yaml:6"},
		{"linear", []string{"mcp", "client_id"}, "p.yaml:4"},
		{"linear", nil, "p.yaml:2"},
		{"wiki", []string{"mcp", "registration"}, "p.yaml:10"},
		{"notion", []string{"mcp"}, "p.yaml"},
	} {
		if got := reg.At(c.name, c.path...); got != c.want {
			t.Errorf("At(%s, %v) = %s, want %s", c.name, c.path, got, c.want)
		}
	}
}

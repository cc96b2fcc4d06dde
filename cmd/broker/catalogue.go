package main

import (
	"fmt"
	"os"

	"go.yaml.in/yaml/v3"

	"credbroker/provider"
)

// catalogue is the provider catalogue as loaded, with its file's name and
// text: a problem found only where the catalogue meets the flags (an
// entry's registration the flags make impossible) is reported at its
// line, like the catalogue's own problems.
type catalogue struct {
	reg  *provider.Registry
	file string // as ParseProviders names it in its problems
	data []byte
}

// loadCatalogue is provider.LoadProviders keeping the file's text.
func loadCatalogue(path string, getenv func(string) string) (catalogue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return catalogue{}, fmt.Errorf("providers: %w", err)
	}
	return parseCatalogue(path, data, getenv)
}

// parseCatalogue is provider.ParseProviders keeping the text; name is
// used in messages.
func parseCatalogue(name string, data []byte, getenv func(string) string) (catalogue, error) {
	reg, err := provider.ParseProviders(name, data, getenv)
	if err != nil {
		return catalogue{}, err
	}
	return catalogue{reg: reg, file: name, data: data}, nil
}

// at is "file:line" of the key at path (mapping keys, e.g. "mcp",
// "registration") in entry's mapping, or of its deepest ancestor there
// (the entry's name at least); the file alone when the text has no such
// entry.
func (c catalogue) at(entry string, path ...string) string {
	var root yaml.Node
	if yaml.Unmarshal(c.data, &root) != nil {
		return c.file
	}
	n := &root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for i, key := range append([]string{"providers", entry}, path...) {
		k, v := mappingEntry(n, key)
		if k == nil {
			break
		}
		if i > 0 { // the line of "providers:" names no entry
			line = k.Line
		}
		n = v
	}
	if line == 0 {
		return c.file
	}
	return fmt.Sprintf("%s:%d", c.file, line)
}

// mappingEntry returns the key and value nodes of key in mapping node m,
// nil when m is no mapping or lacks it.
func mappingEntry(m *yaml.Node, key string) (k, v *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

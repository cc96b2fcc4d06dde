package egress_test

import (
	"errors"
	"fmt"

	"credbroker/internal/egress"
)

// A client for one upstream: https to its host only, no redirects (its
// requests carry a token), special-use addresses refused.
func ExampleNew() {
	c, err := egress.New(egress.Options{AllowedHosts: []string{"mcp.example.com"}})
	if err != nil {
		panic(err)
	}
	_, err = c.Get("https://elsewhere.example.com/mcp")
	fmt.Println(errors.Is(err, egress.ErrHostNotAllowed))
	_, err = c.Get("http://mcp.example.com/mcp")
	fmt.Println(errors.Is(err, egress.ErrNotHTTPS))

	strict, _ := egress.New(egress.Options{})
	_, err = strict.Get("https://169.254.169.254/latest/meta-data/")
	fmt.Println(err)
	// Output:
	// true
	// true
	// Get "https://169.254.169.254/latest/meta-data/": egress: 169.254.169.254 is link-local (RFC 3927): the address is a loopback, private, link-local or other special-use address
}

package demoprovider_test

import (
	"fmt"
	"net/http"

	"credbroker/internal/demoprovider"
)

// The demo provider is mounted under its base URL's path, as `broker dev` does.
func Example() {
	p, err := demoprovider.New(demoprovider.Options{
		BaseURL:      "http://127.0.0.1:8080/dev/provider",
		ClientID:     "credbroker-dev",
		ClientSecret: "dev-secret",
		RedirectURIs: []string{"http://127.0.0.1:8080/oauth/demo/callback"},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dev/provider/", p.Handler())
	fmt.Println(p.AuthURL())
	fmt.Println(p.TokenURL())
	fmt.Println(p.APIBase() + "/user")
	// Output:
	// http://127.0.0.1:8080/dev/provider/authorize
	// http://127.0.0.1:8080/dev/provider/token
	// http://127.0.0.1:8080/dev/provider/api/user
}

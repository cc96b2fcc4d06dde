package demomcp_test

import (
	"fmt"
	"net/http"

	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
)

// `broker dev` mounts the demo provider and the demo MCP server beside the
// broker's own routes (here the broker's metadata paths), on one listener.
func Example() {
	const base = "http://127.0.0.1:8080"
	mux := http.NewServeMux()
	for _, p := range []string{"GET /.well-known/oauth-protected-resource", "GET /.well-known/oauth-protected-resource/mcp",
		"GET /.well-known/oauth-authorization-server", "POST /mcp"} {
		mux.HandleFunc(p, http.NotFound)
	}
	as, err := demoprovider.New(demoprovider.Options{
		BaseURL: base + "/dev/provider", ClientID: "credbroker-demo", ClientSecret: "dev-secret",
		RedirectURIs: []string{base + "/oauth/demo/callback"},
		Resources:    []string{base + "/dev/mcp-upstream"},
	})
	if err != nil {
		panic(err)
	}
	as.Mount(mux)
	srv, err := demomcp.New(demomcp.Options{URL: base + "/dev/mcp-upstream", AuthServer: as})
	if err != nil {
		panic(err)
	}
	srv.Mount(mux)
	fmt.Println(srv.URL())
	fmt.Println(srv.MetadataURL())
	fmt.Println(as.MetadataURL())
	fmt.Println(as.RegisterURL())
	// Output:
	// http://127.0.0.1:8080/dev/mcp-upstream
	// http://127.0.0.1:8080/.well-known/oauth-protected-resource/dev/mcp-upstream
	// http://127.0.0.1:8080/.well-known/oauth-authorization-server/dev/provider
	// http://127.0.0.1:8080/dev/provider/register
}

package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/sidecar/client"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	flag.Parse()
	sc, err := client.New(os.Getenv("BROKER_SIDECAR_URL"), os.Getenv("BROKER_SIDECAR_SECRET"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demorepos:", err)
		os.Exit(2)
	}
	srv := NewServer(sc)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	log.Printf("demorepos: MCP endpoint on http://%s/mcp", *addr)
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	log.Fatal(http.ListenAndServe(*addr, mux))
}

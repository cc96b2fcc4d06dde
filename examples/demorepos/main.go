package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/sidecar/client"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address of this MCP server")
	sidecarURL := flag.String("sidecar-url", envOr("BROKER_SIDECAR_URL", "http://127.0.0.1:8081"), "the broker's sidecar API (env BROKER_SIDECAR_URL), or unix:///path/to.sock")
	secretFile := flag.String("secret-file", os.Getenv("BROKER_SIDECAR_SECRET_FILE"), "file holding the sidecar secret (or env BROKER_SIDECAR_SECRET)")
	flag.Parse()
	secret, err := readSecret(*secretFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demorepos:", err)
		os.Exit(2)
	}
	sc, err := client.New(*sidecarURL, secret, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demorepos:", err)
		os.Exit(2)
	}
	srv := NewServer(sc)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("demorepos: %v", err)
	}
	log.Printf("demorepos: MCP endpoint on http://%s/mcp (broker sidecar %s)", ln.Addr(), *sidecarURL)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(hs.Serve(ln))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// readSecret takes the sidecar secret from file, or else from the
// environment: never from a flag, which other users see in ps.
func readSecret(file string) (string, error) {
	if file == "" {
		if s := os.Getenv("BROKER_SIDECAR_SECRET"); s != "" {
			return s, nil
		}
		return "", errors.New("no sidecar secret: pass -secret-file (broker dev writes data/sidecar.secret) or set BROKER_SIDECAR_SECRET")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("sidecar secret: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("sidecar secret: %s is empty", file)
	}
	return s, nil
}

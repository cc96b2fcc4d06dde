package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"credbroker/apps"
	"credbroker/authserver"
	"credbroker/connections"
	"credbroker/mcpapi"
	"credbroker/provider"
	"credbroker/vault/pgstore"
)

// revocationBound is the target of the revocation row: apps.Bound, the
// bound docs/SECURITY.md's invariant 12 promises.
const revocationBound = apps.Bound

// replicaB is a second broker process's default path on the same
// PostgreSQL database as st's (replica A), in this process: its own pool,
// its own feeds (the apps core's liveness cache and the connections
// listing follow them as serve's do) and its own MCP endpoint, with the
// same key ring, issuer and resource, as replicas behind one load
// balancer are. It returns the endpoint's URL.
func (st *stack) replicaB(ctx context.Context) (string, error) {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	store, err := pgstore.Open(octx, st.dbURL, st.keys, pgstore.Options{})
	cancel()
	if err != nil {
		return "", err
	}
	st.closers = append(st.closers, func() { store.Close() })
	client := &http.Client{Timeout: 10 * time.Second}
	pc, err := provider.New(provider.Options{Store: store, Providers: st.reg, HTTPClient: client, Logger: st.log, BrokerURL: st.base})
	if err != nil {
		return "", err
	}
	conns, err := connections.New(connections.Options{Store: store, Client: pc, PublicURL: st.base, Logger: st.log, Watch: store.AppWatch()})
	if err != nil {
		return "", err
	}
	appSvc, err := apps.New(apps.Options{Store: store.Auth(), Watch: store.AppWatch(), Logger: st.log})
	if err != nil {
		return "", err
	}
	fctx, stop := context.WithCancel(ctx)
	st.closers = append(st.closers, stop)
	go appSvc.Follow(fctx)
	go conns.Follow(fctx)
	as, err := authserver.New(authserver.Options{PublicURL: st.base, Resource: st.base + "/mcp", IdPIssuer: st.idpIss,
		Store: store.Auth(), Keys: st.keys, Apps: appSvc, Logger: st.log,
		// B serves no pages here: only its MCP endpoint is called.
		Person:      func(*http.Request) (authserver.Person, bool) { return authserver.Person{}, false },
		StartSignIn: func(w http.ResponseWriter, r *http.Request, _ string) { http.NotFound(w, r) },
	})
	if err != nil {
		return "", err
	}
	srv, err := mcpapi.New(mcpapi.Options{PublicURL: st.base, ResourceURI: st.base + "/mcp", Issuer: st.idpIss, Connections: conns,
		StateKeys: st.keys.Derive("requestState"), Logger: st.log, HTTPClient: client,
		Verifier: as.Verifier(), VerifierFor: as.VerifierFor, AuthorizationServers: []string{as.Issuer()}})
	if err != nil {
		return "", err
	}
	ln, u, err := listen()
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	srv.Register(mux)
	serve(st, ln, mux)
	return u + "/mcp", nil
}

// revocation measures invariant 12 across two replicas: for each of n
// people (their own app: a host client registered for this run), the
// person's token is accepted by replica B (which reads the token family
// once and answers from its liveness cache after), the app is removed on
// replica A as the connections page's Remove does (apps.Service.Remove:
// the store's delete, A's cache, the audit event), and B is called with
// the token, back to back, from the removal's acknowledgement until it
// refuses it (401). The figure is the time from the acknowledgement to
// that first refusal: p50, p99 and the slowest, against apps.Bound.
func (st *stack) revocation(cfg config) error {
	ctx := context.Background()
	bURL, err := st.replicaB(ctx)
	if err != nil {
		return fmt.Errorf("replica B: %w", err)
	}
	h, err := registerHost(st.base)
	if err != nil {
		return err
	}
	names := make([]string, cfg.revocations)
	for i := range names {
		names[i] = mrtrName(i)
	}
	t0 := time.Now()
	toks, err := h.tokens(names, st.base+"/mcp", 4)
	if err != nil {
		return err
	}
	fmt.Printf("\n## Revocation across two replicas (%s): an app removed on replica A, its token refused on replica B\n\n"+
		"Replica B: a second broker's default path on the same database (its own pool, feeds and MCP endpoint), in this process. "+
		"%d people allowed a host (tokens through the host flow in %s); for each, the token is accepted on B three times, "+
		"the app is removed on A (apps.Service.Remove, what the connections page's Remove does) and B is called with the token back to back "+
		"from A's acknowledgement until it answers 401.\n\n",
		storeTitle(st.kind), len(names), time.Since(t0).Round(10*time.Millisecond))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	call := func(tok string) (int, error) {
		req := st.newRequest(bURL, []string{"Bearer " + tok}, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`))
		req.Header.Set("Mcp-Method", "tools/list")
		req.Header.Del("Mcp-Name")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	took := make([]time.Duration, 0, len(names))
	calls := 0
	for _, name := range names {
		tok := toks[name]
		for range 3 {
			if code, err := call(tok); err != nil || code != http.StatusOK {
				return fmt.Errorf("%s's token on B before the removal: HTTP %d (%v)", name, code, err)
			}
		}
		info, err := st.verify(ctx, tok)
		if err != nil {
			return fmt.Errorf("%s's token on A: %w", name, err)
		}
		appID, _, _ := strings.Cut(info.Session, ".")
		if err := st.apps.Remove(ctx, info.Principal, appID, apps.Actor{Via: "browser"}); err != nil {
			return fmt.Errorf("remove %s's app on A: %w", name, err)
		}
		ack := time.Now()
		for {
			code, err := call(tok)
			calls++
			since := time.Since(ack)
			if err != nil {
				return err
			}
			if code == http.StatusUnauthorized {
				took = append(took, since)
				break
			}
			if code != http.StatusOK {
				return fmt.Errorf("%s's token on B after the removal: HTTP %d", name, code)
			}
			if since > 10*revocationBound {
				return fmt.Errorf("%s's token still accepted on B %v after the removal on A", name, since)
			}
		}
	}
	slices.Sort(took)
	n := len(took)
	// p99 by nearest rank: of 100 removals the 99th, below the slowest.
	p50, p99, slowest := took[n/2], took[(n*99+99)/100-1], took[n-1]
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Printf("| removals | p50 ms | p99 ms | slowest ms | calls to B after the removals | bound |\n|---|---|---|---|---|---|\n"+
		"| %d | %.3f | %.3f | %.3f | %d | %v |\n", n, ms(p50), ms(p99), ms(slowest), calls, revocationBound)
	st.sum.add(fmt.Sprintf("%s, revocation across two replicas, %d app removals: p99 ms from A's acknowledgement to B's first refusal", storeTitle(st.kind), n),
		fmt.Sprintf("%.3f (p50 %.3f, slowest %.3f)", ms(p99), ms(p50), ms(slowest)),
		fmt.Sprintf("≤ %.0f (apps.Bound)", ms(revocationBound)), p99 <= revocationBound)
	return nil
}

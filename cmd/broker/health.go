package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"credbroker/internal/buildinfo"
	"credbroker/internal/telemetry"
	"credbroker/vault"
	"credbroker/web"
)

// readiness answers /readyz: the store is open and usable, the keys are
// loaded and the IdP's discovery document is reachable. The result is
// cached for ttl so a busy load balancer does not turn into load on the
// IdP. The store is not ready while a read fails, nor within ttl of a
// request refused because it was unavailable (lastRefusal: a full disk
// refuses writes while reads go on).
type readiness struct {
	store       vault.Store
	keys        *vault.Keyring
	issuer      string
	client      *http.Client
	lastRefusal func() time.Time
	ttl         time.Duration
	now         func() time.Time

	mu      sync.Mutex // guards the fields below; held while checking
	checked time.Time
	last    readyReport
}

// readyReport is the /readyz body. Check values are "ok" or a short reason
// (no secrets: store errors name the file, IdP errors the status).
type readyReport struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"`
}

const (
	readyCacheTTL     = 5 * time.Second
	readyCheckTimeout = 3 * time.Second
)

func newReadiness(store vault.Store, keys *vault.Keyring, issuer string, client *http.Client, rec *telemetry.Recorder) *readiness {
	return &readiness{store: store, keys: keys, issuer: strings.TrimSuffix(issuer, "/"), client: client,
		lastRefusal: rec.LastStoreUnavailable, ttl: readyCacheTTL, now: time.Now}
}

// report returns the cached report, re-checking when it is older than ttl.
func (rd *readiness) report(ctx context.Context) readyReport {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	// A refusal since the last check is news: check again now.
	if !rd.checked.IsZero() && rd.now().Sub(rd.checked) < rd.ttl && !rd.lastRefusal().After(rd.checked) {
		return rd.last
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyCheckTimeout)
	defer cancel()
	rep := readyReport{Ready: true, Checks: map[string]string{}}
	set := func(name string, err error) {
		if err != nil {
			rep.Ready = false
			rep.Checks[name] = err.Error()
			return
		}
		rep.Checks[name] = "ok"
	}
	set("store", rd.checkStore(ctx))
	set("keys", rd.checkKeys())
	set("idp", rd.checkIdP(ctx))
	rd.checked, rd.last = rd.now(), rep
	return rep
}

func (rd *readiness) checkStore(ctx context.Context) error {
	if rd.store == nil {
		return errors.New("no store")
	}
	if _, err := rd.store.ConnectionIDs(ctx, "", 1); err != nil {
		switch {
		case errors.Is(err, vault.ErrClosed):
			return errors.New("store is closed")
		case errors.Is(err, vault.ErrUnavailable):
			return errors.New("store unavailable (database down or unreachable; see the log)")
		}
		return errors.New("store read failed")
	}
	if at := rd.lastRefusal(); !at.IsZero() && rd.now().Sub(at) < rd.ttl {
		return errors.New("store unavailable: requests were refused for want of it in the last seconds (see the log)")
	}
	return nil
}

func (rd *readiness) checkKeys() error {
	if rd.keys == nil || rd.keys.Primary() == "" {
		return errors.New("no encryption keys loaded")
	}
	return nil
}

func (rd *readiness) checkIdP(ctx context.Context) error {
	u := rd.issuer + "/.well-known/openid-configuration"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("bad issuer URL")
	}
	resp, err := rd.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("IdP discovery at %s timed out", u)
		}
		return fmt.Errorf("IdP discovery at %s unreachable", u)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("IdP discovery at %s answered HTTP %d", u, resp.StatusCode)
	}
	return nil
}

// healthReport is the /healthz body: the process answers, and which build
// it is.
type healthReport struct {
	Status string `json:"status"`
	buildinfo.Info
}

// registerHealth mounts /healthz (the process answers, with its version,
// commit and build date) and /readyz.
func registerHealth(mux *web.Routes, rd *readiness) {
	health, _ := json.Marshal(healthReport{Status: "ok", Info: buildinfo.Get()})
	health = append(health, '\n')
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(health)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rep := rd.report(r.Context())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		status := http.StatusOK
		if !rep.Ready {
			status = http.StatusServiceUnavailable
		}
		b, _ := json.Marshal(rep)
		w.WriteHeader(status)
		w.Write(append(b, '\n'))
	})
}

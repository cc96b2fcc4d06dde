package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"credbroker/vault"
	"credbroker/vault/boltstore"
)

// The vault fixture: n connections, four per principal, the shape of
// vault/boltstore's 1M benchmarks (same ids and key), built with large
// unsynced imports, then measured by a fresh child process so its RSS is
// the broker's, not the builder's.

func vaultKeyring() *vault.Keyring {
	kr, err := vault.NewKeyring([]string{"bench"}, [][]byte{bytes.Repeat([]byte{0x42}, 32)})
	if err != nil {
		panic(err)
	}
	return kr
}

func vaultID(i int) string { return fmt.Sprintf("c%07d", i) }

func vaultConn(i int) vault.Connection {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	id := vaultID(i)
	return vault.Connection{
		ID: id, Principal: vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("u%07d", i/4)},
		Provider: "github", AccountID: strconv.Itoa(i), AccountLogin: strconv.Itoa(i) + "@example.com",
		Scopes: []string{"repo", "read:user"}, Status: vault.StatusActive, Created: base, Updated: base,
		Token: vault.TokenSet{AccessToken: vault.Secret("at-" + id + "-secret"), RefreshToken: vault.Secret("rt-" + id + "-secret"),
			TokenType: "Bearer", Expiry: base.Add(time.Hour)},
	}
}

func vaultRun(dir string, n int) error {
	path := filepath.Join(dir, "vault.db")
	start := time.Now()
	s, err := boltstore.Open(path, vaultKeyring(), boltstore.Options{NoSync: true})
	if err != nil {
		return err
	}
	const chunk = 50_000
	batch := make([]vault.Connection, 0, chunk)
	for i := range n {
		batch = append(batch, vaultConn(i))
		if len(batch) == chunk || i == n-1 {
			if err := s.Import(context.Background(), batch); err != nil {
				s.Close()
				return err
			}
			batch = batch[:0]
		}
	}
	if err := s.DB().Sync(); err != nil {
		s.Close()
		return err
	}
	if err := s.Close(); err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	fmt.Printf("\n## Vault: %d connections (bolt, %d MB file, built in %s)\n\n", n, fi.Size()>>20, time.Since(start).Round(time.Second))
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "vault-measure", path, strconv.Itoa(n))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// vaultMeasure runs in a fresh process: open, random Gets, RSS.
func vaultMeasure(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: bench vault-measure PATH N")
	}
	n, err := strconv.Atoi(args[1])
	if err != nil || n < 1 {
		return fmt.Errorf("bad N %q", args[1])
	}
	rssBefore := rss()
	t0 := time.Now()
	s, err := boltstore.Open(args[0], vaultKeyring(), boltstore.Options{})
	if err != nil {
		return err
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.GetConnection(ctx, vaultID(0)); err != nil {
		return err
	}
	open := time.Since(t0)
	rssOpen := rss()
	rng := rand.New(rand.NewPCG(1, 2))
	const gets = 100_000
	lat := make([]time.Duration, 0, gets)
	for range gets {
		id := vaultID(rng.IntN(n))
		t := time.Now()
		c, err := s.GetConnection(ctx, id)
		lat = append(lat, time.Since(t))
		if err != nil || c.Token.AccessToken.Reveal() == "" {
			return fmt.Errorf("get %s: %v", id, err)
		}
	}
	slices.Sort(lat)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("open (first Get included): %s; Get over %d random ids: p50 %.1f µs, p99 %.1f µs\n",
		open.Round(time.Microsecond), gets, float64(lat[gets/2].Nanoseconds())/1000, float64(lat[gets*99/100].Nanoseconds())/1000)
	fmt.Printf("RSS: %d MB before open, %d MB after open, %d MB after the Gets (peak %d MB); Go heap in use %d MB (the rest is the mmapped file's pages)\n",
		rssBefore>>20, rssOpen>>20, rss()>>20, hwm()>>20, ms.HeapInuse>>20)
	return nil
}

// rss and hwm read VmRSS and VmHWM (bytes) from /proc/self/status.
func rss() int64 { return procStatus("VmRSS:") }
func hwm() int64 { return procStatus("VmHWM:") }

func procStatus(key string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

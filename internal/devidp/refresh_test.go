package devidp_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
)

// TestRefreshTokens: a sign-in asking for offline_access gets a refresh
// token (none without it); spending it gives a fresh ID token of the same
// person for the same client and a new refresh token (the spent one is
// refused after); another client cannot spend it; RevokeRefreshTokens
// ends the person's refresh tokens (invalid_grant) and no one else's.
func TestRefreshTokens(t *testing.T) {
	idp := devidptest.Start(t, nil, []devidp.Client{
		{ID: "broker", Secret: "broker-secret", RedirectURIs: []string{rpCallback}},
		{ID: "other", Secret: "other-secret", RedirectURIs: []string{rpCallback}},
	})
	r := newRP(t, idp, "broker", "broker-secret")
	if _, tok := r.login(t, browser(t), "alice", "alice"); tok.RefreshToken != "" {
		t.Fatal("a refresh token without offline_access")
	}
	r.config.Scopes = append(r.config.Scopes, oidc.ScopeOfflineAccess)
	first, tok := r.login(t, browser(t), "alice", "alice")
	if tok.RefreshToken == "" {
		t.Fatal("no refresh token with offline_access")
	}
	_, bobTok := r.login(t, browser(t), "bob", "bob")

	refresh := func(conf oauth2.Config, rt string) (*oauth2.Token, error) {
		return conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: rt}).Token()
	}
	fresh, err := refresh(r.config, tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := fresh.Extra("id_token").(string)
	idt, err := r.verifier.Verify(context.Background(), raw)
	if err != nil {
		t.Fatalf("the refreshed ID token: %v", err)
	}
	if idt.Subject != first.Subject || !slices.Equal(idt.Audience, []string{"broker"}) {
		t.Errorf("refreshed ID token for %s %v, want %s [broker]", idt.Subject, idt.Audience, first.Subject)
	}
	if fresh.RefreshToken == "" || fresh.RefreshToken == tok.RefreshToken {
		t.Error("the refresh token was not rotated")
	}
	invalidGrant := func(err error) bool {
		var re *oauth2.RetrieveError
		return errors.As(err, &re) && re.ErrorCode == "invalid_grant"
	}
	if _, err := refresh(r.config, tok.RefreshToken); !invalidGrant(err) {
		t.Errorf("the spent refresh token again: %v, want invalid_grant", err)
	}
	other := newRP(t, idp, "other", "other-secret").config
	if _, err := refresh(other, fresh.RefreshToken); err == nil {
		t.Error("another client spent the broker's refresh token")
	}
	if n := idp.RevokeRefreshTokens("alice"); n != 1 {
		t.Errorf("RevokeRefreshTokens(alice) ended %d tokens, want 1", n)
	}
	if _, err := refresh(r.config, fresh.RefreshToken); !invalidGrant(err) {
		t.Errorf("after RevokeRefreshTokens: %v, want invalid_grant", err)
	}
	if _, err := refresh(r.config, bobTok.RefreshToken); err != nil {
		t.Errorf("bob's refresh token after alice's were revoked: %v", err)
	}
	issued := idp.IssuedRefreshTokens()
	for _, rt := range []string{tok.RefreshToken, fresh.RefreshToken, bobTok.RefreshToken} {
		if !slices.Contains(issued, rt) {
			t.Errorf("IssuedRefreshTokens misses one")
		}
	}
}

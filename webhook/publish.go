package webhook

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"time"

	"credbroker/vault"
)

// Publisher turns what happened into deliveries, one per event and
// interested endpoint. It never puts a token in a payload: it is only
// ever given metadata.
type Publisher struct {
	cfg *Config
	now func() time.Time
}

// NewPublisher returns a Publisher for cfg (nil or empty: it publishes
// nothing). A nil now is time.Now.
func NewPublisher(cfg *Config, now func() time.Time) *Publisher {
	if now == nil {
		now = time.Now
	}
	return &Publisher{cfg: cfg, now: now}
}

// ConnectionData is the data of connection.* events: ids, the provider,
// the account and the person, never a token.
type ConnectionData struct {
	ConnectionID string    `json:"connection_id"`
	Provider     string    `json:"provider"`
	AccountID    string    `json:"account_id"`
	AccountLogin string    `json:"account_login,omitempty"`
	Status       string    `json:"status,omitempty"`
	Principal    Principal `json:"principal"`
}

// Principal is a person as the IdP names them.
type Principal struct {
	Issuer  string `json:"iss"`
	Subject string `json:"sub"`
}

// ConnectionEvent returns the data of an event about c (metadata only).
func ConnectionEvent(c vault.Connection) ConnectionData {
	return ConnectionData{ConnectionID: c.ID, Provider: c.Provider, AccountID: c.AccountID, AccountLogin: c.AccountLogin,
		Status: string(c.Status), Principal: Principal{Issuer: c.Principal.Issuer, Subject: c.Principal.Subject}}
}

// AppData is the data of app.* events: which app (an OAuth client of the
// broker's authorization server) and whose, never a token.
type AppData struct {
	ClientID   string    `json:"client_id"`
	ClientName string    `json:"client_name,omitempty"`
	Principal  Principal `json:"principal"`
}

// AppEvent returns the data of an event about the app clientID of p.
func AppEvent(p vault.Principal, clientID, clientName string) AppData {
	return AppData{ClientID: clientID, ClientName: clientName, Principal: Principal{Issuer: p.Issuer, Subject: p.Subject}}
}

// payload is the Standard Webhooks body: type, timestamp of the event,
// data.
type payload struct {
	Type      string `json:"type"`
	Timestamp string `json:"timestamp"`
	Data      any    `json:"data"`
}

// Deliveries returns the deliveries of one event of type typ with data,
// one for each endpoint that wants it (none when none does).
func (p *Publisher) Deliveries(typ string, data any) ([]vault.Delivery, error) {
	if p == nil || p.cfg.Empty() {
		return nil, nil
	}
	now := p.now().UTC()
	var ds []vault.Delivery
	var body []byte
	id := ""
	for _, e := range p.cfg.Endpoints {
		if !e.Wants(typ) {
			continue
		}
		if body == nil {
			var err error
			if body, err = json.Marshal(payload{Type: typ, Timestamp: now.Format(time.RFC3339Nano), Data: data}); err != nil {
				return nil, err
			}
			id = NewMessageID()
		}
		ds = append(ds, vault.Delivery{ID: id, Endpoint: e.Name, Type: typ, Created: now, Due: now, Payload: body})
	}
	return ds, nil
}

// Changes is the vault.ChangeHook[vault.Connection] that turns changes of
// connections into events: a new connection is connection.created, a deleted one
// connection.deleted, one marked needs_reconnect
// connection.needs_reconnect and one active again after that
// connection.reconnected. Other changes (a refresh, a recorded use) are
// no event. Apart from drawing fresh event ids it has no side effect.
func (p *Publisher) Changes(before, after *vault.Connection) []vault.Delivery {
	var typ string
	var c *vault.Connection
	switch {
	case before == nil && after != nil:
		typ, c = ConnectionCreated, after
	case after == nil && before != nil:
		typ, c = ConnectionDeleted, before
	case before == nil || after == nil:
		return nil
	case before.Status != vault.StatusNeedsReconnect && after.Status == vault.StatusNeedsReconnect:
		typ, c = ConnectionNeedsReconnect, after
	case before.Status == vault.StatusNeedsReconnect && after.Status != vault.StatusNeedsReconnect:
		typ, c = ConnectionReconnected, after
	default:
		return nil
	}
	return p.changeDeliveries(typ, ConnectionEvent(*c))
}

// changeDeliveries are a change's deliveries of an event whose data
// always marshals (ConnectionData, AppData).
func (p *Publisher) changeDeliveries(typ string, data any) []vault.Delivery {
	ds, err := p.Deliveries(typ, data)
	if err != nil {
		return nil
	}
	return ds
}

// Hook returns p.Changes as a vault.ChangeHook[vault.Connection], or nil
// when p publishes nothing (so stores skip the work).
func (p *Publisher) Hook() vault.ChangeHook[vault.Connection] {
	if !p.publishes() {
		return nil
	}
	return p.Changes
}

// AppChanges is the vault.ChangeHook[vault.AppAccess] that turns changes of
// app access records (the authorization server's, package apps) into events: a
// record removed is app.removed; a record created holding a consent, or
// whose consent was given again (Updated, "when consent was last given",
// moved on), is app.authorized. A consent is a redirect URI with its
// scopes: a record created without one (the organisation let the app in
// with an ID-JAG; broker dev's built-in host) is no event until the
// person consents. Token families coming and going are no event.
func (p *Publisher) AppChanges(before, after *vault.AppAccess) []vault.Delivery {
	if after == nil && before != nil {
		return p.changeDeliveries(AppRemoved, AppEvent(before.Principal, before.ClientID, before.ClientName))
	}
	if after != nil && after.RedirectURI != "" && (before == nil || after.Updated.After(before.Updated)) {
		return p.changeDeliveries(AppAuthorized, AppEvent(after.Principal, after.ClientID, after.ClientName))
	}
	return nil
}

// AppHook returns p.AppChanges as a vault.ChangeHook[vault.AppAccess], or
// nil when p publishes nothing.
func (p *Publisher) AppHook() vault.ChangeHook[vault.AppAccess] {
	if !p.publishes() {
		return nil
	}
	return p.AppChanges
}

// publishes reports whether any endpoint is configured.
func (p *Publisher) publishes() bool { return p != nil && !p.cfg.Empty() }

// Publish stores an event that no change of a stored record carries
// (connection.refresh_failed) in the outbox of store.
func (p *Publisher) Publish(ctx context.Context, store vault.Store, typ string, data any) error {
	ds, err := p.Deliveries(typ, data)
	if err != nil || len(ds) == 0 {
		return err
	}
	return store.Outbox().EnqueueDeliveries(ctx, ds)
}

// NewMessageID returns a fresh webhook-id: "msg_" and 128 random bits.
func NewMessageID() string {
	var b [16]byte
	rand.Read(b[:])
	return "msg_" + base64.RawURLEncoding.EncodeToString(b[:])
}

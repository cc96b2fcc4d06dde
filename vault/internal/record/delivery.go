package record

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"credbroker/vault"
)

// ChangeDeliveries runs hook on a change of a stored connection record:
// oldRec is nil for a create, newRec nil for a delete. Backends call it
// inside the transaction that writes the change. A nil hook gives nothing.
func ChangeDeliveries(hook vault.ChangeHook[vault.Connection], oldRec, newRec []byte) ([]vault.Delivery, error) {
	if hook == nil {
		return nil, nil
	}
	var before, after *vault.Connection
	if oldRec != nil {
		m, err := ConnectionMeta(oldRec)
		if err != nil {
			return nil, err
		}
		before = &m
	}
	if newRec != nil {
		m, err := ConnectionMeta(newRec)
		if err != nil {
			return nil, err
		}
		after = &m
	}
	ds := hook(before, after)
	if err := CheckDeliveries(ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// AppChangeDeliveries runs hook on a change of an app access record
// (before nil for a create, after nil for a delete) and checks what it
// returns. Backends call it inside the transaction that writes the change,
// so a delivery no outbox can store fails the change. A nil hook gives
// nothing.
func AppChangeDeliveries(hook vault.ChangeHook[vault.AppAccess], before, after *vault.AppAccess) ([]vault.Delivery, error) {
	if hook == nil {
		return nil, nil
	}
	ds := hook(before, after)
	if err := CheckDeliveries(ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// CheckDeliveries is CheckDelivery of each of ds.
func CheckDeliveries(ds []vault.Delivery) error {
	for _, d := range ds {
		if err := CheckDelivery(d); err != nil {
			return err
		}
	}
	return nil
}

// CheckDelivery rejects a delivery no backend can store.
func CheckDelivery(d vault.Delivery) error {
	switch {
	case d.ID == "" || d.Endpoint == "" || d.Type == "":
		return fmt.Errorf("vault: delivery needs an id, an endpoint and a type: %w", vault.ErrMalformed)
	case strings.ContainsRune(d.ID+d.Endpoint+d.Type, 0):
		return fmt.Errorf("vault: delivery %s: NUL in id, endpoint or type: %w", d.ID, vault.ErrMalformed)
	}
	return validUTF8(d.ID, d.Endpoint, d.Type, d.LastError)
}

// deliveryRecord is the stored form of a Delivery.
type deliveryRecord struct {
	V         int       `json:"v"`
	ID        string    `json:"id"`
	Endpoint  string    `json:"endpoint"`
	Type      string    `json:"type"`
	Created   time.Time `json:"created"`
	Payload   []byte    `json:"payload"`
	Attempts  int       `json:"attempts"`
	Due       time.Time `json:"due"`
	LastError string    `json:"last_error,omitempty"`
}

// EncodeDelivery renders d for a backend that stores whole records.
func EncodeDelivery(d vault.Delivery) ([]byte, error) {
	if err := CheckDelivery(d); err != nil {
		return nil, err
	}
	return json.Marshal(deliveryRecord{V: 1, ID: d.ID, Endpoint: d.Endpoint, Type: d.Type, Created: d.Created,
		Payload: d.Payload, Attempts: d.Attempts, Due: d.Due, LastError: d.LastError})
}

// DecodeDelivery parses EncodeDelivery's output.
func DecodeDelivery(b []byte) (vault.Delivery, error) {
	var r deliveryRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return vault.Delivery{}, fmt.Errorf("vault: delivery record: %w (%v)", vault.ErrMalformed, err)
	}
	if r.V != 1 {
		return vault.Delivery{}, fmt.Errorf("vault: delivery record version %d: %w", r.V, vault.ErrMalformed)
	}
	d := vault.Delivery{ID: r.ID, Endpoint: r.Endpoint, Type: r.Type, Created: r.Created, Payload: r.Payload,
		Attempts: r.Attempts, Due: r.Due, LastError: r.LastError}
	if err := CheckDelivery(d); err != nil {
		return vault.Delivery{}, err
	}
	return d, nil
}

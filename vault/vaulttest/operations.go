package vaulttest

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"credbroker/vault"
)

// Operation is one operation of one feature of a store, as EveryOperation
// finds it.
type Operation struct {
	// Feature is the vault.Store accessor that returned the sub-store
	// ("Auth", "Outbox", …), or "Store" for the store's own methods.
	Feature string
	// Method is the method's name ("GetConnection").
	Method string
	// Call calls the method with zero arguments: ctx, zero values,
	// update functions that fail, and notification functions (a
	// watcher's, a struct field's too) that end the call: the first one
	// called cancels the call's context, so an operation that runs until
	// its context ends (WatchApps) returns once it has called back. It
	// releases what the method returns (a lock's unlock) and ignores its
	// error.
	Call func(ctx context.Context)
}

// errNoUpdate is what the update functions Call passes return.
var errNoUpdate = errors.New("vaulttest: no update")

// EveryOperation enumerates, by reflection on vault.Store, every operation
// of every feature of s: the methods of Store but Close and its feature
// accessors, and the methods of each sub-store an accessor returns. A
// feature added to vault.Store is in the list without anyone adding it.
// It fails the test when s lacks a feature (an accessor returns nil):
// enumerate on a store that has them all.
func EveryOperation(t *testing.T, s vault.Store) []Operation {
	t.Helper()
	var ops []Operation
	add := func(feature, method string, fn reflect.Value) {
		ops = append(ops, Operation{Feature: feature, Method: method, Call: func(ctx context.Context) { call(ctx, fn) }})
	}
	st := reflect.TypeFor[vault.Store]()
	sv := reflect.ValueOf(s)
	for i := range st.NumMethod() {
		m := st.Method(i)
		switch {
		case m.Name == "Close":
		case m.Type.NumIn() == 0 && m.Type.NumOut() == 1 && m.Type.Out(0).Kind() == reflect.Interface:
			sub := sv.MethodByName(m.Name).Call(nil)[0]
			if sub.IsNil() {
				t.Fatalf("%T.%s() is nil: enumerate the operations of a store that has every feature", s, m.Name)
			}
			for j := range m.Type.Out(0).NumMethod() {
				name := m.Type.Out(0).Method(j).Name
				add(m.Name, name, sub.MethodByName(name))
			}
		default:
			add("Store", m.Name, sv.MethodByName(m.Name))
		}
	}
	return ops
}

// call calls fn with zero arguments and releases what it returns.
func call(ctx context.Context, fn reflect.Value) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctxType := reflect.TypeFor[context.Context]()
	typ := fn.Type()
	args := make([]reflect.Value, typ.NumIn())
	for i := range args {
		if in := typ.In(i); in == ctxType {
			args[i] = reflect.ValueOf(&ctx).Elem()
		} else {
			args[i] = zeroArg(in, cancel)
		}
	}
	for _, out := range fn.Call(args) {
		if out.Kind() == reflect.Func && !out.IsNil() && out.Type().NumIn() == 0 {
			out.Call(nil)
		}
	}
}

// zeroArg is the zero value of typ, except for functions: one that
// returns values (an update closure) returns zero values and
// errNoUpdate; one that returns nothing (a notification) calls done. A
// struct's function fields get the same.
func zeroArg(typ reflect.Type, done func()) reflect.Value {
	switch typ.Kind() {
	case reflect.Func:
		errType := reflect.TypeFor[error]()
		return reflect.MakeFunc(typ, func([]reflect.Value) []reflect.Value {
			if typ.NumOut() == 0 {
				done()
			}
			outs := make([]reflect.Value, typ.NumOut())
			for j := range outs {
				outs[j] = reflect.Zero(typ.Out(j))
				if typ.Out(j) == errType {
					outs[j] = reflect.ValueOf(&errNoUpdate).Elem()
				}
			}
			return outs
		})
	case reflect.Struct:
		v := reflect.New(typ).Elem()
		for i := range typ.NumField() {
			if f := typ.Field(i); f.IsExported() && f.Type.Kind() == reflect.Func {
				v.Field(i).Set(zeroArg(f.Type, done))
			}
		}
		return v
	}
	return reflect.Zero(typ)
}

// IsOpName reports whether op names method as observers see it: the
// method's name in snake case ("ConnectionIDs": "connection_ids").
func IsOpName(op, method string) bool {
	for w := range strings.SplitSeq(op, "_") {
		if w == "" || strings.ToLower(w) != w {
			return false
		}
	}
	return strings.ReplaceAll(op, "_", "") == strings.ToLower(method)
}

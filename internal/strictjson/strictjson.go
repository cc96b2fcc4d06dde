// Package strictjson decodes one JSON object into a struct, refusing
// fields the struct does not have, with errors a caller can branch on:
// *UnknownFieldError names the field, *json.UnmarshalTypeError a field of
// the wrong type, ErrNotOneObject anything else. encoding/json's own
// unknown-field error is only text.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Errors besides the typed ones.
var (
	// ErrNotOneObject: the input is not a JSON object of the struct's shape.
	ErrNotOneObject = errors.New("strictjson: not one JSON object of the expected shape")
	// ErrTrailing: a JSON value decoded, and more follows it.
	ErrTrailing = errors.New("strictjson: more follows the JSON value")
)

// UnknownFieldError: the object has a member the struct has no field for.
type UnknownFieldError struct {
	// Field is the member's name as the input wrote it (untrusted).
	Field string
}

func (e *UnknownFieldError) Error() string { return fmt.Sprintf("unknown field %q", e.Field) }

// Decode decodes data, one JSON object, into v (a pointer to a struct),
// refusing unknown fields. Errors are *UnknownFieldError (a member of the
// top-level object), *json.UnmarshalTypeError, ErrTrailing or
// ErrNotOneObject.
func Decode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) > 0 {
			return ErrTrailing
		}
		return nil
	}
	var ute *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &ute):
		return ute
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return ErrNotOneObject
	}
	// The input is well-formed and of the right types: what is left is a
	// member the struct does not have.
	if name, ok := unknownField(data, reflect.TypeOf(v)); ok {
		return &UnknownFieldError{Field: name}
	}
	return ErrNotOneObject
}

// unknownField returns the first member of the object data that struct
// type t (through pointers) has no field for, matched as encoding/json
// matches names (exactly, else without regard to case).
func unknownField(data []byte, t reflect.Type) (string, bool) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	names := fieldNames(t)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		key, _ := tok.(string)
		if !known(names, key) {
			return key, true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}

func known(names []string, key string) bool {
	for _, n := range names {
		if n == key || strings.EqualFold(n, key) {
			return true
		}
	}
	return false
}

// fieldNames lists the JSON names of struct type t's fields, those of
// embedded structs included.
func fieldNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-":
		case f.Anonymous && tag == "":
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, fieldNames(ft)...)
			}
		case !f.IsExported():
		case tag != "":
			out = append(out, tag)
		default:
			out = append(out, f.Name)
		}
	}
	return out
}

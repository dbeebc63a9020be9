// Package api holds vmnetctl's declarative types: networks.yaml (lima's
// classic `networks:` map and its newer `vmnet:` section), the VM files that
// `up` and `down` take, their defaults and their validation. It has no side
// effects: it reads bytes and returns values and diagnostics.
package api

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Severity tells an error, which stops a command, from a warning, which does not.
type Severity int

const (
	// SeverityError marks a problem that makes the input unusable.
	SeverityError Severity = iota
	// SeverityWarning marks something ignored or suspicious that still loads.
	SeverityWarning
)

// Diagnostic is one problem found in an input file, located by file, line and
// the dotted path of the field (for example "networks.shared.gateway").
type Diagnostic struct {
	File     string
	Line     int
	Field    string
	Message  string
	Severity Severity
}

// String is FILE:LINE: field: message, with control bytes escaped, so that
// no input can write terminal escapes through an error.
func (d Diagnostic) String() string {
	return escapeControl(d.text())
}

func (d Diagnostic) text() string {
	var b strings.Builder
	b.WriteString(d.File)
	if d.Line > 0 {
		fmt.Fprintf(&b, ":%d", d.Line)
	}
	b.WriteString(": ")
	if d.Severity == SeverityWarning {
		b.WriteString("warning: ")
	}
	if d.Field != "" {
		b.WriteString(d.Field)
		b.WriteString(": ")
	}
	b.WriteString(d.Message)
	return b.String()
}

// Diagnostics is every problem found in one or more files, in file and line order.
type Diagnostics []Diagnostic

// HasErrors reports whether any diagnostic is an error.
func (ds Diagnostics) HasErrors() bool {
	for _, d := range ds {
		if d.Severity == SeverityError {
			return true
		}
	}
	return false
}

// Errors returns only the errors.
func (ds Diagnostics) Errors() Diagnostics { return ds.filter(SeverityError) }

// Warnings returns only the warnings.
func (ds Diagnostics) Warnings() Diagnostics { return ds.filter(SeverityWarning) }

func (ds Diagnostics) filter(s Severity) Diagnostics {
	var out Diagnostics
	for _, d := range ds {
		if d.Severity == s {
			out = append(out, d)
		}
	}
	return out
}

// Sorted returns the diagnostics ordered by file, then line, then field.
func (ds Diagnostics) Sorted() Diagnostics {
	out := append(Diagnostics(nil), ds...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		if out[i].Line != out[j].Line {
			return out[i].Line < out[j].Line
		}
		return out[i].Field < out[j].Field
	})
	return out
}

// Err returns nil when there is no error, else an error listing every error,
// one per line. Warnings are not part of it.
func (ds Diagnostics) Err() error {
	errs := ds.Errors().Sorted()
	if len(errs) == 0 {
		return nil
	}
	return &ValidationError{Diagnostics: errs}
}

// ValidationError carries the diagnostics that made an input invalid.
type ValidationError struct {
	Diagnostics Diagnostics
}

// MaxShown is how many diagnostics an error shows; the rest are counted.
const MaxShown = 100

func (e *ValidationError) Error() string {
	var lines []string
	for _, d := range e.Shown() {
		lines = append(lines, d.String())
	}
	if n := len(e.Diagnostics) - MaxShown; n > 0 {
		lines = append(lines, fmt.Sprintf("... and %d more", n))
	}
	return strings.Join(lines, "\n")
}

// Shown are the diagnostics an error shows: the first MaxShown.
func (e *ValidationError) Shown() Diagnostics {
	return e.Diagnostics[:min(len(e.Diagnostics), MaxShown)]
}

// escapeControl writes control bytes (and invalid UTF-8) as Go escapes.
func escapeControl(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || r == utf8.RuneError }) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// AsValidationError unwraps err into a *ValidationError when it is one.
func AsValidationError(err error) (*ValidationError, bool) {
	var ve *ValidationError
	ok := errors.As(err, &ve)
	return ve, ok
}

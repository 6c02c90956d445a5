// Package logging sets up the one slog logger a corral process uses. main calls
// New once and passes the result down; no package reaches for a global logger.
//
// Keys are snake_case. Values that carry secrets implement slog.LogValuer and
// redact themselves (see Secret).
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Options choose the handler.
type Options struct {
	Level  string // debug, info, warn, error; default info
	Format string // text or json; default text
}

// New returns a logger writing to w.
func New(w io.Writer, opts Options) (*slog.Logger, error) {
	var level slog.Level
	switch strings.ToLower(opts.Level) {
	case "", "info":
		level = slog.LevelInfo
	case "debug":
		level = slog.LevelDebug
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		return nil, fmt.Errorf("unknown log level %q (want debug, info, warn or error)", opts.Level)
	}
	ho := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(opts.Format) {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("unknown log format %q (want text or json)", opts.Format)
}

// Discard is a logger that drops everything, for tests that do not read logs.
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// Secret is a string that never prints: in logs, fmt and JSON it shows as
// [redacted]. Reveal returns the value for the one place that needs it.
type Secret string

// LogValue implements slog.LogValuer.
func (Secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// String implements fmt.Stringer.
func (Secret) String() string { return "[redacted]" }

// GoString implements fmt.GoStringer, so %#v does not leak either.
func (Secret) GoString() string { return "[redacted]" }

// MarshalText keeps encoders from writing the value.
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }

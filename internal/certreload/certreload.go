// Package certreload serves a TLS certificate and key from files and reads
// them again when they change: on SIGHUP, and when a poll of the files'
// metadata sees them change. A pair that does not load (half written,
// mismatched, expired-format garbage) is refused and the previous one kept,
// so a botched rotation never takes a listener down.
//
//	New(cert, key) ── load once (an error refuses to start)
//	Run(ctx) ── SIGHUP ──┐
//	         ── poll ────┴─▶ Reload: parse pair ─ ok: swap, log ─ bad: keep old, log
//	GetCertificate ─▶ the current pair (every handshake)
package certreload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"corral.dev/corral/internal/errdefs"
)

// DefaultPollInterval is how often Run looks at the files' metadata.
const DefaultPollInterval = time.Second

// Reloader holds the current certificate of a PEM certificate file and key
// file.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger

	// mu guards cert and seen.
	mu   sync.RWMutex
	cert *tls.Certificate
	seen stamp // the files' metadata at the last attempt to load them
}

// stamp is what the poll compares: a rewrite (size, modification time) or a
// rename over either file (inode) changes it.
type stamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
	certIno, keyIno   uint64
}

func ino(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

func stampOf(certFile, keyFile string) (stamp, error) {
	c, err := os.Stat(certFile)
	if err != nil {
		return stamp{}, err
	}
	k, err := os.Stat(keyFile)
	if err != nil {
		return stamp{}, err
	}
	return stamp{certMod: c.ModTime(), keyMod: k.ModTime(), certSize: c.Size(), keySize: k.Size(), certIno: ino(c), keyIno: ino(k)}, nil
}

// New loads the pair; it fails when the pair does not load.
func New(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log}
	st, _ := stampOf(certFile, keyFile)
	cert, err := load(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	r.cert, r.seen = cert, st
	return r, nil
}

func load(certFile, keyFile string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, errdefs.InvalidArgument("loading TLS certificate %s and key %s: %v", certFile, keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, errdefs.InvalidArgument("parsing TLS certificate %s: %v", certFile, err)
		}
	}
	return &cert, nil
}

// GetCertificate returns the current pair; it is a tls.Config's
// GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cert, nil
}

// Leaf is the current certificate, parsed.
func (r *Reloader) Leaf() *x509.Certificate {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cert.Leaf
}

// ServerConfig returns a server tls.Config that serves the current pair,
// TLS 1.2 or later, offering protos by ALPN.
func (r *Reloader) ServerConfig(protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.GetCertificate,
		NextProtos:     protos,
	}
}

// Reload reads the pair again. When it does not load, the previous pair
// stays and the error is logged and returned.
func (r *Reloader) Reload() error {
	st, _ := stampOf(r.certFile, r.keyFile)
	cert, err := load(r.certFile, r.keyFile)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = st
	if err != nil {
		r.log.Error("TLS certificate not reloaded: keeping the previous one", "cert_file", r.certFile, "key_file", r.keyFile, "err", err)
		return err
	}
	r.cert = cert
	r.log.Info("TLS certificate reloaded", "cert_file", r.certFile, "subject", cert.Leaf.Subject.String(),
		"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter)
	return nil
}

// changed reports whether the files' metadata differ from the last load.
func (r *Reloader) changed() bool {
	st, err := stampOf(r.certFile, r.keyFile)
	if err != nil {
		return false // a file mid-rename; the next poll sees the new one
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return st != r.seen
}

// Run reloads on SIGHUP and whenever the files change, until ctx ends.
// There is no file-change signal in the standard library (and corral adds
// no dependency for one), so a change is found by comparing the files'
// size and modification time every interval (DefaultPollInterval when
// zero): two stat calls, cheap at any interval.
func (r *Reloader) Run(ctx context.Context, interval time.Duration) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	r.run(ctx, interval, hup)
}

// run is Run with the signal channel given (tests send on it).
func (r *Reloader) run(ctx context.Context, interval time.Duration, hup <-chan os.Signal) {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.log.Info("SIGHUP: reloading the TLS certificate", "cert_file", r.certFile)
			_ = r.Reload()
		case <-t.C:
			if r.changed() {
				_ = r.Reload()
			}
		}
	}
}

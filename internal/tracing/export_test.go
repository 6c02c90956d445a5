package tracing_test

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"corral.dev/corral/internal/tracing"
	"corral.dev/corral/internal/tracing/tracingtest"
)

// The exporter speaks TLS unless told otherwise: it verifies the collector
// against --otlp-ca, and a collector whose certificate the roots do not
// trust gets nothing.
func TestExportOverTLS(t *testing.T) {
	// httptest's certificate is for 127.0.0.1, signed by itself.
	certSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	certSrv.StartTLS()
	cert := certSrv.TLS.Certificates[0]
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certSrv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	certSrv.Close()
	rcv := tracingtest.NewTLSReceiver(t, cert)

	export := func(c tracing.Config, timeout time.Duration) error {
		t.Helper()
		c.Endpoint, c.ServiceName, c.NodeID = rcv.Addr(), "corral-test", "n1"
		p, err := tracing.Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		_, span := p.Tracer("test").Start(context.Background(), "a span")
		span.End()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return p.Shutdown(ctx) // exports what is queued
	}
	if err := export(tracing.Config{CAFile: caFile}, 30*time.Second); err != nil {
		t.Fatalf("exporting with the collector's CA: %v", err)
	}
	sp, ok := rcv.Next(10 * time.Second)
	if !ok || sp.Name != "a span" || sp.Service != "corral-test" || sp.Instance != "n1" {
		t.Fatalf("received %v, %v; want the span of corral-test n1", sp, ok)
	}
	// The exporter retries until the shutdown's deadline.
	if err := export(tracing.Config{}, 2*time.Second); err == nil {
		t.Fatal("exported to a collector the system's roots do not trust")
	}
	// The exporter has stopped: whatever it delivered is queued.
	if n := rcv.Queued(); n != 0 {
		t.Fatalf("%d spans of the untrusted exporter arrived", n)
	}
}

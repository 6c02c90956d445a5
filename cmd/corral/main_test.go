package main

import (
	"os"
	"testing"

	"corral.dev/corral/controlplane/store/pgtest"
)

// The session verbs' tests run against a real control plane on pgtest's
// PostgreSQL.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// BootstrapOperatorKey issues an operator key (a fleet principal, no
// tenant) by writing it as the owner role: the application role cannot,
// so that a compromised control plane cannot mint operators. corral admin
// bootstrap-key and corral dev call it; the roles must be fleet roles of the
// policy (the caller checks).
func BootstrapOperatorKey(ctx context.Context, ownerURL, name string, roles []string) (string, logging.Secret, error) {
	if name = strings.TrimSpace(name); name == "" || len(name) > 200 {
		return "", "", errdefs.InvalidArgument("operator key name must be 1 to 200 characters")
	}
	conn, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		return "", "", errdefs.Unavailable("connecting as the owner: %s", lastLine(err))
	}
	defer conn.Close(ctx)
	id, secret, hash, prefix := NewOperatorKey()
	_, err = conn.Exec(ctx, `INSERT INTO operator_keys (id, name, principal, roles, secret_hash, prefix) VALUES ($1, $2, $3, $4, $5, $6)`,
		id, name, "operator:"+name, roles, hash, prefix)
	if err != nil {
		return "", "", translate(err, "operator key")
	}
	return id, secret, nil
}

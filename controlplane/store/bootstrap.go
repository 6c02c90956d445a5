package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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

// OperatorKeys lists and revokes operator keys through the functions the
// owner grants the application role; issuing stays BootstrapOperatorKey's.
type OperatorKeys struct{ s *Store }

// OperatorKeys returns the operator key repository.
func (s *Store) OperatorKeys() OperatorKeys { return OperatorKeys{s} }

const operatorKeyColumns = `id, name, principal, roles, prefix, created_at, revoked_at, last_used_at`

// List returns every operator key, oldest first, without secrets.
func (r OperatorKeys) List(ctx context.Context) ([]APIKey, error) {
	rows, err := r.s.pool.Query(ctx, `SELECT `+operatorKeyColumns+` FROM list_operator_keys()`)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "listing operator keys")
	}
	keys, err := pgx.CollectRows(rows, scanOperatorKey)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "listing operator keys")
	}
	return keys, nil
}

// Revoke revokes operator key id; revoking twice is not an error.
func (r OperatorKeys) Revoke(ctx context.Context, id string) (APIKey, error) {
	rows, err := r.s.pool.Query(ctx, `SELECT `+operatorKeyColumns+` FROM revoke_operator_key($1)`, id)
	if err != nil {
		return APIKey{}, errdefs.Wrap(errdefs.UnavailableKind, err, "revoking operator key")
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanOperatorKey)
	if err != nil {
		return APIKey{}, translate(err, "operator key "+id)
	}
	return k, nil
}

func scanOperatorKey(row pgx.CollectableRow) (APIKey, error) {
	var (
		k                 APIKey
		created           pgtype.Timestamptz
		revoked, lastUsed pgtype.Timestamptz
	)
	err := row.Scan(&k.ID, &k.Name, &k.Principal, &k.Roles, &k.Prefix, &created, &revoked, &lastUsed)
	k.CreatedAt, k.RevokedAt, k.LastUsedAt = created.Time, fromTS(revoked), fromTS(lastUsed)
	return k, err
}

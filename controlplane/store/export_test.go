package store

import (
	"context"

	"github.com/jackc/pgx/v5/stdlib"
)

// MigrateTo moves the database over ownerURL up or down to version, for
// tests of one migration against data made under the schema before it.
func MigrateTo(ctx context.Context, ownerURL string, version int64) error {
	cfg, err := stdlibConfig(ownerURL)
	if err != nil {
		return err
	}
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	p, err := newProvider(sqlDB)
	if err != nil {
		return err
	}
	current, err := p.GetDBVersion(ctx)
	if err != nil {
		return err
	}
	if version < current {
		_, err = p.DownTo(ctx, version)
	} else {
		_, err = p.UpTo(ctx, version)
	}
	return err
}

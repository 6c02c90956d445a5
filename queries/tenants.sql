-- name: GetTenant :one
SELECT id, name, created_at FROM tenants WHERE id = $1;

package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/policy"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// adminConn is how the admin verbs reach a node: its gRPC address and the
// key they send (an operator's, or a tenant admin's for its own keys).
type adminConn struct {
	addr string
	key  string
	tls  clientTLS
}

func (a *adminConn) flags(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&a.addr, "grpc-addr", envOr("CORRAL_GRPC_ADDR", "127.0.0.1:8090"), "gRPC address of the node")
	cmd.PersistentFlags().StringVar(&a.key, "api-key", "", "API key to send (default $CORRAL_OPERATOR_KEY, else $CORRAL_API_KEY); prefer the environment, flags show in ps")
	a.tls.register(cmd.PersistentFlags())
}

// call dials the node and runs fn with the key in the call's metadata.
func (a *adminConn) call(ctx context.Context, fn func(ctx context.Context, conn *grpc.ClientConn) (proto.Message, error)) error {
	key := a.key
	if key == "" {
		key = envOr("CORRAL_OPERATOR_KEY", os.Getenv("CORRAL_API_KEY"))
	}
	conn, err := a.tls.dial(a.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
	}
	resp, err := fn(ctx, conn.ClientConn)
	if err != nil {
		if hs := conn.handshakeFailure(); hs != nil {
			return fmt.Errorf("asking %s: %w", a.addr, hs)
		}
		return fmt.Errorf("asking %s: %w", a.addr, errgrpc.FromStatus(err))
	}
	b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true, UseProtoNames: true}.Marshal(resp)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

func adminCommand() *cobra.Command {
	var a adminConn
	cmd := &cobra.Command{Use: "admin", Short: "Administer tenants, principals, API keys and quotas (admin API)"}
	a.flags(cmd)
	tenants := func(fn func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error)) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), func(ctx context.Context, conn *grpc.ClientConn) (proto.Message, error) {
				return fn(ctx, adminv1.NewTenantsServiceClient(conn))
			})
		}
	}
	var id, name, keyID, principalID, kind, issuer, subject, envID string
	var roles []string

	create := &cobra.Command{Use: "create-tenant", Short: "Create a tenant", Args: cobra.NoArgs}
	create.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.CreateTenant(ctx, &adminv1.CreateTenantRequest{TenantId: id, Name: name})
	})
	create.Flags().StringVar(&id, "tenant", "", "tenant id, tenant_<letters, digits, _ or ->")
	create.Flags().StringVar(&name, "name", "", "display name")

	list := &cobra.Command{Use: "tenants", Short: "List tenants", Args: cobra.NoArgs}
	list.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.ListTenants(ctx, &adminv1.ListTenantsRequest{})
	})

	keyCreate := &cobra.Command{Use: "create-key", Short: "Issue an API key for a tenant; its secret is printed once", Args: cobra.NoArgs}
	keyCreate.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{TenantId: id, Name: name, Roles: roles, PrincipalId: principalID})
	})
	keyCreate.Flags().StringVar(&id, "tenant", "", "tenant id")
	keyCreate.Flags().StringVar(&name, "name", "", "key name")
	keyCreate.Flags().StringVar(&principalID, "principal", "", "service principal the key acts as (default: a new one named after the key)")
	keyCreate.Flags().StringSliceVar(&roles, "role", nil, "tenant role of the new principal (repeatable; default admin)")

	envKey := &cobra.Command{Use: "create-environment-key", Short: "Issue an environment key for a self_hosted environment's workers; its secret is printed once (revoke it with revoke-key)", Args: cobra.NoArgs}
	envKey.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.CreateEnvironmentKey(ctx, &adminv1.CreateEnvironmentKeyRequest{TenantId: id, EnvironmentId: envID, Name: name})
	})
	envKey.Flags().StringVar(&id, "tenant", "", "tenant id")
	envKey.Flags().StringVar(&envID, "environment", "", "the self_hosted environment (env_...)")
	envKey.Flags().StringVar(&name, "name", "worker", "key name")

	keyList := &cobra.Command{Use: "keys", Short: "List a tenant's API keys", Args: cobra.NoArgs}
	keyList.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.ListAPIKeys(ctx, &adminv1.ListAPIKeysRequest{TenantId: id, PrincipalId: principalID})
	})
	keyList.Flags().StringVar(&id, "tenant", "", "tenant id")
	keyList.Flags().StringVar(&principalID, "principal", "", "only this principal's keys")

	prnCreate := &cobra.Command{Use: "create-principal", Short: "Add a service principal, or a user ahead of its first token", Args: cobra.NoArgs}
	prnCreate.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.CreatePrincipal(ctx, &adminv1.CreatePrincipalRequest{TenantId: id, Kind: kind, Name: name, Issuer: issuer, Subject: subject, Roles: roles})
	})
	prnCreate.Flags().StringVar(&id, "tenant", "", "tenant id")
	prnCreate.Flags().StringVar(&kind, "kind", "service", "service (holds API keys) or user (an OIDC subject)")
	prnCreate.Flags().StringVar(&name, "name", "", "name (a user's defaults to its subject)")
	prnCreate.Flags().StringVar(&issuer, "issuer", "", "a user's OIDC issuer URL")
	prnCreate.Flags().StringVar(&subject, "subject", "", "a user's subject at its issuer")
	prnCreate.Flags().StringSliceVar(&roles, "role", nil, "tenant role (repeatable)")

	prnList := &cobra.Command{Use: "principals", Short: "List a tenant's users and service principals", Args: cobra.NoArgs}
	prnList.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.ListPrincipals(ctx, &adminv1.ListPrincipalsRequest{TenantId: id})
	})
	prnList.Flags().StringVar(&id, "tenant", "", "tenant id")

	grant := &cobra.Command{Use: "set-roles", Short: "Replace the roles granted to a principal (no --role removes them all)", Args: cobra.NoArgs}
	grant.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.SetPrincipalRoles(ctx, &adminv1.SetPrincipalRolesRequest{TenantId: id, PrincipalId: principalID, Roles: roles})
	})
	grant.Flags().StringVar(&id, "tenant", "", "tenant id")
	grant.Flags().StringVar(&principalID, "principal", "", "principal id")
	grant.Flags().StringSliceVar(&roles, "role", nil, "tenant role (repeatable)")

	disable := &cobra.Command{Use: "disable-principal", Short: "Refuse a principal's keys and tokens until it is enabled", Args: cobra.NoArgs}
	disable.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.DisablePrincipal(ctx, &adminv1.DisablePrincipalRequest{TenantId: id, PrincipalId: principalID})
	})
	enable := &cobra.Command{Use: "enable-principal", Short: "Enable a disabled principal", Args: cobra.NoArgs}
	enable.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.EnablePrincipal(ctx, &adminv1.EnablePrincipalRequest{TenantId: id, PrincipalId: principalID})
	})
	for _, c := range []*cobra.Command{disable, enable} {
		c.Flags().StringVar(&id, "tenant", "", "tenant id")
		c.Flags().StringVar(&principalID, "principal", "", "principal id")
	}

	revoke := &cobra.Command{Use: "revoke-key", Short: "Revoke an API key", Args: cobra.NoArgs}
	revoke.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.RevokeAPIKey(ctx, &adminv1.RevokeAPIKeyRequest{TenantId: id, KeyId: keyID})
	})
	revoke.Flags().StringVar(&id, "tenant", "", "tenant id")
	revoke.Flags().StringVar(&keyID, "key", "", "key id")

	del := &cobra.Command{Use: "delete-tenant", Short: "Delete a tenant and everything it owns", Args: cobra.NoArgs}
	del.RunE = tenants(func(ctx context.Context, c adminv1.TenantsServiceClient) (proto.Message, error) {
		return c.DeleteTenant(ctx, &adminv1.DeleteTenantRequest{TenantId: id})
	})
	del.Flags().StringVar(&id, "tenant", "", "tenant id")

	operators := func(fn func(ctx context.Context, c adminv1.OperatorKeysServiceClient) (proto.Message, error)) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), func(ctx context.Context, conn *grpc.ClientConn) (proto.Message, error) {
				return fn(ctx, adminv1.NewOperatorKeysServiceClient(conn))
			})
		}
	}
	opList := &cobra.Command{Use: "operator-keys", Short: "List operator keys, without secrets", Args: cobra.NoArgs}
	opList.RunE = operators(func(ctx context.Context, c adminv1.OperatorKeysServiceClient) (proto.Message, error) {
		return c.ListOperatorKeys(ctx, &adminv1.ListOperatorKeysRequest{})
	})
	opRevoke := &cobra.Command{Use: "revoke-operator-key", Short: "Revoke an operator key (not the one making the call)", Args: cobra.NoArgs}
	opRevoke.RunE = operators(func(ctx context.Context, c adminv1.OperatorKeysServiceClient) (proto.Message, error) {
		return c.RevokeOperatorKey(ctx, &adminv1.RevokeOperatorKeyRequest{KeyId: keyID})
	})
	opRevoke.Flags().StringVar(&keyID, "key", "", "operator key id")

	cmd.AddCommand(create, list, keyCreate, envKey, keyList, revoke, del,
		prnCreate, prnList, grant, disable, enable,
		opList, opRevoke, bootstrapKeyCommand(), nodeTokenCommand(), sealCommand())
	return cmd
}

// bootstrapKeyCommand issues an operator key straight into the database as
// the owner role: how the first operator gets in.
func bootstrapKeyCommand() *cobra.Command {
	var url, name string
	cmd := &cobra.Command{
		Use:   "bootstrap-key",
		Short: "Issue an operator key with the owner role's database URL; prints the key once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if url == "" {
				return fmt.Errorf("--database-url is required (the owner role's URL)")
			}
			p, err := policy.Load()
			if err != nil {
				return err
			}
			if scope, ok := p.HasRole("operator"); !ok || scope != policy.FleetScope {
				return fmt.Errorf("the policy has no fleet role named operator")
			}
			id, secret, err := store.BootstrapOperatorKey(cmd.Context(), url, name, []string{"operator"})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "operator key %s issued; it is shown this once:\n", id)
			fmt.Println(secret.Reveal())
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "database-url", os.Getenv("CORRAL_MIGRATION_DATABASE_URL"), "PostgreSQL URL of the owner role")
	cmd.Flags().StringVar(&name, "name", "operator", "name of the key's principal")
	return cmd
}

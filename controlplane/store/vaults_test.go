package store_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/seal"
)

// vaultSetup is a store over a fresh database, a keyring in a temporary
// seal key file, and a session of the default tenant to name vaults.
func vaultSetup(t *testing.T) (*pgtest.DB, *store.Store, string, context.Context) {
	t.Helper()
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	keyFile := filepath.Join(t.TempDir(), "seal.key")
	if _, err := seal.Create(keyFile); err != nil {
		t.Fatal(err)
	}
	return db, s, keyFile, tenant.With(context.Background(), tenant.Default)
}

func loadRing(t *testing.T, path string) *seal.Keyring {
	t.Helper()
	ring, err := seal.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return ring
}

// newSession stores an agent, an environment and a session naming vaults.
func newSession(t *testing.T, s *store.Store, ctx context.Context, vaults ...string) (store.Session, error) {
	t.Helper()
	a, err := s.Agents().Create(ctx, "a"+store.NewEventID(), []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Environments().Create(ctx, store.Environment{Name: "e" + store.NewEventID(), Config: []byte(`{}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	return s.Sessions().Create(ctx, store.Session{AgentID: a.ID, AgentVersion: a.Version, Agent: []byte(`{}`), EnvironmentID: e.ID, VaultIDs: vaults})
}

// A credential's secret is stored only as ciphertext: its bytes appear
// nowhere in a dump of the database, in any encoding pg_dump writes. The
// session that names its vault gets it back for its MCP server only.
func TestVaultSecretCiphertextAtRest(t *testing.T) {
	db, s, keyFile, ctx := vaultSetup(t)
	v := s.Vaults(loadRing(t, keyFile))
	vault, err := v.Create(ctx, store.Vault{DisplayName: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "tok-5f1c0ffee-very-secret-bearer"
	c, err := v.CreateCredential(ctx, vault.ID, store.Credential{AuthType: store.CredentialStaticBearer, MCPServerURL: "https://MCP.example.com:443/mcp/"}, store.CredentialSecrets{Token: logging.Secret(secret)})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := newSession(t, s, ctx, vault.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := bearerFor(v, ctx, sess.ID, "https://mcp.example.com/mcp")
	if err != nil || !ok || got.Reveal() != secret {
		t.Fatalf("BearerFor = %v, %v, %v", got == secret, ok, err)
	}
	for _, other := range []string{"https://mcp.example.com/other", "http://mcp.example.com/mcp", "https://mcp.example.com:8443/mcp", "https://evil.example/mcp"} {
		if _, ok, err := bearerFor(v, ctx, sess.ID, other); ok || err != nil {
			t.Errorf("BearerFor(%s) = %v, %v; want no credential", other, ok, err)
		}
	}

	dump, err := osexec.Command("pg_dump", "--dbname="+db.SuperuserURL).Output()
	if err != nil {
		t.Fatalf("pg_dump: %v", err)
	}
	if !bytes.Contains(dump, []byte(c.ID)) {
		t.Fatalf("the dump does not hold credential %s; it proves nothing", c.ID)
	}
	for name, form := range map[string]string{
		"plain":  secret,
		"hex":    hex.EncodeToString([]byte(secret)),
		"base64": base64.StdEncoding.EncodeToString([]byte(secret)),
	} {
		if bytes.Contains(dump, []byte(form)) {
			t.Errorf("the database dump holds the secret (%s)", name)
		}
	}
}

// A keyring rotation (a new key first in the seal key file) still opens
// the tenant's data key, which the first use reseals under the new key, so
// the old key can then be dropped. Without the key that sealed it, nothing
// opens: a failed precondition, and no secret.
func TestVaultKeyRotation(t *testing.T) {
	_, s, keyFile, ctx := vaultSetup(t)
	old := loadRing(t, keyFile)
	oldID := old.CurrentID()
	v := s.Vaults(old)
	vault, err := v.Create(ctx, store.Vault{DisplayName: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.CreateCredential(ctx, vault.ID, store.Credential{AuthType: store.CredentialStaticBearer, MCPServerURL: "https://mcp.example.com/mcp"}, store.CredentialSecrets{Token: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	sess, err := newSession(t, s, ctx, vault.ID)
	if err != nil {
		t.Fatal(err)
	}

	// A fresh keyring alone opens nothing.
	other := filepath.Join(t.TempDir(), "other.key")
	if _, err := seal.Create(other); err != nil {
		t.Fatal(err)
	}
	if tok, ok, err := bearerFor(s.Vaults(loadRing(t, other)), ctx, sess.ID, "https://mcp.example.com/mcp"); ok || !errdefs.IsFailedPrecondition(err) || tok != "" {
		t.Fatalf("with the wrong keyring: ok %v, err %v", ok, err)
	}

	newID, err := seal.AddKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	rotated := loadRing(t, keyFile)
	if rotated.CurrentID() != newID || newID == oldID {
		t.Fatalf("rotation: current %s, new %s, old %s", rotated.CurrentID(), newID, oldID)
	}
	if tok, ok, err := bearerFor(s.Vaults(rotated), ctx, sess.ID, "https://mcp.example.com/mcp"); err != nil || !ok || tok.Reveal() != "s3cret" {
		t.Fatalf("after rotation: ok %v, err %v", ok, err)
	}
	// Resealed: the new key alone now opens it.
	b, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	firstLine, _, _ := bytes.Cut(b, []byte("\n"))
	onlyNew := filepath.Join(t.TempDir(), "new.key")
	if err := os.WriteFile(onlyNew, append(firstLine, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, ok, err := bearerFor(s.Vaults(loadRing(t, onlyNew)), ctx, sess.ID, "https://mcp.example.com/mcp"); err != nil || !ok || tok.Reveal() != "s3cret" {
		t.Fatalf("with the new key only: ok %v, err %v", ok, err)
	}
}

// Sessions name only active vaults of their own tenant; archiving a vault
// archives its credentials, and sessions stop getting them; another tenant
// neither sees the vault nor gets its credential.
func TestVaultSessionsAndArchive(t *testing.T) {
	db, s, keyFile, ctx := vaultSetup(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	ctxB := tenant.With(context.Background(), "tenant_b")
	v := s.Vaults(loadRing(t, keyFile))
	vault, err := v.Create(ctx, store.Vault{DisplayName: "prod", Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.CreateCredential(ctx, vault.ID, store.Credential{AuthType: store.CredentialStaticBearer, MCPServerURL: "https://mcp.example.com/mcp"}, store.CredentialSecrets{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.CreateCredential(ctx, vault.ID, store.Credential{AuthType: store.CredentialStaticBearer, MCPServerURL: "https://mcp.example.com/mcp/"}, store.CredentialSecrets{Token: "tok2"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second credential for the same server: %v", err)
	}
	if _, err := v.Get(ctxB, vault.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("tenant_b gets the vault: %v", err)
	}
	if _, err := v.GetCredential(ctxB, vault.ID, c.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("tenant_b gets the credential: %v", err)
	}
	if _, err := newSession(t, s, ctxB, vault.ID); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("tenant_b's session names the vault: %v", err)
	}
	if _, err := newSession(t, s, ctx, "vlt_nope"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a session names a vault that does not exist: %v", err)
	}
	sess, err := newSession(t, s, ctx, vault.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Sessions().Get(ctx, sess.ID); err != nil || len(got.VaultIDs) != 1 || got.VaultIDs[0] != vault.ID {
		t.Fatalf("session vault_ids = %v, %v", got.VaultIDs, err)
	}
	if _, err := v.Archive(ctx, vault.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := bearerFor(v, ctx, sess.ID, "https://mcp.example.com/mcp"); ok || err != nil {
		t.Fatalf("an archived vault's credential is still used: %v, %v", ok, err)
	}
	if got, err := v.GetCredential(ctx, vault.ID, c.ID); err != nil || got.ArchivedAt == nil {
		t.Fatalf("credential of an archived vault: %+v, %v", got, err)
	}
	if _, err := newSession(t, s, ctx, vault.ID); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a session names an archived vault: %v", err)
	}
	if _, err := v.CreateCredential(ctx, vault.ID, store.Credential{AuthType: store.CredentialStaticBearer, MCPServerURL: "https://x.example/mcp"}, store.CredentialSecrets{Token: "t"}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a credential in an archived vault: %v", err)
	}
	if err := v.Delete(ctx, vault.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := v.GetCredential(ctx, vault.ID, c.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("credential of a deleted vault: %v", err)
	}
	if _, err := s.Vaults(nil).Get(ctx, vault.ID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("vaults without a keyring: %v", err)
	}
}

func TestNormalizeMCPServerURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://MCP.Example.com:443/mcp/": "https://mcp.example.com/mcp",
		"http://h:80":                      "http://h",
		"https://h:8443/a?b=c#frag":        "https://h:8443/a?b=c",
		"https://[::1]:9/x":                "https://[::1]:9/x",
	} {
		if got, err := store.NormalizeMCPServerURL(in); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ftp://h/x", "https://u:p@h/x", "mcp.example.com", "https:///x"} {
		if _, err := store.NormalizeMCPServerURL(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
}

// bearerFor is CredentialFor's token.
func bearerFor(v store.Vaults, ctx context.Context, sessionID, url string) (logging.Secret, bool, error) {
	c, ok, err := v.CredentialFor(ctx, sessionID, url)
	return c.Secrets.Token, ok, err
}

// A refreshed mcp_oauth token is stored only over the credential as it was
// read: a second refresh from the same reading loses, and reads again.
func TestVaultStoreRefreshed(t *testing.T) {
	_, s, keyFile, ctx := vaultSetup(t)
	v := s.Vaults(loadRing(t, keyFile))
	vault, err := v.Create(ctx, store.Vault{DisplayName: "oauth"})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute).UTC().Truncate(time.Microsecond)
	refresh := &store.OAuthRefresh{ClientID: "cid", TokenEndpoint: "https://auth.example/token", TokenEndpointAuth: "client_secret_post"}
	if _, err := v.CreateCredential(ctx, vault.ID, store.Credential{AuthType: store.CredentialMCPOAuth, MCPServerURL: "https://m.example/mcp", ExpiresAt: &exp, Refresh: refresh},
		store.CredentialSecrets{Token: "at1", RefreshToken: "rt1", ClientSecret: "cs"}); err != nil {
		t.Fatal(err)
	}
	sess, err := newSession(t, s, ctx, vault.ID)
	if err != nil {
		t.Fatal(err)
	}
	c, ok, err := v.CredentialFor(ctx, sess.ID, "https://m.example/mcp")
	if err != nil || !ok || c.Secrets.Token != "at1" || c.Secrets.RefreshToken != "rt1" || c.Secrets.ClientSecret != "cs" ||
		c.Refresh == nil || *c.Refresh != *refresh || c.ExpiresAt == nil || !c.ExpiresAt.Equal(exp) {
		t.Fatalf("CredentialFor = %+v, %v, %v", c.Credential, ok, err)
	}
	later := exp.Add(time.Hour)
	if stored, err := v.StoreRefreshed(ctx, c, "at2", "rt2", &later); err != nil || !stored {
		t.Fatalf("StoreRefreshed: %v, %v", stored, err)
	}
	if stored, err := v.StoreRefreshed(ctx, c, "at3", "", &later); err != nil || stored {
		t.Fatalf("a stale refresh was stored: %v, %v", stored, err)
	}
	c2, _, err := v.CredentialFor(ctx, sess.ID, "https://m.example/mcp")
	if err != nil || c2.Secrets.Token != "at2" || c2.Secrets.RefreshToken != "rt2" || c2.Secrets.ClientSecret != "cs" || !c2.ExpiresAt.Equal(later) {
		t.Fatalf("after the refresh: %+v, %v", c2.ExpiresAt, err)
	}
}

// BenchmarkCredentialFor is what an MCP operation of a session with a vault
// pays before it connects: one tenant transaction (session, credentials,
// data key) and two AES-GCM opens.
func BenchmarkCredentialFor(b *testing.B) {
	db := pgtest.New(b)
	s, err := store.Open(context.Background(), db.AppURL, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	keyFile := filepath.Join(b.TempDir(), "seal.key")
	if _, err := seal.Create(keyFile); err != nil {
		b.Fatal(err)
	}
	ring, err := seal.Load(keyFile)
	if err != nil {
		b.Fatal(err)
	}
	ctx := tenant.With(context.Background(), tenant.Default)
	v := s.Vaults(ring)
	vault, err := v.Create(ctx, store.Vault{DisplayName: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := v.CreateCredential(ctx, vault.ID, store.Credential{AuthType: store.CredentialStaticBearer, MCPServerURL: "https://m.example/mcp"}, store.CredentialSecrets{Token: "tok"}); err != nil {
		b.Fatal(err)
	}
	a, err := s.Agents().Create(ctx, "a", []byte(`{}`))
	if err != nil {
		b.Fatal(err)
	}
	e, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: []byte(`{}`), Scope: "organization"})
	if err != nil {
		b.Fatal(err)
	}
	sess, err := s.Sessions().Create(ctx, store.Session{AgentID: a.ID, AgentVersion: a.Version, Agent: []byte(`{}`), EnvironmentID: e.ID, VaultIDs: []string{vault.ID}})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, ok, err := v.CredentialFor(ctx, sess.ID, "https://m.example/mcp"); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// environment_variable credentials: one active per variable in a vault;
// a session gets them with placeholders that are the same at every call,
// differ between sessions, and hold nothing of the secret; the first vault
// of its vault_ids wins a variable; an update replaces the hosts and the
// secret; an archived one is gone.
func TestVaultEgressCredentials(t *testing.T) {
	_, s, keyFile, ctx := vaultSetup(t)
	v := s.Vaults(loadRing(t, keyFile))
	a, _ := v.Create(ctx, store.Vault{DisplayName: "a"})
	b, _ := v.Create(ctx, store.Vault{DisplayName: "b"})
	env := func(name string, hosts ...string) store.Credential {
		return store.Credential{AuthType: store.CredentialEnvironmentVariable, SecretName: name, AllowedHosts: hosts}
	}
	ca, err := v.CreateCredential(ctx, a.ID, env("TOKEN", "api.example.com", "*.example.org"), store.CredentialSecrets{Token: "secret-a"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := v.GetCredential(ctx, a.ID, ca.ID); err != nil || got.SecretName != "TOKEN" || len(got.AllowedHosts) != 2 || got.MCPServerURL != "" {
		t.Fatalf("stored credential: %+v, %v", got, err)
	}
	if _, err := v.CreateCredential(ctx, a.ID, env("TOKEN", "x.example"), store.CredentialSecrets{Token: "t"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second TOKEN in the vault: %v", err)
	}
	if _, err := v.CreateCredential(ctx, b.ID, env("TOKEN", "b.example"), store.CredentialSecrets{Token: "secret-b"}); err != nil {
		t.Fatal(err)
	}
	cb2, err := v.CreateCredential(ctx, b.ID, env("OTHER", "o.example"), store.CredentialSecrets{Token: "secret-o"})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := newSession(t, s, ctx, a.ID, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := newSession(t, s, ctx, a.ID, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	get := func(id string) []store.EgressCredential {
		t.Helper()
		got, vaults, err := v.EgressCredentialsFor(ctx, id)
		if err != nil || !vaults {
			t.Fatal(vaults, err)
		}
		return got
	}
	first := get(s1.ID)
	if len(first) != 2 || first[0].SecretName != "OTHER" || first[1].SecretName != "TOKEN" || first[1].Secret.Reveal() != "secret-a" || first[1].AllowedHosts[1] != "*.example.org" {
		t.Fatalf("session credentials: %+v", first)
	}
	for _, c := range first {
		if len(c.Placeholder) != len(store.PlaceholderPrefix)+32 || bytes.Contains([]byte(c.Placeholder), []byte("secret")) {
			t.Fatalf("placeholder %q", c.Placeholder)
		}
	}
	if again := get(s1.ID); again[1].Placeholder != first[1].Placeholder || again[0].Placeholder != first[0].Placeholder {
		t.Fatalf("placeholders changed between calls: %v, %v", first, again)
	}
	if other := get(s2.ID); other[1].Placeholder == first[1].Placeholder {
		t.Fatal("two sessions got the same placeholder")
	}
	if _, err := v.UpdateCredential(ctx, a.ID, ca.ID, func(c store.Credential) (store.Credential, store.SecretsPatch, error) {
		c.AllowedHosts = []string{"new.example"}
		sec := logging.Secret("secret-a2")
		return c, store.SecretsPatch{Token: &sec}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := get(s1.ID); got[1].Secret.Reveal() != "secret-a2" || len(got[1].AllowedHosts) != 1 || got[1].Placeholder != first[1].Placeholder {
		t.Fatalf("after an update: %+v", got[1])
	}
	if _, err := v.ArchiveCredential(ctx, b.ID, cb2.ID); err != nil {
		t.Fatal(err)
	}
	if got := get(s1.ID); len(got) != 1 || got[0].SecretName != "TOKEN" {
		t.Fatalf("after an archive: %+v", got)
	}
	s3, _ := newSession(t, s, ctx)
	if got, vaults, err := v.EgressCredentialsFor(ctx, s3.ID); len(got) != 0 || vaults || err != nil {
		t.Fatalf("a session without vaults: %v, %v, %v", got, vaults, err)
	}
}

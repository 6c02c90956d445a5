package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// admin runs `corral admin args...` against a node with key and decodes the
// JSON it prints.
func admin(t *testing.T, grpcAddr, key string, args ...string) map[string]any {
	t.Helper()
	cmd := exec.Command(corralBin, append([]string{"admin", "--grpc-addr", grpcAddr}, args...)...)
	cmd.Env = append(os.Environ(), "CORRAL_OPERATOR_KEY="+key, "CORRAL_API_KEY=")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("corral admin %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("corral admin %s printed %q: %v", strings.Join(args, " "), out, err)
	}
	return v
}

// The README's tenant walk through the real binary: an operator creates a
// tenant and a service principal with a key; the tenant's admin grants the
// principal another role and disables it; its key follows each change.
func TestAdminCLIPrincipalWalk(t *testing.T) {
	dir := dataDir(t)
	httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
	dev := startDev(t, dir, "--http-addr", httpAddr, "--grpc-addr", grpcAddr, "--runtime", "process")
	dev.waitListening(t)
	env := readEnv(t, dir)
	op := env["CORRAL_OPERATOR_KEY"]
	status := func(method, key string) int {
		t.Helper()
		body := ""
		if method == "POST" {
			body = `{"name":"a","model":"claude-test"}`
		}
		req, _ := http.NewRequest(method, env["CORRAL_URL"]+"/v1/agents", strings.NewReader(body))
		req.Header.Set("x-api-key", key)
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	admin(t, grpcAddr, op, "create-tenant", "--tenant", "tenant_acme", "--name", "Acme")
	tenantAdmin := admin(t, grpcAddr, op, "create-key", "--tenant", "tenant_acme", "--name", "acme-admin")["secret"].(string)
	prn := admin(t, grpcAddr, tenantAdmin, "create-principal", "--name", "ci", "--role", "developer")["principal"].(map[string]any)
	id := prn["id"].(string)
	key := admin(t, grpcAddr, tenantAdmin, "create-key", "--name", "ci-key", "--principal", id)["secret"].(string)
	if got := status("POST", key); got != 200 {
		t.Fatalf("developer key: POST /v1/agents = %d", got)
	}
	admin(t, grpcAddr, tenantAdmin, "set-roles", "--principal", id, "--role", "viewer")
	if w, r := status("POST", key), status("GET", key); w != 403 || r != 200 {
		t.Fatalf("viewer key: POST %d GET %d, want 403 200", w, r)
	}
	admin(t, grpcAddr, tenantAdmin, "disable-principal", "--principal", id)
	if got := status("GET", key); got != 401 {
		t.Fatalf("disabled principal's key: GET %d, want 401", got)
	}
	list := admin(t, grpcAddr, op, "principals", "--tenant", "tenant_acme")["principals"].([]any)
	var found map[string]any
	for _, p := range list {
		if p.(map[string]any)["id"] == id {
			found = p.(map[string]any)
		}
	}
	if len(list) != 2 || found == nil || found["disabled_at"] == nil || found["kind"] != "service" {
		t.Fatalf("the operator's listing of tenant_acme: %v", list)
	}
	admin(t, grpcAddr, tenantAdmin, "enable-principal", "--principal", id)
	if got := status("GET", key); got != 200 {
		t.Fatalf("enabled again: GET %d, want 200", got)
	}

	// A self-hosted environment's worker key (README: Self-hosted workers):
	// it polls its queue, is refused elsewhere, and once revoked at all.
	call := func(method, path, key, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, env["CORRAL_URL"]+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, b
	}
	code, b := call("POST", "/v1/environments", tenantAdmin, `{"name":"laptop","config":{"type":"self_hosted"}}`)
	var created struct{ ID string }
	if code != 200 || json.Unmarshal(b, &created) != nil {
		t.Fatalf("self-hosted environment: %d %s", code, b)
	}
	ek := admin(t, grpcAddr, tenantAdmin, "create-environment-key", "--environment", created.ID, "--name", "laptop")
	envKey := ek["secret"].(string)
	keyID := ek["api_key"].(map[string]any)["id"].(string)
	if code, b := call("GET", "/v1/environments/"+created.ID+"/work/poll", envKey, ""); code != 200 || strings.TrimSpace(string(b)) != "null" {
		t.Fatalf("poll with the environment key: %d %s", code, b)
	}
	if code, _ := call("GET", "/v1/agents", envKey, ""); code != 403 {
		t.Fatalf("the environment key on /v1/agents: %d, want 403", code)
	}
	admin(t, grpcAddr, tenantAdmin, "revoke-key", "--key", keyID)
	if code, _ := call("GET", "/v1/environments/"+created.ID+"/work/poll", envKey, ""); code != 401 {
		t.Fatalf("revoked environment key: %d, want 401", code)
	}
	dev.stop(t)
}

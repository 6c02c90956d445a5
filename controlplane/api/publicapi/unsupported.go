package publicapi

import (
	"fmt"

	"corral.dev/corral/internal/errdefs"
)

// What corral refuses, and why.
//
// The rule (issue 13): a field corral accepts, it enforces; what it does not
// enforce it refuses. Every member of a create or update body is one of:
//
//   - enforced: some code acts on it. An agent's system, model.id, tools
//     (each tool's enabled flag and permission policy, custom tools' names,
//     descriptions and schemas, MCP toolsets) and mcp_servers are read by
//     controlplane/agentloop and sent to the model (controlplane/model) or
//     run (controlplane/tools, controlplane/mcp); a session's agent and
//     environment_id pick what it runs, and its vault_ids which
//     credentials the MCP client sends (vaults.go); initial_events and client events
//     drive the loop; tool confirmations' result and deny_message and
//     custom tool results' content and is_error reach the model.
//   - descriptive: names, titles, descriptions and metadata, which only
//     ever come back to the caller; there is nothing to enforce.
//   - refused unless neutral: the rows of unsupportedFields below. A request
//     that sets one to anything but its neutral value (absent, null, an empty
//     list or the documented default, which is what corral really applies)
//     is a 400 that names the field, so that the official SDKs' default
//     requests work and nothing is stored as if it were in force.
//
// Two cases are enforced in their own way rather than refused: the "auto"
// permission policy is enforced as always_ask (corral evaluates no policy
// on the server, so such a call waits for a confirmation: it fails
// closed); and the provider-run web tools (web_fetch, web_search) are
// offered to the anthropic model only under always_allow, since a call the
// provider runs cannot wait for a confirmation, and the fake model has none.
//
// Objects stored before a field was refused are reported with the field at
// its neutral value (see neutralize): the field was never in force, so the
// neutral value is what the session really got.

// unsupportedField is one request field corral accepts only at its neutral
// value.
type unsupportedField struct {
	// Field names the member as the API's reference does (agent.multiagent,
	// session.resources); the 400 names it, with the request path.
	Field string
	// Neutral is what is accepted instead ("" when nothing is: the member
	// or event type is refused whatever its value).
	Neutral string
	// Why is what corral lacks to honour it.
	Why string
}

// unsupportedFields lists every refused field. TestUnsupportedFields covers
// each row: refused when set, accepted at its neutral value.
var unsupportedFields = []unsupportedField{
	// Agents: POST /v1/agents, POST /v1/agents/{id}, a session's
	// agent_with_overrides and a session update's agent.
	{Field: "agent.model.effort", Neutral: `null or "high" (the default)`, Why: "the model clients send no effort level, so every call runs at the model's default, high"},
	{Field: "agent.model.speed", Neutral: `null or "standard" (the default)`, Why: "the model clients do not ask for fast output"},
	{Field: "agent.model.inference_geo", Neutral: `null or ""`, Why: "the model clients do not choose where inference runs"},
	{Field: "agent.execution_identity", Neutral: `null or {"type":"service_account"}`, Why: "sandboxes and tools assume no cloud identity, so an aws_role would never be assumed"},
	{Field: "agent.multiagent", Neutral: "null", Why: "a session runs one agent in one thread"},
	{Field: "web_fetch.url_sources", Neutral: `null, or "all" for every source`, Why: "the model's provider takes no such option, so every source may contribute URLs"},

	// Sessions: POST /v1/sessions and POST /v1/sessions/{id}.
	{Field: "session update vault_ids", Neutral: "null or []", Why: "a session's vaults are fixed when it is created, as in the Managed Agents API"},

	// Events: POST /v1/sessions/{id}/events and a session's initial_events.
	{Field: "user.message image or document source of type file", Neutral: "a base64, text or url source", Why: "a file's content is not yet sent to the model; send it as base64"},
	{Field: "user.custom_tool_result image, document or search_result block", Neutral: "text blocks", Why: "tool results reach the model as text only"},
	{Field: "user.interrupt.session_thread_id", Neutral: "null", Why: "a session has one thread, and an interrupt stops the whole session"},
	{Field: "user.define_outcome", Why: "outcomes are not evaluated"},
	{Field: "system.message", Why: "system messages are not delivered to the agent"},

	// Vault credentials: POST /v1/vaults/{id}/credentials and updates.
	// static_bearer and mcp_oauth are honoured (the MCP client sends them).
	// environment_variable is honoured through the hosts' egress proxies,
	// which substitute the secret in request headers toward its hosts.
	{Field: "credential.auth.networking unrestricted", Neutral: `limited networking with allowed_hosts`, Why: "the egress proxy substitutes a secret only toward the hosts its credential lists"},
	{Field: "credential.auth.injection_location.body", Neutral: "false, or leave it out", Why: "the egress proxy substitutes a placeholder in request header values only; request bodies pass untouched"},

	// Files: POST /v1/files (a multipart field).
	{Field: "file.expires_in_seconds", Why: "nothing deletes a file when it expires; delete it instead"},

	// Environments: refused in decodeEnvConfig and decodeScope, whose
	// messages say what to send instead.
	{Field: "environment.config.networking", Neutral: "null, or limited networking with allowed_hosts (enforced by the host's egress proxy), allow_package_managers only where the operator configured package mirrors (--package-mirror), and allow_mcp_servers (the hosts of the agent's mcp_servers)", Why: "unrestricted networking is only for tenants the operator's policy grants it (unrestricted_networking); allow_package_managers reaches the operator's mirrors only"},
	{Field: "environment.config.packages", Neutral: "null, empty lists, or packages of the managers the operator has a mirror for (--package-mirror)", Why: "packages are built into the sessions' image from the operator's mirrors only"},
	{Field: "environment.scope account", Neutral: `null or "organization"`, Why: "environments are organization-scoped"},
}

// refuse is the 400 for a refused field (a Field of unsupportedFields) set
// at path, the member's place in the request.
func refuse(fieldName, path string) error {
	f := unsupportedField{Field: fieldName}
	for _, row := range unsupportedFields {
		if row.Field == fieldName {
			f = row
		}
	}
	msg := f.Field + " is not supported by this server yet"
	if f.Why != "" {
		msg += ": " + f.Why
	}
	msg += "; remove it"
	if f.Neutral != "" {
		msg += " or send " + f.Neutral
	}
	if path != "" && path != f.Field {
		msg = fmt.Sprintf("%s: %s", path, msg)
	}
	return errdefs.InvalidArgument("%s", msg)
}

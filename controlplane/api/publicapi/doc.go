// Package publicapi serves corral's public REST API under /v1/, wire
// compatible with the Claude Managed Agents API so that the official
// Anthropic SDKs work against corral by changing only the base URL: agents
// (with immutable versions), environments, sessions, a session's events,
// vaults with their credentials (vaults.go: write-only secrets, static_bearer
// and mcp_oauth, sent by the MCP client for sessions that name the vault),
// files (files.go: multipart uploads streamed to the blob store, bounded
// per file and by the tenant's file_storage_mib quota; metadata in the
// store) and a session's file resources (resources.go: kept on the session
// row, mounted read-only in its sandbox by the fleet), memory stores
// (memory.go: path-addressed text memories with content_sha256
// preconditions, a version per write naming its author, redaction;
// mounted read_only in a session's sandbox at /mnt/memory/<name>), skills and their
// versions (skills.go, skillbundle.go: an upload checked whole, SKILL.md's
// front matter included; an agent's custom skills pinned to a version and
// refused when they do not exist),
// and the work queue of self_hosted environments (work.go: poll,
// ack, heartbeat leases with their 412, stop, list, get, update, stats, as
// the SDKs' environment workers speak them). An environment key (a
// worker's) reaches only the routes Rules marks Worker, for its own
// environment and its sessions, and sends only tool results.
//
//	request ─▶ principal and tenant (api.Security.Authenticate) ─▶ Guard: the
//	           route's rule (Rules) ─▶ handler: read capped body, decode
//	           strictly, validate, apply through store ─▶ JSON | error envelope
//
// Requests are decoded member by member so that an omitted field, null and a
// value mean different things (update and patch semantics); unknown members
// and enum values are 400s that name the field. Every error is an errdefs
// kind written by api.WriteError, the one translation to HTTP. Page cursors
// are opaque: base64url JSON naming the list they belong to, its order and
// the (created_at, id) position, so a cursor reused with another list or
// order is a 400.
//
// Where the wire reference and anthropic-sdk-go v2.15.0 disagree, the SDK
// wins: up to 256 tools across toolsets (not 128); the "auto" permission
// policy is accepted; a custom tool without input_schema gets the empty
// object schema (the SDK omits a zero schema); environment metadata patches
// delete a key set to "" as well as null; environment DELETE answers
// {id, type:"environment_deleted"}. Choices where both are silent: an
// environment created without config is cloud with no network (said as
// limited networking allowing nothing) and no packages; model effort defaults to high and speed to standard;
// agent toolsets default to always_allow and MCP toolsets to always_ask;
// agents, versions and environments list newest first. A field corral does
// not enforce is refused with a 400 that names it, and accepted only at its
// neutral value, so that nothing is stored as if it were in force: the list,
// with the reason for each, is unsupportedFields (unsupported.go).
package publicapi

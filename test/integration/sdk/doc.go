// Package sdk drives corral through the official Anthropic Go SDK (v2), the
// way users will: a node started in process on a private PostgreSQL, the
// SDK pointed at it by base URL, and every response decoded by the SDK's own
// types.
package sdk

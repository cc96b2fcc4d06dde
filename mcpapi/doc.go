// Package mcpapi is credbroker's MCP surface: one Streamable HTTP endpoint
// serving MCP 2026-07-28 with a lean handler of its own (on the go-sdk's wire
// types) and 2025-11-25 legacy clients through the go-sdk's stateless handler,
// the OAuth 2.0 protected-resource side (bearer validation, RFC 9728
// metadata, challenges), the tools, and multi round-trip requests with sealed
// requestState.
package mcpapi

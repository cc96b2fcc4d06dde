//go:build race

package mcpapi

// raceEnabled: the tests run under the race detector.
const raceEnabled = true

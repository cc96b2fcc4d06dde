//go:build race

package mcpup

// raceEnabled: the tests run under the race detector.
const raceEnabled = true

//go:build !race

package main

// raceEnabled reports whether the tests run with -race; the broker binaries
// they start are then built with -race too.
const raceEnabled = false

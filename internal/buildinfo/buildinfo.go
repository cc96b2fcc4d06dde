// Package buildinfo says which build of the broker is running: its version,
// the commit it was built from and a date.
//
// Release builds stamp the three values with the linker (the Makefile and
// the Dockerfile do this):
//
//	go build -ldflags "-X credbroker/internal/buildinfo.version=v1.2.3
//	  -X credbroker/internal/buildinfo.commit=$(git rev-parse HEAD)
//	  -X credbroker/internal/buildinfo.date=2026-12-01T10:00:00Z" ./cmd/broker
//
// A value left unstamped falls back to what the Go toolchain recorded in the
// binary (runtime/debug.ReadBuildInfo): the module version (a pseudo-version
// such as v0.0.0-20261130022210-89ed7e31b9c1 when built inside a git
// checkout), vcs.revision and vcs.time (the commit's date). A binary built
// with neither reports "devel" and "unknown".
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set by -ldflags "-X credbroker/internal/buildinfo.NAME=VALUE"; they must
// stay plain string variables without initialisers for -X to work.
var (
	version string
	commit  string
	date    string
)

// Info describes one build. It is what `broker version` prints and what
// /healthz reports.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	// Date is the build date when stamped by the linker, otherwise the
	// commit date recorded by the Go toolchain (RFC 3339, UTC).
	Date string `json:"date"`
	// Modified: the toolchain saw uncommitted changes in the checkout.
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go"`
}

// Unknown stands for a value neither stamped nor recorded by the toolchain.
const Unknown = "unknown"

// Get returns the running binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, date, bi)
}

// resolve combines the linker-stamped values with bi (nil when the binary
// carries no build information); each field falls back on its own.
func resolve(ver, rev, when string, bi *debug.BuildInfo) Info {
	info := Info{Version: ver, Commit: rev, Date: when, GoVersion: runtime.Version()}
	if bi == nil {
		return fill(info)
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if info.Commit == "" {
				info.Commit = s.Value
			}
		case "vcs.time":
			if info.Date == "" {
				info.Date = s.Value
			}
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return fill(info)
}

func fill(info Info) Info {
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = Unknown
	}
	if info.Date == "" {
		info.Date = Unknown
	}
	return info
}

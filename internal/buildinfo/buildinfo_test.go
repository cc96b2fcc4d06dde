package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "credbroker", Version: "v0.0.0-20261130022210-89ed7e31b9c1+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "89ed7e31b9c1839a34377ce58e7a559e32f92e38"},
			{Key: "vcs.time", Value: "2026-11-30T02:22:10Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	noVCS := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "credbroker", Version: "(devel)"}}
	tests := []struct {
		name           string
		ver, rev, when string
		bi             *debug.BuildInfo
		want           Info
	}{
		{"stamped wins over the toolchain", "v1.2.3", "abc123", "2026-12-01T10:00:00Z", vcs,
			Info{Version: "v1.2.3", Commit: "abc123", Date: "2026-12-01T10:00:00Z", Modified: true, GoVersion: "go1.26.8"}},
		{"toolchain fallback", "", "", "", vcs,
			Info{Version: "v0.0.0-20261130022210-89ed7e31b9c1+dirty", Commit: "89ed7e31b9c1839a34377ce58e7a559e32f92e38",
				Date: "2026-11-30T02:22:10Z", Modified: true, GoVersion: "go1.26.8"}},
		{"each field falls back on its own", "v1.2.3", "", "", vcs,
			Info{Version: "v1.2.3", Commit: "89ed7e31b9c1839a34377ce58e7a559e32f92e38", Date: "2026-11-30T02:22:10Z", Modified: true, GoVersion: "go1.26.8"}},
		{"no VCS stamp: devel and unknown", "", "", "", noVCS,
			Info{Version: "devel", Commit: Unknown, Date: Unknown, GoVersion: "go1.26.8"}},
		{"no build information at all", "", "", "", nil,
			Info{Version: "devel", Commit: Unknown, Date: Unknown, GoVersion: runtime.Version()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolve(tc.ver, tc.rev, tc.when, tc.bi); got != tc.want {
				t.Errorf("resolve = %+v\nwant      %+v", got, tc.want)
			}
		})
	}
}

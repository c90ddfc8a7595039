package mainlib

import (
	"runtime/debug"
	"strings"
)

// Version, Commit and BuildDate are set at link time by `make build` and
// the Dockerfile (-ldflags "-X .../mainlib.Commit=…"). A plain `go build`
// in a git checkout stamps the commit and its time itself (vcs.revision,
// vcs.time), which are used when the link-time values are not set.
var (
	Version   = "dev"
	Commit    = ""
	BuildDate = ""
)

// versionString is what `extproc version` prints and the start-up line
// carries: the version, the commit (marked when the tree had changes), the
// build date and the Go release.
func versionString() string {
	commit, date, dirty := Commit, BuildDate, false
	goVersion := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if commit == "" {
					commit = s.Value
				}
			case "vcs.time":
				if date == "" {
					date = s.Value
				}
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if c, ok := strings.CutSuffix(commit, "-dirty"); ok {
		commit, dirty = c, true
	}
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if commit == "" {
		commit = "unknown commit"
	} else if dirty && !strings.HasSuffix(commit, "-dirty") {
		commit += "-dirty"
	}
	if date == "" {
		date = "unknown date"
	}
	return "fusebox extproc " + Version + " (" + commit + ", built " + date + ") " + goVersion
}

package mainlib

import "runtime/debug"

// Version is set at link time (-ldflags "-X .../mainlib.Version=v1.2.3").
var Version = "dev"

func versionString() string {
	v := Version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
		v += " " + bi.GoVersion
	}
	return "fusebox extproc " + v
}

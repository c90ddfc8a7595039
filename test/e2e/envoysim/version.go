package envoysim

import "fmt"

// Version is the Envoy release the proxy plays where releases differ
// (docs/envoy.md, "Envoy's own local replies and ext_proc").
type Version struct{ Major, Minor, Patch int }

// The releases the shipped configs name.
var (
	// Envoy136 is the last release whose ext_proc filter skips the
	// router's local replies (CVE-2025-30157 fix, default on).
	Envoy136 = Version{1, 36, 2}
	// Envoy133 is the last release before the ext_proc filter sent
	// protocol_config (and before the skip: 1.33.0 itself).
	Envoy133 = Version{1, 33, 0}
	// Envoy140 sends them again (envoyproxy/envoy#41769, 1.37+) and has the
	// failover the attempt role needs.
	Envoy140 = Version{1, 40, 0}
)

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// skipGuard is the runtime guard of the skip.
const skipGuard = "envoy.reloadable_features.skip_ext_proc_on_local_reply"

// SkipsLocalReplies reports whether the ext_proc filter of this release
// never sends the router's local replies to the server, given the static
// runtime values: 1.34.0–1.36.x and the backports 1.30.10+, 1.31.6+,
// 1.32.4+, 1.33.1+, unless the guard is set false (the zero Version plays
// the current behaviour: they pass through).
func (v Version) SkipsLocalReplies(runtime map[string]string) bool {
	if runtime[skipGuard] == "false" || v.Major != 1 {
		return false
	}
	switch {
	case v.Minor >= 34 && v.Minor <= 36:
		return true
	case v.Minor == 30:
		return v.Patch >= 10
	case v.Minor == 31:
		return v.Patch >= 6
	case v.Minor == 32:
		return v.Patch >= 4
	case v.Minor == 33:
		return v.Patch >= 1
	}
	return false
}

// ConnWindowDefault is the HTTP/2 initial_connection_window_size a
// cluster gets when its file sets none: 24 MiB from 1.36.0, 256 MiB before
// (the same release notes: "connection window from 256MiB to 24MiB").
func (v Version) ConnWindowDefault() int {
	if v != (Version{}) && (v.Major < 1 || v.Major == 1 && v.Minor < 36) {
		return 256 << 20
	}
	return 24 << 20
}

// StreamWindowDefault is the HTTP/2 initial_stream_window_size a cluster
// gets when its file sets none: 16 MiB from 1.36.0, 256 MiB before (the
// 1.36.0 release notes, "The default value for the initial stream window
// size in HTTP/2 has been changed from 256MiB to 16MiB"). The zero Version
// plays the current release.
func (v Version) StreamWindowDefault() int {
	if v != (Version{}) && (v.Major < 1 || v.Major == 1 && v.Minor < 36) {
		return 256 << 20
	}
	return 16 << 20
}

// AtLeast reports whether v is major.minor or later; the zero Version
// plays the current release, later than any named.
func (v Version) AtLeast(major, minor int) bool {
	return v == (Version{}) || v.Major > major || v.Major == major && v.Minor >= minor
}

// SendsProtocolConfig reports whether the filter sends protocol_config on a
// stream's first message: from 1.34.0 (docs/envoy/stream.md). The field is
// not in Envoy's API of 2025-02-03, after 1.33.0 (go-control-plane/envoy
// v1.32.4), and is in 1.35's (v1.35.0).
func (v Version) SendsProtocolConfig() bool { return v.AtLeast(1, 34) }

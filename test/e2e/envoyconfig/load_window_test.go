package envoyconfig

import "testing"

// Every ext_proc filter takes its own cluster's initial_stream_window_size
// from the file, the route filter's as the observer's: envoysim opens its
// connection to fusebox with it, as Envoy does. Before, only the observer's
// was read, and the route filter's connection (the first one to the fusebox
// cluster, shared with the observer) advertised the release's default in
// the observer profile, where the file sets 1 MiB.
func TestEachFilterTakesItsClustersWindow(t *testing.T) {
	seen := false
	for f, cfg := range shippedHarnesses(t) {
		if cfg.Observer == nil {
			continue
		}
		seen = true
		if cfg.ExtProc.StreamWindow != cfg.Observer.StreamWindow {
			t.Errorf("%s: the route filter's window %d, the observer's %d: both name the fusebox cluster", f, cfg.ExtProc.StreamWindow, cfg.Observer.StreamWindow)
		}
	}
	if !seen {
		t.Fatal("no shipped profile has an observer")
	}
}

// Package shared owns the admin changes (overlays) of a store every
// replica shares (R-API2a, Redis): read and written through the store's
// raw backend (breaker.RawOverlayBackend), decoded as routes.Overlay,
// written only onto the revision this replica last read, put back when the
// store went back to an older revision or was emptied, and kept in a local
// cache file so that a fleet restarted with an empty Redis loses no
// acknowledged change (cache.go, R-ST15). It is the routes.OverlayStore
// mainlib gives routes.Manager on Redis; the memory store keeps its
// overlays in a file (routes.FileOverlays).
package shared

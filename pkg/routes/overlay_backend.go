package routes

import (
	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The shared backend's interfaces and errors are the store side's
// (breaker/overlays.go), named here as the config side has always named
// them.
type (
	// RawOverlayBackend keeps overlay documents as bytes by gateway id.
	RawOverlayBackend = breaker.RawOverlayBackend
	// RevisionedBackend is a backend whose documents carry revisions.
	RevisionedBackend = breaker.RevisionedBackend
	// BadOverlaysError names stored overlays that are not overlay documents.
	BadOverlaysError = breaker.BadOverlaysError
)

// EpochField is the revisions' entry naming the store's lineage.
const EpochField = breaker.OverlayEpochField

var (
	// ErrConflict: another replica changed the overlay since this one read it.
	ErrConflict = breaker.ErrOverlayConflict
	// ErrStoreEmpty: the shared store holds no overlay and no revision at all.
	ErrStoreEmpty = breaker.ErrOverlaysEmpty
)

package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
)

// Profile drives each fusebox process (the synchronous profile, then the
// observer profile) with lifecycles for as long as its admin takes a 10 s
// CPU profile, and writes the profiles to dir as sync.pprof and
// observer.pprof (and each one's allocations since it started, as
// sync.allocs.pprof and observer.allocs.pprof): the server's own profile,
// the driver not in it.
func Profile(bin, dir string, conc int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fb, err := startFusebox(bin)
	if err != nil {
		return err
	}
	defer fb.stop()
	ob, err := startFuseboxObserver(bin)
	if err != nil {
		return err
	}
	defer ob.stop()
	ob.observer = true
	l := newLifecycle()
	for _, p := range []struct {
		name string
		s    *proc
	}{{"sync", fb}, {"observer", ob}} {
		if _, err := p.s.drive(l, 200, conc, nil); err != nil {
			return err
		}
		var stop atomic.Bool
		errc := make(chan error, 1)
		go func() {
			for !stop.Load() {
				if _, err := p.s.drive(l, 500, conc, nil); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		perr := fetchProfile(p.s.admin, "profile?seconds=10", filepath.Join(dir, p.name+".pprof"))
		if perr == nil {
			perr = fetchProfile(p.s.admin, "allocs", filepath.Join(dir, p.name+".allocs.pprof"))
		}
		stop.Store(true)
		if err := <-errc; err != nil {
			return err
		}
		if perr != nil {
			return perr
		}
	}
	return nil
}

func fetchProfile(admin, which, path string) error {
	resp, err := http.Get("http://" + admin + "/debug/pprof/" + which)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("profile: %s: %s", resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

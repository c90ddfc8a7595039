package envoysim

import "time"

// Envoy writes a request's access log entry as its downstream stream ends,
// after the last byte went to the client: a client can hold the whole
// response before the entry exists, and a later request's entry can be
// written first. So a test finds its request's entry by the id the
// response carries (RequestHeader), not by its place in the log.

// Logged returns the access log entry of request id, if it is written.
func (p *Proxy) Logged(id string) (Entry, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok, _ := p.loggedLocked(id)
	return e, ok
}

// WaitLogged waits at most d for the access log entry of request id (the
// RequestHeader of its response) and returns it; false on the timeout.
func (p *Proxy) WaitLogged(id string, d time.Duration) (Entry, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		p.mu.Lock()
		e, ok, next := p.loggedLocked(id)
		p.mu.Unlock()
		if ok {
			return e, true
		}
		select {
		case <-next:
		case <-timer.C:
			return Entry{}, false
		}
	}
}

// loggedLocked finds id's entry, newest first (the one asked for is near
// the end); when it is not there, it returns the channel closed as the
// next entry is recorded. p.mu is held.
func (p *Proxy) loggedLocked(id string) (Entry, bool, chan struct{}) {
	for i := len(p.log) - 1; i >= 0; i-- {
		if p.log[i].RequestID == id {
			return p.log[i], true, nil
		}
	}
	if p.logged == nil {
		p.logged = make(chan struct{})
	}
	return Entry{}, false, p.logged
}

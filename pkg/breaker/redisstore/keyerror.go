package redisstore

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A bad key is that key's problem (R-L12). Redis answering one breaker's
// call with an error reply (a script error on a value the script could not
// handle, a reply of the wrong shape) says nothing about Redis being
// reachable: before, one garbage value turned every replica degraded for
// good, deciding alone and logging "Redis is unreachable" every refresh.
// Such a breaker decides and records on the local view alone, counted
// (aig_store_errors_total{op="key"}) and logged once, until a refresh reads
// it again. The script itself rewrites a state it cannot read
// (breaker.lua, "readable"), so this is the last line, not the first.

// serverWide are error replies that speak for the whole server, not a key:
// they turn the store degraded as a dropped connection does.
var serverWide = []string{"LOADING", "BUSY", "OOM", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "NOAUTH", "NOPERM",
	"WRONGPASS", "TRYAGAIN", "NOREPLICAS", "MISCONF", "NOSCRIPT", "ERR max number of clients", "UNBLOCKED"}

// keyError reports whether err is one breaker's problem rather than Redis's.
func keyError(err error) bool {
	var re *replyError
	if errors.As(err, &re) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) || errors.Is(err, redis.Nil) {
		return false
	}
	msg := rerr.Error()
	for _, p := range serverWide {
		if strings.HasPrefix(msg, p) {
			return false
		}
	}
	return true
}

// keyFailed puts e on the local view alone.
func (s *Store) keyFailed(e *entry, op string, err error) {
	s.count("key")
	s.lines.Lock()
	defer s.lines.Unlock()
	if !e.bad.Swap(true) {
		s.log.Error("[store] Redis answered one breaker's state with an error: that breaker decides and records on this replica's local state until it reads again; the others are not affected",
			"gateway", e.id.Gateway, "route", e.id.Route, "op", op, "error", err.Error())
	}
}

// keyAnswered notes a good answer for e: a breaker on the local view alone
// is back, and a state the script rewrote is logged (it is a new
// incarnation of the key, so apply takes it whatever the view held).
func (s *Store) keyAnswered(e *entry, r *result) {
	if e.bad.Load() {
		s.lines.Lock()
		if e.bad.Swap(false) {
			s.log.Info("[store] a breaker's state in Redis reads again", "gateway", e.id.Gateway, "route", e.id.Route)
		}
		s.lines.Unlock()
	}
	if r.Rewritten {
		s.count("key_rewritten")
		s.log.Warn("[store] a breaker's state in Redis could not be read (not fusebox's, or corrupt) and was rewritten as closed",
			"gateway", e.id.Gateway, "route", e.id.Route)
	}
}

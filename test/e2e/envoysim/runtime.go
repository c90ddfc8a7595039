package envoysim

import (
	"fmt"
	"sort"
)

// playedRuntime are the runtime keys envoysim plays: a config that sets
// any other key is refused (New), so that a guard the harness does not
// play never passes a test silently. ignoredRuntime are keys known not to
// matter to what envoysim plays, each with the reason.
var (
	playedRuntime = map[string]bool{
		skipGuard:          true, // version.go, SkipsLocalReplies
		streamCloseGuard:   true, // streamclose.go, closesEarly (1.37-1.39)
		gracefulCloseGuard: true, // streamclose.go, gracefulClose (1.34+)
		remoteCloseTimeout: true, // streamclose.go, gracefulClose
	}
	// None so far: the shipped configs set only the skip guard.
	ignoredRuntime = map[string]string{}
)

// checkRuntime refuses runtime keys envoysim neither plays nor knows not
// to matter.
func checkRuntime(rt map[string]string) error {
	var unknown []string
	for k := range rt {
		if !playedRuntime[k] && ignoredRuntime[k] == "" {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("envoysim: runtime keys it does not play: %v (play them, or list them in runtime.go with why they do not matter)", unknown)
	}
	return nil
}

// checkFlagNames refuses a response_flag_filter name envoysim does not
// know (flagNames): a flag it cannot set would filter nothing in.
func checkFlagNames(names []string) error {
	for _, n := range names {
		if _, ok := flagNames[n]; !ok {
			return fmt.Errorf("envoysim: response_flag_filter flag %q is not one it plays", n)
		}
	}
	return nil
}

// playedResponseAttributes are the response attributes envoysim sends
// (respond.go, attributes).
var playedResponseAttributes = map[string]bool{"response.flags": true, "response.code_details": true, "response.code": true}

// checkAttributes refuses attributes envoysim would not send: a filter
// that asks for one it does not play would get nothing in a test, and
// Envoy would send it. xds.cluster_name is played on the attempt role
// only (an upstream filter, whose cluster is the attempt's).
func (c *Config) checkAttributes() error {
	for name, f := range c.filters() {
		for _, a := range f.ResponseAttributes {
			if !playedResponseAttributes[a] {
				return fmt.Errorf("envoysim: the %s asks for response attribute %q, which it does not send", name, a)
			}
		}
		for _, a := range f.RequestAttributes {
			if a != "xds.cluster_name" || name != "attempt role" {
				return fmt.Errorf("envoysim: the %s asks for request attribute %q, which it does not send there", name, a)
			}
		}
	}
	return nil
}

// filters are the config's ext_proc filters by the role they play.
func (c *Config) filters() map[string]*ExtProcConfig {
	filters := map[string]*ExtProcConfig{"route role": &c.ExtProc}
	if c.Observer != nil {
		filters["observer"] = c.Observer
	}
	if c.Failover != nil {
		filters["attempt role"] = &c.Failover.Attempt
	}
	return filters
}

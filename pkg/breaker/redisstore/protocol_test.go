package redisstore

import (
	"regexp"
	"strings"
	"testing"
)

// TestReplyProtocolNames: the script builds its reply from the same field
// lists script.go reads it by, in the same order, and the position
// constants name those lists.
func TestReplyProtocolNames(t *testing.T) {
	for _, c := range []struct {
		lua   string
		names []string
		n     int
	}{{"REPLY", replyNames, replyFields}, {"EVENT", eventNames, eventFields}} {
		m := regexp.MustCompile(`(?s)local ` + c.lua + ` = \{(.*?)\}`).FindStringSubmatch(scriptSrc)
		if m == nil {
			t.Fatalf("breaker.lua has no %s list", c.lua)
		}
		var lua []string
		for _, q := range regexp.MustCompile(`"([a-z_]+)"`).FindAllStringSubmatch(m[1], -1) {
			lua = append(lua, q[1])
		}
		if strings.Join(lua, ",") != strings.Join(c.names, ",") || len(c.names) != c.n {
			t.Errorf("%s: breaker.lua %v, script.go %v (%d positions)", c.lua, lua, c.names, c.n)
		}
	}
}

package redisstore

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
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

// TestScriptArgumentNames (R-ST16): the script reads its policy (P) and
// its call (A) by name, and every name it reads is one the Go side sends,
// and the other way round. Before, rec took 13 positional arguments and
// merge 7, held together by their order alone.
func TestScriptArgumentNames(t *testing.T) {
	read := func(table string) map[string]bool {
		out := map[string]bool{}
		for _, m := range regexp.MustCompile(`\b`+table+`\.([a-z_]+)`).FindAllStringSubmatch(scriptSrc, -1) {
			out[m[1]] = true
		}
		return out
	}
	p := breaker.DefaultPolicy()
	p.Enabled = true
	policy := map[string]bool{}
	for _, k := range msgpackKeys(t, []byte(policyArgs(p.Finish()))) {
		policy[k] = true
	}
	sent := map[string]bool{"op": true, "now": true, "age": true}
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "script.go" || f == "syncstate.go" || f == "overlays.go" || f == "notes.go" || f == "changes.go" {
			continue // the policy (checked above), the reply, the other scripts
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`\{"([a-z_]+)", `).FindAllStringSubmatch(string(src), -1) {
			sent[m[1]] = true
		}
	}
	for _, c := range []struct {
		table      string
		read, sent map[string]bool
	}{{"P", read("P"), policy}, {"A", read("A"), sent}} {
		for k := range c.read {
			if !c.sent[k] {
				t.Errorf("breaker.lua reads %s.%s, which the Go side never sends", c.table, k)
			}
		}
		for k := range c.sent {
			if !c.read[k] {
				t.Errorf("the Go side sends %s.%s, which breaker.lua never reads", c.table, k)
			}
		}
	}
}

// msgpackKeys reads the keys of a map msgpackMap encoded.
func msgpackKeys(t *testing.T, b []byte) []string {
	t.Helper()
	if len(b) < 3 || b[0] != 0xde {
		t.Fatalf("not a map16: % x", b[:min(len(b), 8)])
	}
	n, i := int(b[1])<<8|int(b[2]), 3
	str := func() string {
		l := int(b[i+1])
		s := string(b[i+2 : i+2+l])
		i += 2 + l
		return s
	}
	var keys []string
	for range n {
		keys = append(keys, str())
		switch b[i] {
		case 0xc2, 0xc3:
			i++
		case 0xd3, 0xcb:
			i += 9
		case 0xd9:
			str()
		default:
			t.Fatalf("a value of type %#x", b[i])
		}
	}
	return keys
}

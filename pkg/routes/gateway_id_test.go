package routes

import (
	"strings"
	"testing"
)

// Gateway ids name Redis keys and hash fields (#36): an id holding '{',
// '}', '|', ':' or '~' (or too long) is refused, naming the field, so two
// gateways' keys cannot collide or move to another Cluster slot. Before,
// ids were only checked to be non-empty.
func TestGatewayIDsAreSafeInKeys(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"default", true}, {"team-a.eu_1", true}, {"a{b}", false}, {"a|b", false}, {"a:b", false},
		{"~epoch", false}, {"-a", false}, {strings.Repeat("a", 65), false}, {"a b", false},
	} {
		cfg := "gateways:\n  - id: \"" + tc.id + "\"\n    models: [{name: m, routes: [\"a:r:m\"]}]\n    routes: [{key: \"a:r:m\", cluster: ca}]\n"
		_, err := Parse([]byte(cfg), Options{})
		if (err == nil) != tc.ok {
			t.Errorf("id %q: %v", tc.id, err)
		}
		if err != nil && !strings.Contains(err.Error(), "id") {
			t.Errorf("id %q: the error does not name the field: %v", tc.id, err)
		}
	}
}

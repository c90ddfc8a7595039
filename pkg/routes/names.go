package routes

import (
	"fmt"
	"strings"
)

// checkRouteKey applies the route key rules: provider:rest, where the
// provider is the text before the first ':' and the rest is opaque (it may
// hold ':' or '/'). Commas are refused because keys travel in comma-separated
// lists (fallbacks, the stage's routes).
func checkRouteKey(k string) error {
	i := strings.IndexByte(k, ':')
	if i <= 0 || i == len(k)-1 {
		return fmt.Errorf("%q must be provider:region:model (a provider before the first ':' and something after it)", k)
	}
	for _, r := range k {
		if r <= ' ' || r == ',' || r == 0x7f {
			return fmt.Errorf("%q must not contain spaces, commas or control characters", k)
		}
	}
	return nil
}

// checkEntryName refuses a model name the admin API could not address
// as one path segment: "." and ".." (an HTTP mux cleans them away: a
// DELETE of model ".." was redirected to its gateway, and a client that
// followed the redirect deleted the gateway), "/" and control characters.
// Route keys may hold "/" (model ids such as meta-llama/Llama-3.1-70B do);
// the API takes them %2F-escaped.
func checkEntryName(s string) error {
	if s == "." || s == ".." {
		return fmt.Errorf("%q is not a name (an HTTP path cannot address it)", s)
	}
	for _, r := range s {
		if r == '/' || r < ' ' || r == 0x7f {
			return fmt.Errorf("%q must not contain '/' or control characters", s)
		}
	}
	return nil
}

func validName(s string) bool {
	if s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return s != ""
}

func validClusterName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-:/", r)) {
			return false
		}
	}
	return s != ""
}

// reservedHeader reports names fusebox must never read as its own or write:
// what Envoy owns or what routing and framing depend on (R-L8).
func reservedHeader(s string) bool {
	switch s {
	case "host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "authorization":
		return true
	}
	return strings.HasPrefix(s, "x-envoy-")
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func validHeaderName(s string) bool {
	if s == "" || s[0] == ':' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// ValidGatewayID reports whether id may name a gateway: 1..64 of letters,
// digits, '.', '_' and '-', starting with a letter or digit. A gateway id
// goes into Redis keys and hash fields: '{' and '}' would move a key to
// another Cluster slot, '|' and ':' would let two gateways' keys collide,
// and '~' starts the overlay hash's own fields (EpochField).
func ValidGatewayID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

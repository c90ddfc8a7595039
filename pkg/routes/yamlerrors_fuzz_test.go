package routes

import "testing"

// The rewriting of decoder messages never panics and never loses the line.
func FuzzFriendlyYAMLError(f *testing.F) {
	for _, s := range []string{
		"line 3: field x not found in type routes.RouteSpec",
		"line 5: cannot unmarshal !!str `a` into []string",
		"yaml: line 4: did not find expected ',' or ']'",
		"yaml: line 1: mapping values are not allowed in this context",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		out := friendlyYAMLError(msg)
		if m := reLine.FindString(msg); m != "" && len(out) == 0 {
			t.Fatalf("lost the message %q", msg)
		}
	})
}
